// Opening a state store (OpenStateBackend): fsync policies, specs that are
// refused, a Redis nobody listens on, directories that cannot be made, and
// plain and relative paths.
#include "server/durability/state_backend.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/server/durability/state_backend_fixture.h"

namespace txl {
namespace {

namespace fs = std::filesystem;
using testing::RedisConfig;
using testing::TempDir;

TEST(OpenStateBackendTest, ParsesFsyncPolicies) {
  EXPECT_EQ(*ParseFsyncPolicy("always"), FsyncPolicy::kAlways);
  EXPECT_EQ(*ParseFsyncPolicy("interval"), FsyncPolicy::kInterval);
  EXPECT_EQ(*ParseFsyncPolicy("never"), FsyncPolicy::kNever);
  for (const char* bad : {"", "Always", "sometimes"}) {
    auto p = ParseFsyncPolicy(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(OpenStateBackendTest, BadSpecsAreInvalidArgumentNamingTheSpec) {
  for (const char* spec :
       {"", "dir:", "ftp://host/x", "redis:host:1", "redis://", "redis://host", "redis://:6379", "redis://host:0",
        "redis://host:70000", "redis://host:port", "redis://h:1/bad prefix", "redis://[::1/x"}) {
    StateBackendConfig config;
    config.spec = spec;
    auto backend = OpenStateBackend(config);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << spec << ": " << backend.status();
    EXPECT_TRUE(absl::StrContains(backend.status().message(), absl::StrCat("\"", spec, "\""))) << backend.status();
  }
}

TEST(OpenStateBackendTest, RedisNobodyListensIsUnavailable) {
  // Bound but not listening: connections are refused, and nobody else can take the port meanwhile.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  StateBackendConfig config = RedisConfig(port, "txl");
  config.redis_timeout = absl::Milliseconds(500);
  auto backend = OpenStateBackend(config);
  close(fd);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_TRUE(absl::StrContains(backend.status().message(), absl::StrCat("127.0.0.1:", port))) << backend.status();
}

TEST(OpenStateBackendTest, DirectoryUnderARegularFileIsUnavailable) {
  TempDir dir;
  const std::string file = absl::StrCat(dir.path(), "/file");
  std::ofstream(file) << "x";
  StateBackendConfig config;
  config.spec = absl::StrCat(file, "/state");
  auto backend = OpenStateBackend(config);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_TRUE(absl::StrContains(backend.status().message(), config.spec)) << backend.status();
  config.spec = file;  // the file itself
  EXPECT_EQ(OpenStateBackend(config).status().code(), absl::StatusCode::kUnavailable);
}

TEST(OpenStateBackendTest, PlainAndRelativePathsAreDirectories) {
  TempDir dir;
  StateBackendConfig config;
  config.spec = absl::StrCat(dir.path(), "/a/b/c/");  // created, parents too
  auto backend = OpenStateBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Describe(), absl::StrCat("dir:", dir.path(), "/a/b/c"));

  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  config.spec = "rel";
  backend = OpenStateBackend(config);
  fs::current_path(cwd);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Describe(), absl::StrCat("dir:", dir.path(), "/rel"));
  ASSERT_TRUE((*backend)->Put("k", "v").ok());  // the root is absolute from then on
  EXPECT_TRUE(fs::exists(absl::StrCat(dir.path(), "/rel/k")));
}

}  // namespace
}  // namespace txl

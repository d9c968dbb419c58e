// base/: whole-file reads and writes (errors name the path and the system's reason), the
// levelled log (its line format and its minimum level), and the status helpers.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "base/log.h"
#include "base/read_file.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"

namespace txl {
namespace {

// CTest runs each test as its own process, two at a time: the pid keeps their files apart
// (a shared name let one test remove the file another was reading).
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/base_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(ReadFileTest, RoundTripKeepsEveryByte) {
  const std::string path = TempPath("bytes");
  const std::string bytes("a\0b\r\n\xff", 6);
  ASSERT_TRUE(WriteFile(path, bytes).ok());
  absl::StatusOr<std::string> back = ReadFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  ASSERT_TRUE(WriteFile(path, "").ok());  // truncates
  EXPECT_EQ(ReadFile(path).value(), "");
  std::remove(path.c_str());
}

TEST(ReadFileTest, MissingFileNamesPathAndReason) {
  const std::string path = TempPath("no/such/file.txt");
  absl::StatusOr<std::string> r = ReadFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), path + ": cannot open: No such file or directory");
}

TEST(ReadFileTest, DirectoryIsRefused) {
  absl::StatusOr<std::string> r = ReadFile(::testing::TempDir());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "is a directory")) << r.status();
}

TEST(ReadFileTest, ReadsFilesThatReportNoSize) {
  absl::StatusOr<std::string> r = ReadFile("/proc/self/status");  // st_size 0
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::StrContains(*r, "Name:"));
}

TEST(WriteFileTest, MissingDirectoryNamesPath) {
  const std::string path = TempPath("no/such/dir/out.txt");
  absl::Status s = WriteFile(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(s.message(), path + ": cannot open for writing: ")) << s;
}

// Runs `body` with stderr sent to a file; returns what was written.
template <typename F>
std::string CaptureStderr(F body) {
  const std::string path = TempPath("stderr");
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(fd, 2);
  ::close(fd);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string out = ReadFile(path).value();
  std::remove(path.c_str());
  return out;
}

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override { SetMinLogLevel(LogLevel::kInfo); }
};

TEST_F(LogTest, OneLineWithProgramAndLevel) {
  const std::string out = CaptureStderr([] {
    TXL_LOG(INFO) << "session " << 7 << " recovered";
    TXL_LOG(WARNING) << "heartbeat: slow";
    Log(LogLevel::kError, "store failed\n");  // one newline, not two
  });
  EXPECT_EQ(out,
            "base_test: info: session 7 recovered\n"
            "base_test: warning: heartbeat: slow\n"
            "base_test: error: store failed\n");
}

TEST_F(LogTest, MinimumLevelDropsLowerLevelsWithoutEvaluating) {
  SetMinLogLevel(LogLevel::kWarning);
  EXPECT_EQ(MinLogLevel(), LogLevel::kWarning);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  const std::string out = CaptureStderr([&] {
    TXL_LOG(INFO) << "dropped " << count();
    TXL_LOG(WARNING) << "kept " << count();
    TXL_LOG(ERROR) << "kept " << count();
  });
  EXPECT_EQ(out, "base_test: warning: kept 1\nbase_test: error: kept 2\n");
  EXPECT_EQ(evaluated, 2);
  SetMinLogLevel(LogLevel::kError);
  EXPECT_EQ(CaptureStderr([] { TXL_LOG(WARNING) << "dropped"; }), "");
}

TEST_F(LogTest, MacroIsOneStatement) {
  // No dangling else: the else belongs to the outer if.
  bool took_else = false;
  const std::string out = CaptureStderr([&] {
    if (false)
      TXL_LOG(ERROR) << "not logged";
    else
      took_else = true;
  });
  EXPECT_TRUE(took_else);
  EXPECT_EQ(out, "");
}

absl::StatusOr<int> Half(int n) {
  if (n % 2 != 0) return absl::InvalidArgumentError("odd");
  return n / 2;
}

absl::StatusOr<int> Quarter(int n) {
  ASSIGN_OR_RETURN(const int half, Half(n));
  ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int n) {
  RETURN_IF_ERROR(Half(n).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnTheFirstErrorUnchanged) {
  EXPECT_EQ(Quarter(8).value(), 2);
  EXPECT_EQ(Quarter(6).status(), absl::InvalidArgumentError("odd"));
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_EQ(CheckEven(3), absl::InvalidArgumentError("odd"));
}

TEST(StatusMacrosTest, WithContextKeepsTheCode) {
  EXPECT_EQ(WithContext("vocab file", absl::NotFoundError("x: gone")), absl::NotFoundError("vocab file: x: gone"));
  EXPECT_TRUE(WithContext("anything", absl::OkStatus()).ok());
}

}  // namespace
}  // namespace txl

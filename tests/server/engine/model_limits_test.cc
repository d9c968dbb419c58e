// ModelLimits: DIR/NAME/limits.json, read and checked against the server's flags.
#include "server/engine/model_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "base/read_file.h"

namespace txl {
namespace {

namespace fs = std::filesystem;

// The server's flags as ceilings: --max_mem_len 4096, --max_new_tokens 4096,
// --max_input_tokens 65536, --max_sessions 1000.
constexpr ModelLimits kServer{0, 4096, 4096, 65536, 1000};

void ExpectRefused(const std::string& text, const std::string& naming) {
  auto limits = ParseModelLimits(text, kServer);
  ASSERT_FALSE(limits.ok()) << text;
  EXPECT_EQ(limits.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_NE(limits.status().message().find(naming), std::string::npos) << limits.status();
}

TEST(ModelLimitsTest, EachFieldLowersTheServersAndAbsentOnesStayZero) {
  auto limits = ParseModelLimits(R"({"max_mem_len": 512, "default_mem_len": 128, "max_sessions": 3})", kServer);
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->max_mem_len, 512);
  EXPECT_EQ(limits->default_mem_len, 128);
  EXPECT_EQ(limits->max_sessions, 3);
  EXPECT_EQ(limits->max_new_tokens, 0);  // the server's
  EXPECT_EQ(limits->max_input_tokens, 0);
  auto all = ParseModelLimits(
      R"({"default_mem_len": 1, "max_mem_len": 4096, "max_new_tokens": 8, "max_input_tokens": 100,
          "max_sessions": 1000})",
      kServer);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->max_new_tokens, 8);
  EXPECT_EQ(all->max_input_tokens, 100);
  auto empty = ParseModelLimits("{}", kServer);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->max_mem_len, 0);
}

TEST(ModelLimitsTest, BadFilesAreRefusedNamingTheField) {
  ExpectRefused("{", "not valid JSON");
  ExpectRefused("[1, 2]", "JSON object");
  ExpectRefused(R"({"max_memlen": 10})", "unknown field \"max_memlen\" (known: default_mem_len, max_mem_len");
  ExpectRefused(R"({"max_mem_len": 0})", "max_mem_len must be a positive integer");
  ExpectRefused(R"({"max_mem_len": -4})", "max_mem_len must be a positive integer");
  ExpectRefused(R"({"max_new_tokens": 2.5})", "max_new_tokens must be a positive integer");
  ExpectRefused(R"({"max_sessions": "10"})", "max_sessions must be a positive integer");
  ExpectRefused(R"({"max_sessions": 18446744073709551615})", "max_sessions must be a positive integer");
  // A model may lower the server's flags, never raise them.
  ExpectRefused(R"({"max_mem_len": 8192})", "max_mem_len 8192 exceeds the server's --max_mem_len 4096");
  ExpectRefused(R"({"default_mem_len": 5000})", "default_mem_len 5000 exceeds the server's --max_mem_len 4096");
  ExpectRefused(R"({"max_sessions": 1001})", "exceeds the server's --max_sessions 1000");
  ExpectRefused(R"({"max_mem_len": 100, "default_mem_len": 200})", "default_mem_len 200 exceeds max_mem_len 100");
}

TEST(ModelLimitsTest, AModelWithoutTheFileHasNoneAndABadFileIsNamed) {
  const fs::path dir = fs::temp_directory_path() / ("model_limits_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto none = ReadModelLimits(dir.string(), kServer);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->max_sessions, 0);
  ASSERT_TRUE(WriteFile((dir / kModelLimitsFileName).string(), R"({"max_new_tokens": 9000})").ok());
  auto bad = ReadModelLimits(dir.string(), kServer);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find((dir / "limits.json").string() + ": max_new_tokens 9000"), std::string::npos)
      << bad.status();
  fs::remove_all(dir);
  fs::create_directories(dir / kModelLimitsFileName);  // not a file
  EXPECT_FALSE(ReadModelLimits(dir.string(), kServer).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace txl

// The --auth_tokens file parser and the bearer-token check (server/core/auth.h).
#include "server/core/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace txl {
namespace {

std::unique_ptr<BearerTokens> MustParse(absl::string_view text) {
  auto t = BearerTokens::Parse(text, "tokens.txt");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

void ExpectParseError(absl::string_view text, const std::string& where, const std::string& what) {
  auto t = BearerTokens::Parse(text, "tokens.txt");
  ASSERT_FALSE(t.ok()) << text;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(where), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status();
}

TEST(BearerTokensTest, ParsesTokensCommentsAndBlankLines) {
  auto t = MustParse(
      "# team tokens\n"
      "\n"
      "tok-alice-1 alice\n"
      "   # indented comment\n"
      "tok-alice-2\talice\r\n"  // a tab, and a Windows line end
      "  tok-bob   bob  \n"
      "tok-carol carol");  // no final newline
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->size(), 4u);
  EXPECT_EQ(t->Lookup("tok-alice-1"), "alice");
  EXPECT_EQ(t->Lookup("tok-alice-2"), "alice");  // one principal, two tokens (rotation)
  EXPECT_EQ(t->Lookup("tok-bob"), "bob");
  EXPECT_EQ(t->Lookup("tok-carol"), "carol");
}

TEST(BearerTokensTest, LookupNeedsTheWholeToken) {
  auto t = MustParse("abcdef alice\n");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Lookup("abcdef"), "alice");
  for (const char* wrong : {"", "abcde", "abcdefg", "abcdeF", "bcdef", "abcdefabcdef", "alice", "xbcdef"}) {
    EXPECT_EQ(t->Lookup(wrong), std::nullopt) << wrong;
  }
}

TEST(BearerTokensTest, MalformedLinesNameFileAndLineAndNotTheToken) {
  ExpectParseError("ok-token alice\nsecret-only\n", "tokens.txt:2: ", "expected 'TOKEN PRINCIPAL', got 1 field");
  ExpectParseError("# c\n\nsecret alice extra\n", "tokens.txt:3: ", "got 3 field");
  ExpectParseError("secr\x01t alice\n", "tokens.txt:1: ", "printable ASCII");
  ExpectParseError(
      "secret al\xc3\xa9"
      "ce\n",
      "tokens.txt:1: ", "printable ASCII");
  // The message never quotes the line: it holds a secret.
  auto t = BearerTokens::Parse("the-secret-value\n", "tokens.txt");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message().find("the-secret-value"), std::string::npos) << t.status();
}

TEST(BearerTokensTest, DuplicateTokenIsAnError) {
  ExpectParseError("same-token alice\nother bob\nsame-token carol\n",
                   "tokens.txt:3: ", "duplicate token (first on line 1)");
}

TEST(BearerTokensTest, EmptyTableIsAnError) {
  ExpectParseError("", "tokens.txt", "holds no tokens");
  ExpectParseError("# only a comment\n\n", "tokens.txt", "holds no tokens");
}

TEST(BearerTokensTest, CreateReadsTheFileAndNamesAMissingOne) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("txl_auth_test_" + std::to_string(getpid()) + ".txt")).string();
  {
    std::ofstream f(path);
    f << "file-token dave\n";
  }
  auto t = BearerTokens::Create({path});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Lookup("file-token"), "dave");
  std::remove(path.c_str());
  auto missing = BearerTokens::Create({path});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path + ": cannot open"), std::string::npos) << missing.status();
}

TEST(BearerTokensTest, AuthenticateTakesOnlyBearerWithAKnownToken) {
  auto t = MustParse("tok-alice alice\n");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(*t->Authenticate(absl::string_view("Bearer tok-alice")), "alice");
  EXPECT_EQ(*t->Authenticate(absl::string_view("bearer  tok-alice ")), "alice");  // scheme is case-insensitive
  const auto code_and_message = [&](std::optional<absl::string_view> header, const std::string& message) {
    auto p = t->Authenticate(header);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_NE(p.status().message().find(message), std::string::npos) << p.status();
  };
  code_and_message(std::nullopt, "missing credentials");
  code_and_message(absl::string_view(""), "must be 'Bearer <token>'");
  code_and_message(absl::string_view("Bearer"), "must be 'Bearer <token>'");
  code_and_message(absl::string_view("Bearer   "), "must be 'Bearer <token>'");
  code_and_message(absl::string_view("Basic dG9rLWFsaWNl"), "must be 'Bearer <token>'");
  code_and_message(absl::string_view("tok-alice"), "must be 'Bearer <token>'");
  code_and_message(absl::string_view("Bearer tok-alicE"), "invalid bearer token");
  // Never echo what was presented.
  auto wrong = t->Authenticate(absl::string_view("Bearer guessed-secret"));
  EXPECT_EQ(wrong.status().message().find("guessed-secret"), std::string::npos) << wrong.status();
}

}  // namespace
}  // namespace txl

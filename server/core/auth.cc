#include "server/core/auth.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace txl {
namespace {

// Printable ASCII without space: what may go into an HTTP/2 header value
// unquoted, and what cannot be confused with the separator.
bool IsFieldText(absl::string_view s) {
  for (char c : s)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

// No early exit: the time depends on the presented token's length only, not
// on where (or whether) it differs from the stored one.
bool SameToken(absl::string_view stored, absl::string_view presented) {
  size_t diff = stored.size() ^ presented.size();
  for (size_t i = 0; i < presented.size(); ++i) {
    diff |= static_cast<unsigned char>(stored[i % stored.size()]) ^ static_cast<unsigned char>(presented[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BearerTokens>> BearerTokens::Create(const AuthConfig& config) {
  std::ifstream in(config.tokens_file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(config.tokens_file, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(config.tokens_file, ": cannot read"));
  return Parse(text.str(), config.tokens_file);
}

absl::StatusOr<std::unique_ptr<BearerTokens>> BearerTokens::Parse(absl::string_view text, absl::string_view file) {
  std::vector<Entry> entries;
  absl::flat_hash_map<std::string, int> line_of;  // token -> the line that holds it
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripSuffix(line, "\r");  // files written on Windows
    const absl::string_view content = absl::StripAsciiWhitespace(line);
    if (content.empty() || content[0] == '#') continue;
    const auto where = [&] { return absl::StrCat(file, ":", line_no, ": "); };
    // Errors below never quote the line: it holds a secret.
    std::vector<absl::string_view> fields = absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "expected 'TOKEN PRINCIPAL', got ", fields.size(), " field(s)"));
    }
    if (!IsFieldText(fields[0]) || !IsFieldText(fields[1])) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "TOKEN and PRINCIPAL must be printable ASCII"));
    }
    auto [it, inserted] = line_of.emplace(std::string(fields[0]), line_no);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where(), "duplicate token (first on line ", it->second, ")"));
    }
    entries.push_back({std::string(fields[0]), std::string(fields[1])});
  }
  // An empty table would lock every client out: surely a mistake.
  if (entries.empty()) return absl::InvalidArgumentError(absl::StrCat(file, ": holds no tokens"));
  return std::unique_ptr<BearerTokens>(new BearerTokens(std::move(entries)));
}

std::optional<std::string> BearerTokens::Lookup(absl::string_view token) const {
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {  // every entry, also after a match
    if (SameToken(e.token, token)) found = &e;
  }
  if (found == nullptr) return std::nullopt;
  return found->principal;
}

absl::StatusOr<std::string> BearerTokens::Authenticate(const std::optional<absl::string_view>& header) const {
  if (!header.has_value()) {
    return absl::UnauthenticatedError("missing credentials: send metadata 'authorization: Bearer <token>'");
  }
  // RFC 6750: the scheme is case-insensitive; one or more spaces follow it.
  absl::string_view value = absl::StripAsciiWhitespace(*header);
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  const absl::string_view token = absl::StripLeadingAsciiWhitespace(value.substr(7));
  if (token.empty()) return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  std::optional<std::string> principal = Lookup(token);
  if (!principal) return absl::UnauthenticatedError("invalid bearer token");
  return *std::move(principal);
}

}  // namespace txl

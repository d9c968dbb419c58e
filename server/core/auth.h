// BearerTokens: the --auth_tokens file, and the check of one call's
// "authorization" metadata against it. No gRPC and no torch here: the service
// hands in the metadata value and gets a principal or UNAUTHENTICATED back.
//
// File format: one "TOKEN PRINCIPAL" per line, separated by spaces or tabs;
// blank lines and lines starting with '#' are skipped. Both fields are
// printable ASCII without spaces. One principal may have several tokens (so
// a token can be rotated without downtime); a token may appear only once.
//
// Threading: immutable after Create/Parse; Authenticate is thread-safe.
#ifndef TXL_SERVER_CORE_AUTH_H_
#define TXL_SERVER_CORE_AUTH_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

struct AuthConfig {
  std::string tokens_file;  // the --auth_tokens path
};

class BearerTokens {
 public:
  // Reads and parses config.tokens_file. Errors name the file (and line);
  // they never quote a token.
  static absl::StatusOr<std::unique_ptr<BearerTokens>> Create(const AuthConfig& config);
  // `text` is the file's content; `file` names it in errors.
  static absl::StatusOr<std::unique_ptr<BearerTokens>> Parse(absl::string_view text, absl::string_view file);

  // The principal of the call whose "authorization" metadata is `header`
  // (nullopt: the call has none). UNAUTHENTICATED, without the token in the
  // message, when it is missing, not "Bearer <token>", or unknown.
  absl::StatusOr<std::string> Authenticate(const std::optional<absl::string_view>& header) const;

  // The principal of `token`, or nullopt. Compares against every token in
  // constant time, so the time taken tells nothing about how close a guess was.
  std::optional<std::string> Lookup(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string token;
    std::string principal;
  };
  explicit BearerTokens(std::vector<Entry> entries) : entries_(std::move(entries)) {}

  const std::vector<Entry> entries_;
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_AUTH_H_

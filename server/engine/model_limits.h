// ModelLimits: what one model of a repository allows its requests and
// sessions, from DIR/NAME/limits.json (docs/OPERATIONS.md, "Limits per
// model"). The server's flags (--max_mem_len, --max_new_tokens,
// --max_input_tokens, --max_sessions) are the ceilings for every model; a
// model's file may lower them, never raise them. Torch-free.
#ifndef TXL_SERVER_ENGINE_MODEL_LIMITS_H_
#define TXL_SERVER_ENGINE_MODEL_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace txl {

// Each field: 0 means "the server's" (its flag).
struct ModelLimits {
  int64_t default_mem_len = 0;  // a new session's window when it asks for none
  int64_t max_mem_len = 0;
  int64_t max_new_tokens = 0;  // per request
  int64_t max_input_tokens = 0;
  int64_t max_sessions = 0;  // live sessions of the model, all its versions together
};
// A model's limit where its limits.json sets one (> 0), else the server's.
inline int64_t ModelOrServer(int64_t model, int64_t server) { return model > 0 ? model : server; }
// Whether a request on a session reads alike under both: the per-request
// limits (a session's window, and the model's session count, are the
// session's and the model's already).
inline bool SameRequestLimits(const ModelLimits& a, const ModelLimits& b) {
  return a.max_new_tokens == b.max_new_tokens && a.max_input_tokens == b.max_input_tokens;
}

inline constexpr char kModelLimitsFileName[] = "limits.json";

// Parses a limits file's text: a JSON object of the fields above, each a
// positive integer, none above `ceilings`' (the server's flags; 0 there:
// none) and default_mem_len within max_mem_len. INVALID_ARGUMENT naming the
// field and the rule; an unknown field is refused, never ignored.
absl::StatusOr<ModelLimits> ParseModelLimits(const std::string& text, const ModelLimits& ceilings);

// DIR/NAME/limits.json of the model directory `model_dir`, or no limits of
// its own when the file is not there. Errors name the file.
absl::StatusOr<ModelLimits> ReadModelLimits(const std::string& model_dir, const ModelLimits& ceilings);

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_MODEL_LIMITS_H_

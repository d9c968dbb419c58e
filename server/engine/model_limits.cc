#include "server/engine/model_limits.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/read_file.h"
#include "nlohmann/json.hpp"

namespace txl {

namespace {

using json = nlohmann::json;

struct Field {
  const char* name;
  int64_t ModelLimits::*member;
  const char* flag;  // the server's ceiling
};

constexpr Field kFields[] = {
    {"default_mem_len", &ModelLimits::default_mem_len, "--max_mem_len"},
    {"max_mem_len", &ModelLimits::max_mem_len, "--max_mem_len"},
    {"max_new_tokens", &ModelLimits::max_new_tokens, "--max_new_tokens"},
    {"max_input_tokens", &ModelLimits::max_input_tokens, "--max_input_tokens"},
    {"max_sessions", &ModelLimits::max_sessions, "--max_sessions"},
};

const Field* FindField(const std::string& name) {
  for (const Field& f : kFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The ceiling of a field: default_mem_len's is max_mem_len's.
int64_t Ceiling(const Field& f, const ModelLimits& ceilings) {
  return f.member == &ModelLimits::default_mem_len ? ceilings.max_mem_len : ceilings.*f.member;
}

}  // namespace

absl::StatusOr<ModelLimits> ParseModelLimits(const std::string& text, const ModelLimits& ceilings) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("must be a JSON object of limits");
  ModelLimits limits;
  for (const auto& [key, value] : j.items()) {
    const Field* f = FindField(key);
    if (f == nullptr) {
      std::vector<std::string> known;
      for (const Field& k : kFields) known.push_back(k.name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field \"", key.substr(0, 64), "\" (known: ", absl::StrJoin(known, ", "), ")"));
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(f->name, " must be a positive integer"));
    }
    const int64_t v = value.get<int64_t>();
    const int64_t ceiling = Ceiling(*f, ceilings);
    if (ceiling > 0 && v > ceiling) {
      return absl::InvalidArgumentError(absl::StrCat(f->name, " ", v, " exceeds the server's ", f->flag, " ", ceiling,
                                                     " (a model may only lower it)"));
    }
    limits.*f->member = v;
  }
  if (limits.default_mem_len > 0 && limits.max_mem_len > 0 && limits.default_mem_len > limits.max_mem_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_mem_len ", limits.default_mem_len, " exceeds max_mem_len ", limits.max_mem_len));
  }
  return limits;
}

absl::StatusOr<ModelLimits> ReadModelLimits(const std::string& model_dir, const ModelLimits& ceilings) {
  const std::string path = (std::filesystem::path(model_dir) / kModelLimitsFileName).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec) return ModelLimits{};
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelLimits> limits = ParseModelLimits(*text, ceilings);
  if (!limits.ok()) return absl::Status(limits.status().code(), absl::StrCat(path, ": ", limits.status().message()));
  return limits;
}

}  // namespace txl

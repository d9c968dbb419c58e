#include "server/engine/model_loader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/net/checkpoint.h"
#include "server/engine/model_engine.h"

namespace txl {

namespace {

// One step of four tokens on a fresh session: what a damaged weight (a NaN,
// an infinity) or a kernel that does not run on this host shows first. Four
// is more than a short feed (docs/MODEL.md, "Mixed steps"), so the step is one
// multi-token pass: on a GPU it captures no decode graph on the loader's thread.
absl::Status WarmUp(Engine& engine, const ModelConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<SessionState> session, engine.NewSession(std::max<int64_t>(1, config.mem_len)));
  const int n = static_cast<int>(config.n_token);
  StepInput in;
  in.session = session.get();
  in.tokens = {0, 1 % n, 2 % n, 3 % n};
  in.targets = {1 % n};
  in.want_last_distribution = true;
  ASSIGN_OR_RETURN(std::vector<StepOutput> out, engine.Step(absl::MakeSpan(&in, 1)));
  if (out.size() != 1 || out[0].target_logprobs.size() != 1 ||
      out[0].last_distribution.size() != static_cast<size_t>(n)) {
    return absl::InternalError("the step gave no distribution");
  }
  if (!std::isfinite(out[0].target_logprobs[0])) {
    return absl::DataLossError(absl::StrCat("the log-prob of a target is ", out[0].target_logprobs[0]));
  }
  double total = 0;
  for (size_t t = 0; t < out[0].last_distribution.size(); ++t) {
    const float lp = out[0].last_distribution[t];
    if (!std::isfinite(lp) && lp != -INFINITY) {
      return absl::DataLossError(absl::StrCat("the log-prob of token ", t, " is ", lp));
    }
    total += std::exp(static_cast<double>(lp));
  }
  if (std::abs(total - 1) > 1e-3) {
    return absl::DataLossError(absl::StrCat("the probabilities sum to ", total, ", not 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedModel>> LoadServedModel(const LanguageModelOptions& options,
                                                             const std::string& name, const RepositoryVersion& v,
                                                             const ModelLimits& ceilings) {
  const std::string what = absl::StrCat(name, " version ", v.version, " (", v.path, ")");
  // DIR/NAME/VERSION/model.pt: the limits are the model's, beside its versions.
  auto limits = ReadModelLimits(std::filesystem::path(v.path).parent_path().parent_path().string(), ceilings);
  if (!limits.ok()) return absl::Status(limits.status().code(), absl::StrCat(what, ": ", limits.status().message()));
  LanguageModelOptions o = options;
  o.path = v.path;
  auto engine = ModelEngine::Create(o);
  if (!engine.ok()) return absl::Status(engine.status().code(), absl::StrCat(what, ": ", engine.status().message()));
  const ModelConfig config = (*engine)->model().config();
  const Tokenizer tokenizer = (*engine)->model().tokenizer();
  if ((*engine)->fingerprint().empty()) return absl::DataLossError(absl::StrCat(what, ": no fingerprint"));
  if (absl::Status warm = WarmUp(**engine, config); !warm.ok()) {
    return absl::Status(warm.code(), absl::StrCat(what, ": warm-up step: ", warm.message()));
  }
  // Checked on a pool of its own; it serves from the one its shape shares.
  (*engine)->JoinSharedPool();
  return std::make_unique<ServedModel>(name, v.version, *std::move(engine), config, tokenizer, v.path, *limits);
}

absl::StatusOr<int64_t> EstimateServedBytes(const LanguageModelOptions& options, const RepositoryVersion& v) {
  ASSIGN_OR_RETURN(const ModelConfig config, ReadCheckpointConfig(v.path));
  struct stat st;
  if (stat(v.path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat(v.path, ": cannot read its size"));
  return LanguageModel::EstimateWeightBytes(config, options, static_cast<int64_t>(st.st_size));
}

VersionLoader ServedModelLoader(LanguageModelOptions options, ModelLimits ceilings) {
  return [options, ceilings](const std::string& name,
                             const RepositoryVersion& v) -> absl::StatusOr<std::shared_ptr<ServedVersion>> {
    ASSIGN_OR_RETURN(std::unique_ptr<ServedModel> served, LoadServedModel(options, name, v, ceilings));
    return std::shared_ptr<ServedVersion>(std::move(served));
  };
}

VersionSizer ServedModelSizer(LanguageModelOptions options) {
  return [options](const RepositoryVersion& v) { return EstimateServedBytes(options, v); };
}

}  // namespace txl

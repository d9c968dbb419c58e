// Metrics per model version (docs/OPERATIONS.md, "Model repository"): steps,
// tokens fed and generated, live sessions, and each version's state. The
// `model` label is NAME@VERSION, which only the repository's directory
// names, so clients cannot grow the label set.
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "server/metrics/metrics.h"

namespace txl {

void Metrics::AddModelFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  model_steps_ =
      &BuildCounter().Name("txl_model_steps_total").Help("Engine steps, by the model version stepped").Register(r);
  model_fed_ = &BuildCounter().Name("txl_model_tokens_fed_total").Help("Tokens fed, by model version").Register(r);
  model_generated_ =
      &BuildCounter().Name("txl_model_tokens_generated_total").Help("Tokens generated, by model version").Register(r);
  model_sessions_ = &BuildGauge()
                         .Name("txl_model_sessions")
                         .Help("Live sessions, by the model version they are bound to")
                         .Register(r);
  model_state_ = &BuildGauge()
                      .Name("txl_model_version_state")
                      .Help("1 for each model version's current state (LOADING, READY, FAILED, RETIRING, UNLOADED)")
                      .Register(r);
}

void Metrics::OnModelStep(const std::string& model, int rows, int64_t tokens) {
  (void)rows;
  model_steps_->Add({{"model", model}}).Increment();
  model_fed_->Add({{"model", model}}).Increment(static_cast<double>(tokens));
}

void Metrics::OnModelTokenGenerated(const std::string& model) { model_generated_->Add({{"model", model}}).Increment(); }

void Metrics::TickModels() {
  static constexpr VersionState kStates[] = {VersionState::kLoading, VersionState::kReady, VersionState::kFailed,
                                             VersionState::kRetiring, VersionState::kUnloaded};
  std::vector<std::string> serving;  // versions that may hold sessions: their gauge shows 0 too
  if (versions_) {
    for (const VersionStatus& v : versions_()) {
      const std::string version = std::to_string(v.version);
      for (VersionState s : kStates) {
        model_state_->Add({{"model", v.model}, {"version", version}, {"state", VersionStateName(s)}})
            .Set(s == v.state ? 1 : 0);
      }
      if (v.state == VersionState::kReady || v.state == VersionState::kRetiring) {
        serving.push_back(v.model + "@" + version);
      }
    }
  }
  if (table_ == nullptr) return;
  const std::map<std::string, int64_t> live = table_->SessionsByModel();
  absl::MutexLock lock(&model_mu_);
  models_seen_.insert(serving.begin(), serving.end());
  for (const auto& [model, n] : live) models_seen_.insert(model);
  for (const std::string& model : models_seen_) {
    auto it = live.find(model);
    model_sessions_->Add({{"model", model}}).Set(it == live.end() ? 0 : static_cast<double>(it->second));
  }
}

}  // namespace txl

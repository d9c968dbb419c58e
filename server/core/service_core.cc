#include "server/core/service_core.h"

#include <memory>
#include <utility>

#include "base/status_macros.h"

namespace txl {

ServiceCore::ServiceCore(ServiceParts parts)
    : config(std::move(parts.config)),
      served(std::move(parts.served)),
      models(SingleModel(served)),
      model(served->config()),
      tokenizer(served->tokenizer()),
      engine(served->engine()),
      table(parts.table),
      scheduler(parts.scheduler),
      metrics(parts.metrics),
      tokens(parts.tokens),
      journal(parts.journal),
      validator(RequestLimits{model.n_token, config.default_mem_len, config.max_mem_len, config.max_new_tokens,
                              config.max_input_tokens, config.max_top_logprobs},
                tokenizer) {}

absl::StatusOr<std::string> ServiceCore::Authenticate(std::optional<absl::string_view> authorization) const {
  if (tokens == nullptr) return std::string();
  return tokens->Authenticate(authorization);
}

absl::StatusOr<std::string> ServiceCore::RequiredSession(const std::string& field, const std::string* header) const {
  ASSIGN_OR_RETURN(std::string id, ResolveSessionId(field, header));
  if (id.empty()) return absl::InvalidArgumentError("session_id: required");
  return id;
}

absl::StatusOr<SessionLease> ServiceCore::Lease(const std::string& principal, const std::string& id) const {
  if (!id.empty()) return table->Acquire(principal, id, absl::Now());
  ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, engine->NewSession(config.default_mem_len));
  ASSIGN_OR_RETURN(SessionLease lease,
                   table->CreateAcquired(principal, served, std::move(state), absl::ZeroDuration(), {}, absl::Now()));
  lease.throwaway = true;
  return lease;
}

void ServiceCore::WithAdoption(const std::string& principal, const std::string& id,
                               std::function<absl::Status()> attempt, std::function<void(absl::Status)> fail) const {
  absl::Status s = attempt();
  if (s.ok()) return;
  if (!absl::IsNotFound(s) || id.empty() || journal == nullptr) {
    fail(s);
    return;
  }
  // Quarantined at start-up: DATA_LOSS once for its owner (then NOT_FOUND).
  if (absl::Status lost = journal->TakeQuarantined(id, principal); !lost.ok()) {
    fail(lost);
    return;
  }
  auto adopted = [attempt, fail](absl::Status status) {
    absl::Status again = status.ok() ? attempt() : status;
    if (!again.ok()) fail(again);
  };
  auto job = scheduler->SubmitAdopt(principal, id, RecordsOf(models.get()), std::move(adopted));
  if (!job.ok()) fail(job.status());
}

std::string ServiceCore::TokenText(int id) const {
  auto t = tokenizer.TokenText(id);
  return t.ok() ? *t : "";
}

}  // namespace txl

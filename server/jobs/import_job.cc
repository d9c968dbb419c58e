#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {

ImportJob::ImportJob(ImportSpec spec, SessionMade done) : MakeSessionJob(std::move(done)), spec_(std::move(spec)) {}

void ImportJob::Run(JobRunner& runner) {
  absl::Status s = Import(runner);
  runner.Finish(*this, s);
}

absl::Status ImportJob::Import(JobRunner& runner) {
  Engine* engine = spec_.model->engine();
  SessionTable* table = runner.table();
  // The bytes' own consistency is the engine's to check (RestoreSession);
  // these are the facts only the image and this server's limits tell.
  ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, engine->RestoreSession(spec_.image.state));
  if (state->mem_len() > spec_.max_mem_len) {
    return absl::InvalidArgumentError(absl::StrCat("import: the session's mem_len ", state->mem_len(),
                                                   " is more than this server allows (max_mem_len=", spec_.max_mem_len,
                                                   ")"));
  }
  if (state->position() + static_cast<int64_t>(spec_.image.pending.size()) != spec_.image.position) {
    return absl::InvalidArgumentError("session export: the position does not match the state");
  }
  for (int t : spec_.image.pending) {
    if (t < 0 || t >= engine->vocab_size())
      return absl::InvalidArgumentError("session export: a pending token is outside the vocabulary");
  }
  const bool durable = runner.journal() != nullptr;
  ASSIGN_OR_RETURN(SessionLease made, table->CreateAcquired(spec_.owner, spec_.model, std::move(state), spec_.idle_ttl,
                                                            spec_.labels, absl::Now(), spec_.id, durable));
  made.pending = spec_.image.pending;
  // Nothing before the image is known: the image itself is where rewinds can start.
  made.history = TokenHistory(made.state->position(), made.pending);
  runner.Checkpoint(made);
  const std::string id = made.id;
  if (durable) {
    ASSIGN_OR_RETURN(SessionInfo info, table->Get(spec_.owner, id));
    Record(runner, info, std::move(made), EncodeSessionExport(spec_.image));
    return absl::OkStatus();
  }
  table->Release(std::move(made), absl::Now());
  ASSIGN_OR_RETURN(SessionInfo info, table->Get(spec_.owner, id));
  Made(std::move(info));
  return absl::OkStatus();
}

}  // namespace txl

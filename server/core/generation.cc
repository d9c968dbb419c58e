// ServiceCore's jobs that feed tokens (service_core.h): Generate and Score.
// Each takes its session (adopting it when needed), queues the job, and hands
// the transport its tokens and its end.
#include <memory>
#include <utility>

#include "base/status_macros.h"
#include "server/core/service_core.h"

namespace txl {

void ServiceCore::Generate(const std::string& principal, GenerateArgs args, bool adopt,
                           std::shared_ptr<JobControl> control, GenerateCallbacks callbacks) const {
  auto cb = std::make_shared<GenerateCallbacks>(std::move(callbacks));
  WithAdoption(
      principal, adopt ? args.session_id : "",
      [this, principal, session = args.session_id, spec = std::move(args.spec), model = std::move(args.model), control,
       cb]() -> absl::Status {
        ASSIGN_OR_RETURN(SessionLease lease, Lease(principal, session, model));
        if (absl::Status s = RequestValidator::Continuation(spec, lease.position()); !s.ok()) {
          table->GiveBack(std::move(lease), absl::Now());
          return s;
        }
        GenerateCallbacks job_cb;
        job_cb.on_tokens = cb->on_tokens;
        job_cb.on_done = [control, on_done = cb->on_done](absl::Status status, GenerateResult result) {
          control->Detach();
          on_done(std::move(status), std::move(result));
        };
        ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                         scheduler->SubmitGenerate(std::move(lease), spec, std::move(job_cb)));
        control->Attach(std::move(job));
        return absl::OkStatus();
      },
      [cb](absl::Status s) { cb->on_done(std::move(s), GenerateResult()); });
}

void ServiceCore::Score(const std::string& principal, ScoreArgs args, bool commit, std::shared_ptr<JobControl> control,
                        ScoreDone done) const {
  WithAdoption(
      principal, args.session_id,
      [this, principal, session = args.session_id, input = std::move(args.input), model = std::move(args.model), commit,
       control, done]() -> absl::Status {
        ASSIGN_OR_RETURN(SessionLease lease, Lease(principal, session, model));
        auto scored = [control, done](absl::Status status, ScoreResult result) {
          control->Detach();
          done(std::move(status), std::move(result));
        };
        ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                         scheduler->SubmitScore(std::move(lease), input, commit, std::move(scored)));
        control->Attach(std::move(job));
        return absl::OkStatus();
      },
      [done](absl::Status s) { done(std::move(s), ScoreResult()); });
}

}  // namespace txl

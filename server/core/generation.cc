// ServiceCore's jobs that feed tokens (service_core.h): Generate and Score.
// Each takes its session (adopting it when needed), queues the job, and hands
// the transport its tokens and its end.
#include <memory>
#include <utility>

#include "base/status_macros.h"
#include "server/core/choices.h"
#include "server/core/service_core.h"

namespace txl {

namespace {

// Choice i's seed: seed + i, skipping 0 (a fresh random seed) when it wraps.
uint64_t ChoiceSeed(uint64_t seed, int i) {
  const uint64_t s = seed + static_cast<uint64_t>(i);
  return s < seed ? s + 1 : s;
}

}  // namespace

void ServiceCore::Generate(const std::string& principal, GenerateArgs args, bool adopt,
                           std::shared_ptr<JobControl> control, GenerateCallbacks callbacks) const {
  if (args.best_of > 1) {
    GenerateChoices(principal, std::move(args), std::move(control), std::move(callbacks));
    return;
  }
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

void ServiceCore::GenerateChoices(const std::string& principal, GenerateArgs args, std::shared_ptr<JobControl> control,
                                  GenerateCallbacks callbacks) const {
  const int count = args.best_of;
  args.spec.call_start = absl::Now();  // each choice's time to its first token counts from here
  auto set = std::make_shared<ChoiceSet>(args.n, count, std::move(callbacks), [control] { control->Cancel(); });
  auto refuse = [&](absl::Status s) { set->Fail(std::move(s)); };
  if (!args.session_id.empty()) {  // request validation refuses it; a Converse turn's own session too
    return refuse(absl::InvalidArgumentError("n: several choices need a request without a session"));
  }
  if (absl::Status s = RequestValidator::Continuation(args.spec, 0); !s.ok()) return refuse(s);
  auto lease = Lease(principal, "", args.model);
  if (!lease.ok()) return refuse(lease.status());
  // Once the prompt is fed, each candidate is a generation on its own copy
  // of the session, with its own seed stream, from the prompt's last token.
  auto branched = [this, set, control, spec = args.spec, count](absl::StatusOr<Branches> b) {
    control->Detach();
    if (!b.ok()) return set->Fail(b.status());
    set->Branched(b->input_tokens, b->times);
    for (int i = 0; i < count; ++i) {
      GenerateSpec choice = spec;
      choice.input.clear();  // the pending token
      if (spec.sampling.seed != 0) choice.sampling.seed = ChoiceSeed(spec.sampling.seed, i);
      std::shared_ptr<JobControl> child = control->AddChild();
      GenerateCallbacks cb = set->For(i);
      cb.on_done = [child, done = std::move(cb.on_done)](absl::Status status, GenerateResult result) {
        child->Detach();
        done(std::move(status), std::move(result));
      };
      // Part of a call already admitted: neither a drain nor a full queue refuses it.
      child->Attach(scheduler->SubmitChoice(std::move(b->leases[static_cast<size_t>(i)]), std::move(choice), cb));
    }
  };
  auto job = scheduler->SubmitBranch(*std::move(lease), args.spec.input, count - 1, std::move(branched));
  if (!job.ok()) return refuse(job.status());
  control->Attach(*std::move(job));
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

// Score: one job, with a reactor of its own so that a cancel stops it.
#include <atomic>
#include <chrono>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "server/api/call_context.h"
#include "server/api/service.h"
#include "server/sampling/text_stream.h"

namespace txl {

// Score: one job. Unlike the other unary calls it has a reactor of its
// own, so that a cancel, a deadline or a disconnect stops the job at the
// next step (it keeps the prefix fed so far, like a cancelled Generate).
// Lifetime: one reference for gRPC (dropped in OnDone), one for the job.
class ScoreCall final : public grpc::ServerUnaryReactor {
 public:
  ScoreCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
            v1::ScoreResponse* r)
      : c_(c), ctx_(ctx), r_(r) {
    Ref();  // the job may end before Start returns
    if (absl::Status s = Start(*req); !s.ok()) End(s);
    Unref();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (job_) c_->scheduler->Cancel(job_);
  }
  void OnDone() override { Unref(); }

 private:
  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  absl::Status Start(const v1::ScoreRequest& req) {
    ASSIGN_OR_RETURN(std::string principal, c_->Principal(ctx_));
    ASSIGN_OR_RETURN(ScoreArgs args, c_->ValidScore(ctx_, req));
    c_->WithAdoption(
        principal, args.session_id,
        [this, principal, session = args.session_id, input = args.input, commit = req.commit()]() -> absl::Status {
          bool throwaway = false;
          ASSIGN_OR_RETURN(SessionLease lease, c_->Lease(principal, session, &throwaway));
          Ref();  // for the job
          JobCallbacks cb;
          cb.on_done = [this](absl::Status s, JobResult result) {
            {
              absl::MutexLock lock(&mu_);
              job_.reset();
            }
            if (s.ok()) Fill(result);
            End(s);
            Unref();
          };
          auto job = c_->scheduler->SubmitScore(std::move(lease), throwaway, input, commit, std::move(cb));
          if (!job.ok()) {
            Unref();
            return job.status();
          }
          absl::MutexLock lock(&mu_);
          job_ = *std::move(job);
          if (cancelled_) c_->scheduler->Cancel(job_);  // cancelled before the job was known
          return absl::OkStatus();
        },
        [this](absl::Status s) { End(s); });
    return absl::OkStatus();
  }

  void Fill(const JobResult& result) {
    double total = 0;
    for (const ScoredTokenResult& t : result.scores) {
      v1::ScoredToken* out = r_->add_tokens();
      out->set_id(t.id);
      std::string text = c_->TokenText(t.id);
      if (IsValidUtf8(text)) out->set_text(std::move(text));
      out->set_has_logprob(t.has_logprob);
      if (t.has_logprob) {
        out->set_logprob(t.logprob);
        total += t.logprob;
      }
    }
    r_->set_total_logprob(total);
    r_->set_position(result.position);
  }

  // A call the client abandoned counts as what ended it: its deadline or its cancel.
  void End(const absl::Status& s) {
    grpc::Status g = ToGrpcStatus(s);
    bool cancelled = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    if (cancelled) {
      const bool expired = ctx_->deadline() <= std::chrono::system_clock::now();
      g = expired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline expired")
                  : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
    c_->Count("Score", g);
    Finish(g);
  }

  const ServiceContext* c_;
  grpc::CallbackServerContext* ctx_;
  v1::ScoreResponse* r_;
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerUnaryReactor* TxlService::Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
                                            v1::ScoreResponse* r) {
  return new ScoreCall(ctx_.get(), ctx, req, r);
}

}  // namespace txl

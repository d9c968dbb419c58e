// Score: one job, with a reactor of its own so that a cancel stops it.
#include <atomic>
#include <chrono>
#include <memory>

#include "base/status_macros.h"
#include "server/grpc/call_context.h"
#include "server/grpc/service.h"

namespace txl {

// Score: one job. Unlike the other unary calls it has a reactor of its
// own, so that a cancel, a deadline or a disconnect stops the job at the
// next step (it keeps the prefix fed so far, like a cancelled Generate).
// Lifetime: one reference for gRPC (dropped in OnDone), one for the job.
class ScoreCall final : public grpc::ServerUnaryReactor {
 public:
  ScoreCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
            v1::ScoreResponse* r)
      : c_(c), ctx_(ctx), r_(r), control_(c->NewJobControl()) {
    Ref();  // the job may end before Start returns
    if (absl::Status s = Start(*req); !s.ok()) End(s);
    Unref();
  }
  void OnCancel() override { control_->Cancel(); }
  void OnDone() override { Unref(); }

 private:
  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  absl::Status Start(const v1::ScoreRequest& req) {
    ASSIGN_OR_RETURN(std::string principal, c_->Principal(ctx_));
    ASSIGN_OR_RETURN(ScoreArgs args, c_->ValidScore(ctx_, principal, req));
    Ref();  // for the job
    std::shared_ptr<ServedModel> model = args.model;
    c_->Score(principal, std::move(args), req.commit(), control_, [this, model](absl::Status s, ScoreResult result) {
      if (s.ok()) FillScore(result, model->tokenizer(), r_);
      End(s);
      Unref();
    });
    return absl::OkStatus();
  }

  // A call the client abandoned counts as what ended it: its deadline or its cancel.
  void End(const absl::Status& s) {
    grpc::Status g = ToGrpcStatus(s);
    if (control_->cancelled()) g = AbandonedCallStatus(ctx_->deadline(), std::chrono::system_clock::now());
    c_->Count("Score", g);
    Finish(g);
  }

  const ServiceContext* c_;
  grpc::CallbackServerContext* ctx_;
  v1::ScoreResponse* r_;
  const std::shared_ptr<JobControl> control_;
  std::atomic<int> refs_{1};
};

grpc::ServerUnaryReactor* TxlService::Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
                                            v1::ScoreResponse* r) {
  return new ScoreCall(ctx_.get(), ctx, req, r);
}

}  // namespace txl

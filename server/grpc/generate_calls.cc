// The streaming calls: Generate (one generation) and Converse (turns on one
// stream). Both write through StreamingCall.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/grpc/service.h"
#include "server/grpc/streaming_call.h"

namespace txl {
// Generate: one job, then the final response, then Finish.
class GenerateCall final : public StreamingCall<grpc::ServerWriteReactor<v1::GenerateResponse>> {
 public:
  GenerateCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req)
      : StreamingCall(c, ctx, "Generate") {
    Ref();  // the job may end (and drop its reference) before we return
    absl::Status s = Start(ctx, *req);
    if (!s.ok()) End(ToGrpcStatus(s));
    Unref();
  }
  void OnWriteDone(bool ok) override { WriteDone(ok); }
  void OnCancel() override { Cancelled(); }
  void OnDone() override { Unref(); }

 private:
  absl::Status Start(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& req) {
    ASSIGN_OR_RETURN(std::string principal, c_->Principal(ctx));
    ASSIGN_OR_RETURN(GenerateArgs args, c_->ValidGenerate(ctx, principal, req));
    auto model = args.model;
    Generate(principal, std::move(args), /*adopt=*/true, [this, model](absl::Status status, GenerateResult result) {
      if (status.ok()) {
        for (v1::GenerateResponse& r : FinalResponses(result, model->tokenizer())) Send(std::move(r));
      }
      End(ToGrpcStatus(status));
    });
    return absl::OkStatus();
  }
};

// Converse: turns read one at a time; each runs like a Generate. A turn with
// no session id uses a session that lives as long as the stream.
class ConverseCall final : public StreamingCall<grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>> {
 public:
  ConverseCall(const ServiceContext* c, grpc::CallbackServerContext* ctx) : StreamingCall(c, ctx, "Converse") {
    // Once per stream: every turn runs as this principal.
    auto principal = c_->Principal(ctx);
    if (!principal.ok()) {
      End(ToGrpcStatus(principal.status()));
      return;
    }
    principal_ = *std::move(principal);
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the client has no more turns
      End(grpc::Status::OK);
      return;
    }
    absl::Status s = Turn();
    if (!s.ok()) End(ToGrpcStatus(s));
  }
  void OnWriteDone(bool ok) override { WriteDone(ok); }
  void OnCancel() override { Cancelled(); }
  void OnDone() override {
    if (!stream_session_.empty()) c_->DropStreamSession(principal_, stream_session_);
    Unref();
  }

 private:
  absl::Status Turn() {
    if (request_.n() > 1 || request_.best_of() > 1) {  // before the stream's session is named in it
      return absl::InvalidArgumentError(absl::StrCat(request_.n() > 1 ? "n" : "best_of",
                                                     ": a Converse turn continues the stream's session; ask for "
                                                     "several choices with Generate"));
    }
    // A turn naming no session continues the stream's own, on its version.
    if (request_.session_id().empty() && !stream_session_.empty() && !ServiceContext::MetadataSessionId(ctx_)) {
      request_.set_session_id(stream_session_);
    }
    ASSIGN_OR_RETURN(GenerateArgs args, c_->ValidGenerate(ctx_, principal_, request_));
    std::string session = args.session_id;
    if (session.empty()) {
      ASSIGN_OR_RETURN(stream_session_, c_->NewStreamSession(principal_, args.model));
      session = stream_session_;
    }
    const bool own = session == stream_session_;  // the stream's own session is never adopted
    args.session_id = session;
    auto model = args.model;
    Generate(principal_, std::move(args), /*adopt=*/!own, [this, model](absl::Status status, GenerateResult result) {
      if (status.ok()) {
        Send(FinalResponse(result, model->tokenizer()));
        StartRead(&request_);  // the next turn
      } else {
        End(ToGrpcStatus(status));
      }
    });
    return absl::OkStatus();
  }

  std::string principal_;  // set before the first read, then only read
  v1::GenerateRequest request_;
  std::string stream_session_;  // touched by one turn at a time
};

grpc::ServerWriteReactor<v1::GenerateResponse>* TxlService::Generate(grpc::CallbackServerContext* ctx,
                                                                     const v1::GenerateRequest* req) {
  return new GenerateCall(ctx_.get(), ctx, req);
}

grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>* TxlService::Converse(
    grpc::CallbackServerContext* ctx) {
  return new ConverseCall(ctx_.get(), ctx);
}

}  // namespace txl

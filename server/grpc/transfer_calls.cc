// Moving sessions between servers: ExportSession streams a session's image
// out in chunks; ImportSession reads one in and makes a session of it.
#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/grpc/call_context.h"
#include "server/grpc/service.h"

namespace txl {

// ExportSession: one export job on the engine thread, then its bytes in
// chunks, one write at a time. Deletes itself in OnDone.
class ExportCall final : public grpc::ServerWriteReactor<v1::SessionChunk> {
 public:
  ExportCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const v1::ExportSessionRequest& req)
      : c_(c), ctx_(ctx) {
    absl::Status s = Start(ctx, req);
    if (!s.ok()) End(ToGrpcStatus(s));
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client gave up: its deadline, a cancel or a disconnect
      End(AbandonedCallStatus(ctx_->deadline(), std::chrono::system_clock::now()));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  static constexpr size_t kChunkBytes = 1 << 20;

  absl::Status Start(grpc::CallbackServerContext* ctx, const v1::ExportSessionRequest& req) {
    ASSIGN_OR_RETURN(CallTarget t, c_->NamedSession(ctx, req.session_id()));
    // Runs on the engine thread, after this constructor has returned (or at once on a refusal).
    c_->ExportSession(t.principal, t.session_id, [this](absl::StatusOr<std::string> exported) {
      if (!exported.ok()) {
        End(ToGrpcStatus(exported.status()));
        return;
      }
      data_ = *std::move(exported);
      Next();
    });
    return absl::OkStatus();
  }
  void Next() {
    if (offset_ >= data_.size()) {
      End(grpc::Status::OK);
      return;
    }
    const size_t n = std::min(kChunkBytes, data_.size() - offset_);
    chunk_.set_data(data_.substr(offset_, n));
    offset_ += n;
    StartWrite(&chunk_);
  }
  void End(const grpc::Status& g) {
    c_->Count("ExportSession", g);
    Finish(g);
  }

  const ServiceContext* c_;
  grpc::CallbackServerContext* ctx_;
  std::string data_;  // set once, on the engine thread, before the first write
  size_t offset_ = 0;
  v1::SessionChunk chunk_;
};

// ImportSession: reads every chunk (bounded), checks the bytes, then one
// import job on the engine thread. Deletes itself in OnDone.
class ImportCall final : public grpc::ServerReadReactor<v1::ImportSessionRequest> {
 public:
  ImportCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, v1::Session* response)
      : c_(c), ctx_(ctx), response_(response) {
    auto principal = c_->Principal(ctx);
    if (!principal.ok()) {
      End(ToGrpcStatus(principal.status()));
      return;
    }
    principal_ = *std::move(principal);
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (ok) {
      if (first_) {
        settings_ = request_;
        settings_.clear_data();
        first_ = false;
      }
      data_ += request_.data();
      if (static_cast<int64_t>(data_.size()) > c_->config.max_import_bytes) {
        End(ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat("import: more than ", c_->config.max_import_bytes,
                                                                   " bytes (a session of max_mem_len at most)"))));
        return;
      }
      StartRead(&request_);
      return;
    }
    absl::Status s = Submit();
    if (!s.ok()) End(ToGrpcStatus(s));
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Submit() {
    if (first_) return absl::InvalidArgumentError("import: no data");
    v1::CreateSessionRequest as_create;  // the same rules for the id and the ttl
    as_create.set_session_id(settings_.session_id());
    as_create.set_idle_ttl_seconds(settings_.idle_ttl_seconds());
    const std::optional<std::string> md = ServiceContext::MetadataSessionId(ctx_);
    ASSIGN_OR_RETURN(NewSessionArgs args, c_->CheckImport(as_create, md ? &*md : nullptr));
    c_->ImportSession(principal_, std::move(args), {settings_.labels().begin(), settings_.labels().end()}, data_,
                      [this](absl::StatusOr<SessionInfo> made) {
                        if (made.ok()) FillSession(*made, response_);
                        End(ToGrpcStatus(made.status()));
                      });
    return absl::OkStatus();
  }
  void End(const grpc::Status& g) {
    c_->Count("ImportSession", g);
    Finish(g);
  }

  const ServiceContext* c_;
  grpc::CallbackServerContext* ctx_;
  v1::Session* response_;
  std::string principal_;
  v1::ImportSessionRequest request_, settings_;
  bool first_ = true;
  std::string data_;
};

grpc::ServerWriteReactor<v1::SessionChunk>* TxlService::ExportSession(grpc::CallbackServerContext* ctx,
                                                                      const v1::ExportSessionRequest* req) {
  return new ExportCall(ctx_.get(), ctx, *req);
}

grpc::ServerReadReactor<v1::ImportSessionRequest>* TxlService::ImportSession(grpc::CallbackServerContext* ctx,
                                                                             v1::Session* resp) {
  return new ImportCall(ctx_.get(), ctx, resp);
}

}  // namespace txl

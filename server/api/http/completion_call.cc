#include "server/api/http/completion_call.h"

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace txl {
namespace {

std::string NewCompletionId() {
  absl::BitGen gen;  // one per call: a shared one would need a lock
  return absl::StrFormat("cmpl-%016x%08x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint32_t>(gen));
}

// One /v1/completions call: a Generate stream on the in-process channel.
// Streaming, each GenerateResponse becomes one server-sent event, and the
// next is read only once that event is on the wire (flow control reaches the
// service's own buffer, which pauses the job: docs/ROBUSTNESS.md). A client
// that leaves cancels the call.
class CompletionCall final : public grpc::ClientReadReactor<v1::GenerateResponse>,
                             public std::enable_shared_from_this<CompletionCall> {
 public:
  // `chat`: the chat shapes; `on_success` runs with the whole result once
  // the call has succeeded (before the client is answered).
  CompletionCall(const GatewayContext* s, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
                 std::function<void(const CompletionResult&)> on_success = nullptr)
      : s_(s), x_(std::move(x)), p_(std::move(p)), chat_(chat), on_success_(std::move(on_success)) {
    route_ = chat ? "/v1/chat/completions" : "/v1/completions";
    id_.id = (chat ? "chat" : "") + NewCompletionId();
    id_.created = absl::ToUnixSeconds(absl::Now());
    id_.model = s_->config.model_name;
    result_.stateful = !p_.request.session_id().empty();
  }

  void Start() {
    self_ = shared_from_this();  // released in OnDone
    s_->active->fetch_add(1);
    CopyAuth(x_->request(), &ctx_);
    std::weak_ptr<CompletionCall> weak = self_;
    x_->OnClientGone([weak] {
      if (auto self = weak.lock()) self->ClientGone();
    });
    s_->stub->async()->Generate(&ctx_, &p_.request, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (!p_.stream) {
      result_.Add(response_);
      StartRead(&response_);
      return;
    }
    result_.Add(response_);  // for the usage event and the error path
    if (!started_) {
      started_ = true;
      s_->Count(route_, 200);
      x_->StartStream(200, "text/event-stream");
    }
    std::string event =
        chat_ ? ChatChunk(id_, response_, p_.logprobs, offset_ == 0 && !role_sent_, p_.request.session_id())
              : CompletionChunk(id_, response_, p_.logprobs, offset_, p_.request.session_id());
    role_sent_ = true;
    offset_ += static_cast<int64_t>(response_.text().size());
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return;  // the cancel is under way; OnDone follows
      waiting_ = true;
    }
    AddHold();  // OnDone waits until the read is restarted (or the client is gone)
    std::weak_ptr<CompletionCall> weak = self_;
    x_->Send(std::move(event), [weak] {
      if (auto self = weak.lock()) self->Written();
    });
  }

  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) {
      const HttpError e = FromGrpc(status);
      if (!started_) {
        s_->Answer(*x_, route_, e.status, ErrorBody(e));
      } else {  // mid-stream: an error event, as OpenAI sends one
        x_->Send(absl::StrCat("data: ", ErrorBody(e), "\n\n"), nullptr);
        x_->EndStream();
      }
    } else if (!p_.stream) {
      if (on_success_) on_success_(result_);
      s_->Answer(*x_, route_, 200,
                 chat_ ? ChatBody(id_, result_, p_.logprobs) : CompletionBody(id_, result_, p_.logprobs));
    } else {
      if (!started_) {  // nothing was generated, not even a final response (cannot happen on success)
        s_->Count(route_, 200);
        x_->StartStream(200, "text/event-stream");
      }
      if (on_success_) on_success_(result_);
      if (p_.include_usage) {
        x_->Send(chat_ ? ChatUsageChunk(id_, result_.usage, result_.position, result_.session_id)
                       : UsageChunk(id_, result_.usage, result_.position, result_.session_id),
                 nullptr);
      }
      x_->Send("data: [DONE]\n\n", nullptr);
      x_->EndStream();
    }
    s_->active->fetch_sub(1);
    self_.reset();  // may delete this: nothing after
  }

 private:
  void Written() {
    {
      absl::MutexLock lock(&mu_);
      if (!waiting_) return;
      waiting_ = false;
    }
    StartRead(&response_);
    RemoveHold();
  }
  void ClientGone() {
    ctx_.TryCancel();
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
      release = waiting_;
      waiting_ = false;
    }
    if (release) RemoveHold();
  }

  const GatewayContext* s_;
  std::shared_ptr<HttpExchange> x_;
  CompletionParams p_;
  const bool chat_;
  std::function<void(const CompletionResult&)> on_success_;
  std::string route_;
  bool role_sent_ = false;
  CompletionId id_;
  grpc::ClientContext ctx_;
  v1::GenerateResponse response_;
  CompletionResult result_;  // gRPC's callbacks for one call never overlap
  bool started_ = false;
  int64_t offset_ = 0;
  std::shared_ptr<CompletionCall> self_;
  absl::Mutex mu_;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // a hold is taken until the event is written
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void StartCompletion(const GatewayContext* c, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
                     std::function<void(const CompletionResult&)> on_success) {
  std::make_shared<CompletionCall>(c, std::move(x), std::move(p), chat, std::move(on_success))->Start();
}

}  // namespace txl

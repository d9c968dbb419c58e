#include "server/http/completion_call.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/core/responses.h"

namespace txl {
namespace {

std::string NewCompletionId() {
  absl::BitGen gen;  // one per call: a shared one would need a lock
  return absl::StrFormat("cmpl-%016x%08x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint32_t>(gen));
}

// One /v1/completions call: a generation on the service core. Streaming,
// each batch of tokens the engine thread produces becomes one server-sent
// event, formatted on the connection's thread; past max_stream_buffer_bytes not yet on the wire the job is
// paused until the client has taken half of it (the same flow control as a
// gRPC stream: docs/ROBUSTNESS.md, "Slow readers"). A client that leaves
// cancels the job.
//
// Threading: the token and end callbacks come from the engine thread (the
// end at once, on the calling thread, when the core refuses the request
// before it is queued) and only hand their events to the exchange's thread
// (HttpExchange::Run), where Response and Done run, one at a time, in order:
// they alone touch the result and the stream's progress. `written` and the
// client-gone hook run on transport threads and touch only what mu_ guards.
class CompletionCall final : public std::enable_shared_from_this<CompletionCall> {
 public:
  // `chat`: the chat shapes; `on_success` runs with the whole result once
  // the call has succeeded (before the client is answered).
  CompletionCall(const GatewayContext* s, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
                 std::function<void(const CompletionResult&)> on_success = nullptr)
      : s_(s),
        x_(std::move(x)),
        p_(std::move(p)),
        chat_(chat),
        on_success_(std::move(on_success)),
        control_(s->core->NewJobControl()) {
    route_ = chat ? "/v1/chat/completions" : "/v1/completions";
    id_.id = (chat ? "chat" : "") + NewCompletionId();
    id_.created = absl::ToUnixSeconds(absl::Now());
    result_.stateful = !p_.request.session_id().empty();
  }

  void Start() {
    auto principal = s_->Principal(x_->request());
    if (!principal.ok()) return s_->Fail(*x_, route_, principal.status());
    // ParseCompletion took the session id from the body, else the txl-session-id header.
    auto args = s_->core->CheckGenerate(*principal, p_.request, nullptr);
    if (!args.ok()) return s_->Fail(*x_, route_, args.status(), p_.fields);
    id_.model = args->model->name();
    const std::shared_ptr<ServedModel> model = args->model;
    s_->active->fetch_add(1);
    std::shared_ptr<CompletionCall> self = shared_from_this();
    std::weak_ptr<CompletionCall> weak = self;
    x_->OnClientGone([weak] {
      if (auto call = weak.lock()) call->ClientGone();
    });
    GenerateCallbacks cb;
    // The end keeps the call alive until the job is done (the runner moves it
    // out of the job then). The tokens hold it weakly: a job the runner has
    // finished keeps its on_tokens, and this call's JobControl may keep the
    // job (JobControl::Attach after the end), which would be a cycle.
    cb.on_tokens = [weak, model](std::vector<GeneratedTokenEvent> events, int64_t position) {
      auto call = weak.lock();
      if (call == nullptr) return;
      call->x_->Run([weak, model, events = std::move(events), position] {
        if (auto call = weak.lock()) call->Response(TokensResponse(events, position, model->tokenizer()));
      });
    };
    cb.on_choice_end = [weak](ChoiceEnd end) {  // after its tokens: the same queue
      auto call = weak.lock();
      if (call == nullptr) return;
      call->x_->Run([weak, end = std::move(end)] {
        if (auto call = weak.lock()) call->Response(ChoiceEndResponse(end));
      });
    };
    cb.on_done = [self, model](absl::Status status, GenerateResult result) {
      self->x_->Run([self, model, status = std::move(status), result = std::move(result)] {
        self->Done(status, result, model->tokenizer());
      });
    };
    s_->core->Generate(*principal, *std::move(args), /*adopt=*/true, control_, std::move(cb));
  }

 private:
  // One GenerateResponse: gathered, and streaming, sent as an event.
  void Response(const v1::GenerateResponse& response) {
    result_.Add(response);  // for the whole body, the usage event and the error path
    const size_t index = static_cast<size_t>(std::max(0, response.index()));
    std::string echo_text;  // the prompt, before the first token (or alone)
    if (response.echo_size() > 0) {
      echo_text = EchoText({response.echo().begin(), response.echo().end()});
      result_.choices[index].echo_text = echo_text;
    }
    if (!p_.stream) return;
    if (offsets_.size() <= index) offsets_.resize(index + 1, -1);
    if (!started_) {
      started_ = true;
      s_->Count(route_, 200);
      x_->StartStream(200, "text/event-stream");
    }
    int64_t& offset = offsets_[index];  // -1: nothing of this choice sent yet (chat: its role goes first)
    const bool first = offset < 0;
    if (first) offset = 0;
    std::string event = chat_ ? ChatChunk(id_, response, p_.logprobs, first, p_.request.session_id())
                              : CompletionChunk(id_, response, p_.logprobs, offset, p_.request.session_id(), echo_text);
    offset += static_cast<int64_t>(echo_text.size() + response.text().size());
    const int64_t bytes = static_cast<int64_t>(event.size());
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return;
      buffered_ += bytes;
      if (buffered_ > s_->core->config.max_stream_buffer_bytes && !paused_) {
        paused_ = true;
        control_->Pause();
      }
    }
    std::weak_ptr<CompletionCall> weak = shared_from_this();
    x_->Send(std::move(event), [weak, bytes] {
      if (auto call = weak.lock()) call->Written(bytes);
    });
  }

  void Done(absl::Status status, const GenerateResult& result, const Tokenizer& tokenizer) {
    if (status.ok()) {
      for (const v1::GenerateResponse& r : FinalResponses(result, tokenizer)) Response(r);
    }
    {
      absl::MutexLock lock(&mu_);
      // A client that left ended the call, whatever the job made of it.
      if (gone_) status = absl::CancelledError("cancelled by the client");
    }
    if (!status.ok()) {
      const HttpError e = FromStatus(status, p_.fields);
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
  }

  void Written(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    buffered_ -= bytes;
    if (paused_ && buffered_ <= s_->core->config.max_stream_buffer_bytes / 2) {
      paused_ = false;
      control_->Resume();
    }
  }
  void ClientGone() {
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
    }
    control_->Cancel();
  }

  const GatewayContext* s_;
  std::shared_ptr<HttpExchange> x_;
  CompletionParams p_;
  const bool chat_;
  std::function<void(const CompletionResult&)> on_success_;
  const std::shared_ptr<JobControl> control_;
  std::string route_;
  CompletionId id_;
  // The exchange thread's (see the class comment).
  CompletionResult result_;
  bool started_ = false;
  std::vector<int64_t> offsets_;  // by choice: text bytes sent (-1: none yet)
  absl::Mutex mu_;
  int64_t buffered_ ABSL_GUARDED_BY(mu_) = 0;  // event bytes sent and not yet on the wire
  bool paused_ ABSL_GUARDED_BY(mu_) = false;   // the job is paused for this client
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void StartCompletion(const GatewayContext* c, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
                     std::function<void(const CompletionResult&)> on_success) {
  std::make_shared<CompletionCall>(c, std::move(x), std::move(p), chat, std::move(on_success))->Start();
}

}  // namespace txl

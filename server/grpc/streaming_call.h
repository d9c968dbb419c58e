// StreamingCall: the part Generate and Converse share. It writes the
// GenerateResponses a job produces on the engine thread, one at a time, and
// finishes the call once the job is done and every response is out; past
// max_stream_buffer_bytes unsent it pauses the job (flow control).
#ifndef TXL_SERVER_GRPC_STREAMING_CALL_H_
#define TXL_SERVER_GRPC_STREAMING_CALL_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "server/core/responses.h"
#include "server/grpc/call_context.h"
#include "server/jobs/job.h"

namespace txl {

// Writes GenerateResponses produced on the engine thread, one at a time, and
// finishes the call once the job is done and every response is out.
// Lifetime: one reference for gRPC (dropped in OnDone) and one per job in
// flight (dropped at the end of its on_done); the last one deletes.
template <typename Base>
class StreamingCall : public Base {
 protected:
  StreamingCall(const ServiceContext* c, grpc::CallbackServerContext* ctx, const char* method)
      : c_(c), ctx_(ctx), method_(method), control_(c->NewJobControl()) {}

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // Queues a response; the caller holds no lock.
  // Past max_stream_buffer_bytes unsent, the job is paused until the
  // client has taken half of it (docs/ROBUSTNESS.md, "Slow readers").
  void Send(v1::GenerateResponse response) {
    Step a;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;  // nobody to send it to
      // Its size in memory (with 20 alternatives a token, several times its wire size).
      const int64_t bytes = static_cast<int64_t>(response.SpaceUsedLong());
      buffered_ += bytes;
      queue_.push_back({std::move(response), bytes});
      if (buffered_ > c_->config.max_stream_buffer_bytes && !paused_) {
        paused_ = true;
        control_->Pause();
      }
      a = Pump();
    }
    Run(a);
  }
  // Finishes once the queue is empty.
  // The first End decides the status.
  void End(grpc::Status status) {
    Step a;
    {
      absl::MutexLock lock(&mu_);
      if (!ending_) status_ = std::move(status);
      ending_ = true;
      a = Pump();
    }
    Run(a);
  }
  void WriteDone(bool ok) {
    Step a;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      buffered_ -= current_bytes_;
      if (!ok) {
        cancelled_ = true;
        queue_.clear();  // the client is gone
        buffered_ = 0;
        control_->Cancel();
      }
      if (paused_ && buffered_ <= c_->config.max_stream_buffer_bytes / 2) {
        paused_ = false;
        control_->Resume();
      }
      a = Pump();
    }
    Run(a);
  }
  void Cancelled() {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    control_->Cancel();
  }

  // Hands one generation to the service core: its tokens become responses,
  // and `after` runs when it ends (on the engine thread, or at once when the
  // core refused it).
  void Generate(const std::string& principal, GenerateArgs args, bool adopt,
                std::function<void(absl::Status, GenerateResult)> after) {
    Ref();  // for the job
    GenerateCallbacks cb;
    cb.on_tokens = [this, model = args.model](std::vector<GeneratedTokenEvent> events, int64_t position) {
      Send(TokensResponse(events, position, model->tokenizer()));
    };
    cb.on_choice_end = [this](ChoiceEnd end) { Send(ChoiceEndResponse(end)); };
    cb.on_done = [this, after = std::move(after)](absl::Status status, GenerateResult result) {
      // A client that stopped reading cannot take even the status: the
      // write in flight would never complete, so the call is cancelled.
      if (IsStalled(status)) {
        Abandon();
        ctx_->TryCancel();
      }
      after(std::move(status), std::move(result));
      Unref();
    };
    c_->Generate(principal, std::move(args), adopt, control_, std::move(cb));
  }

  // Drops what is queued: the call ends as cancelled (a stalled client).
  void Abandon() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    stalled_ = true;
    queue_.clear();
    buffered_ = 0;
  }

  const ServiceContext* c_;
  grpc::CallbackServerContext* ctx_;
  const char* method_;
  const std::shared_ptr<JobControl> control_;  // the call's jobs (a Converse stream: one turn at a time)

 private:
  enum class Action { kNone, kWrite, kFinish };
  struct Step {
    Action action = Action::kNone;
    grpc::Status status;  // for kFinish: copied under the lock
  };
  Step Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return {};
    if (!queue_.empty()) {
      current_ = std::move(queue_.front().first);
      current_bytes_ = queue_.front().second;
      queue_.pop_front();
      writing_ = true;
      return {Action::kWrite, {}};
    }
    if (ending_) {
      finished_ = true;
      // A call the client abandoned (cancel, deadline, disconnect) is counted
      // as such (AbandonedCallStatus), whatever the job made of it.
      if (stalled_) return {Action::kFinish, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the server")};
      if (cancelled_) return {Action::kFinish, AbandonedCallStatus(ctx_->deadline(), std::chrono::system_clock::now())};
      return {Action::kFinish, status_};
    }
    return {};
  }
  // Outside the lock: gRPC may run OnDone right after Finish.
  void Run(const Step& step) {
    if (step.action == Action::kWrite) {
      this->StartWrite(&current_);
    } else if (step.action == Action::kFinish) {
      c_->Count(method_, step.status);
      this->Finish(step.status);
    }
  }

  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  std::deque<std::pair<v1::GenerateResponse, int64_t>> queue_ ABSL_GUARDED_BY(mu_);  // with its bytes
  v1::GenerateResponse current_;                                                     // the write in flight
  int64_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;  // the server cancelled it: its client stopped reading
  bool paused_ ABSL_GUARDED_BY(mu_) = false;   // the call's jobs are paused for this client
  int64_t buffered_ ABSL_GUARDED_BY(mu_) = 0;  // bytes queued or in the write in flight
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace txl

#endif  // TXL_SERVER_GRPC_STREAMING_CALL_H_

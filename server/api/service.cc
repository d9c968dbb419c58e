#include "server/api/service.h"

#include <atomic>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/time_util.h"
#include "server/api/request_validation.h"
#include "server/sessions/session_export.h"
#include "server/durability/session_journal.h"
#include "server/batching/text_stream.h"

namespace txl {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

namespace {

// The metrics' code label: gRPC's codes are absl's, numbered alike.
std::string CodeName(grpc::StatusCode code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN" : name;
}

v1::FinishReason ToProto(Finish f) {
  switch (f) {
    case Finish::kLength: return v1::FINISH_REASON_LENGTH;
    case Finish::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case Finish::kStopSequence: return v1::FINISH_REASON_STOP_SEQUENCE;
    case Finish::kCancelled: return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

void FillSession(const SessionInfo& info, v1::Session* out) {
  out->set_session_id(info.id);
  out->set_position(info.position);
  out->set_mem_len(info.mem_len);
  out->set_memory_tokens(info.memory_tokens);
  out->set_memory_bytes(info.memory_bytes);
  *out->mutable_created() = ToProto(info.created);
  *out->mutable_last_used() = ToProto(info.last_used);
  out->set_idle_ttl_seconds(absl::ToInt64Seconds(info.idle_ttl));
  for (const auto& [k, v] : info.labels) (*out->mutable_labels())[k] = v;
  out->set_busy(info.busy);
}

}  // namespace

struct TxlService::Context {
  ServiceConfig config;
  ModelConfig model;
  Tokenizer tokenizer;
  Engine* engine;
  SessionTable* table;
  Scheduler* scheduler;
  ServiceMetrics* metrics;
  const BearerTokens* tokens;  // null: no authentication
  RequestValidator validator;  // request checks (server/api/request_validation.h)
  SessionJournal* journal;     // null: no state store

  // Runs `attempt`, which either fails or sees the request through. When it
  // fails with NOT_FOUND for a named session and there is a state store, the
  // session may be one a replica that is gone served: adopt it (on the
  // engine thread; reactors never wait for the store) and try once more.
  // `fail` gets the error that ends the request.
  void WithAdoption(const std::string& principal, const std::string& id, std::function<absl::Status()> attempt,
                    std::function<void(absl::Status)> fail) const {
    absl::Status s = attempt();
    if (s.ok()) return;
    if (!absl::IsNotFound(s) || id.empty() || journal == nullptr) {
      fail(s);
      return;
    }
    // Quarantined at start-up: DATA_LOSS once for its owner (then NOT_FOUND).
    if (absl::Status lost = journal->TakeQuarantined(id, principal); !lost.ok()) {
      fail(lost);
      return;
    }
    JobCallbacks cb;
    cb.on_done = [attempt, fail](absl::Status adopted, JobResult) {
      absl::Status again = adopted.ok() ? attempt() : adopted;
      if (!again.ok()) fail(again);
    };
    auto job = scheduler->SubmitAdopt(principal, id, std::move(cb));
    if (!job.ok()) fail(job.status());
  }

  void Count(const char* method, const grpc::Status& s) const {
    if (metrics) metrics->OnRequest(method, CodeName(s.error_code()));
  }

  // Who is calling: the principal of the call's bearer token, or the
  // anonymous principal "" when the server has no tokens.
  absl::StatusOr<std::string> Principal(grpc::CallbackServerContext* ctx) const {
    if (tokens == nullptr) return std::string();
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    std::optional<absl::string_view> header;
    if (it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
    return tokens->Authenticate(header);
  }

  // The txl-session-id metadata of the call, if it has one.
  static std::optional<std::string> MetadataSessionId(grpc::CallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("txl-session-id");
    if (it == md.end()) return std::nullopt;
    return std::string(it->second.data(), it->second.size());
  }

  // The session id from the field, or else from "txl-session-id" metadata.
  absl::StatusOr<std::string> SessionId(grpc::CallbackServerContext* ctx, const std::string& field) const {
    const std::optional<std::string> md = MetadataSessionId(ctx);
    return ResolveSessionId(field, md ? &*md : nullptr);
  }

  // A throw-away session (empty id) or the named one, acquired for `principal`.
  absl::StatusOr<SessionLease> Lease(const std::string& principal, const std::string& id, bool* throwaway) const {
    *throwaway = id.empty();
    if (!id.empty()) return table->Acquire(principal, id, absl::Now());
    auto state = engine->NewSession(config.default_mem_len);
    if (!state.ok()) return state.status();
    return table->CreateAcquired(principal, *std::move(state), absl::ZeroDuration(), {}, absl::Now());
  }

  std::string TokenText(int id) const {
    auto t = tokenizer.TokenText(id);
    return t.ok() ? *t : "";
  }
};

// Writes GenerateResponses produced on the engine thread, one at a time, and
// finishes the call once the job is done and every response is out.
// Lifetime: one reference for gRPC (dropped in OnDone) and one per job in
// flight (dropped at the end of its on_done); the last one deletes.
template <typename Base>
class StreamingCall : public Base {
 protected:
  StreamingCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx, const char* method)
      : c_(c), ctx_(ctx), method_(method) {}

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
      if (buffered_ > c_->config.max_stream_buffer_bytes && job_ && !paused_) {
        paused_ = true;
        c_->scheduler->Pause(job_);
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
        if (job_) c_->scheduler->Cancel(job_);
      }
      if (paused_ && buffered_ <= c_->config.max_stream_buffer_bytes / 2) {
        paused_ = false;
        if (job_) c_->scheduler->Resume(job_);
      }
      a = Pump();
    }
    Run(a);
  }
  void Cancelled() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (job_) c_->scheduler->Cancel(job_);
  }
  void SetJob(std::shared_ptr<Job> job) {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
    if (cancelled_) c_->scheduler->Cancel(job_);  // the client left before the job was known
    if (paused_) c_->scheduler->Pause(job_);      // a turn after one that filled the buffer
  }
  void ClearJob() {
    absl::MutexLock lock(&mu_);
    job_.reset();
  }

  // Hands one generation to the scheduler: its tokens become responses, and
  // `after` runs (on the engine thread) when it ends.
  absl::Status Submit(SessionLease lease, bool throwaway, GenerateSpec spec,
                      std::function<void(absl::Status, JobResult)> after) {
    Ref();  // for the job
    JobCallbacks cb;
    const TxlService::Context* c = c_;
    cb.on_tokens = [this, c](std::vector<GeneratedTokenEvent> events, int64_t position) {
      v1::GenerateResponse r;
      for (auto& e : events) {
        v1::GeneratedToken* t = r.add_tokens();
        t->set_id(e.id);
        t->set_text(e.text);
        t->set_logprob(e.logprob);
        r.mutable_text()->append(e.text);
        for (const auto& [id, lp] : e.top) {
          v1::TokenLogprob* alt = t->add_top();
          alt->set_id(id);
          alt->set_logprob(lp);
          // An alternative's text may be a partial character: sent only when valid.
          std::string text = c->TokenText(id);
          if (IsValidUtf8(text)) alt->set_text(std::move(text));
        }
      }
      r.set_position(position);
      Send(std::move(r));
    };
    cb.on_done = [this, after = std::move(after)](absl::Status status, JobResult result) {
      ClearJob();
      // A client that stopped reading cannot take even the status: the
      // write in flight would never complete, so the call is cancelled.
      if (IsStalled(status)) {
        Abandon();
        ctx_->TryCancel();
      }
      after(std::move(status), std::move(result));
      Unref();
    };
    auto job = c_->scheduler->SubmitGenerate(std::move(lease), throwaway, std::move(spec), std::move(cb));
    if (!job.ok()) {
      Unref();
      return job.status();
    }
    SetJob(*std::move(job));
    return absl::OkStatus();
  }

  // Drops what is queued: the call ends as cancelled (a stalled client).
  void Abandon() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    queue_.clear();
    buffered_ = 0;
  }

  const TxlService::Context* c_;
  grpc::CallbackServerContext* ctx_;
  const char* method_;

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
      // as such, whatever the job made of it.
      if (cancelled_) return {Action::kFinish, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client")};
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
  v1::GenerateResponse current_;  // the write in flight
  int64_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;    // the job is paused for this client
  int64_t buffered_ ABSL_GUARDED_BY(mu_) = 0;   // bytes queued or in the write in flight
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
};

namespace {

v1::GenerateResponse FinalResponse(const JobResult& result) {
  v1::GenerateResponse r;
  r.set_text(result.trailing_text);
  r.set_position(result.position);
  r.set_finish_reason(ToProto(result.finish));
  r.set_session_id(result.session_id);
  v1::Usage* u = r.mutable_usage();
  u->set_input_tokens(result.input_tokens);
  u->set_generated_tokens(result.generated_tokens);
  u->set_queue_seconds(result.queue_seconds);
  u->set_time_to_first_token_seconds(result.first_token_seconds);
  u->set_total_seconds(result.total_seconds);
  return r;
}

}  // namespace

// Generate: one job, then the final response, then Finish.
class GenerateCall final : public StreamingCall<grpc::ServerWriteReactor<v1::GenerateResponse>> {
 public:
  GenerateCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req)
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
    auto principal = c_->Principal(ctx);
    if (!principal.ok()) return principal.status();
    const std::optional<std::string> md = c_->MetadataSessionId(ctx);
    auto args = c_->validator.Generate(req, md ? &*md : nullptr);
    if (!args.ok()) return args.status();
    c_->WithAdoption(
        *principal, args->session_id,
        [this, principal = *principal, session = args->session_id, spec = args->spec]() -> absl::Status {
          bool throwaway = false;
          auto lease = c_->Lease(principal, session, &throwaway);
          if (!lease.ok()) return lease.status();
          return Submit(*std::move(lease), throwaway, spec, [this](absl::Status status, JobResult result) {
            if (status.ok()) Send(FinalResponse(result));
            End(ToGrpcStatus(status));
          });
        },
        [this](absl::Status s) { End(ToGrpcStatus(s)); });
    return absl::OkStatus();
  }
};

// Converse: turns read one at a time; each runs like a Generate. A turn with
// no session id uses a session that lives as long as the stream.
class ConverseCall final
    : public StreamingCall<grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>> {
 public:
  ConverseCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx)
      : StreamingCall(c, ctx, "Converse") {
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
    if (!stream_session_.empty()) (void)c_->table->Delete(principal_, stream_session_);
    Unref();
  }

 private:
  absl::Status Turn() {
    const std::optional<std::string> md = c_->MetadataSessionId(ctx_);
    auto args = c_->validator.Generate(request_, md ? &*md : nullptr);
    if (!args.ok()) return args.status();
    std::string session = args->session_id;
    if (session.empty()) {
      if (stream_session_.empty()) {
        auto state = c_->engine->NewSession(c_->config.default_mem_len);
        if (!state.ok()) return state.status();
        auto info = c_->table->Create(principal_, *std::move(state), absl::ZeroDuration(), {}, absl::Now());
        if (!info.ok()) return info.status();
        stream_session_ = info->id;
      }
      session = stream_session_;
    }
    c_->WithAdoption(
        principal_, session == stream_session_ ? "" : session,
        [this, session, spec = args->spec]() -> absl::Status {
          auto lease = c_->table->Acquire(principal_, session, absl::Now());
          if (!lease.ok()) return lease.status();
          return Submit(*std::move(lease), false, spec, [this](absl::Status status, JobResult result) {
            if (status.ok()) {
              Send(FinalResponse(result));
              StartRead(&request_);  // the next turn
            } else {
              End(ToGrpcStatus(status));
            }
          });
        },
        [this](absl::Status s) { End(ToGrpcStatus(s)); });
    return absl::OkStatus();
  }

  std::string principal_;  // set before the first read, then only read
  v1::GenerateRequest request_;
  std::string stream_session_;  // touched by one turn at a time
};

TxlService::TxlService(const ServiceConfig& config, const ModelConfig& model, const Tokenizer& tokenizer,
                       Engine* engine, SessionTable* table, Scheduler* scheduler, ServiceMetrics* metrics,
                       const BearerTokens* tokens, SessionJournal* journal)
    : ctx_(new Context{config, model, tokenizer, engine, table, scheduler, metrics, tokens,
                       RequestValidator(RequestLimits{model.n_token, config.default_mem_len, config.max_mem_len,
                                                      config.max_new_tokens, config.max_input_tokens,
                                                      config.max_top_logprobs},
                                        tokenizer),
                       journal}) {}

TxlService::~TxlService() = default;

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const TxlService::Context* c,
                               const char* method, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status g = ToGrpcStatus(s);
  c->Count(method, g);
  reactor->Finish(g);
  return reactor;
}

// Finishes a unary call with `s` (OK included) and counts it.
void Answer(const TxlService::Context* c, grpc::ServerUnaryReactor* reactor, const char* method, const absl::Status& s) {
  grpc::Status g = ToGrpcStatus(s);
  c->Count(method, g);
  reactor->Finish(g);
}

}  // namespace

grpc::ServerUnaryReactor* TxlService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                   const v1::GetModelInfoRequest*, v1::ModelInfo* r) {
  if (auto principal = ctx_->Principal(ctx); !principal.ok())
    return Done(ctx, ctx_.get(), "GetModelInfo", principal.status());
  const ModelConfig& m = ctx_->model;
  r->set_n_token(m.n_token);
  r->set_n_layer(m.n_layer);
  r->set_n_head(m.n_head);
  r->set_d_model(m.d_model);
  r->set_d_head(m.d_head);
  r->set_d_inner(m.d_inner);
  r->set_d_embed(m.embed_dim());
  r->set_div_val(m.div_val);
  for (int64_t c : m.cutoffs) r->add_cutoffs(c);
  r->set_pre_lnorm(m.pre_lnorm);
  r->set_clamp_len(m.clamp_len);
  const TokenizerKind k = ctx_->tokenizer.kind();
  r->set_tokenizer(k == TokenizerKind::kByte ? "byte" : k == TokenizerKind::kChar ? "char" : "word");
  r->set_vocab_size(ctx_->tokenizer.vocab_size());
  r->set_default_mem_len(ctx_->config.default_mem_len);
  r->set_max_mem_len(ctx_->config.max_mem_len);
  r->set_device(ctx_->config.device);
  r->set_model_path(ctx_->config.model_path);
  r->set_fingerprint(ctx_->engine->fingerprint());
  return Done(ctx, ctx_.get(), "GetModelInfo", absl::OkStatus());
}

grpc::ServerUnaryReactor* TxlService::CreateSession(grpc::CallbackServerContext* ctx,
                                                    const v1::CreateSessionRequest* req, v1::Session* r) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const Context* c = ctx_.get();
  auto status = [&]() -> absl::Status {
    auto principal = ctx_->Principal(ctx);
    if (!principal.ok()) return principal.status();
    const std::optional<std::string> md = ctx_->MetadataSessionId(ctx);
    auto args = ctx_->validator.CreateSession(*req, md ? &*md : nullptr);
    if (!args.ok()) return args.status();
    // A session made now would die with the process moments later.
    if (ctx_->scheduler->draining()) return absl::UnavailableError("the server is shutting down");
    if (c->journal != nullptr) {
      if (absl::Status w = c->journal->Writable(); !w.ok()) return w;  // it could not be made durable
    }
    auto state = c->engine->NewSession(args->mem_len);
    if (!state.ok()) return state.status();
    if (c->journal == nullptr) {
      auto info = c->table->Create(*principal, *std::move(state), args->idle_ttl,
                                   {req->labels().begin(), req->labels().end()}, absl::Now(), args->session_id);
      if (!info.ok()) return info.status();
      FillSession(*info, r);
      Answer(c, reactor, "CreateSession", absl::OkStatus());
      return absl::OkStatus();
    }
    // Journaled: busy (requests on it get ABORTED) until its creation is
    // written, and answered only then, so a crash after the answer keeps it.
    auto lease = c->table->CreateAcquired(*principal, *std::move(state), args->idle_ttl,
                                          {req->labels().begin(), req->labels().end()}, absl::Now(),
                                          args->session_id, /*durable=*/true);
    if (!lease.ok()) return lease.status();
    auto info = c->table->Get(*principal, lease->id);
    if (!info.ok()) return info.status();
    info->busy = false;
    FillSession(*info, r);
    SessionExport fresh;  // an empty state: the journal rebuilds it from mem_len
    fresh.fingerprint = c->engine->fingerprint();
    auto held = std::make_shared<SessionLease>(*std::move(lease));
    c->journal->RecordCreate(
        SessionMeta{info->id, info->owner, info->mem_len, info->idle_ttl, info->created, info->labels},
        EncodeSessionExport(fresh), [c, reactor, held](absl::Status written) {
          if (written.ok()) {
            c->table->Release(std::move(*held), absl::Now());
          } else {
            c->table->Discard(std::move(*held));  // the id is taken in the store, or the store failed
          }
          Answer(c, reactor, "CreateSession", written);
        });
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    grpc::Status g = ToGrpcStatus(status);
    c->Count("CreateSession", g);
    reactor->Finish(g);
  }
  return reactor;
}

grpc::ServerUnaryReactor* TxlService::GetSession(grpc::CallbackServerContext* ctx,
                                                 const v1::GetSessionRequest* req, v1::Session* r) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const Context* c = ctx_.get();
  auto status = [&]() -> absl::Status {
    auto principal = c->Principal(ctx);
    if (!principal.ok()) return principal.status();
    auto id = c->SessionId(ctx, req->session_id());
    if (!id.ok()) return id.status();
    if (id->empty()) return absl::InvalidArgumentError("session_id: required");
    c->WithAdoption(
        *principal, *id,
        [c, reactor, r, principal = *principal, id = *id]() -> absl::Status {
          auto info = c->table->Get(principal, id);
          if (!info.ok()) return info.status();
          FillSession(*info, r);
          c->Count("GetSession", grpc::Status::OK);
          reactor->Finish(grpc::Status::OK);
          return absl::OkStatus();
        },
        [c, reactor](absl::Status s) { Answer(c, reactor, "GetSession", s); });
    return absl::OkStatus();
  }();
  if (!status.ok()) Answer(c, reactor, "GetSession", status);
  return reactor;
}

grpc::ServerUnaryReactor* TxlService::ListSessions(grpc::CallbackServerContext* ctx,
                                                   const v1::ListSessionsRequest*,
                                                   v1::ListSessionsResponse* r) {
  auto principal = ctx_->Principal(ctx);
  if (!principal.ok()) return Done(ctx, ctx_.get(), "ListSessions", principal.status());
  for (const SessionInfo& info : ctx_->table->List(*principal)) FillSession(info, r->add_sessions());
  return Done(ctx, ctx_.get(), "ListSessions", absl::OkStatus());
}

grpc::ServerUnaryReactor* TxlService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                    const v1::DeleteSessionRequest* req,
                                                    v1::DeleteSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const Context* c = ctx_.get();
  auto status = [&]() -> absl::Status {
    auto principal = c->Principal(ctx);
    if (!principal.ok()) return principal.status();
    auto id = c->SessionId(ctx, req->session_id());
    if (!id.ok()) return id.status();
    if (id->empty()) return absl::InvalidArgumentError("session_id: required");
    c->WithAdoption(
        *principal, *id,
        [c, reactor, principal = *principal, id = *id]() -> absl::Status {
          if (c->journal == nullptr) {
            if (auto s = c->table->Delete(principal, id); !s.ok()) return s;
            c->Count("DeleteSession", grpc::Status::OK);
            reactor->Finish(grpc::Status::OK);
            return absl::OkStatus();
          }
          // Journaled: busy until the store has deleted it; if the store
          // fails, the session stays (here and there) and the client is told.
          auto lease = c->table->Acquire(principal, id, absl::Now());
          if (!lease.ok()) return lease.status();
          if (!lease->durable) {  // not journaled (a Converse stream's own session)
            c->table->Discard(*std::move(lease));
            Answer(c, reactor, "DeleteSession", absl::OkStatus());
            return absl::OkStatus();
          }
          if (absl::Status w = c->journal->Writable(); !w.ok()) {
            c->table->Release(*std::move(lease), absl::Now());
            return w;
          }
          auto held = std::make_shared<SessionLease>(*std::move(lease));
          c->journal->RecordDelete(id, [c, reactor, held](absl::Status written) {
            if (written.ok()) {
              c->table->Discard(std::move(*held));
            } else {
              c->table->Release(std::move(*held), absl::Now());
            }
            Answer(c, reactor, "DeleteSession", written);
          });
          return absl::OkStatus();
        },
        [c, reactor](absl::Status s) { Answer(c, reactor, "DeleteSession", s); });
    return absl::OkStatus();
  }();
  if (!status.ok()) Answer(c, reactor, "DeleteSession", status);
  return reactor;
}

grpc::ServerUnaryReactor* TxlService::ForkSession(grpc::CallbackServerContext* ctx,
                                                  const v1::ForkSessionRequest* req, v1::Session* r) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const Context* c = ctx_.get();
  auto status = [&]() -> absl::Status {
    auto principal = c->Principal(ctx);
    if (!principal.ok()) return principal.status();
    auto id = c->SessionId(ctx, req->session_id());
    if (!id.ok()) return id.status();
    if (id->empty()) return absl::InvalidArgumentError("session_id: required");
    c->WithAdoption(
        *principal, *id,
        [c, reactor, r, req, principal = *principal, id = *id]() -> absl::Status {
          auto lease = c->table->Acquire(principal, id, absl::Now());
          if (!lease.ok()) return lease.status();
          auto ttl = c->table->Get(principal, id);
          JobCallbacks cb;
          cb.on_done = [reactor, r, c](absl::Status s, JobResult result) {
            if (s.ok()) FillSession(result.forked, r);
            Answer(c, reactor, "ForkSession", s);
          };
          auto job = c->scheduler->SubmitFork(*std::move(lease), ttl.ok() ? ttl->idle_ttl : absl::ZeroDuration(),
                                              {req->labels().begin(), req->labels().end()}, std::move(cb));
          return job.status();
        },
        [c, reactor](absl::Status s) { Answer(c, reactor, "ForkSession", s); });
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    grpc::Status g = ToGrpcStatus(status);
    c->Count("ForkSession", g);
    reactor->Finish(g);
  }
  return reactor;
}

// Score: one job. Unlike the other unary calls it has a reactor of its
// own, so that a cancel, a deadline or a disconnect stops the job at the
// next step (it keeps the prefix fed so far, like a cancelled Generate).
// Lifetime: one reference for gRPC (dropped in OnDone), one for the job.
class ScoreCall final : public grpc::ServerUnaryReactor {
 public:
  ScoreCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
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
    auto principal = c_->Principal(ctx_);
    if (!principal.ok()) return principal.status();
    const std::optional<std::string> md = c_->MetadataSessionId(ctx_);
    auto args = c_->validator.Score(req, md ? &*md : nullptr);
    if (!args.ok()) return args.status();
    c_->WithAdoption(
        *principal, args->session_id,
        [this, principal = *principal, session = args->session_id, input = args->input,
         commit = req.commit()]() -> absl::Status {
          bool throwaway = false;
          auto lease = c_->Lease(principal, session, &throwaway);
          if (!lease.ok()) return lease.status();
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
          auto job = c_->scheduler->SubmitScore(*std::move(lease), throwaway, input, commit, std::move(cb));
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

  const TxlService::Context* c_;
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

// ExportSession: one export job on the engine thread, then its bytes in
// chunks, one write at a time. Deletes itself in OnDone.
class ExportCall final : public grpc::ServerWriteReactor<v1::SessionChunk> {
 public:
  ExportCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx, const v1::ExportSessionRequest& req)
      : c_(c) {
    absl::Status s = Start(ctx, req);
    if (!s.ok()) End(ToGrpcStatus(s));
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  static constexpr size_t kChunkBytes = 1 << 20;

  absl::Status Start(grpc::CallbackServerContext* ctx, const v1::ExportSessionRequest& req) {
    auto principal = c_->Principal(ctx);
    if (!principal.ok()) return principal.status();
    auto id = c_->SessionId(ctx, req.session_id());
    if (!id.ok()) return id.status();
    if (id->empty()) return absl::InvalidArgumentError("session_id: required");
    c_->WithAdoption(
        *principal, *id,
        [this, principal = *principal, id = *id]() -> absl::Status {
          auto lease = c_->table->Acquire(principal, id, absl::Now());
          if (!lease.ok()) return lease.status();
          JobCallbacks cb;
          // Runs on the engine thread, after this constructor has returned.
          cb.on_done = [this](absl::Status s, JobResult result) {
            if (!s.ok()) {
              End(ToGrpcStatus(s));
              return;
            }
            data_ = std::move(result.exported);
            Next();
          };
          return c_->scheduler->SubmitExport(*std::move(lease), std::move(cb)).status();
        },
        [this](absl::Status s) { End(ToGrpcStatus(s)); });
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

  const TxlService::Context* c_;
  std::string data_;  // set once, on the engine thread, before the first write
  size_t offset_ = 0;
  v1::SessionChunk chunk_;
};

// ImportSession: reads every chunk (bounded), checks the bytes, then one
// import job on the engine thread. Deletes itself in OnDone.
class ImportCall final : public grpc::ServerReadReactor<v1::ImportSessionRequest> {
 public:
  ImportCall(const TxlService::Context* c, grpc::CallbackServerContext* ctx, v1::Session* response)
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
        End(ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
            "import: more than ", c_->config.max_import_bytes, " bytes (a session of max_mem_len at most)"))));
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
    const std::optional<std::string> md = c_->MetadataSessionId(ctx_);
    auto args = c_->validator.CreateSession(as_create, md ? &*md : nullptr);
    if (!args.ok()) return args.status();
    auto image = DecodeSessionExport(data_);
    if (!image.ok()) return image.status();
    const std::string here = c_->engine->fingerprint();
    if (image->fingerprint != here) {
      return absl::FailedPreconditionError(absl::StrCat("import: the session was exported from model ",
                                                        image->fingerprint, "; this server serves ", here));
    }
    if (c_->scheduler->draining()) return absl::UnavailableError("the server is shutting down");
    JobCallbacks cb;
    cb.on_done = [this](absl::Status s, JobResult result) {
      if (s.ok()) FillSession(result.forked, response_);
      End(ToGrpcStatus(s));
    };
    Scheduler::ImportSpec spec;
    spec.owner = principal_;
    spec.image = *std::move(image);
    spec.idle_ttl = args->idle_ttl;
    spec.labels = {settings_.labels().begin(), settings_.labels().end()};
    spec.id = args->session_id;
    spec.max_mem_len = c_->config.max_mem_len;
    return c_->scheduler->SubmitImport(std::move(spec), std::move(cb)).status();
  }
  void End(const grpc::Status& g) {
    c_->Count("ImportSession", g);
    Finish(g);
  }

  const TxlService::Context* c_;
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

grpc::ServerWriteReactor<v1::GenerateResponse>* TxlService::Generate(grpc::CallbackServerContext* ctx,
                                                                     const v1::GenerateRequest* req) {
  return new GenerateCall(ctx_.get(), ctx, req);
}

grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>* TxlService::Converse(
    grpc::CallbackServerContext* ctx) {
  return new ConverseCall(ctx_.get(), ctx);
}

}  // namespace txl

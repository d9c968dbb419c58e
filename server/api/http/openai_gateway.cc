#include "server/api/http/openai_gateway.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/api/http/openai_json.h"
#include "server/api/http/playground/playground_page.h"

namespace txl {
namespace {

using json = nlohmann::json;
constexpr char kJson[] = "application/json";

HttpError FromGrpc(const grpc::Status& s) {
  return ErrorFromStatus(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The caller's credentials go on to the service as they came.
void CopyAuth(const HttpRequest& req, grpc::ClientContext* ctx) {
  const std::string auth = req.Header("authorization");
  if (!auth.empty()) ctx->AddMetadata("authorization", auth);
}

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
  CompletionCall(const OpenAiGateway::Shared* s, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
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

  const OpenAiGateway::Shared* s_;
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

// GET /v1/models (and /v1/models/ID): the one model, with what GetModelInfo
// says of it. Going through the service also applies its bearer tokens.
void Models(const OpenAiGateway::Shared* s, std::shared_ptr<HttpExchange> x, const std::string& id) {
  struct Call {
    grpc::ClientContext ctx;
    v1::GetModelInfoRequest req;
    v1::ModelInfo info;
  };
  auto call = std::make_shared<Call>();
  CopyAuth(x->request(), &call->ctx);
  s->stub->async()->GetModelInfo(&call->ctx, &call->req, &call->info, [s, x, call, id](grpc::Status status) {
    const std::string route = "/v1/models";
    if (!status.ok()) {
      const HttpError e = FromGrpc(status);
      s->Answer(*x, route, e.status, ErrorBody(e));
      return;
    }
    const v1::ModelInfo& m = call->info;
    json model{{"id", s->config.model_name},
               {"object", "model"},
               {"created", 0},
               {"owned_by", "txl-serve"},
               {"txl", json{{"n_layer", m.n_layer()},
                            {"d_model", m.d_model()},
                            {"vocab_size", m.vocab_size()},
                            {"tokenizer", m.tokenizer()},
                            {"default_mem_len", m.default_mem_len()},
                            {"max_mem_len", m.max_mem_len()},
                            {"device", m.device()},
                            {"dtype", m.dtype()},
                            {"kv_dtype", m.kv_dtype()},
                            {"fingerprint", m.fingerprint()}}}};
    if (!id.empty()) {
      if (id != s->config.model_name) {
        s->Answer(*x, route, 404,
                  ErrorBody({404, absl::StrCat("model '", id, "' is not served here"), "model", "model_not_found"}));
        return;
      }
      s->Answer(*x, route, 200, JsonText(model));
      return;
    }
    s->Answer(*x, route, 200, JsonText(json{{"object", "list"}, {"data", json::array({model})}}));
  });
}

// One unary call on the service, answered with render(response) as JSON.
// `invoke` starts it on the stub's callback API.
template <typename Req, typename Resp>
void Unary(const OpenAiGateway::Shared* s, std::shared_ptr<HttpExchange> x, std::string route, Req req,
           void (*invoke)(v1::TransformerXL::Stub::async_interface*, grpc::ClientContext*, const Req*, Resp*,
                          std::function<void(grpc::Status)>),
           std::function<json(const Resp&)> render) {
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
  };
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  CopyAuth(x->request(), &call->ctx);
  invoke(s->stub->async(), &call->ctx, &call->req, &call->resp,
         [s, x, call, route = std::move(route), render = std::move(render)](grpc::Status status) {
           if (!status.ok()) {
             const HttpError e = FromGrpc(status);
             s->Answer(*x, route, e.status, ErrorBody(e));
             return;
           }
           s->Answer(*x, route, 200, JsonText(render(call->resp)));
         });
}

// /v1/sessions[/ID[/fork]]: the session calls of the gRPC API, same semantics.
void Sessions(const OpenAiGateway::Shared* s, std::shared_ptr<HttpExchange> x) {
  const HttpRequest& req = x->request();
  const std::string rest = req.path.substr(std::string("/v1/sessions").size());  // "", "/ID" or "/ID/fork"
  const std::vector<std::string> parts = absl::StrSplit(rest, '/', absl::SkipEmpty());
  const std::string route = parts.empty()       ? "/v1/sessions"
                            : parts.size() == 1 ? "/v1/sessions/{id}"
                                                : absl::StrCat("/v1/sessions/{id}/", parts[1]);
  auto wrong_method = [&](const char* allowed) {
    s->Answer(*x, route, 405,
              ErrorBody({405, absl::StrCat(req.method, " is not allowed on ", route, " (use ", allowed, ")"), "",
                         "method_not_allowed"}));
  };
  auto session = [](const v1::Session& r) { return SessionJson(r); };
  HttpError error;
  if (parts.empty()) {
    if (req.method == "POST") {
      auto create = ParseCreateSession(req.body, &error);
      if (!create.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
      return Unary<v1::CreateSessionRequest, v1::Session>(
          s, std::move(x), route, *std::move(create),
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->CreateSession(c, q, o, std::move(f)); }, session);
    }
    if (req.method == "GET") {
      return Unary<v1::ListSessionsRequest, v1::ListSessionsResponse>(
          s, std::move(x), route, {},
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->ListSessions(c, q, o, std::move(f)); },
          [](const v1::ListSessionsResponse& r) {
            json data = json::array();
            for (const auto& one : r.sessions()) data.push_back(SessionJson(one));
            return json{{"object", "list"}, {"data", data}};
          });
    }
    return wrong_method("GET or POST");
  }
  const std::string& id = parts[0];
  if (parts.size() == 1) {
    if (req.method == "GET") {
      v1::GetSessionRequest q;
      q.set_session_id(id);
      return Unary<v1::GetSessionRequest, v1::Session>(
          s, std::move(x), route, q,
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->GetSession(c, q, o, std::move(f)); }, session);
    }
    if (req.method == "DELETE") {
      v1::DeleteSessionRequest q;
      q.set_session_id(id);
      return Unary<v1::DeleteSessionRequest, v1::DeleteSessionResponse>(
          s, std::move(x), route, q,
          [](auto* a, auto* c, auto* q, auto* o, auto f) { a->DeleteSession(c, q, o, std::move(f)); },
          [s, id](const v1::DeleteSessionResponse&) {
            s->chats->Forget(id);
            return json{{"id", id}, {"object", "session"}, {"deleted", true}};
          });
    }
    return wrong_method("GET or DELETE");
  }
  if (parts.size() == 2 && parts[1] == "fork") {
    if (req.method != "POST") return wrong_method("POST");
    auto body = ParseCreateSession(req.body, &error);
    if (!body.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    v1::ForkSessionRequest q;
    q.set_session_id(id);
    *q.mutable_labels() = body->labels();
    return Unary<v1::ForkSessionRequest, v1::Session>(
        s, std::move(x), route, q,
        [](auto* a, auto* c, auto* q, auto* o, auto f) { a->ForkSession(c, q, o, std::move(f)); },
        [s, id](const v1::Session& r) {
          s->chats->Copy(id, r.session_id());
          return SessionJson(r);
        });
  }
  if (parts.size() == 2 && parts[1] == "score") {
    if (req.method != "POST") return wrong_method("POST");
    auto score = ParseScore(req.body, id, &error);
    if (!score.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    return Unary<v1::ScoreRequest, v1::ScoreResponse>(
        s, std::move(x), route, *std::move(score),
        [](auto* a, auto* c, auto* q, auto* o, auto f) { a->Score(c, q, o, std::move(f)); },
        [id](const v1::ScoreResponse& r) { return ScoreJson(id, r); });
  }
  s->Answer(*x, "other", 404, ErrorBody({404, absl::StrCat("no route ", req.method, " ", req.path), "", "not_found"}));
}

// POST /v1/chat/completions: the messages rendered by the chat template; with
// a session, only those it has not seen (ChatSessions::Plan, which needs the
// session's position: one GetSession first).
void Chat(const OpenAiGateway::Shared* s, std::shared_ptr<HttpExchange> x, ChatParams p) {
  const std::string route = "/v1/chat/completions";
  const ChatTemplate& t = s->config.chat_template;
  if (p.completion.request.stop_sequences().empty()) {
    for (const std::string& stop : t.stop) p.completion.request.add_stop_sequences(stop);
  }
  auto start = [s, route](std::shared_ptr<HttpExchange> x, ChatParams p, std::string feed) {
    p.completion.request.mutable_input()->set_text(std::move(feed));
    const std::string session = p.completion.request.session_id();
    std::function<void(const CompletionResult&)> record;
    if (!session.empty()) {
      record = [s, session, messages = p.messages](const CompletionResult& r) {
        s->chats->Record(session, messages, r.text, r.position);
      };
    }
    std::make_shared<CompletionCall>(s, std::move(x), std::move(p.completion), /*chat=*/true, std::move(record))
        ->Start();
  };
  const std::string session = p.completion.request.session_id();
  if (session.empty()) {
    std::string feed;
    for (const ChatMessage& m : p.messages) feed += t.Render(m);
    return start(std::move(x), std::move(p), feed + t.generation_prompt);
  }
  struct Call {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    v1::Session resp;
    ChatParams p;
  };
  auto call = std::make_shared<Call>();
  call->req.set_session_id(session);
  call->p = std::move(p);
  CopyAuth(x->request(), &call->ctx);
  s->stub->async()->GetSession(&call->ctx, &call->req, &call->resp, [s, x, call, route, start](grpc::Status status) {
    if (!status.ok()) {
      const HttpError e = FromGrpc(status);
      return s->Answer(*x, route, e.status, ErrorBody(e));
    }
    HttpError error;
    auto feed = s->chats->Plan(call->req.session_id(), call->resp.position(), call->p.messages, s->config.chat_template,
                               &error);
    if (!feed.ok()) return s->Answer(*x, route, error.status, ErrorBody(error));
    start(x, std::move(call->p), *std::move(feed));
  });
}

}  // namespace

void OpenAiGateway::Shared::Answer(HttpExchange& x, const std::string& route, int status,
                                   const std::string& body) const {
  Count(route, status);
  x.Respond(status, kJson, body);
}

OpenAiGateway::OpenAiGateway(const OpenAiGatewayConfig& config, std::shared_ptr<grpc::Channel> channel,
                             ServiceMetrics* metrics) {
  shared_.config = config;
  shared_.stub = v1::TransformerXL::NewStub(std::move(channel));
  shared_.metrics = metrics;
  shared_.active = &active_;
  shared_.chats = &chats_;
}

void OpenAiGateway::Handle(std::shared_ptr<HttpExchange> x) {
  const HttpRequest& req = x->request();
  const std::string& path = req.path;
  auto wrong_method = [&](const std::string& route, const char* allowed) {
    shared_.Answer(*x, route, 405,
                   ErrorBody({405, absl::StrCat(req.method, " is not allowed on ", route, " (use ", allowed, ")"), "",
                              "method_not_allowed"}));
  };
  if (path == "/" || path == "/index.html") {  // the playground; its API calls carry the token
    if (req.method != "GET") return wrong_method("/", "GET");
    shared_.Count("/", 200);
    return x->Respond(200, "text/html; charset=utf-8", PlaygroundPage());
  }
  // Health: no credentials (as gRPC's health service), so probes need none.
  if (path == "/healthz" || path == "/v2/health/live") {
    if (req.method != "GET") return wrong_method(path, "GET");
    return shared_.Answer(*x, path, 200, R"({"status":"ok"})");
  }
  if (path == "/readyz" || path == "/v2/health/ready") {
    if (req.method != "GET") return wrong_method(path, "GET");
    if (draining_) return shared_.Answer(*x, path, 503, R"({"status":"draining"})");
    return shared_.Answer(*x, path, 200, R"({"status":"ready"})");
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (req.method != "GET") return wrong_method("/v1/models", "GET");
    return Models(&shared_, std::move(x), path.size() > 11 ? path.substr(11) : "");
  }
  if (path == "/v1/sessions" || path.rfind("/v1/sessions/", 0) == 0) return Sessions(&shared_, std::move(x));
  if (path == "/v1/chat/completions") {
    if (req.method != "POST") return wrong_method(path, "POST");
    HttpError error;
    auto params = ParseChat(req.body, req.Header("txl-session-id"), shared_.config.model_name, &error);
    if (!params.ok()) return shared_.Answer(*x, path, error.status, ErrorBody(error));
    return Chat(&shared_, std::move(x), *std::move(params));
  }
  if (path == "/v1/completions") {
    if (req.method != "POST") return wrong_method(path, "POST");
    HttpError error;
    auto params = ParseCompletion(req.body, req.Header("txl-session-id"), shared_.config.model_name, &error);
    if (!params.ok()) return shared_.Answer(*x, path, error.status, ErrorBody(error));
    auto call = std::make_shared<CompletionCall>(&shared_, std::move(x), *std::move(params), /*chat=*/false);
    call->Start();
    return;
  }
  shared_.Answer(*x, "other", 404, ErrorBody({404, absl::StrCat("no route ", req.method, " ", path), "", "not_found"}));
}

}  // namespace txl

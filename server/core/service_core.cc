#include "server/core/service_core.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace txl {

ServiceCore::ServiceCore(ServiceParts parts)
    : config(std::move(parts.config)),
      models(parts.models),
      repository(parts.repository),
      poller(parts.poller),
      table(parts.table),
      scheduler(parts.scheduler),
      metrics(parts.metrics),
      tokens(parts.tokens),
      journal(parts.journal) {}

absl::StatusOr<std::string> ServiceCore::Authenticate(std::optional<absl::string_view> authorization) const {
  if (tokens == nullptr) return std::string();
  return tokens->Authenticate(authorization);
}

absl::StatusOr<std::string> ServiceCore::RequiredSession(const std::string& field, const std::string* header) const {
  ASSIGN_OR_RETURN(std::string id, ResolveSessionId(field, header));
  if (id.empty()) return absl::InvalidArgumentError("session_id: required");
  return id;
}

absl::StatusOr<std::shared_ptr<ServedModel>> ServiceCore::Model(absl::string_view ref) const {
  ASSIGN_OR_RETURN(ModelRef parsed, ParseModelRef(ref));
  return models->Find(parsed);
}

absl::StatusOr<std::shared_ptr<ServedModel>> ServiceCore::ModelFor(const std::string& principal, absl::string_view ref,
                                                                   const std::string& id) const {
  if (id.empty()) return Model(ref);
  auto bound = table->ModelOf(principal, id);
  if (!bound.ok()) {
    // Not live here: adoption may find it, on a version known only then
    // (Lease checks that it reads input as this one does).
    auto named = Model(ref);
    if (ref.empty() && journal != nullptr && absl::IsInvalidArgument(named.status())) {
      std::vector<std::shared_ptr<ServedModel>> ready = models->Ready();  // several models: read it as the first
      if (!ready.empty()) return ready.front();
    }
    return named;
  }
  std::shared_ptr<ServedModel> m = *std::move(bound);
  if (!ref.empty()) {
    ASSIGN_OR_RETURN(ModelRef parsed, ParseModelRef(ref));
    if (parsed.name != m->name() || (parsed.version != 0 && parsed.version != m->version())) {
      return absl::InvalidArgumentError(absl::StrCat("model: the session is on ", m->ref(), ", not \"", ref,
                                                     "\" (a session keeps the version it was made on; leave "
                                                     "model empty, or name ",
                                                     m->name(), ")"));
    }
  }
  return m;
}

RequestLimits ServiceCore::Limits(const ServedModel* m) const {
  if (m == nullptr) {
    RequestLimits limits{0,
                         config.default_mem_len,
                         config.max_mem_len,
                         config.max_new_tokens,
                         config.max_input_tokens,
                         config.max_top_logprobs};
    limits.max_n = config.max_n;
    return limits;
  }
  const ModelLimits& own = m->limits();  // 0: the server's
  RequestLimits limits;
  limits.n_token = m->config().n_token;
  limits.max_mem_len = ModelOrServer(own.max_mem_len, config.max_mem_len);
  limits.default_mem_len =
      std::min(ModelOrServer(own.default_mem_len, DefaultMemLenOf(config, m->config().mem_len)), limits.max_mem_len);
  limits.max_new_tokens = static_cast<int>(ModelOrServer(own.max_new_tokens, config.max_new_tokens));
  limits.max_input_tokens = ModelOrServer(own.max_input_tokens, config.max_input_tokens);
  limits.max_top_logprobs = config.max_top_logprobs;
  limits.max_n = config.max_n;
  return limits;
}

int64_t ServiceCore::DefaultMemLen(const ServedModel& m) const { return Limits(&m).default_mem_len; }

int64_t ServiceCore::MaxSessions(const ServedModel& m) const {
  return ModelOrServer(m.limits().max_sessions, table->config().max_sessions);
}

RequestValidator ServiceCore::Validator(const ServedModel& m) const {
  return RequestValidator(Limits(&m), m.tokenizer(), &m.grammars());
}

absl::StatusOr<NewSessionArgs> ServiceCore::CheckImport(const v1::CreateSessionRequest& settings,
                                                        const std::string* metadata_session_id) const {
  return RequestValidator(Limits(nullptr)).CreateSession(settings, metadata_session_id);
}

absl::StatusOr<NewSessionArgs> ServiceCore::CheckCreateSession(const v1::CreateSessionRequest& req,
                                                               const std::string* metadata_session_id) const {
  ASSIGN_OR_RETURN(std::shared_ptr<ServedModel> m, Model(req.model()));
  ASSIGN_OR_RETURN(NewSessionArgs args, Validator(*m).CreateSession(req, metadata_session_id));
  args.model = std::move(m);
  return args;
}

namespace {

// A request that may name a session, read for the version it runs on
// (ServiceCore::ModelFor) by `check`, one of RequestValidator's.
template <typename Args, typename Request>
absl::StatusOr<Args> ReadForItsVersion(const ServiceCore& core, const std::string& principal, const Request& req,
                                       const std::string* metadata_session_id,
                                       absl::StatusOr<Args> (RequestValidator::*check)(const Request&,
                                                                                       const std::string*) const) {
  ASSIGN_OR_RETURN(const std::string id, ResolveSessionId(req.session_id(), metadata_session_id));
  ASSIGN_OR_RETURN(std::shared_ptr<ServedModel> m, core.ModelFor(principal, req.model(), id));
  ASSIGN_OR_RETURN(Args args, (core.Validator(*m).*check)(req, metadata_session_id));
  args.model = std::move(m);
  return args;
}

}  // namespace

absl::StatusOr<GenerateArgs> ServiceCore::CheckGenerate(const std::string& principal, const v1::GenerateRequest& req,
                                                        const std::string* metadata_session_id) const {
  return ReadForItsVersion(*this, principal, req, metadata_session_id, &RequestValidator::Generate);
}

absl::StatusOr<ScoreArgs> ServiceCore::CheckScore(const std::string& principal, const v1::ScoreRequest& req,
                                                  const std::string* metadata_session_id) const {
  return ReadForItsVersion(*this, principal, req, metadata_session_id, &RequestValidator::Score);
}

std::vector<VersionStatus> ServiceCore::ListModels() const { return models->List(); }

void ServiceCore::LoadModel(const std::string& name, StatusDone done) const {
  OnRepository(
      "loading", [name](ModelRepository* r) { return r->Load(name); }, std::move(done));
}

void ServiceCore::UnloadModel(const std::string& name, StatusDone done) const {
  OnRepository(
      "unloading", [name](ModelRepository* r) { return r->Unload(name); }, std::move(done));
}

void ServiceCore::OnRepository(const char* what, std::function<absl::Status(ModelRepository*)> work,
                               StatusDone done) const {
  if (repository == nullptr || poller == nullptr) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("this server serves one --model; ", what, " needs --model_repository")));
  }
  if (!poller->Run([r = repository, work, done] { done(work(r)); })) {
    done(absl::UnavailableError("the server is shutting down"));
  }
}

absl::StatusOr<SessionLease> ServiceCore::Lease(const std::string& principal, const std::string& id,
                                                const std::shared_ptr<ServedModel>& model) const {
  if (!id.empty()) {
    ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
    // Another version of the same model reads and limits a request alike
    // when its vocabulary and limits are the same (a session adopted on an
    // older version of the model).
    const bool reads_alike = lease.model == model || (lease.model->name() == model->name() &&
                                                      SameRequestLimits(lease.model->limits(), model->limits()) &&
                                                      lease.model->config().n_token == model->config().n_token &&
                                                      lease.model->tokenizer().SameVocabulary(model->tokenizer()));
    if (!reads_alike) {
      const std::string on = lease.model->ref();
      table->GiveBack(std::move(lease), absl::Now());
      return absl::FailedPreconditionError(absl::StrCat("session ", id, " is on model ", on,
                                                        ", and the request was read for ", model->ref(),
                                                        "; send it again (or name model ", on, ")"));
    }
    return lease;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, model->engine()->NewSession(DefaultMemLen(*model)));
  ASSIGN_OR_RETURN(SessionLease lease,
                   table->CreateAcquired(principal, model, std::move(state), absl::ZeroDuration(), {}, absl::Now()));
  lease.throwaway = true;
  return lease;
}

void ServiceCore::WithAdoption(const std::string& principal, const std::string& id,
                               std::function<absl::Status()> attempt, std::function<void(absl::Status)> fail) const {
  absl::Status s = attempt();
  if (s.ok()) return;
  if (!absl::IsNotFound(s) || id.empty() || journal == nullptr) {
    fail(s);
    return;
  }
  // Quarantined at start-up: DATA_LOSS once for its owner (then NOT_FOUND).
  // Waiting for room for its version: FAILED_PRECONDITION saying so.
  // Once its version is served here (loaded since), it is adopted as usual.
  const auto served = [this](const std::string& fingerprint) { return models->WithFingerprint(fingerprint).ok(); };
  for (absl::Status held : {journal->TakeQuarantined(id, principal), journal->Waiting(id, principal, served)}) {
    if (!held.ok()) {
      fail(held);
      return;
    }
  }
  auto adopted = [attempt, fail](absl::Status status) {
    absl::Status again = status.ok() ? attempt() : status;
    if (!again.ok()) fail(again);
  };
  auto job = scheduler->SubmitAdopt(principal, id, RecordsOf(models), std::move(adopted));
  if (!job.ok()) fail(job.status());
}

}  // namespace txl

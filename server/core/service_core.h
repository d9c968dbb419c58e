// ServiceCore: what both transports call. It knows no transport: callers
// hand it a principal (from Authenticate), checked arguments
// (request_validation.h) and a callback, and get absl statuses and plain C++
// results back. It takes sessions out of the table (adopting one from the
// state store when a replica that is gone held it), and runs the session
// operations, generation and scoring; the gRPC service (server/grpc/) and the
// HTTP routes (server/http/) only convert at their edge.
//
// Threading: const methods may be called from any number of threads at once;
// they never block on the engine or the state store. A callback runs exactly
// once: at once, on the calling thread, when the operation fails before it is
// queued, else later on the engine thread or the journal's writer.
#ifndef TXL_SERVER_CORE_SERVICE_CORE_H_
#define TXL_SERVER_CORE_SERVICE_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "server/batching/scheduler.h"
#include "server/core/auth.h"
#include "server/core/job_control.h"
#include "server/core/request_validation.h"
#include "server/core/service_config.h"
#include "server/durability/session_journal.h"
#include "server/engine/engine.h"
#include "server/engine/model_source.h"
#include "server/engine/repository_poller.h"
#include "server/engine/served_model.h"
#include "server/metrics/service_metrics.h"
#include "server/sessions/session_table.h"

namespace txl {

// The server's parts the core drives; all must outlive it.
struct ServiceParts {
  ServiceConfig config;
  const ModelSource* models = nullptr;    // the versions requests may name
  ModelRepository* repository = nullptr;  // null: --model (nothing to load or unload)
  RepositoryPoller* poller = nullptr;     // runs loads and unloads; set with repository
  SessionTable* table = nullptr;
  Scheduler* scheduler = nullptr;
  ServiceMetrics* metrics = nullptr;     // may be null
  const BearerTokens* tokens = nullptr;  // null: no authentication
  SessionJournal* journal = nullptr;     // null: no state store
};

using SessionDone = std::function<void(absl::StatusOr<SessionInfo>)>;
using StatusDone = std::function<void(absl::Status)>;

class ServiceCore {
 public:
  explicit ServiceCore(ServiceParts parts);

  // Who is calling: the principal of the bearer token in `authorization`
  // (an "Authorization" header's value), or the anonymous principal "" when
  // the server has no tokens. UNAUTHENTICATED otherwise.
  absl::StatusOr<std::string> Authenticate(std::optional<absl::string_view> authorization) const;
  // The session a call names: `field`, else the txl-session-id header
  // (`header`, may be null); INVALID_ARGUMENT "session_id: required" when
  // neither names one.
  absl::StatusOr<std::string> RequiredSession(const std::string& field, const std::string* header) const;

  // The version a request's `model` field names (model_source.h's forms);
  // errors name the field "model".
  absl::StatusOr<std::shared_ptr<ServedModel>> Model(absl::string_view ref) const;
  // The version a request on session `id` (empty: none) runs on: the
  // session's own when it is live here (`ref` may be empty or must name it:
  // INVALID_ARGUMENT otherwise), else Model(ref).
  absl::StatusOr<std::shared_ptr<ServedModel>> ModelFor(const std::string& principal, absl::string_view ref,
                                                        const std::string& id) const;
  // The checks of request_validation.h, for version `m`'s tokenizer and vocabulary.
  RequestValidator Validator(const ServedModel& m) const;
  // The limits of requests on version `m`: its vocabulary, and the server's
  // flags lowered by its model's limits.json (model_limits.h); null: no
  // version yet (an import's settings, checked again on the version found).
  RequestLimits Limits(const ServedModel* m) const;
  // A new session's window on `m` when it asks for none.
  int64_t DefaultMemLen(const ServedModel& m) const;
  // The live sessions `m`'s model may hold, all versions together.
  int64_t MaxSessions(const ServedModel& m) const;
  // Whole requests, checked for the version each runs on (args.model).
  // `metadata_session_id` as RequestValidator's.
  absl::StatusOr<NewSessionArgs> CheckCreateSession(const v1::CreateSessionRequest& req,
                                                    const std::string* metadata_session_id) const;
  absl::StatusOr<GenerateArgs> CheckGenerate(const std::string& principal, const v1::GenerateRequest& req,
                                             const std::string* metadata_session_id) const;
  // An import's settings (its image names its model: ImportSession).
  absl::StatusOr<NewSessionArgs> CheckImport(const v1::CreateSessionRequest& settings,
                                             const std::string* metadata_session_id) const;
  absl::StatusOr<ScoreArgs> CheckScore(const std::string& principal, const v1::ScoreRequest& req,
                                       const std::string* metadata_session_id) const;

  // The repository's versions and their states (a --model server: its one
  // version, READY), and explicit control (ModelRepository::Load, Unload),
  // run on the poller's thread (a load takes seconds); `done` gets its
  // status. FAILED_PRECONDITION without a repository.
  std::vector<VersionStatus> ListModels() const;
  void LoadModel(const std::string& name, StatusDone done) const;
  void UnloadModel(const std::string& name, StatusDone done) const;

  // The session operations, for `principal`.
  void CreateSession(const std::string& principal, NewSessionArgs args, std::map<std::string, std::string> labels,
                     SessionDone done) const;
  void GetSession(const std::string& principal, const std::string& id, SessionDone done) const;
  std::vector<SessionInfo> ListSessions(const std::string& principal) const;
  void DeleteSession(const std::string& principal, const std::string& id, StatusDone done) const;
  // A new session with `id`'s history up to `position` (-1: all of it).
  void ForkSession(const std::string& principal, const std::string& id, int64_t position,
                   std::map<std::string, std::string> labels, SessionDone done) const;
  void RewindSession(const std::string& principal, const std::string& id, int64_t position, SessionDone done) const;
  // The session rebuilt on the version `model` names (MigrateJob; opt-in,
  // it changes the session's answers). Already on it: answered as it is.
  void MigrateSession(const std::string& principal, const std::string& id, const std::string& model,
                      SessionDone done) const;

  // Moving sessions between servers (transfer_ops.cc). Export: the session's
  // image (EncodeSessionExport's bytes). Import: a new session from such an
  // image, with the id and ttl rules of CreateSession; FAILED_PRECONDITION for
  // another model's image.
  void ExportSession(const std::string& principal, const std::string& id,
                     std::function<void(absl::StatusOr<std::string>)> done) const;
  void ImportSession(const std::string& principal, NewSessionArgs args, std::map<std::string, std::string> labels,
                     const std::string& data, SessionDone done) const;
  // A session of `model` that lives as long as its caller keeps it (a
  // Converse stream's own): no ttl, never journaled; DropStreamSession ends it.
  absl::StatusOr<std::string> NewStreamSession(const std::string& principal, std::shared_ptr<ServedModel> model) const;
  void DropStreamSession(const std::string& principal, const std::string& id) const;

  // A hold on a job a front end is about to start (Generate, Score).
  std::shared_ptr<JobControl> NewJobControl() const { return std::make_shared<JobControl>(scheduler); }

  // A generation (generation.cc): leases the session `args` names (none: a
  // throw-away one; a named one a replica that is gone held is adopted when
  // `adopt`), checks that the request continues its history, and queues the
  // job. `control` cancels, pauses and resumes it. `on_tokens` runs on the
  // engine thread as tokens come; `on_done` exactly once: at once when the
  // request is refused before it is queued, else when the job ends.
  // With best_of > 1 (choices.h) the prompt is fed once and each candidate
  // generates on its own copy: `on_tokens` gets each choice's tokens, marked
  // with its index, and `on_done` runs once, after the last, with every
  // kept choice's end (GenerateResult::choices); without best_of above n, a
  // choice that ends before the last goes to `on_choice_end` as it ends.
  void Generate(const std::string& principal, GenerateArgs args, bool adopt, std::shared_ptr<JobControl> control,
                GenerateCallbacks callbacks) const;
  // A score of `args.input` after the session's history (committed to it when
  // `commit`); `done` as Generate's `on_done`, with the scores in the result.
  void Score(const std::string& principal, ScoreArgs args, bool commit, std::shared_ptr<JobControl> control,
             ScoreDone done) const;

  // A throw-away session of `model` (empty id: SessionLease::throwaway) or
  // the named one, acquired for `principal`; SessionTable::GiveBack ends
  // either. The named one must read input as `model` does (the version its
  // request was checked for: the same one, or one with the same vocabulary):
  // FAILED_PRECONDITION naming both when it does not (a session adopted
  // from a replica that is gone may be on another version or model).
  absl::StatusOr<SessionLease> Lease(const std::string& principal, const std::string& id,
                                     const std::shared_ptr<ServedModel>& model) const;
  // Runs `attempt`, which either fails or sees the request through. When it
  // fails with NOT_FOUND for a named session and there is a state store, the
  // session may be one a replica that is gone served: adopt it (on the
  // engine thread) and try once more. `fail` gets the error that ends the
  // request.
  void WithAdoption(const std::string& principal, const std::string& id, std::function<absl::Status()> attempt,
                    std::function<void(absl::Status)> fail) const;

  // The parts, as the transports' adapters read them.
  const ServiceConfig config;
  const ModelSource* const models;
  ModelRepository* const repository;
  RepositoryPoller* const poller;
  SessionTable* const table;
  Scheduler* const scheduler;
  ServiceMetrics* const metrics;
  const BearerTokens* const tokens;
  SessionJournal* const journal;

 private:
  // Runs `work` on the repository's thread and answers `done` with its
  // status; FAILED_PRECONDITION naming `what` without a repository.
  void OnRepository(const char* what, std::function<absl::Status(ModelRepository*)> work, StatusDone done) const;
  // Generate's several choices (generation.cc).
  void GenerateChoices(const std::string& principal, GenerateArgs args, std::shared_ptr<JobControl> control,
                       GenerateCallbacks callbacks) const;
};

}  // namespace txl

#endif  // TXL_SERVER_CORE_SERVICE_CORE_H_

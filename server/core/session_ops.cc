// ServiceCore's session operations (service_core.h): create, get, list,
// delete, fork and rewind, each answered through its callback once the
// session table, the engine thread or the journal is done with it.
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/core/service_core.h"
#include "server/durability/new_session.h"
#include "server/sessions/session_export.h"

namespace txl {
namespace {

// Runs `body`; an error it returns (before anything was queued) goes to `done`.
template <typename Done>
void Try(const Done& done, const std::function<absl::Status()>& body) {
  if (absl::Status s = body(); !s.ok()) done(s);
}

}  // namespace

void ServiceCore::CreateSession(const std::string& principal, NewSessionArgs args,
                                std::map<std::string, std::string> labels, SessionDone done) const {
  Try(done, [&]() -> absl::Status {
    RETURN_IF_ERROR(RequestValidator::Labels(labels));
    // A session made now would die with the process moments later.
    if (scheduler->draining()) return absl::UnavailableError("the server is shutting down");
    if (journal != nullptr) RETURN_IF_ERROR(journal->Writable());  // it could not be made durable
    if (args.model == nullptr) return absl::InternalError("CreateSession: arguments not checked for a model");
    ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, args.model->engine()->NewSession(args.mem_len));
    if (journal == nullptr) {
      ASSIGN_OR_RETURN(SessionInfo info, table->Create(principal, args.model, std::move(state), args.idle_ttl,
                                                       std::move(labels), absl::Now(), args.session_id));
      done(std::move(info));
      return absl::OkStatus();
    }
    // Journaled: busy (requests on it get ABORTED) until its creation is
    // written, and answered only then, so a crash after the answer keeps it.
    ASSIGN_OR_RETURN(SessionLease lease, table->CreateAcquired(principal, args.model, std::move(state), args.idle_ttl,
                                                               std::move(labels), absl::Now(), args.session_id,
                                                               /*durable=*/true));
    ASSIGN_OR_RETURN(SessionInfo info, table->Get(principal, lease.id));
    SessionExport fresh;  // an empty state: the journal rebuilds it from mem_len
    fresh.fingerprint = args.model->engine()->fingerprint();
    fresh.model = args.model->ref();
    RecordNewSession(journal, table, info, std::move(lease), EncodeSessionExport(fresh),
                     [done](absl::Status written, const SessionInfo& made) {
                       if (written.ok()) {
                         done(made);
                       } else {
                         done(written);
                       }
                     });
    return absl::OkStatus();
  });
}

void ServiceCore::GetSession(const std::string& principal, const std::string& id, SessionDone done) const {
  WithAdoption(
      principal, id,
      [this, principal, id, done]() -> absl::Status {
        ASSIGN_OR_RETURN(SessionInfo info, table->Get(principal, id));
        done(std::move(info));
        return absl::OkStatus();
      },
      done);
}

std::vector<SessionInfo> ServiceCore::ListSessions(const std::string& principal) const {
  return table->List(principal);
}

void ServiceCore::DeleteSession(const std::string& principal, const std::string& id, StatusDone done) const {
  // Waiting for room for its version (held here, out of the table): deleted
  // from the store as it is; if that fails, it waits again.
  if (journal != nullptr) {
    if (std::optional<SessionJournal::WaitingSession> waiting = journal->EndWait(id, principal)) {
      if (absl::Status w = journal->Writable(); !w.ok()) {
        journal->Wait(*std::move(waiting));
        done(w);
        return;
      }
      journal->RecordDelete(id, [journal = journal, waiting = *std::move(waiting), done](absl::Status written) {
        if (!written.ok()) journal->Wait(waiting);
        done(written);
      });
      return;
    }
  }
  WithAdoption(
      principal, id,
      [this, principal, id, done]() -> absl::Status {
        if (journal == nullptr) {
          RETURN_IF_ERROR(table->Delete(principal, id));
          done(absl::OkStatus());
          return absl::OkStatus();
        }
        // Journaled: busy until the state store has deleted it; if it
        // fails, the session stays (here and there) and the client is told.
        ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
        if (!lease.durable) {  // not journaled (a Converse stream's own session)
          table->Discard(std::move(lease));
          done(absl::OkStatus());
          return absl::OkStatus();
        }
        if (absl::Status w = journal->Writable(); !w.ok()) {
          table->Release(std::move(lease), absl::Now());
          return w;
        }
        auto held = std::make_shared<SessionLease>(std::move(lease));
        journal->RecordDelete(id, [this, done, held](absl::Status written) {
          if (written.ok()) {
            table->Discard(std::move(*held));
          } else {
            table->Release(std::move(*held), absl::Now());
          }
          done(written);
        });
        return absl::OkStatus();
      },
      done);
}

void ServiceCore::ForkSession(const std::string& principal, const std::string& id, int64_t position,
                              std::map<std::string, std::string> labels, SessionDone done) const {
  Try(done, [&]() -> absl::Status {
    RETURN_IF_ERROR(RequestValidator::HistoryPosition(position));
    RETURN_IF_ERROR(RequestValidator::Labels(labels));
    WithAdoption(
        principal, id,
        [this, principal, id, labels, position, done]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
          auto source = table->Get(principal, id);  // the fork keeps its ttl
          return scheduler
              ->SubmitFork(std::move(lease), source.ok() ? source->idle_ttl : absl::ZeroDuration(), labels, position,
                           done)
              .status();
        },
        done);
    return absl::OkStatus();
  });
}

void ServiceCore::RewindSession(const std::string& principal, const std::string& id, int64_t position,
                                SessionDone done) const {
  Try(done, [&]() -> absl::Status {
    RETURN_IF_ERROR(RequestValidator::HistoryPosition(position));
    WithAdoption(
        principal, id,
        [this, principal, id, position, done]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
          auto rewound = [this, principal, id, done](absl::Status s) {
            if (!s.ok()) {
              done(s);
              return;
            }
            done(table->Get(principal, id));
          };
          return scheduler->SubmitRewind(std::move(lease), position, std::move(rewound)).status();
        },
        done);
    return absl::OkStatus();
  });
}

void ServiceCore::MigrateSession(const std::string& principal, const std::string& id, const std::string& model,
                                 SessionDone done) const {
  Try(done, [&]() -> absl::Status {
    if (model.empty()) return absl::InvalidArgumentError("model: required (the version to migrate the session to)");
    ASSIGN_OR_RETURN(std::shared_ptr<ServedModel> to, Model(model));
    WithAdoption(
        principal, id,
        [this, principal, id, to, done]() -> absl::Status {
          ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
          if (lease.model->name() != to->name()) {  // another model: its history means nothing there
            const std::string on = lease.model->ref();
            table->Release(std::move(lease), absl::Now());
            return absl::InvalidArgumentError(absl::StrCat("model: a session moves between versions of its own model (",
                                                           on, "), not to ", to->ref()));
          }
          if (lease.model->config().n_token != to->config().n_token ||
              !lease.model->tokenizer().SameVocabulary(to->tokenizer())) {
            const std::string on = lease.model->ref();
            table->Release(std::move(lease), absl::Now());
            return absl::FailedPreconditionError(absl::StrCat("model: ", to->ref(), " has another vocabulary than ", on,
                                                              ", so the session's history cannot be read by it"));
          }
          if (lease.model == to) {
            table->Release(std::move(lease), absl::Now());
            done(table->Get(principal, id));
            return absl::OkStatus();
          }
          // Its window stays: the version's limits.json may allow less.
          const int64_t mem_len = table->Get(principal, id).value_or(SessionInfo()).mem_len;
          if (const int64_t most = Limits(to.get()).max_mem_len; mem_len > most) {
            table->Release(std::move(lease), absl::Now());
            return absl::FailedPreconditionError(absl::StrCat("model: the session's mem_len ", mem_len,
                                                              " is more than ", to->ref(), " allows (max_mem_len ",
                                                              most, ")"));
          }
          auto migrated = [this, principal, id, done](absl::Status s) {
            if (!s.ok()) return done(s);
            done(table->Get(principal, id));
          };
          return scheduler->SubmitMigrate(std::move(lease), to, std::move(migrated)).status();
        },
        done);
    return absl::OkStatus();
  });
}

}  // namespace txl

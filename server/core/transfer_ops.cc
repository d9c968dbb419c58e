// ServiceCore's transfers (service_core.h): a session's image out of this
// server and into another, and the sessions a stream keeps for itself.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/core/service_core.h"
#include "server/sessions/session_export.h"

namespace txl {

void ServiceCore::ExportSession(const std::string& principal, const std::string& id,
                                std::function<void(absl::StatusOr<std::string>)> done) const {
  WithAdoption(
      principal, id,
      [this, principal, id, done]() -> absl::Status {
        ASSIGN_OR_RETURN(SessionLease lease, table->Acquire(principal, id, absl::Now()));
        return scheduler->SubmitExport(std::move(lease), done).status();
      },
      [done](absl::Status s) { done(s); });
}

void ServiceCore::ImportSession(const std::string& principal, NewSessionArgs args,
                                std::map<std::string, std::string> labels, const std::string& data,
                                SessionDone done) const {
  absl::Status s = [&]() -> absl::Status {
    RETURN_IF_ERROR(RequestValidator::Labels(labels));
    ASSIGN_OR_RETURN(SessionExport image, DecodeSessionExport(data));
    // The version whose weights made it, whatever the request would name.
    auto model = models->WithFingerprint(image.fingerprint);
    if (!model.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("import: the session was exported from model ",
                       image.model.empty() ? "" : absl::StrCat(image.model, ", fingerprint "), image.fingerprint,
                       "; this server serves ", models->DescribeReady()));
    }
    if (scheduler->draining()) return absl::UnavailableError("the server is shutting down");
    ImportSpec spec;
    spec.owner = principal;
    spec.model = *std::move(model);
    image.model = spec.model->ref();  // journaled as the version it now runs on
    spec.image = std::move(image);
    spec.idle_ttl = args.idle_ttl;
    spec.labels = std::move(labels);
    spec.id = args.session_id;
    spec.max_mem_len = Limits(spec.model.get()).max_mem_len;  // the version's, with its model's limits.json
    return scheduler->SubmitImport(std::move(spec), done).status();
  }();
  if (!s.ok()) done(s);
}

absl::StatusOr<std::string> ServiceCore::NewStreamSession(const std::string& principal,
                                                          std::shared_ptr<ServedModel> model) const {
  ASSIGN_OR_RETURN(std::unique_ptr<SessionState> state, model->engine()->NewSession(DefaultMemLen(*model)));
  ASSIGN_OR_RETURN(SessionInfo info,
                   table->Create(principal, std::move(model), std::move(state), absl::ZeroDuration(), {}, absl::Now()));
  return info.id;
}

void ServiceCore::DropStreamSession(const std::string& principal, const std::string& id) const {
  (void)table->Delete(principal, id);
}

}  // namespace txl

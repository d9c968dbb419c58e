#include "base/status_macros.h"
#include "server/durability/recovery.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {

AdoptJob::AdoptJob(std::string caller, std::string id, RecordModel model_of, JobDone done)
    : caller_(std::move(caller)), id_(std::move(id)), model_of_(std::move(model_of)), done_(std::move(done)) {}

void AdoptJob::Run(JobRunner& runner) {
  auto adopted = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(JournalRecord record, runner.journal()->Adopt(id_, caller_));
    auto model = model_of_(record);
    if (!model.ok()) {
      runner.journal()->RecordRelease(id_);  // claimed, but for a replica that serves its model
      return model.status();
    }
    absl::Status s = AddRecordedSession(record, *std::move(model), runner.table());
    return absl::IsAlreadyExists(s) ? absl::OkStatus() : s;  // a concurrent adoption got here first
  }();
  runner.Finish(*this, adopted);
}

}  // namespace txl

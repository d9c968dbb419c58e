#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {

ExportJob::ExportJob(SessionLease session, JobCallbacks cb) {
  lease = std::move(session);
  callbacks = std::move(cb);
}

void ExportJob::Run(JobRunner& runner) {
  auto image = runner.ExportImage(lease);
  if (image.ok()) result.exported = *std::move(image);
  runner.Finish(*this, image.status());
}

}  // namespace txl

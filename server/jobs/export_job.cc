#include "server/jobs/job_runner.h"
#include "server/jobs/session_jobs.h"

namespace txl {

ExportJob::ExportJob(SessionLease session, ExportDone done) : done_(std::move(done)) { lease = std::move(session); }

void ExportJob::Run(JobRunner& runner) {
  auto image = runner.ExportImage(lease);
  if (image.ok()) bytes_ = *std::move(image);
  runner.Finish(*this, image.status());
}

}  // namespace txl

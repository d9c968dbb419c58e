// The core's one way to answer with a job's result: a job ends with a status
// and a JobResult; a caller waits for a StatusOr of the one field it asked
// for (the new session of a fork or an import, an export's bytes).
// Internal to server/core/.
#ifndef TXL_SERVER_CORE_JOB_ANSWER_H_
#define TXL_SERVER_CORE_JOB_ANSWER_H_

#include <functional>
#include <utility>

#include "absl/status/statusor.h"
#include "server/jobs/job.h"

namespace txl {

// An on_done that hands `done` the result's `field`, or the job's error.
template <typename T>
std::function<void(absl::Status, JobResult)> AnswerWith(std::function<void(absl::StatusOr<T>)> done,
                                                        T JobResult::*field) {
  return [done = std::move(done), field](absl::Status status, JobResult result) {
    if (status.ok()) {
      done(std::move(result.*field));
    } else {
      done(std::move(status));
    }
  };
}

}  // namespace txl

#endif  // TXL_SERVER_CORE_JOB_ANSWER_H_

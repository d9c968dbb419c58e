// One job's callbacks collected for a test, which can then wait for its end
// (the serving-core tests against the fake engine).
#ifndef TXL_TESTS_SERVER_JOB_OUTCOME_H_
#define TXL_TESTS_SERVER_JOB_OUTCOME_H_

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/jobs/job.h"

namespace txl::testing {

struct Outcome {
  std::vector<int> ids;
  std::vector<std::vector<std::pair<int, float>>> top;  // each token's alternatives
  std::string text;
  std::vector<int64_t> positions;
  absl::Status status;
  JobResult result;
  absl::Notification done;

  JobCallbacks Callbacks() {
    JobCallbacks cb;
    cb.on_tokens = [this](std::vector<GeneratedTokenEvent> events, int64_t position) {
      for (auto& e : events) {
        ids.push_back(e.id);
        top.push_back(e.top);
        text += e.text;
      }
      positions.push_back(position);
    };
    cb.on_done = [this](absl::Status s, JobResult r) {
      status = std::move(s);
      result = std::move(r);
      done.Notify();
    };
    return cb;
  }
  void Wait() { ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30))); }
};

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_JOB_OUTCOME_H_

// One job's callbacks collected for a test, which can then wait for its end
// (the serving-core tests against the fake engine).
#ifndef TXL_TESTS_SERVER_JOB_OUTCOME_H_
#define TXL_TESTS_SERVER_JOB_OUTCOME_H_

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/jobs/job_results.h"

namespace txl::testing {

// One job's answer, whichever its kind: Callbacks() for a generation,
// Scored() for a score, Made() for a fork or an import, Ended() for a rewind.
struct Outcome {
  std::vector<int> ids;
  std::vector<std::vector<std::pair<int, float>>> top;  // each token's alternatives
  std::string text;
  std::vector<int64_t> positions;
  std::vector<ScoredTokenResult> echo;      // a generation's echoed input, from its first token's event
  std::vector<GeneratedTokenEvent> events;  // as they came
  absl::Status status;
  GenerateResult result;
  ScoreResult score;
  SessionInfo made;
  absl::Notification done;

  GenerateCallbacks Callbacks() {
    GenerateCallbacks cb;
    cb.on_tokens = [this](std::vector<GeneratedTokenEvent> events, int64_t position) {
      for (auto& e : events) {
        this->events.push_back(e);
        echo.insert(echo.end(), e.echo.begin(), e.echo.end());
        ids.push_back(e.id);
        top.push_back(e.top);
        text += e.text;
      }
      positions.push_back(position);
    };
    cb.on_done = [this](absl::Status s, GenerateResult r) {
      result = std::move(r);
      End(std::move(s));
    };
    return cb;
  }
  ScoreDone Scored() {
    return [this](absl::Status s, ScoreResult r) {
      score = std::move(r);
      End(std::move(s));
    };
  }
  SessionMade Made() {
    return [this](absl::StatusOr<SessionInfo> info) {
      if (info.ok()) made = *info;
      End(info.status());
    };
  }
  JobDone Ended() {
    return [this](absl::Status s) { End(std::move(s)); };
  }
  void Wait() { ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30))); }

 private:
  void End(absl::Status s) {
    status = std::move(s);
    done.Notify();
  }
};

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_JOB_OUTCOME_H_

// SchedulerTest: a scheduler over a session table and the fake engine, and
// the helpers its tests share (sessions, leases, generation specs, the fed
// history, a hook on the engine thread at a chosen token).
#ifndef TXL_TESTS_SERVER_BATCHING_SCHEDULER_FIXTURE_H_
#define TXL_TESTS_SERVER_BATCHING_SCHEDULER_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/batching/scheduler.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_outcome.h"

namespace txl::testing {

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(SchedulerConfig config = {}) { scheduler_ = std::make_unique<Scheduler>(config, &table_, nullptr); }
  std::string NewSession(int64_t mem_len = 64) {
    auto info = table_.Create("", served_, *engine_.NewSession(mem_len), absl::ZeroDuration(), {}, absl::Now());
    EXPECT_TRUE(info.ok()) << info.status();
    return info->id;
  }
  SessionLease Lease(const std::string& id) {
    auto lease = table_.Acquire("", id, absl::Now());
    EXPECT_TRUE(lease.ok()) << lease.status();
    return *std::move(lease);
  }
  GenerateSpec Spec(std::vector<int> input, int max_new) {
    GenerateSpec s;
    s.input = std::move(input);
    s.max_new_tokens = max_new;
    return s;
  }
  // The fake session's fed history, read while the session is idle.
  std::vector<int> History(const std::string& id) {
    auto lease = Lease(id);
    std::vector<int> h = static_cast<FakeSession*>(lease.state.get())->history;
    h.insert(h.end(), lease.pending.begin(), lease.pending.end());
    table_.Release(std::move(lease), absl::Now());
    return h;
  }

  // Submits a generation whose `at`-th token calls `hook(job)` on the engine
  // thread, before its next step: deterministic, unlike acting from the test's thread.
  std::shared_ptr<Job> SubmitWithHook(const std::string& id, GenerateSpec spec, Outcome& o, size_t at,
                                      std::function<void(const std::shared_ptr<Job>&)> hook) {
    // Weak: the job holds this callback, so a strong reference would keep both alive forever.
    auto job = std::make_shared<std::weak_ptr<Job>>();
    GenerateCallbacks cb = o.Callbacks();
    cb.on_tokens = [&o, inner = cb.on_tokens, at, hook, job](std::vector<GeneratedTokenEvent> ev, int64_t pos) {
      inner(std::move(ev), pos);
      if (o.ids.size() == at) hook(job->lock());
    };
    auto submitted = scheduler_->SubmitGenerate(Lease(id), std::move(spec), std::move(cb));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return nullptr;
    *job = *submitted;
    return *submitted;
  }

  // A generation whose step fails with `injected`: the status it ends with,
  // and whether its session was left as it was.
  absl::Status FailedStep(absl::Status injected, bool* unchanged) {
    Make();
    const std::string id = NewSession();
    Outcome first;
    EXPECT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({1, 2, 3}, 2), first.Callbacks()).ok());
    scheduler_->Start();
    first.Wait();
    const std::vector<int> before = History(id);
    engine_.FailNextStep(std::move(injected));
    Outcome failed;
    EXPECT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({9}, 2), failed.Callbacks()).ok());
    failed.Wait();
    *unchanged = History(id) == before && !table_.Get("", id)->busy;
    return failed.status;
  }

  std::shared_ptr<ServedModel> served_ = FakeServed();
  FakeEngine& engine_ = FakeOf(*served_);
  SessionTable table_{SessionTableConfig{}};
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace txl::testing

#endif  // TXL_TESTS_SERVER_BATCHING_SCHEDULER_FIXTURE_H_

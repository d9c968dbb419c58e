// JobControl (server/core/job_control.h): which job a front end holds.
#include "server/core/job_control.h"

#include <gtest/gtest.h>

#include <memory>

namespace txl {
namespace {

class NoopJob : public Job {
 public:
  void Run(JobRunner&) override {}
  Answer TakeAnswer() override { return nullptr; }
};

TEST(JobControlTest, AJobThatEndedBeforeItWasAttachedIsNotKept) {
  JobControl control(nullptr);  // neither cancelled nor paused: the scheduler is never called
  auto job = std::make_shared<NoopJob>();
  control.Detach();  // the engine thread finished the job before the core attached it
  control.Attach(job);
  EXPECT_FALSE(control.holds_job());
  EXPECT_EQ(job.use_count(), 1);  // a call keeping it would keep its callbacks too
}

TEST(JobControlTest, AJobIsHeldFromAttachToItsEndAndTheNextTurnsToo) {
  JobControl control(nullptr);
  auto first = std::make_shared<NoopJob>();
  control.Attach(first);
  EXPECT_TRUE(control.holds_job());
  control.Detach();
  EXPECT_FALSE(control.holds_job());
  EXPECT_EQ(first.use_count(), 1);
  auto next = std::make_shared<NoopJob>();  // a Converse stream's next turn
  control.Attach(next);
  EXPECT_TRUE(control.holds_job());
  control.Detach();
  EXPECT_FALSE(control.holds_job());
}

// The choices of one call (ServiceCore::Generate with n > 1) each run under
// a child control: what the call does reaches each job, attached before or after.
TEST(JobControlTest, ACancelOrAPauseReachesEveryChildJobWhenEverItIsAttached) {
  SessionTable table{SessionTableConfig{}};
  Scheduler scheduler(SchedulerConfig{}, &table, nullptr);  // not started: Cancel and Pause only mark jobs
  JobControl call(&scheduler);
  auto early = std::make_shared<NoopJob>();
  std::shared_ptr<JobControl> first = call.AddChild();
  first->Attach(early);
  EXPECT_TRUE(call.holds_job()) << "a child's job is the call's";
  call.Pause();
  EXPECT_NE(early->paused_since.load(), 0);
  call.Resume();
  EXPECT_EQ(early->paused_since.load(), 0);
  call.Pause();
  call.Cancel();
  EXPECT_TRUE(early->cancelled.load());
  auto late = std::make_shared<NoopJob>();  // a choice started after the cancel
  std::shared_ptr<JobControl> second = call.AddChild();
  second->Attach(late);
  EXPECT_TRUE(late->cancelled.load());
  EXPECT_NE(late->paused_since.load(), 0);
  first->Detach();
  second->Detach();
  EXPECT_FALSE(call.holds_job());
}

}  // namespace
}  // namespace txl

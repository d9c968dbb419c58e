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

}  // namespace
}  // namespace txl

// AbandonedCallStatus: how a call its client gave up on is counted.
#include <gtest/gtest.h>

#include <chrono>

#include "server/grpc/call_context.h"

namespace txl {
namespace {

using Clock = std::chrono::system_clock;
using std::chrono::milliseconds;

TEST(AbandonedCallStatusTest, APassedDeadlineIsDeadlineExceeded) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(AbandonedCallStatus(now - milliseconds(5), now).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(AbandonedCallStatus(now, now).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// The client's library gives up when its own deadline passes, which runs
// ahead of the server's by the request's transit; its cancel arrives before
// the server's deadline (CI saw a Score with a 0.3 s deadline counted CANCELLED).
TEST(AbandonedCallStatusTest, ACancelJustBeforeTheDeadlineIsTheDeadline) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(AbandonedCallStatus(now + milliseconds(40), now).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(AbandonedCallStatus(now + kDeadlineSlack, now).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST(AbandonedCallStatusTest, AnEarlierCancelIsACancel) {
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(AbandonedCallStatus(now + kDeadlineSlack + milliseconds(1), now).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(AbandonedCallStatus(now + std::chrono::seconds(60), now).error_code(), grpc::StatusCode::CANCELLED);
  // A call without a deadline: gRPC's deadline() is the time point's maximum.
  EXPECT_EQ(AbandonedCallStatus(Clock::time_point::max(), now).error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace txl

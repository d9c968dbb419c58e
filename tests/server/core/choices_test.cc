// ServiceCore::Generate with several choices (n, best_of: server/core/choices.h
// and server/jobs/branch_job.h) against the fake engine: the prompt fed
// once, each choice's seed stream, best_of's ranking, refusals and cancels.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/core/responses.h"
#include "server/core/service_core.h"
#include "server/engine/model_source.h"
#include "tests/server/fake_engine.h"

namespace txl {
namespace {

using testing::FakeEngine;
using testing::FakeOf;

// One call's callbacks, by choice; `dones` counts on_done (it must run once).
struct Call {
  absl::Mutex mu;
  std::map<int, std::vector<int>> ids ABSL_GUARDED_BY(mu);
  std::map<int, double> logprob ABSL_GUARDED_BY(mu);
  // With ends as they come: what came, in order ({choice, true} for an end).
  bool ends_as_they_come = false;
  std::vector<std::pair<int, bool>> order ABSL_GUARDED_BY(mu);
  std::vector<ChoiceEnd> ends ABSL_GUARDED_BY(mu);
  int dones ABSL_GUARDED_BY(mu) = 0;
  absl::Status status;
  GenerateResult result;
  absl::Notification first_token, done;

  GenerateCallbacks Callbacks() {
    GenerateCallbacks cb;
    cb.on_tokens = [this](std::vector<GeneratedTokenEvent> events, int64_t) {
      {
        absl::MutexLock lock(&mu);
        for (const GeneratedTokenEvent& e : events) {
          ids[e.choice].push_back(e.id);
          logprob[e.choice] += e.logprob;
          order.emplace_back(e.choice, false);
        }
      }
      if (!first_token.HasBeenNotified()) first_token.Notify();
    };
    if (ends_as_they_come) {
      cb.on_choice_end = [this](ChoiceEnd end) {
        absl::MutexLock lock(&mu);
        order.emplace_back(end.index, true);
        ends.push_back(std::move(end));
      };
    }
    cb.on_done = [this](absl::Status s, GenerateResult r) {
      {
        absl::MutexLock lock(&mu);
        if (++dones > 1) return;  // counted, and reported by the test
      }
      status = std::move(s);
      result = std::move(r);
      done.Notify();
    };
    return cb;
  }
  void Wait() { ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30))); }
  std::vector<int> Ids(int choice) {
    absl::MutexLock lock(&mu);
    return ids[choice];
  }
  double Logprob(int choice) {
    absl::MutexLock lock(&mu);
    return logprob[choice];
  }
  int Dones() {
    absl::MutexLock lock(&mu);
    return dones;
  }
};

class ChoicesTest : public ::testing::Test {
 protected:
  void Make(SessionTableConfig table_config = {}, SchedulerConfig config = {}) {
    table_ = std::make_unique<SessionTable>(table_config);
    scheduler_ = std::make_unique<Scheduler>(config, table_.get(), nullptr);
    scheduler_->Start();
    ServiceParts parts;
    parts.models = models_.get();
    parts.table = table_.get();
    parts.scheduler = scheduler_.get();
    core_ = std::make_unique<ServiceCore>(std::move(parts));
  }
  void TearDown() override {
    core_.reset();
    scheduler_.reset();
  }
  GenerateArgs Args(int n, int best_of, int max_new, float temperature = 0, uint64_t seed = 0) {
    GenerateArgs args;
    args.model = served_;
    args.n = n;
    args.best_of = best_of;
    args.spec.input = prompt_;
    args.spec.max_new_tokens = max_new;
    args.spec.sampling.temperature = temperature;
    args.spec.sampling.seed = seed;
    return args;
  }
  // Starts the call; `control` may be kept to cancel it.
  void Start(GenerateArgs args, Call* call, std::shared_ptr<JobControl> control = nullptr) {
    core_->Generate("", std::move(args), /*adopt=*/false, control ? control : core_->NewJobControl(),
                    call->Callbacks());
  }
  int64_t FedTokens() const {
    int64_t n = 0;
    for (const auto& step : FakeOf(*served_).steps()) n += step.tokens;
    return n;
  }
  bool NoSessionLeft() const { return table_->SessionsByModel().empty(); }

  const std::vector<int> prompt_ = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  std::shared_ptr<ServedModel> served_ = testing::FakeServed();
  std::unique_ptr<ModelSource> models_ = SingleModel(served_);
  std::unique_ptr<SessionTable> table_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ServiceCore> core_;
};

TEST_F(ChoicesTest, ThePromptIsFedOnceAndEveryChoiceGoesOnFromIt) {
  Make();
  Call call;
  Start(Args(/*n=*/3, /*best_of=*/3, /*max_new=*/4), &call);
  call.Wait();
  ASSERT_TRUE(call.status.ok()) << call.status;
  EXPECT_EQ(call.Dones(), 1);
  ASSERT_EQ(call.result.choices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(call.Ids(i), (std::vector<int>{20, 21, 22, 23})) << "greedy: each goes on from the whole prompt";
    EXPECT_EQ(call.result.choices[i].index, i);
    EXPECT_EQ(call.result.choices[i].generated_tokens, 4);
    EXPECT_EQ(call.result.choices[i].finish, Finish::kLength);
  }
  EXPECT_EQ(call.result.input_tokens, 10) << "the prompt counted once";
  EXPECT_EQ(call.result.generated_tokens, 12);
  // The first 9 prompt tokens once; then each choice feeds the last one and
  // 3 of its 4 tokens (the last stays pending). Three separate calls: 39.
  EXPECT_EQ(FedTokens(), 9 + 3 * (1 + 3));
  EXPECT_TRUE(NoSessionLeft()) << "every copy is thrown away at its end";
}

TEST_F(ChoicesTest, EachChoiceDrawsFromItsOwnSeedStreamAndSeededCallsRepeat) {
  Make();
  Call together;
  Start(Args(3, 3, 16, /*temperature=*/1, /*seed=*/7), &together);
  together.Wait();
  ASSERT_TRUE(together.status.ok()) << together.status;
  std::vector<std::vector<int>> alone;
  for (int i = 0; i < 3; ++i) {
    Call single;
    Start(Args(1, 1, 16, 1, 7 + i), &single);
    single.Wait();
    ASSERT_TRUE(single.status.ok()) << single.status;
    EXPECT_TRUE(single.result.choices.empty()) << "one choice: the plain result";
    alone.push_back(single.Ids(0));
    EXPECT_EQ(together.Ids(i), alone.back()) << "choice " << i << " draws as a call seeded " << 7 + i;
  }
  EXPECT_FALSE(alone[0] == alone[1] && alone[1] == alone[2]) << "the seeds chosen here draw different texts";
  Call again;
  Start(Args(3, 3, 16, 1, 7), &again);
  again.Wait();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.Ids(i), together.Ids(i));
}

// A choice that ends before the others goes to the transport as it ends,
// after its tokens and while the others go on; on_done's result marks it
// sent, and FinalResponses leaves it out (the last one's carries the usage).
TEST_F(ChoicesTest, AChoiceThatEndsFirstIsSentAsItEnds) {
  Make();
  int checked = 0;
  for (uint64_t seed = 1; seed <= 40 && checked < 3; ++seed) {
    GenerateArgs args = Args(3, 3, 12, /*temperature=*/1, seed);
    args.spec.stop_token_ids = {22};  // the fake model counts 20, 21, 22 unless a draw strays
    Call call;
    call.ends_as_they_come = true;
    Start(std::move(args), &call);
    call.Wait();
    ASSERT_TRUE(call.status.ok()) << call.status;
    absl::MutexLock lock(&call.mu);
    std::map<int, int64_t> lengths;
    for (const ChoiceEnd& c : call.result.choices) lengths[c.index] = c.generated_tokens;
    if (lengths[0] == lengths[1] && lengths[1] == lengths[2]) continue;  // they end in one step
    ++checked;
    SCOPED_TRACE(seed);
    ASSERT_FALSE(call.ends.empty());
    for (const ChoiceEnd& sent : call.ends) {
      // Its end came after all its tokens, and before the longest choice's last token.
      const auto at = std::find(call.order.begin(), call.order.end(), std::make_pair(sent.index, true));
      EXPECT_EQ(std::count(at, call.order.end(), std::make_pair(sent.index, false)), 0);
      int longest = 0;
      for (const auto& [i, n] : lengths) longest = n > lengths[longest] ? i : longest;
      if (lengths[sent.index] < lengths[longest]) {
        EXPECT_GT(std::count(at, call.order.end(), std::make_pair(longest, false)), 0);
      }
      EXPECT_TRUE(call.result.choices[static_cast<size_t>(sent.index)].sent);
      EXPECT_EQ(sent.generated_tokens, lengths[sent.index]);
    }
    const std::vector<v1::GenerateResponse> last = FinalResponses(call.result, served_->tokenizer());
    EXPECT_EQ(last.size() + call.ends.size(), 3u) << "each end once";
    EXPECT_TRUE(last.back().has_usage());
    EXPECT_EQ(last.back().usage().generated_tokens(), lengths[0] + lengths[1] + lengths[2]);
  }
  EXPECT_EQ(checked, 3) << "seeds whose choices end at different steps";
  // Without the callback, every end comes with on_done, as before.
  Call plain;
  GenerateArgs args = Args(3, 3, 12, 1, 1);
  args.spec.stop_token_ids = {22};
  Start(std::move(args), &plain);
  plain.Wait();
  for (const ChoiceEnd& c : plain.result.choices) EXPECT_FALSE(c.sent);
  EXPECT_EQ(FinalResponses(plain.result, served_->tokenizer()).size(), 3u);
  // best_of above n: which candidates are kept is known only at the end, so no end goes early.
  Call best;
  best.ends_as_they_come = true;
  args = Args(2, 3, 12, 1, 1);
  args.spec.stop_token_ids = {22};
  Start(std::move(args), &best);
  best.Wait();
  ASSERT_TRUE(best.status.ok()) << best.status;
  absl::MutexLock lock(&best.mu);
  EXPECT_TRUE(best.ends.empty());
  EXPECT_EQ(best.result.choices.size(), 2u);
}

// A seed whose stream wraps skips 0, which would mean "a fresh random seed".
TEST_F(ChoicesTest, ASeedStreamThatWrapsStaysSeeded) {
  Make();
  const uint64_t last = std::numeric_limits<uint64_t>::max();
  Call together, after_the_wrap;
  Start(Args(2, 2, 16, 1, last), &together);
  Start(Args(1, 1, 16, 1, 1), &after_the_wrap);
  together.Wait();
  after_the_wrap.Wait();
  EXPECT_EQ(together.Ids(1), after_the_wrap.Ids(0));
}

// Regression: the choices went through the admission of a new request, so
// a call whose prompt had been fed failed when the queue was full (or the
// server draining) as they were submitted.
TEST_F(ChoicesTest, ACallAdmittedOnceIsNotRefusedForItsChoices) {
  SchedulerConfig config;
  config.max_queue = 1;  // the call's one place: its BranchJob's
  Make({}, config);
  Call call;
  Start(Args(3, 3, 4), &call);
  call.Wait();
  EXPECT_TRUE(call.status.ok()) << call.status;
  EXPECT_EQ(call.result.choices.size(), 3u);
  EXPECT_TRUE(NoSessionLeft());
}

TEST_F(ChoicesTest, BestOfKeepsTheNWithTheHighestTotalLogProbBestFirst) {
  Make();
  // Each candidate as a call of its own: choice i of a seeded call draws as one seeded seed + i.
  std::vector<std::pair<double, std::vector<int>>> candidates;
  for (int i = 0; i < 4; ++i) {
    Call single;
    Start(Args(1, 1, 12, 1, 5 + i), &single);
    single.Wait();
    ASSERT_TRUE(single.status.ok()) << single.status;
    candidates.emplace_back(single.Logprob(0), single.Ids(0));
  }
  std::vector<size_t> best = {0, 1, 2, 3};
  std::stable_sort(best.begin(), best.end(),
                   [&](size_t a, size_t b) { return candidates[a].first > candidates[b].first; });
  ASSERT_NE(candidates[best[1]].first, candidates[best[2]].first) << "a tie at the cut: pick other seeds";
  Call call;
  Start(Args(/*n=*/2, /*best_of=*/4, 12, 1, 5), &call);
  call.Wait();
  ASSERT_TRUE(call.status.ok()) << call.status;
  ASSERT_EQ(call.result.choices.size(), 2u);
  EXPECT_EQ(call.Ids(0), candidates[best[0]].second);
  EXPECT_EQ(call.Ids(1), candidates[best[1]].second);
  EXPECT_TRUE(call.Ids(2).empty()) << "the others never reach the transport";
  EXPECT_EQ(call.result.generated_tokens, 4 * 12) << "every candidate's tokens are counted";
  EXPECT_TRUE(NoSessionLeft());
}

TEST_F(ChoicesTest, ACopyTheTableRefusesFailsTheCallOnceAndLeavesNoSession) {
  SessionTableConfig config;
  config.max_sessions_per_principal = 2;  // each choice is a session
  Make(config);
  Call call;
  Start(Args(3, 3, 4), &call);
  call.Wait();
  EXPECT_TRUE(absl::IsResourceExhausted(call.status)) << call.status;
  EXPECT_TRUE(NoSessionLeft());
  Call fits;  // two choices fit
  Start(Args(2, 2, 4), &fits);
  fits.Wait();
  EXPECT_TRUE(fits.status.ok()) << fits.status;
  EXPECT_EQ(call.Dones(), 1);
}

TEST_F(ChoicesTest, ACancelEndsEveryChoiceAndTheCallIsAnsweredOnce) {
  Make();
  Call call;
  std::shared_ptr<JobControl> control = core_->NewJobControl();
  Start(Args(3, 3, 4000), &call, control);
  ASSERT_TRUE(call.first_token.WaitForNotificationWithTimeout(absl::Seconds(30)));
  control->Cancel();
  call.Wait();
  ASSERT_TRUE(call.status.ok()) << call.status;
  ASSERT_EQ(call.result.choices.size(), 3u);
  for (const ChoiceEnd& c : call.result.choices) {
    EXPECT_EQ(c.finish, Finish::kCancelled) << c.index;
    EXPECT_LT(c.generated_tokens, 4000) << c.index;
  }
  EXPECT_EQ(call.Dones(), 1);
  EXPECT_TRUE(NoSessionLeft());
}

TEST_F(ChoicesTest, ACallWithNothingToFeedIsRefusedBeforeAnyJob) {
  Make();
  Call call;
  GenerateArgs args = Args(2, 2, 4);
  args.spec.input.clear();
  Start(std::move(args), &call);
  call.Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(call.status)) << call.status;
  EXPECT_EQ(FedTokens(), 0);
  EXPECT_TRUE(NoSessionLeft());
}

}  // namespace
}  // namespace txl

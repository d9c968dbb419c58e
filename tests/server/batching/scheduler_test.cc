// The scheduler against a fake engine: history bookkeeping, batching,
// chunked prefill, limits, cancellation, scoring and forks. (Rewinds and
// forks at a position: rewind_test.cc.)
#include "server/batching/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "server/core/responses.h"
#include "tests/server/batching/scheduler_fixture.h"
#include "tests/server/fake_engine.h"
#include "tests/server/job_outcome.h"

namespace txl {
namespace {

using testing::FakeSession;
using testing::Outcome;
using testing::SchedulerTest;

// A fake word-level model of the words a, b, c and <eos> (it counts: a, b,
// c, <eos>, a, ...).
std::shared_ptr<ServedModel> FakeWordModel() {
  ModelConfig config;
  config.n_token = 4;
  return std::make_shared<ServedModel>("words", 1, std::make_unique<testing::FakeEngine>(4), config,
                                       *Tokenizer::WordFromSymbols({"a", "b", "c", "<eos>"}));
}

TEST_F(SchedulerTest, GenerateFeedsInputAndKeepsEveryTokenInHistory) {
  Make();
  scheduler_->Start();
  const std::string id = NewSession();
  Outcome a;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({'a', 'b'}, 3), a.Callbacks()).ok());
  a.Wait();
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.ids, (std::vector<int>{'c', 'd', 'e'}));
  EXPECT_EQ(a.text, "cde");
  EXPECT_EQ(a.positions, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(a.result.finish, Finish::kLength);
  EXPECT_EQ(a.result.position, 5);
  EXPECT_EQ(a.result.generated_tokens, 3);
  EXPECT_EQ(History(id), (std::vector<int>{'a', 'b', 'c', 'd', 'e'}));

  // No input: continue from the history (the pending 'e' is fed first).
  Outcome b;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({}, 2), b.Callbacks()).ok());
  b.Wait();
  EXPECT_EQ(b.ids, (std::vector<int>{'f', 'g'}));
  EXPECT_EQ(table_.Get("", id)->position, 7);
  EXPECT_FALSE(table_.Get("", id)->busy);
}

// Constrained output: each token is drawn from those whose text can continue
// the grammar, and the generation ends, as at a stop token, once the text is
// a whole root; max_new_tokens cuts it short, a valid prefix.
TEST_F(SchedulerTest, AGrammarHoldsTheOutputToItAndEndsItWhenWhole) {
  Make();
  scheduler_->Start();
  // The fake model counts (q, r, s, ...); held to this, it stops at w, and its
  // other draws (a tenth of the mass, over every byte) stay in the classes.
  auto grammar = Grammar::Parse(R"(root ::= "r" [s-v]+ ("," [s-v]+)* "w")");
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    GenerateSpec spec = Spec({'q'}, 200);
    spec.sampling.temperature = 1.0f;
    spec.sampling.seed = seed;
    spec.grammar = *grammar;
    const std::string id = NewSession();
    Outcome o;
    ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), spec, o.Callbacks()).ok());
    o.Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    GrammarState check(*grammar);
    EXPECT_TRUE(check.Advance(o.text) && check.Complete()) << o.text;
    EXPECT_EQ(o.result.finish, Finish::kStopToken) << o.text;
  }
  GenerateSpec spec = Spec({'q'}, 2);
  spec.sampling.temperature = 1.0f;
  spec.grammar = *grammar;
  Outcome cut;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(NewSession()), spec, cut.Callbacks()).ok());
  cut.Wait();
  EXPECT_EQ(cut.result.finish, Finish::kLength);
  ASSERT_EQ(cut.text.size(), 2u);
  EXPECT_EQ(cut.text[0], 'r');
  EXPECT_TRUE(cut.text[1] >= 's' && cut.text[1] <= 'v') << cut.text;
}

// Under a grammar, greedy and plain temperatures keep the model's own pick,
// constrained (SamplingPlan::allowed): no whole row leaves the model, the
// tokens are ConstrainedPick's at the seed's two uniforms a token, and every
// log-prob (the token's, the alternatives') is the model's, before the
// mask. Top-k takes the whole row and masks it on the host.
TEST_F(SchedulerTest, AGrammarKeepsTheModelsPickConstrainedAndItsLogProbs) {
  Make();
  scheduler_->Start();
  auto grammar = Grammar::Parse(R"(root ::= "r" [s-v]+ ("," [s-v]+)* "w")");
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  auto masker = TokenMasker::Create(*grammar, served_->tokenizer());
  GenerateSpec spec = Spec({'q'}, 200);
  spec.sampling.temperature = 1.0f;
  spec.grammar = *grammar;
  spec.top_logprobs = 2;
  bool refused_some = false;  // a first pick the grammar refused, drawn again
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE(seed);
    spec.sampling.seed = seed;
    const int64_t picks = engine_.picks(), rows = engine_.distributions();
    Outcome o;
    ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(NewSession()), spec, o.Callbacks()).ok());
    o.Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(engine_.distributions() - rows, 0) << "no whole row left the model";
    EXPECT_EQ(engine_.picks() - picks, static_cast<int64_t>(o.ids.size()));
    Sampler uniforms(spec.sampling, 0);
    GrammarState state(*grammar);
    int last = 'q';
    ASSERT_EQ(o.events.size(), o.ids.size());
    for (size_t i = 0; i < o.ids.size(); ++i) {
      const std::vector<float> d = engine_.Distribution(last);
      SamplingPlan plan;
      plan.pick = SamplingPlan::Pick::kDraw;
      plan.uniform = uniforms.NextUniform();
      plan.fallback_uniform = uniforms.NextUniform();
      std::shared_ptr<const TokenMask> mask = masker->Next(state, false);
      plan.allowed = std::shared_ptr<const AllowedTokens>(mask, &mask->bits);
      const int first = DrawInIdOrder(d.data(), static_cast<int64_t>(d.size()), 1.0f, plan.uniform);
      refused_some |= !mask->bits.contains(first);
      ASSERT_EQ(o.ids[i], ConstrainedPick(d.data(), static_cast<int64_t>(d.size()), plan, first)) << i;
      EXPECT_EQ(o.events[i].logprob, d[static_cast<size_t>(o.ids[i])]) << "the model's own log-prob, " << i;
      EXPECT_EQ(o.events[i].top, TopN(d, 2)) << "the model's own alternatives, " << i;
      ASSERT_TRUE(state.Advance(std::string(1, static_cast<char>(o.ids[i]))));
      last = o.ids[i];
    }
    EXPECT_TRUE(state.Complete());
  }
  EXPECT_TRUE(refused_some) << "a tenth of the fake model's mass is on bytes the grammar refuses";

  spec.sampling.top_k = 3;  // the model's lists are not constrained: the whole row, masked here
  const int64_t rows_before = engine_.distributions();
  Outcome top_k;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(NewSession()), spec, top_k.Callbacks()).ok());
  top_k.Wait();
  ASSERT_TRUE(top_k.status.ok()) << top_k.status;
  EXPECT_EQ(engine_.distributions() - rows_before, static_cast<int64_t>(top_k.ids.size()));
  GrammarState check(*grammar);
  EXPECT_TRUE(check.Advance(top_k.text) && check.Complete()) << top_k.text;
  int last = 'q';
  for (size_t i = 0; i < top_k.ids.size(); ++i) {
    EXPECT_NEAR(top_k.events[i].logprob, engine_.Distribution(last)[static_cast<size_t>(top_k.ids[i])], 1e-5) << i;
    last = top_k.ids[i];
  }
}

// Regression: where no token can continue the grammar's text (a dead end),
// the call ends FAILED_PRECONDITION before a step feeds its last token. That
// step used to run: it fed the token, which was also left pending, so the
// session's history held it twice.
TEST_F(SchedulerTest, AGrammarsDeadEndFeedsNoTokenTwice) {
  Make();
  scheduler_->Start();
  auto served = FakeWordModel();
  auto info =
      table_.Create("", served, *testing::FakeOf(*served).NewSession(64), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(info.ok()) << info.status();
  auto grammar = Grammar::Parse(R"(root ::= " b" " x")");  // no word "x"
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  GenerateSpec spec = Spec({0}, 5);
  spec.grammar = *grammar;
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(info->id), spec, o.Callbacks()).ok());
  o.Wait();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition) << o.status;
  EXPECT_EQ(o.ids, (std::vector<int>{1}));
  EXPECT_EQ(History(info->id), (std::vector<int>{0, 1})) << "b once: pending, not fed";
  Outcome next;  // the fake model counts: after b, c
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(info->id), Spec({}, 1), next.Callbacks()).ok());
  next.Wait();
  ASSERT_TRUE(next.status.ok()) << next.status;
  EXPECT_EQ(next.ids, (std::vector<int>{2}));
  EXPECT_EQ(History(info->id), (std::vector<int>{0, 1, 2}));
}

// A word-level model's text is spaced as Tokenizer::Decode writes the same
// ids (words joined by spaces, <eos> as a newline), and a grammar holds that
// text: its masks see each word with the space before it.
TEST_F(SchedulerTest, AWordLevelModelsTextIsSpacedAsDecodeWritesItAndAGrammarHoldsIt) {
  Make();
  scheduler_->Start();
  auto served = FakeWordModel();
  const Tokenizer& words = served->tokenizer();
  auto session = [&] {
    auto info =
        table_.Create("", served, *testing::FakeOf(*served).NewSession(64), absl::ZeroDuration(), {}, absl::Now());
    EXPECT_TRUE(info.ok()) << info.status();
    return info->id;
  };
  Outcome greedy;  // the fake model counts: a, then b c <eos> a b
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(session()), Spec({0}, 5), greedy.Callbacks()).ok());
  greedy.Wait();
  ASSERT_TRUE(greedy.status.ok()) << greedy.status;
  EXPECT_EQ(greedy.text, " b c\na b");
  auto grammar = Grammar::Parse(R"(root ::= " b" (" " [a-c])* "\n")");
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  // The calls share the model's masker (as RequestValidator hands it out):
  // the places the first calls walked are look-ups for the later ones.
  auto checked = served->grammars().Get(R"(root ::= " b" (" " [a-c])* "\n")");
  ASSERT_TRUE(checked.ok()) << checked.status();
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE(seed);
    GenerateSpec spec = Spec({0}, 50);
    spec.sampling.temperature = 1.0f;
    spec.sampling.seed = seed;
    spec.grammar = checked->grammar;
    spec.masker = checked->masker;
    Outcome o;
    ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(session()), spec, o.Callbacks()).ok());
    o.Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.finish, Finish::kStopToken) << o.text;
    GrammarState check(*grammar);
    EXPECT_TRUE(check.Advance(o.text) && check.Complete()) << o.text;
    std::vector<int> all = {0};
    all.insert(all.end(), o.ids.begin(), o.ids.end());
    EXPECT_EQ("a" + o.text, *words.Decode(all));
  }
  EXPECT_LE(checked->masker->stats().walks, 4) << "two places, in two word contexts at most";
  EXPECT_GT(checked->masker->stats().reused, 10);
  // A masker made for another vocabulary is not used: the job makes its own.
  const Tokenizer other = *Tokenizer::WordFromSymbols({"a", "b", "c", "<eos>"});
  GenerateSpec spec = Spec({0}, 50);
  spec.grammar = checked->grammar;
  spec.masker = TokenMasker::Create(checked->grammar, other);
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(session()), spec, o.Callbacks()).ok());
  o.Wait();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.text, " b c\n");
  EXPECT_EQ(spec.masker->stats().walks + spec.masker->stats().reused, 0);
  // Alternatives and echoed input are spaced as the text is.
  spec = Spec({0, 1}, 2);
  spec.top_logprobs = 2;
  spec.echo = true;
  Outcome alts;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(session()), spec, alts.Callbacks()).ok());
  alts.Wait();
  ASSERT_TRUE(alts.status.ok()) << alts.status;
  ASSERT_EQ(alts.events.size(), 2u);
  const v1::GenerateResponse first = TokensResponse({alts.events[0]}, 3, words);
  EXPECT_EQ(first.tokens(0).text(), " c");
  EXPECT_EQ(first.tokens(0).top(0).text(), " c") << "the likeliest alternative is the token";
  ASSERT_EQ(first.echo_size(), 2);
  EXPECT_EQ(first.echo(0).text() + first.echo(1).text(), "a b");
  EXPECT_EQ(TokensResponse({alts.events[1]}, 4, words).tokens(0).text(), "\n");
}

// The engine picks the token itself (greedy, or a draw at any temperature),
// or lists the tokens the request needs (top-k candidates, top-N
// alternatives, a nucleus), so no n_token row leaves the model for any
// sampling setting. Every path gives the tokens that the sampler's walk
// over whole rows gives for the same seed.
TEST_F(SchedulerTest, TheModelPicksOrListsTheTokensSoNoWholeRowLeavesIt) {
  Make();
  scheduler_->Start();
  struct Run {
    std::vector<int> ids;
    std::vector<std::vector<std::pair<int, float>>> top;
    int64_t picks, rows, lists;
  };
  auto run = [&](SamplingConfig sampling, int top_logprobs) {
    GenerateSpec spec = Spec({'a'}, 30);
    sampling.seed = 9;
    spec.sampling = sampling;
    spec.top_logprobs = top_logprobs;
    Outcome o;
    const int64_t picks = engine_.picks(), rows = engine_.distributions(), lists = engine_.lists();
    EXPECT_TRUE(scheduler_->SubmitGenerate(Lease(NewSession()), std::move(spec), o.Callbacks()).ok());
    o.Wait();
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.ids.size(), 30u);
    return Run{o.ids, o.top, engine_.picks() - picks, engine_.distributions() - rows, engine_.lists() - lists};
  };
  // What Sampler::Sample draws from whole rows with the same seed.
  auto walk = [&](SamplingConfig sampling) {
    sampling.seed = 9;
    Sampler sampler(sampling, 0);
    std::vector<int> ids;
    int last = 'a';
    for (int i = 0; i < 30; ++i) ids.push_back(last = sampler.Sample(engine_.Distribution(last)));
    return ids;
  };
  auto config = [](float temperature, int top_k, float top_p) {
    SamplingConfig c;
    c.temperature = temperature;
    c.top_k = top_k;
    c.top_p = top_p;
    return c;
  };

  const Run greedy = run(config(0, 0, 0), 0);
  EXPECT_EQ(greedy.picks, 30);
  EXPECT_EQ(greedy.rows + greedy.lists, 0);
  EXPECT_EQ(greedy.ids, walk(config(0, 0, 0)));
  const Run greedy_top = run(config(0, 0, 0), 2);
  EXPECT_EQ(greedy_top.lists, 30);
  EXPECT_EQ(greedy_top.picks + greedy_top.rows, 0);
  EXPECT_EQ(greedy_top.ids, greedy.ids) << "the list's first is the argmax";
  ASSERT_EQ(greedy_top.top.size(), 30u);
  EXPECT_EQ(greedy_top.top[0], TopN(engine_.Distribution('a'), 2));

  const Run drawn = run(config(1, 0, 0), 0);
  EXPECT_EQ(drawn.picks, 30);
  EXPECT_EQ(drawn.rows + drawn.lists, 0);
  EXPECT_EQ(drawn.ids, walk(config(1, 0, 0))) << "the model's draw and the sampler's walk take the same uniforms";
  EXPECT_NE(drawn.ids, greedy.ids) << "at temperature 1 some of 30 draws leave the 0.9 token";
  const Run drawn_top = run(config(1, 0, 0), 1);
  EXPECT_EQ(drawn_top.picks, 30);
  EXPECT_EQ(drawn_top.lists, 30);
  EXPECT_EQ(drawn_top.rows, 0);
  EXPECT_EQ(drawn_top.ids, drawn.ids);

  for (const SamplingConfig& c : {config(1, 5, 0), config(0.7f, 5, 0.95f), config(2.5f, 3, 0)}) {
    const Run k = run(c, 0);
    EXPECT_EQ(k.lists, 30) << c.temperature;
    EXPECT_EQ(k.picks + k.rows, 0);
    EXPECT_EQ(k.ids, walk(c)) << "top-k from the model's list draws as from the whole row, at " << c.temperature;
  }
  const Run k_top = run(config(2.5f, 3, 0), 6);
  EXPECT_EQ(k_top.ids, walk(config(2.5f, 3, 0)));
  EXPECT_EQ(k_top.top[0].size(), 6u) << "the list is the longer of k and the alternatives";

  for (const SamplingConfig& c : {config(0.8f, 0, 0.9f), config(1, 0, 0.5f), config(3, 0, 0.95f)}) {
    const Run nucleus = run(c, 0);
    EXPECT_EQ(nucleus.lists, 30) << "top-p alone: the model lists the nucleus";
    EXPECT_EQ(nucleus.picks + nucleus.rows, 0);
    EXPECT_EQ(nucleus.ids, walk(c)) << c.temperature << " " << c.top_p;
  }
  const Run tempered = run(config(2.5f, 0, 0), 3);
  EXPECT_EQ(tempered.picks, 30) << "another temperature: the model draws";
  EXPECT_EQ(tempered.lists, 30) << "and lists the alternatives";
  EXPECT_EQ(tempered.rows, 0);
  EXPECT_EQ(tempered.ids, walk(config(2.5f, 0, 0)));
  EXPECT_NE(tempered.ids, drawn.ids);
}

// Request validation refuses this (RequestValidator::Continuation); should
// one get through anyway, the job ends at once instead of waiting forever
// for a row, and the session comes back unchanged.
TEST_F(SchedulerTest, AGenerationWithNothingToFeedEndsAndReturnsTheSession) {
  Make();
  const std::string id = NewSession();
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({}, 2), o.Callbacks()).ok());
  scheduler_->Start();
  o.Wait();
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(table_.Get("", id)->busy);
  EXPECT_EQ(table_.Get("", id)->position, 0);
}

TEST_F(SchedulerTest, DecodersShareOneStep) {
  Make();
  std::vector<std::string> ids;
  std::vector<std::unique_ptr<Outcome>> outs;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(NewSession());
    outs.push_back(std::make_unique<Outcome>());
    ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(ids.back()), Spec({10 * i}, 4), outs.back()->Callbacks()).ok());
  }
  scheduler_->Start();  // all five are queued: they start together
  for (auto& o : outs) o->Wait();
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(outs[i]->ids, (std::vector<int>{10 * i + 1, 10 * i + 2, 10 * i + 3, 10 * i + 4}));
  const auto steps = engine_.steps();
  // One prefill step and three decode steps, each with all five sessions.
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& s : steps) EXPECT_EQ(s.rows, 5);
}

// Two model versions at once (ServedModel per session): a step runs one
// version's sessions, and the versions take turns, a step each.
TEST_F(SchedulerTest, AStepRunsOneVersionAndVersionsTakeTurns) {
  Make();
  std::shared_ptr<ServedModel> other = testing::FakeServed("other", 2);
  const std::string a1 = NewSession(), a2 = NewSession();
  auto b1 = table_.Create("", other, *testing::FakeOf(*other).NewSession(64), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(b1.ok()) << b1.status();
  Outcome oa1, oa2, ob1;
  std::vector<size_t> a_steps_at_b_token;  // engine thread, then read after Wait
  GenerateCallbacks cb = ob1.Callbacks();
  cb.on_tokens = [this, &ob1, inner = cb.on_tokens, &a_steps_at_b_token](std::vector<GeneratedTokenEvent> ev,
                                                                         int64_t pos) {
    inner(std::move(ev), pos);
    a_steps_at_b_token.push_back(engine_.steps().size());
  };
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(a1), Spec({10}, 8), oa1.Callbacks()).ok());
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(b1->id), Spec({50}, 8), std::move(cb)).ok());
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(a2), Spec({30}, 8), oa2.Callbacks()).ok());
  scheduler_->Start();
  oa1.Wait();
  oa2.Wait();
  ob1.Wait();
  EXPECT_EQ(oa1.ids, (std::vector<int>{11, 12, 13, 14, 15, 16, 17, 18}));
  EXPECT_EQ(oa2.ids, (std::vector<int>{31, 32, 33, 34, 35, 36, 37, 38}));
  EXPECT_EQ(ob1.ids, (std::vector<int>{51, 52, 53, 54, 55, 56, 57, 58}));
  // Each engine stepped its own sessions only: both of version 1's in each of its steps, one in the other's.
  const auto a_steps = engine_.steps(), b_steps = testing::FakeOf(*other).steps();
  ASSERT_EQ(a_steps.size(), 8u);
  ASSERT_EQ(b_steps.size(), 8u);
  for (const auto& step : a_steps) EXPECT_EQ(step.rows, 2);
  for (const auto& step : b_steps) EXPECT_EQ(step.rows, 1);
  // Turns: when version 2 had made its k-th token, version 1 had stepped k - 1 to k + 1 times.
  ASSERT_EQ(a_steps_at_b_token.size(), 8u);
  for (size_t k = 1; k <= 8; ++k) {
    EXPECT_GE(a_steps_at_b_token[k - 1] + 1, k) << "token " << k;
    EXPECT_LE(a_steps_at_b_token[k - 1], k + 1) << "token " << k;
  }
}

TEST_F(SchedulerTest, LongPrefillIsChunkedAndDoesNotStarveADecoder) {
  SchedulerConfig config;
  config.prefill_chunk = 4;
  config.max_batch_tokens = 6;
  Make(config);
  const std::string decoder = NewSession(), prefill = NewSession();
  Outcome d, p;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(decoder), Spec({1}, 6), d.Callbacks()).ok());
  std::vector<int> long_input(20, 7);
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(prefill), Spec(long_input, 1), p.Callbacks()).ok());
  scheduler_->Start();
  d.Wait();
  p.Wait();
  EXPECT_EQ(d.ids.size(), 6u);
  EXPECT_EQ(History(prefill).size(), 21u);
  const auto steps = engine_.steps();
  for (const auto& s : steps) EXPECT_LE(s.tokens, config.max_batch_tokens);
  // The decoder produced a token in each of the first steps, while the
  // 20-token prefill advanced by at most 4 per step.
  EXPECT_GE(steps.size(), 5u);
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(steps[i].rows, 2) << "step " << i;
}

TEST_F(SchedulerTest, FullQueueIsResourceExhaustedAndDrainIsUnavailable) {
  SchedulerConfig config;
  config.max_queue = 1;
  Make(config);  // not started: the queue fills
  const std::string a = NewSession(), b = NewSession();
  Outcome first;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(a), Spec({1}, 1), first.Callbacks()).ok());
  auto full = scheduler_->SubmitGenerate(Lease(b), Spec({1}, 1), {});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("max_queue=1"), std::string::npos);
  EXPECT_FALSE(table_.Get("", b)->busy);  // the rejected lease went back
  EXPECT_EQ(table_.Get("", b)->position, 0);
  scheduler_->Drain();
  auto drained = scheduler_->SubmitGenerate(Lease(b), Spec({1}, 1), {});
  EXPECT_EQ(drained.status().code(), absl::StatusCode::kUnavailable);
  scheduler_->Start();  // what was accepted still runs
  first.Wait();
  EXPECT_TRUE(first.status.ok());
}

// Regression (issue 13, 1): SubmitGenerate moved the session's pending token
// into the job before the queue could refuse it, so a refused Generate
// (queue full, draining) handed back a session one token shorter.
TEST_F(SchedulerTest, ARefusedGenerateLeavesTheSessionExactlyAsItWas) {
  SchedulerConfig config;
  config.max_queue = 1;
  Make(config);
  const std::string a = NewSession(), b = NewSession();
  scheduler_->Start();
  Outcome warm;  // b gets a history whose last token is pending
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(b), Spec({10, 11, 12}, 1), warm.Callbacks()).ok());
  warm.Wait();
  ASSERT_TRUE(warm.status.ok());
  const std::vector<int> before = History(b);
  ASSERT_EQ(table_.Get("", b)->position, 4);
  scheduler_->Stop();  // a scheduler that runs nothing: its queue fills
  Make(config);
  Outcome first;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(a), Spec({1}, 1), first.Callbacks()).ok());
  auto full = scheduler_->SubmitGenerate(Lease(b), Spec({}, 1), {});
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table_.Get("", b)->position, 4);
  EXPECT_EQ(History(b), before);
  scheduler_->Drain();
  auto drained = scheduler_->SubmitGenerate(Lease(b), Spec({5}, 1), {});
  ASSERT_EQ(drained.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(table_.Get("", b)->position, 4);
  EXPECT_EQ(History(b), before);
  scheduler_->Start();
  first.Wait();
}

// Flow control (issue 13, 3): a job paused for a client that does not read
// leaves the batch; the others go on; Resume brings it back.
TEST_F(SchedulerTest, APausedJobWaitsWithoutHoldingUpTheOthers) {
  Make();
  const std::string slow = NewSession(), fast = NewSession();
  Outcome paused_outcome, fast_outcome;
  absl::Notification first_token;
  auto job = SubmitWithHook(slow, Spec({'a'}, 20), paused_outcome, 1, [&](const std::shared_ptr<Job>& j) {
    scheduler_->Pause(j);
    first_token.Notify();
  });
  scheduler_->Start();
  ASSERT_TRUE(first_token.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(fast), Spec({'x'}, 50), fast_outcome.Callbacks()).ok());
  fast_outcome.Wait();
  EXPECT_EQ(fast_outcome.ids.size(), 50u);
  EXPECT_FALSE(paused_outcome.done.HasBeenNotified());
  EXPECT_EQ(paused_outcome.ids.size(), 1u) << "a paused job takes no step";
  scheduler_->Resume(job);
  paused_outcome.Wait();
  EXPECT_TRUE(paused_outcome.status.ok()) << paused_outcome.status;
  EXPECT_EQ(paused_outcome.ids.size(), 20u);
}

// A job paused past stall_timeout ends with StalledError; the session keeps
// what was generated, exactly like a client's cancel.
TEST_F(SchedulerTest, AJobPausedPastTheStallTimeoutIsCancelled) {
  SchedulerConfig config;
  config.stall_timeout = absl::Milliseconds(50);
  Make(config);
  const std::string id = NewSession();
  Outcome o;
  SubmitWithHook(id, Spec({'a'}, 1000), o, 2, [&](const std::shared_ptr<Job>& j) { scheduler_->Pause(j); });
  scheduler_->Start();
  o.Wait();
  EXPECT_TRUE(IsStalled(o.status)) << o.status;
  EXPECT_EQ(o.result.finish, Finish::kCancelled);
  EXPECT_EQ(o.ids.size(), 2u);
  std::vector<int> expected = {'a'};
  expected.insert(expected.end(), o.ids.begin(), o.ids.end());
  EXPECT_EQ(History(id), expected);
  EXPECT_FALSE(IsStalled(absl::CancelledError("a client's own cancel")));
}

TEST_F(SchedulerTest, CancelledGenerationKeepsWhatWasDelivered) {
  Make();
  const std::string id = NewSession();
  Outcome o;
  // Regression (flaky under load): the test cancelled from its own thread
  // after the third token, racing the engine, which sometimes finished all
  // 1000 first. Cancelling on the engine thread, before its next step, is
  // deterministic.
  SubmitWithHook(id, Spec({'a'}, 1000), o, 3, [&](const std::shared_ptr<Job>& j) { scheduler_->Cancel(j); });
  scheduler_->Start();
  o.Wait();
  EXPECT_EQ(o.result.finish, Finish::kCancelled);
  EXPECT_LT(o.ids.size(), 1000u);
  // Exactly the input and every delivered token are the history.
  std::vector<int> expected = {'a'};
  expected.insert(expected.end(), o.ids.begin(), o.ids.end());
  EXPECT_EQ(History(id), expected);
  EXPECT_EQ(table_.Get("", id)->position, static_cast<int64_t>(expected.size()));
}

TEST_F(SchedulerTest, ScoreCommitsOrLeavesTheSessionUntouched) {
  Make();
  scheduler_->Start();
  const std::string id = NewSession();
  Outcome probe;
  ASSERT_TRUE(scheduler_->SubmitScore(Lease(id), {5, 6, 9}, false, probe.Scored()).ok());
  probe.Wait();
  ASSERT_TRUE(probe.status.ok()) << probe.status;
  ASSERT_EQ(probe.score.scores.size(), 3u);
  EXPECT_FALSE(probe.score.scores[0].has_logprob);  // nothing precedes it
  EXPECT_TRUE(probe.score.scores[1].has_logprob);
  EXPECT_NEAR(probe.score.scores[1].logprob, std::log(0.9f), 1e-6);  // 6 follows 5
  EXPECT_LT(probe.score.scores[2].logprob, std::log(0.01f));         // 9 does not follow 6
  EXPECT_EQ(table_.Get("", id)->position, 0);

  Outcome commit;
  ASSERT_TRUE(scheduler_->SubmitScore(Lease(id), {5, 6}, true, commit.Scored()).ok());
  commit.Wait();
  EXPECT_EQ(History(id), (std::vector<int>{5, 6}));
  // The next score is conditioned on that history: 7 follows 6.
  Outcome next;
  ASSERT_TRUE(scheduler_->SubmitScore(Lease(id), {7}, true, next.Scored()).ok());
  next.Wait();
  ASSERT_EQ(next.score.scores.size(), 1u);
  EXPECT_TRUE(next.score.scores[0].has_logprob);
  EXPECT_NEAR(next.score.scores[0].logprob, std::log(0.9f), 1e-6);
  EXPECT_EQ(table_.Get("", id)->position, 3);
}

// Echo: a generation returns its input's log-probs, the ones Score gives,
// with its first token; generating nothing (max_new_tokens 0) it feeds all
// but the last input token, which stays pending, as a committed Score does.
TEST_F(SchedulerTest, EchoScoresTheInputAsScoreDoes) {
  Make();
  scheduler_->Start();
  const std::string id = NewSession(), other = NewSession();
  GenerateSpec spec = Spec({5, 6, 9, 10}, 2);
  spec.echo = true;
  Outcome g;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), spec, g.Callbacks()).ok());
  g.Wait();
  ASSERT_TRUE(g.status.ok()) << g.status;
  EXPECT_EQ(g.ids, (std::vector<int>{11, 12}));
  EXPECT_TRUE(g.result.echo.empty());  // it came with the first token
  Outcome s;
  ASSERT_TRUE(scheduler_->SubmitScore(Lease(other), {5, 6, 9, 10}, false, s.Scored()).ok());
  s.Wait();
  ASSERT_EQ(g.echo.size(), 4u);
  ASSERT_EQ(s.score.scores.size(), 4u);
  EXPECT_FALSE(g.echo[0].has_logprob);  // nothing precedes it
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(g.echo[i].id, s.score.scores[i].id) << i;
    EXPECT_EQ(g.echo[i].has_logprob, s.score.scores[i].has_logprob) << i;
    EXPECT_FLOAT_EQ(g.echo[i].logprob, s.score.scores[i].logprob) << i;
  }
  EXPECT_NEAR(g.echo[1].logprob, std::log(0.9f), 1e-6);  // 6 follows 5

  // Nothing generated: the pending 12 predicts the first input token.
  spec = Spec({13, 20}, 0);
  spec.echo = true;
  Outcome only;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), spec, only.Callbacks()).ok());
  only.Wait();
  ASSERT_TRUE(only.status.ok()) << only.status;
  EXPECT_TRUE(only.ids.empty());
  EXPECT_EQ(only.result.generated_tokens, 0);
  ASSERT_EQ(only.result.echo.size(), 2u);
  EXPECT_TRUE(only.result.echo[0].has_logprob);
  EXPECT_NEAR(only.result.echo[0].logprob, std::log(0.9f), 1e-6);  // 13 follows 12
  EXPECT_LT(only.result.echo[1].logprob, std::log(0.01f));         // 20 does not follow 13
  EXPECT_EQ(only.result.position, 8);
  EXPECT_EQ(History(id), (std::vector<int>{5, 6, 9, 10, 11, 12, 13, 20}));
  // The session goes on from the pending 20.
  Outcome next;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({}, 1), next.Callbacks()).ok());
  next.Wait();
  EXPECT_EQ(next.ids, (std::vector<int>{21}));

  // One token alone, on a fresh session: nothing to feed or predict.
  spec = Spec({7}, 0);
  spec.echo = true;
  const std::string fresh = NewSession();
  Outcome one;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(fresh), spec, one.Callbacks()).ok());
  one.Wait();
  ASSERT_TRUE(one.status.ok()) << one.status;
  ASSERT_EQ(one.result.echo.size(), 1u);
  EXPECT_FALSE(one.result.echo[0].has_logprob);
  EXPECT_EQ(one.result.position, 1);
  EXPECT_EQ(History(fresh), (std::vector<int>{7}));
}

// A stateless echo computes every input token: no bounded replay of a long
// input (it would leave the first tokens unscored), no cached prefix.
TEST_F(SchedulerTest, AStatelessEchoFeedsItsWholeInput) {
  Make();
  scheduler_->Start();
  const int64_t mem_len = 4;  // a receptive field of 6
  std::vector<int> input;
  for (int i = 0; i < 20; ++i) input.push_back(i * 3 % 50);
  int64_t fed = 0;
  auto lease = table_.CreateAcquired("", served_, *engine_.NewSession(mem_len), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(lease.ok());
  lease->throwaway = true;
  GenerateSpec spec = Spec(input, 1);
  spec.echo = true;
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(*std::move(lease), spec, o.Callbacks()).ok());
  o.Wait();
  ASSERT_TRUE(o.status.ok()) << o.status;
  for (const auto& step : engine_.steps()) fed += step.tokens;
  EXPECT_EQ(fed, 20);
  ASSERT_EQ(o.echo.size(), 20u);
  EXPECT_FALSE(o.echo[0].has_logprob);
  for (size_t i = 1; i < 20; ++i) {
    EXPECT_EQ(o.echo[i].id, input[i]);
    EXPECT_TRUE(o.echo[i].has_logprob) << i;
  }
}

TEST_F(SchedulerTest, ForkCopiesHistoryAndThenDiverges) {
  Make();
  scheduler_->Start();
  const std::string id = NewSession();
  Outcome gen;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({1, 2}, 2), gen.Callbacks()).ok());
  gen.Wait();
  Outcome fork;
  ASSERT_TRUE(scheduler_->SubmitFork(Lease(id), absl::ZeroDuration(), {{"k", "v"}}, 0, fork.Made()).ok());
  fork.Wait();
  ASSERT_TRUE(fork.status.ok()) << fork.status;
  const std::string child = fork.made.id;
  EXPECT_NE(child, id);
  EXPECT_EQ(fork.made.labels.at("k"), "v");
  EXPECT_EQ(History(child), History(id));
  Outcome more;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(child), Spec({50}, 1), more.Callbacks()).ok());
  more.Wait();
  EXPECT_EQ(History(id), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(History(child), (std::vector<int>{1, 2, 3, 4, 50, 51}));
}

// A fork is made on the engine thread, away from the call that asked for it:
// it must still belong to the source's owner (the caller), and to nobody else.
TEST_F(SchedulerTest, ForkBelongsToTheSourcesOwner) {
  Make();
  scheduler_->Start();
  auto info = table_.Create("alice", served_, *engine_.NewSession(64), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(info.ok()) << info.status();
  auto lease = table_.Acquire("alice", info->id, absl::Now());
  ASSERT_TRUE(lease.ok()) << lease.status();
  Outcome fork;
  ASSERT_TRUE(scheduler_->SubmitFork(*std::move(lease), absl::ZeroDuration(), {}, 0, fork.Made()).ok());
  fork.Wait();
  ASSERT_TRUE(fork.status.ok()) << fork.status;
  EXPECT_EQ(fork.made.owner, "alice");
  EXPECT_TRUE(table_.Get("alice", fork.made.id).ok());
  EXPECT_EQ(table_.Get("", fork.made.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.List("alice").size(), 2u);
  EXPECT_TRUE(table_.List("").empty());
}

// Regression: a failed memory copy (device out of memory) used to throw on
// the engine thread and take the server down; now the request fails cleanly.
TEST_F(SchedulerTest, FailedCopyFailsTheRequestAndKeepsTheSession) {
  Make();
  scheduler_->Start();
  const std::string id = NewSession();
  Outcome gen;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec({1, 2}, 2), gen.Callbacks()).ok());
  gen.Wait();
  {
    auto lease = Lease(id);
    static_cast<FakeSession*>(lease.state.get())->fail_clone = true;
    table_.Release(std::move(lease), absl::Now());
  }
  Outcome fork, probe;
  ASSERT_TRUE(scheduler_->SubmitFork(Lease(id), absl::ZeroDuration(), {}, 0, fork.Made()).ok());
  fork.Wait();
  EXPECT_EQ(fork.status.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(scheduler_->SubmitScore(Lease(id), {9}, false, probe.Scored()).ok());
  probe.Wait();
  EXPECT_EQ(probe.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(table_.size(), 1);
  EXPECT_EQ(History(id), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_FALSE(table_.Get("", id)->busy);
}

TEST_F(SchedulerTest, StopTokenAndStopSequence) {
  Make();
  scheduler_->Start();
  const std::string a = NewSession(), b = NewSession();
  GenerateSpec tok = Spec({'a'}, 10);
  tok.stop_token_ids = {'d'};
  Outcome ta;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(a), tok, ta.Callbacks()).ok());
  ta.Wait();
  EXPECT_EQ(ta.result.finish, Finish::kStopToken);
  EXPECT_EQ(ta.text, "bcd");

  GenerateSpec seq = Spec({'a'}, 10);
  seq.stop_sequences = {"def"};
  Outcome sb;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(b), seq, sb.Callbacks()).ok());
  sb.Wait();
  EXPECT_EQ(sb.result.finish, Finish::kStopSequence);
  EXPECT_EQ(sb.text, "bc");                   // never a piece of the stop sequence
  EXPECT_EQ(table_.Get("", b)->position, 6);  // the stop sequence's tokens are history
}

TEST_F(SchedulerTest, EngineFailureIsInternalAndChangesNoSession) {
  bool unchanged = false;
  EXPECT_EQ(FailedStep(absl::InternalError("injected engine failure"), &unchanged).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(unchanged);
}

// A step out of device memory is RESOURCE_EXHAUSTED, as admission would
// have answered, not the server's fault. (That the model moves no session
// when a step fails is IncrementalTest.AFailedReadoutMovesNoSession.)
TEST_F(SchedulerTest, AStepOutOfMemoryIsResourceExhaustedNotInternal) {
  bool unchanged = false;
  const absl::Status status = FailedStep(
      absl::ResourceExhaustedError("model step: CUDA out of memory. Tried to allocate 4096 bytes"), &unchanged);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("out of memory"), std::string::npos) << status;
  EXPECT_TRUE(unchanged);
}

TEST_F(SchedulerTest, ThrowAwaySessionIsGoneAfterTheRequest) {
  Make();
  scheduler_->Start();
  auto lease = table_.CreateAcquired("", served_, *engine_.NewSession(16), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(lease.ok());
  lease->throwaway = true;
  const std::string id = lease->id;
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(*std::move(lease), Spec({1}, 2), o.Callbacks()).ok());
  o.Wait();
  EXPECT_EQ(o.ids.size(), 2u);
  EXPECT_EQ(table_.Get("", id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.size(), 0);
}

// Bounded replay (docs/SESSIONS.md, "Bounded replay"): a request without a
// session feeds only the last ReceptiveField tokens of a long input, into an
// empty state where they begin; it answers as if it had fed them all. A
// named session's input is fed whole: its state continues.
TEST_F(SchedulerTest, AStatelessGenerationFeedsOnlyTheReceptiveField) {
  Make();
  scheduler_->Start();
  const int64_t mem_len = 4, field = engine_.ReceptiveField(mem_len);  // 6
  std::vector<int> input;
  for (int i = 0; i < 20; ++i) input.push_back(i * 3 % 50);
  auto fed = [&] {
    int64_t n = 0;
    for (const auto& step : engine_.steps()) n += step.tokens;
    return n;
  };
  auto lease = table_.CreateAcquired("", served_, *engine_.NewSession(mem_len), absl::ZeroDuration(), {}, absl::Now());
  ASSERT_TRUE(lease.ok());
  lease->throwaway = true;
  Outcome o;
  ASSERT_TRUE(scheduler_->SubmitGenerate(*std::move(lease), Spec(input, 3), o.Callbacks()).ok());
  o.Wait();
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(fed(), field + 2);  // the prefill's last 6 tokens, then two sampled ones
  EXPECT_EQ(o.ids, (std::vector<int>{input.back() + 1, input.back() + 2, input.back() + 3}));
  EXPECT_EQ(o.result.position, 23);
  EXPECT_EQ(o.result.input_tokens, 20);
  EXPECT_EQ(o.positions, (std::vector<int64_t>{21, 22, 23}));

  const std::string id = NewSession(mem_len);
  const int64_t before = fed();
  Outcome named;
  ASSERT_TRUE(scheduler_->SubmitGenerate(Lease(id), Spec(input, 1), named.Callbacks()).ok());
  named.Wait();
  EXPECT_EQ(fed() - before, 20);
  EXPECT_EQ(History(id).size(), 21u);
}

// The state cache (docs/SESSIONS.md, "The state cache"): a request without a
// session goes on from the state its principal's earlier request left at the
// end of its prompt or of its generation, feeding only the rest, and answers
// as if it had fed everything. Another principal's identical request misses.
TEST_F(SchedulerTest, AStatelessRequestGoesOnFromItsPrincipalsCachedPrefix) {
  Make();
  scheduler_->Start();
  auto fed = [&] {
    int64_t n = 0;
    for (const auto& step : engine_.steps()) n += step.tokens;
    return n;
  };
  auto stateless = [&](const std::string& owner, const std::vector<int>& input, Outcome& o) {
    auto lease = table_.CreateAcquired(owner, served_, *engine_.NewSession(64), absl::ZeroDuration(), {}, absl::Now());
    ASSERT_TRUE(lease.ok());
    lease->throwaway = true;
    const int64_t before = fed();
    ASSERT_TRUE(scheduler_->SubmitGenerate(*std::move(lease), Spec(input, 3), o.Callbacks()).ok());
    o.Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    o.positions = {fed() - before};  // reused: the tokens this request fed
  };
  std::vector<int> turn1;
  for (int i = 0; i < 20; ++i) turn1.push_back(10 + i);
  Outcome first;
  stateless("alice", turn1, first);
  EXPECT_EQ(first.positions[0], 20 + 2);

  std::vector<int> turn2 = turn1;  // the whole conversation again, and more
  turn2.insert(turn2.end(), first.ids.begin(), first.ids.end());
  for (int t : {40, 41, 42, 43, 44}) turn2.push_back(t);
  Outcome second;
  stateless("alice", turn2, second);
  EXPECT_EQ(second.positions[0], 1 + 5 + 2);  // the cached generation's pending token, the new ones, two sampled
  EXPECT_EQ(second.ids, (std::vector<int>{45, 46, 47}));
  EXPECT_EQ(second.result.position, 28 + 3);
  EXPECT_EQ(second.result.input_tokens, 28);

  Outcome other;
  stateless("bob", turn2, other);
  EXPECT_EQ(other.positions[0], 28 + 2);
  EXPECT_EQ(other.ids, second.ids);

  std::vector<int> edited = turn1;  // the first prompt, then something else
  edited.push_back(7);
  Outcome third;
  stateless("alice", edited, third);
  EXPECT_EQ(third.positions[0], 1 + 2);  // from the end of the first prompt
  EXPECT_EQ(third.ids, (std::vector<int>{8, 9, 10}));

  const StateCacheStats stats = table_.state_cache().stats();
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.tokens_saved, 22 + 20);
}

}  // namespace
}  // namespace txl

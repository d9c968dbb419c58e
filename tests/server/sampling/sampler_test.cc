#include "server/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace txl {
namespace {

std::vector<float> LogProbs(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

TEST(SamplerTest, GreedyPicksTheArgmax) {
  Sampler s({}, 1);
  EXPECT_EQ(s.Sample(LogProbs({0.1, 0.6, 0.3})), 1);
}

TEST(SamplerTest, SameSeedSameTokens) {
  SamplingConfig c;
  c.temperature = 1.0f;
  c.seed = 42;
  Sampler a(c, 1), b(c, 999);  // the request's seed wins over the fallback
  const auto lp = LogProbs({0.25, 0.25, 0.25, 0.25});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.Sample(lp), b.Sample(lp));
}

TEST(SamplerTest, FollowsTheDistribution) {
  SamplingConfig c;
  c.temperature = 1.0f;
  Sampler s(c, 7);
  std::map<int, int> counts;
  const auto lp = LogProbs({0.7, 0.2, 0.1});
  for (int i = 0; i < 20000; ++i) ++counts[s.Sample(lp)];
  EXPECT_NEAR(counts[0] / 20000.0, 0.7, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.1, 0.02);
}

TEST(SamplerTest, TopKAndTopPRestrictTheCandidates) {
  SamplingConfig k;
  k.temperature = 1.0f;
  k.top_k = 2;
  Sampler sk(k, 3);
  SamplingConfig p;
  p.temperature = 1.0f;
  p.top_p = 0.75f;  // 0.5 + 0.3 reaches it: two candidates
  Sampler sp(p, 3);
  const auto lp = LogProbs({0.3, 0.5, 0.15, 0.05});
  for (int i = 0; i < 2000; ++i) {
    const int a = sk.Sample(lp), b = sp.Sample(lp);
    EXPECT_TRUE(a == 0 || a == 1) << a;
    EXPECT_TRUE(b == 0 || b == 1) << b;
  }
}

TEST(SamplerTest, LowTemperatureApproachesGreedy) {
  SamplingConfig c;
  c.temperature = 0.01f;
  Sampler s(c, 5);
  const auto lp = LogProbs({0.45, 0.55});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(lp), 1);
}

TEST(SamplerTest, ValidationNamesTheField) {
  SamplingConfig c;
  c.temperature = -1;
  EXPECT_NE(ValidateSampling(c).message().find("sampling.temperature"), std::string::npos);
  c = {};
  c.top_k = -2;
  EXPECT_NE(ValidateSampling(c).message().find("sampling.top_k"), std::string::npos);
  c = {};
  c.top_p = 1.5f;
  EXPECT_NE(ValidateSampling(c).message().find("sampling.top_p"), std::string::npos);
  EXPECT_TRUE(ValidateSampling({}).ok());
}

// OpenAI's logit_bias: -100 bans a token outright, +100 all but forces it,
// other values shift its logit; the row is a distribution again after.
TEST(SamplerTest, LogitBiasBansForcesAndShifts) {
  SamplingConfig c;
  c.temperature = 1.0f;
  c.logit_bias = {{1, -100.0f}};
  Sampler ban(c, 3);
  ASSERT_TRUE(ban.Adjusts());
  EXPECT_TRUE(ban.Plan(0).empty());  // the whole row is drawn here, not in the model
  const auto lp = LogProbs({0.1, 0.8, 0.1});
  const std::vector<float> banned = ban.Adjusted(lp);
  EXPECT_EQ(banned[1], -INFINITY);
  EXPECT_NEAR(std::exp(banned[0]), 0.5, 1e-6);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(ban.Sample(banned), 1);

  c.logit_bias = {{2, 100.0f}};
  Sampler force(c, 3);
  const std::vector<float> forced = force.Adjusted(LogProbs({0.45, 0.5, 0.05}));
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(force.Sample(forced), 2);

  c.logit_bias = {{0, static_cast<float>(std::log(3.0))}};  // three times as likely, before renormalising
  Sampler shift(c, 3);
  const std::vector<float> shifted = shift.Adjusted(LogProbs({0.25, 0.5, 0.25}));
  EXPECT_NEAR(std::exp(shifted[0]), 0.5, 1e-6);
  EXPECT_NEAR(std::exp(shifted[1]), 1.0 / 3, 1e-6);
  EXPECT_NEAR(std::exp(shifted[2]), 1.0 / 6, 1e-6);
  // Greedy follows the biased argmax.
  c.temperature = 0.0f;
  c.logit_bias = {{1, -100.0f}, {2, 1.0f}};
  Sampler greedy(c, 3);
  EXPECT_EQ(greedy.Sample(greedy.Adjusted(LogProbs({0.3, 0.5, 0.2}))), 2);
}

// A grammar's mask (constrained output): greedy and plain temperatures keep
// the model's pick, constrained and drawn at two uniforms; top-k and top-p
// take the whole row, which Masked bans to what the grammar allows.
TEST(SamplerTest, AConstraintKeepsTheModelsPickOrMasksTheWholeRow) {
  auto allowed = std::make_shared<AllowedTokens>();
  allowed->words = {0b101};  // tokens 0 and 2
  SamplingConfig c;
  c.temperature = 1.0f;
  c.seed = 9;
  Sampler s(c, 5);
  s.Constrain();
  EXPECT_FALSE(s.Adjusts()) << "a plain temperature: the model draws";
  const SamplingPlan plan = s.Plan(2, allowed);
  EXPECT_EQ(plan.pick, SamplingPlan::Pick::kDraw);
  EXPECT_EQ(plan.allowed, allowed);
  EXPECT_EQ(plan.top_n, 2);
  Sampler same(c, 5);
  EXPECT_EQ(plan.uniform, same.NextUniform());
  EXPECT_EQ(plan.fallback_uniform, same.NextUniform()) << "two uniforms a token";

  SamplingConfig g;  // greedy
  Sampler greedy(g, 5);
  greedy.Constrain();
  EXPECT_EQ(greedy.Plan(0, allowed).pick, SamplingPlan::Pick::kArgmax);

  c.top_k = 2;
  Sampler top_k(c, 5);
  top_k.Constrain();
  ASSERT_TRUE(top_k.Adjusts()) << "the model's lists are not constrained";
  EXPECT_TRUE(top_k.Plan(0, allowed).empty()) << "the whole row is drawn here";
  const std::vector<float> masked = Masked(LogProbs({0.2, 0.6, 0.2}), *allowed);
  EXPECT_EQ(masked[1], -INFINITY);
  EXPECT_NEAR(std::exp(masked[0]), 0.2, 1e-6) << "not renormalised";
  for (int i = 0; i < 2000; ++i) EXPECT_NE(top_k.Sample(masked), 1);
}

// OpenAI's penalties: a drawn token's logit loses frequency_penalty per draw
// and presence_penalty once; tokens never drawn are unchanged.
TEST(SamplerTest, PenaltiesCountTheTokensDrawn) {
  SamplingConfig c;
  c.presence_penalty = 0.5f;
  c.frequency_penalty = 0.25f;
  Sampler s(c, 1);
  ASSERT_TRUE(s.Adjusts());
  const auto lp = LogProbs({0.25, 0.25, 0.5});
  std::vector<float> same = s.Adjusted(lp);
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(same[t], lp[t], 1e-6);
  s.Count(2);
  s.Count(2);
  s.Count(0);
  const std::vector<float> after = s.Adjusted(lp);
  // Logits (up to one shift): 0 loses 0.25 + 0.5, 2 loses 2 x 0.25 + 0.5, 1 nothing.
  const double l0 = lp[0] - 0.75, l1 = lp[1], l2 = lp[2] - 1.0;
  const double z = std::log(std::exp(l0) + std::exp(l1) + std::exp(l2));
  EXPECT_NEAR(after[0], l0 - z, 1e-5);
  EXPECT_NEAR(after[1], l1 - z, 1e-5);
  EXPECT_NEAR(after[2], l2 - z, 1e-5);
  EXPECT_FALSE(Sampler(SamplingConfig{}, 1).Adjusts());  // no bias, no penalty: the model's paths
}

TEST(SamplerTest, BiasAndPenaltyValidationNamesTheField) {
  SamplingConfig c;
  c.presence_penalty = 2.5f;
  EXPECT_NE(ValidateSampling(c).message().find("sampling.presence_penalty must be in [-2, 2]"), std::string::npos);
  c.presence_penalty = 0.0f;
  c.frequency_penalty = -2.01f;
  EXPECT_NE(ValidateSampling(c).message().find("sampling.frequency_penalty"), std::string::npos);
  c.frequency_penalty = NAN;
  EXPECT_FALSE(ValidateSampling(c).ok());
  c.frequency_penalty = 2.0f;
  c.logit_bias = {{3, 100.5f}};
  EXPECT_NE(ValidateSampling(c).message().find("the bias of token 3 must be in [-100, 100]"), std::string::npos);
  c.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(ValidateSampling(c).message().find("token -1 is negative"), std::string::npos);
  c.logit_bias.assign(kMaxLogitBias + 1, {0, 1.0f});
  EXPECT_NE(ValidateSampling(c).message().find("at most 1024 tokens"), std::string::npos);
  c.logit_bias = {{0, -100.0f}, {5, 100.0f}};
  EXPECT_TRUE(ValidateSampling(c).ok());
}

TEST(SamplerTest, TopNOrdersByProbability) {
  auto top = TopN(LogProbs({0.1, 0.5, 0.3, 0.1}), 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  EXPECT_EQ(top[2].first, 0);  // ties: lower id first
}

// The candidate rule with a full sort (the sampler's rule before it stopped
// sorting the vocabulary): sort by descending probability (ties: lower id),
// cut to top_k, then to the shortest prefix whose tempered mass reaches
// top_p, and walk that prefix at u * its mass.
int SortedReference(const std::vector<float>& lp, const SamplingConfig& c, double u) {
  std::vector<std::pair<float, int>> all;
  for (size_t i = 0; i < lp.size(); ++i) all.push_back({lp[i], static_cast<int>(i)});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = c.top_k > 0 ? std::min(all.size(), static_cast<size_t>(c.top_k)) : all.size();
  std::vector<double> w(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp((all[i].first - all[0].first) / c.temperature);
  if (c.top_p > 0 && c.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += w[i] / total;
      if (mass >= c.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u * kept < acc) return all[i].second;
  }
  return all[keep - 1].second;
}

// A vocabulary large enough for the nucleus search's partitioning, with runs
// of equal log-probs (ties) and a long flat tail.
std::vector<float> BigDistribution(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> e(1.0);
  std::vector<double> p(5000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = i % 7 == 3 ? p[i - 1] : std::pow(e(rng), 3.0);
  double total = 0;
  for (double x : p) total += x;
  for (double& x : p) x /= total;
  return LogProbs(p);
}

TEST(SamplerTest, TopKAndTopPChooseAsAFullSortWould) {
  for (float t : {0.7f, 1.0f, 1.6f}) {
    for (auto [k, p] : std::vector<std::pair<int, float>>{{0, 0.3f}, {0, 0.9f}, {0, 0.999f}, {40, 0.0f}, {40, 0.5f}}) {
      SamplingConfig c;
      c.temperature = t;
      c.top_k = k;
      c.top_p = p;
      c.seed = 17;
      Sampler s(c, 1);
      std::mt19937_64 rng(17);  // the same stream: one uniform per token
      for (int n = 0; n < 60; ++n) {
        const std::vector<float> lp = BigDistribution(n);
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        ASSERT_EQ(s.Sample(lp), SortedReference(lp, c, u)) << "t " << t << " k " << k << " p " << p << " n " << n;
      }
    }
  }
}

// The nucleus is found through buckets of log-prob distance: rows where it
// is one token, where impossible tokens (-inf) sit in the last bucket, and
// top-p so near 1 that the prefix reaches that bucket, all choose as a full
// sort would.
TEST(SamplerTest, TopPChoosesAsAFullSortWouldAtTheBucketsEdges) {
  std::mt19937_64 rows(5);
  for (float p : {0.5f, 0.9f, 0.999999f}) {
    for (float t : {0.25f, 1.0f, 3.0f}) {
      SamplingConfig c;
      c.temperature = t;
      c.top_p = p;
      c.seed = 31;
      Sampler s(c, 1);
      std::mt19937_64 rng(31);
      for (int n = 0; n < 30; ++n) {
        std::vector<float> lp = BigDistribution(200 + n);
        if (n % 3 == 0) lp[rows() % lp.size()] = 5.0f;  // one token far above the rest
        for (int k = 0; k < 50 * (n % 2); ++k) lp[rows() % lp.size()] = -std::numeric_limits<float>::infinity();
        const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        ASSERT_EQ(s.Sample(lp), SortedReference(lp, c, u)) << "t " << t << " p " << p << " n " << n;
      }
    }
  }
}

// What the model's list gives (TopN of the row; SamplingPlan::top_n) draws the
// token the whole row draws, with or without top-p, at any temperature.
TEST(SamplerTest, TopKFromTheListDrawsAsFromTheWholeRow) {
  for (float t : {0.3f, 1.0f, 1.6f}) {
    for (auto [k, p] : std::vector<std::pair<int, float>>{{1, 0.0f}, {40, 0.0f}, {40, 0.5f}, {400, 0.95f}}) {
      SamplingConfig c;
      c.temperature = t;
      c.top_k = k;
      c.top_p = p;
      c.seed = 23;
      Sampler whole(c, 1), listed(c, 1);
      ASSERT_EQ(listed.TopCandidates(), k);
      for (int n = 0; n < 40; ++n) {
        const std::vector<float> lp = BigDistribution(100 + n);
        ASSERT_EQ(listed.SampleFromTop(TopN(lp, k + n % 3)), whole.Sample(lp))
            << "t " << t << " k " << k << " p " << p << " n " << n;
      }
    }
  }
  SamplingConfig greedy;
  EXPECT_EQ(Sampler(greedy, 1).TopCandidates(), 0) << "greedy needs no list";
  SamplingConfig nucleus;
  nucleus.temperature = 1.0f;
  nucleus.top_p = 0.9f;
  EXPECT_EQ(Sampler(nucleus, 1).TopCandidates(), 0) << "top-p alone needs the whole row";
}

TEST(SamplerTest, PlainTemperatureWalksInIdOrderWithTheUniformAModelDrawWouldUse) {
  SamplingConfig c;
  c.temperature = 1.0f;
  c.seed = 5;
  Sampler sampled(c, 1), drawn(c, 1);
  EXPECT_TRUE(drawn.IdOrderDraw());
  const std::vector<float> lp = BigDistribution(3);
  for (int n = 0; n < 200; ++n)
    ASSERT_EQ(sampled.Sample(lp), DrawInIdOrder(lp.data(), static_cast<int64_t>(lp.size()), 1.0f, drawn.NextUniform()));
  c.top_p = 0.5f;
  EXPECT_FALSE(Sampler(c, 1).IdOrderDraw());
  EXPECT_TRUE(Sampler(c, 1).NucleusOnly());
  c.top_k = 3;
  EXPECT_FALSE(Sampler(c, 1).NucleusOnly());
  c.top_k = 0;
  c.top_p = 0;
  c.temperature = 0.5f;
  EXPECT_TRUE(Sampler(c, 1).IdOrderDraw()) << "another temperature draws in id order too";
  EXPECT_FALSE(Sampler(c, 1).NucleusOnly());
  c.temperature = 0;
  EXPECT_FALSE(Sampler(c, 1).IdOrderDraw());
}

TEST(SamplerTest, DrawInIdOrderIsTheInverseCdf) {
  const auto lp = LogProbs({0.25, 0.5, 0.25});
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, 0.0), 0);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, 0.24), 0);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, 0.26), 1);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, 0.74), 1);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, 0.76), 2);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 1.0f, std::nextafter(1.0, 0.0)), 2);
  // At temperature 2 the weights are sqrt(p): 0.5, 0.707, 0.5 of 1.707.
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 2.0f, 0.28), 0);
  EXPECT_EQ(DrawInIdOrder(lp.data(), 3, 2.0f, 0.30), 1);
}

TEST(SamplerTest, TopNMatchesAFullSort) {
  for (int n : {1, 5, 64}) {
    const std::vector<float> lp = BigDistribution(n);
    std::vector<std::pair<int, float>> all;
    for (size_t i = 0; i < lp.size(); ++i) all.push_back({static_cast<int>(i), lp[i]});
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
    all.resize(n);
    EXPECT_EQ(TopN(lp, n), all) << n;
  }
  EXPECT_TRUE(TopN(LogProbs({0.5, 0.5}), 0).empty());
  EXPECT_EQ(TopN(LogProbs({0.5, 0.5}), 5).size(), 2u);
}

}  // namespace
}  // namespace txl

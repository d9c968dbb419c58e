#include "server/batching/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

TEST(SamplerTest, TopNOrdersByProbability) {
  auto top = TopN(LogProbs({0.1, 0.5, 0.3, 0.1}), 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_EQ(top[1].first, 2);
  EXPECT_EQ(top[2].first, 0);  // ties: lower id first
}

}  // namespace
}  // namespace txl

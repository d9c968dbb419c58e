// The in-model sampling kernels against the sampler's arithmetic done
// directly in double: the same nucleus prefix and total, the same draw
// except within rounding of a boundary.
#include "model/kernels/sampling_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tests/model/model_fixture.h"

namespace txl {
namespace {

// Log-probs with runs of equal values, a long tail and (long rows) some -inf.
std::vector<float> Row(int64_t n, uint64_t seed, float spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, spread);
  std::vector<double> logits(n);
  for (int64_t i = 0; i < n; ++i) logits[i] = i % 11 == 5 ? logits[i - 1] : normal(rng);
  double z = 0;
  for (double x : logits) z += std::exp(x);
  std::vector<float> out;
  for (double x : logits) out.push_back(static_cast<float>(x - std::log(z)));
  for (int k = 0; n > 100 && k < 20; ++k) out[rng() % n] = -std::numeric_limits<float>::infinity();
  return out;
}

std::vector<double> Weights(const std::vector<float>& row, float t) {
  const double best = *std::max_element(row.begin(), row.end());
  std::vector<double> w;
  for (float lp : row) w.push_back(std::exp((lp - best) / t));
  return w;
}

TEST(SamplingKernelsTest, TheNucleusListIsASortedPrefixThatHoldsTheNucleus) {
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{5003}}) {
    for (float t : {0.4f, 1.0f, 2.5f}) {
      for (float p : {0.3f, 0.9f, 0.999f}) {
        const std::vector<float> row = Row(n, n * 7 + static_cast<uint64_t>(t * 10), 3.0f);
        const NucleusList got = NucleusOf(row.data(), n, t, p);
        const std::vector<double> w = Weights(row, t);
        double total = 0;
        for (double x : w) total += x;
        EXPECT_NEAR(got.total / total, 1.0, 1e-6) << n << " " << t << " " << p;
        const TokenList sorted = testing::SortedTokens(row.data(), n);
        ASSERT_GE(got.tokens.size(), 1u);
        ASSERT_LE(got.tokens.size(), sorted.size());
        for (size_t i = 0; i < got.tokens.size(); ++i) ASSERT_EQ(got.tokens[i], sorted[i]) << "rank " << i;
        double mass = 0;
        size_t nucleus = 0;
        while (nucleus < sorted.size() && mass < p) mass += w[sorted[nucleus++].first] / total;
        EXPECT_GE(got.tokens.size(), nucleus) << "the list holds the nucleus";
        if (n > 1000 && p < 0.5f) {
          EXPECT_LT(got.tokens.size(), static_cast<size_t>(n) / 2) << "not the whole row";
        }
        for (const auto& [id, lp] : got.tokens) EXPECT_TRUE(std::isfinite(lp)) << "an impossible token listed";
      }
    }
  }
}

TEST(SamplingKernelsTest, TheIdOrderDrawWalksTheRowInIdOrder) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int boundary = 0;
  for (int64_t n : {int64_t{7}, int64_t{5003}}) {
    for (float t : {0.3f, 0.8f, 2.0f}) {
      const std::vector<float> row = Row(n, 100 + n, 2.0f);
      const std::vector<double> w = Weights(row, t);
      std::vector<double> cdf;
      double acc = 0;
      for (double x : w) cdf.push_back(acc += x);
      for (int k = 0; k < 300; ++k) {
        const double u = k == 0 ? 0.0 : k == 1 ? std::nextafter(1.0, 0.0) : uniform(rng);
        const int got = DrawInIdOrder(row.data(), n, t, u);
        ASSERT_GE(got, 0);
        ASSERT_LT(got, n);
        EXPECT_TRUE(std::isfinite(row[got])) << "drew an impossible token";
        const int64_t want = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u * acc) - cdf.begin(), n - 1);
        if (got != want && std::isfinite(row[want])) {
          ++boundary;
          EXPECT_NEAR(u * acc / acc, cdf[std::min<int64_t>(got, want)] / acc, 1e-6) << "u " << u;
        }
      }
    }
  }
  EXPECT_LT(boundary, 5) << "float rounding moves only draws that land on a boundary";
}

// A goal at the total (u rounded up to 1) walks past every token: the draw
// is the last token with weight, wherever it lies in its block of 8 and
// whatever impossible tokens follow it.
TEST(SamplingKernelsTest, AGoalAtTheTotalDrawsTheLastPossibleToken) {
  for (int64_t n : {int64_t{64}, int64_t{67}, int64_t{5003}}) {
    for (int64_t last : {n - 1, n - 4, n - 9, n / 2 + 3, int64_t{0}}) {
      std::vector<float> row = Row(n, 7 + n, 2.0f);
      for (int64_t i = last + 1; i < n; ++i) row[static_cast<size_t>(i)] = -INFINITY;
      EXPECT_EQ(DrawInIdOrder(row.data(), n, 0.8f, 1.0), last) << "n " << n;
      EXPECT_EQ(DrawInIdOrder(row.data(), n, 1.0f, 0.0), 0) << "n " << n;
    }
  }
}

// ConstrainedPick: the first pick when allowed, else the pick over the row
// with every refused token at -inf, whichever ids the mask spans (a narrow
// mask is walked over its own span only, to the same token). A refused
// NaN does not spoil it; an allowed NaN or +inf, or no allowed finite
// token, gives -1.
TEST(SamplingKernelsTest, AConstrainedPickIsThePickOverTheAllowedTokens) {
  const int64_t n = 1000;
  std::vector<float> row = Row(n, 4, 3.0f);
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 200; ++trial) {
    auto allowed = std::make_shared<AllowedTokens>();
    allowed->words.assign(static_cast<size_t>((n + 63) / 64), 0);
    // Masks from one token to most of the row, and spans of every width.
    const int64_t from = static_cast<int64_t>(rng() % n), span = 1 + static_cast<int64_t>(rng() % (n - from));
    const int64_t every = 1 + static_cast<int64_t>(rng() % 9);
    for (int64_t id = from; id < from + span; id += every) allowed->words[id / 64] |= uint64_t{1} << (id % 64);
    std::vector<float> masked(row.size(), -INFINITY);
    for (int64_t id = 0; id < n; ++id) {
      if (allowed->contains(id)) masked[static_cast<size_t>(id)] = row[static_cast<size_t>(id)];
    }
    SamplingPlan plan;
    plan.allowed = allowed;
    plan.pick = trial % 2 == 0 ? SamplingPlan::Pick::kDraw : SamplingPlan::Pick::kArgmax;
    plan.temperature = trial % 3 == 0 ? 0.7f : 1.0f;
    plan.fallback_uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const int refused = static_cast<int>(from == 0 ? n - 1 : from - 1);  // outside the mask
    const int want = plan.pick == SamplingPlan::Pick::kArgmax
                         ? static_cast<int>(std::max_element(masked.begin(), masked.end()) - masked.begin())
                         : DrawInIdOrder(masked.data(), n, plan.temperature, plan.fallback_uniform);
    if (!allowed->contains(refused)) {
      EXPECT_EQ(ConstrainedPick(row.data(), n, plan, refused), want) << "trial " << trial;
    }
    EXPECT_EQ(ConstrainedPick(row.data(), n, plan, static_cast<int>(from)), from) << "an allowed first pick stays";
  }
  auto one = std::make_shared<AllowedTokens>();
  one->words.assign(static_cast<size_t>((n + 63) / 64), 0);
  one->words[0] = 0b100;  // token 2
  SamplingPlan plan;
  plan.pick = SamplingPlan::Pick::kDraw;
  plan.allowed = one;
  std::vector<float> spoiled = row;
  spoiled[5] = std::numeric_limits<float>::quiet_NaN();  // refused anyway
  EXPECT_EQ(ConstrainedPick(spoiled.data(), n, plan, 5), 2);
  spoiled[2] = -INFINITY;
  EXPECT_EQ(ConstrainedPick(spoiled.data(), n, plan, 5), -1) << "nothing allowed can be drawn";
  spoiled[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ConstrainedPick(spoiled.data(), n, plan, 5), -1) << "an allowed NaN: a damaged row";
  spoiled[2] = INFINITY;
  EXPECT_EQ(ConstrainedPick(spoiled.data(), n, plan, 5), -1) << "an allowed +inf: a damaged row";
}

TEST(SamplingKernelsTest, ARowWithNaNGivesNoAnswer) {
  std::vector<float> row = Row(100, 1, 1.0f);
  row[40] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(NucleusOf(row.data(), 100, 1.0f, 0.9f).tokens.empty());
  EXPECT_EQ(DrawInIdOrder(row.data(), 100, 0.7f, 0.5), -1);
  row[40] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(NucleusOf(row.data(), 100, 1.0f, 0.9f).tokens.empty());
  EXPECT_EQ(DrawInIdOrder(row.data(), 100, 0.7f, 0.5), -1);
}

}  // namespace
}  // namespace txl

// OutputLayer's readouts against the whole log-prob rows (txl_math.h's
// LogProbs): the same values, the same argmax, and a draw that lands where
// walking the whole row in id order lands.
#include "model/net/output_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/net/download.h"
#include "model/net/txl_math.h"
#include "tests/model/model_fixture.h"

namespace txl {
namespace {

std::vector<testing::NamedConfig> Configs() {
  std::vector<testing::NamedConfig> out = testing::Variants();
  // Clusters cut from one output matrix (div_val 1), walked in both orders.
  ModelConfig div1 = testing::SmallConfig();
  div1.cutoffs = {10, 20, 30};
  out.push_back({"Div1Reversed", div1});
  div1.tail_cluster_order = TailClusterOrder::kSequential;
  out.push_back({"Div1Sequential", div1});
  return out;
}

class OutputLayerTest : public ::testing::TestWithParam<testing::NamedConfig> {
 protected:
  void SetUp() override {
    c_ = GetParam().config;
    w_ = testing::TestWeights(c_, 5);
    at::manual_seed(3);
    // Spread-out rows: some peaked, some flat, so draws reach every bin.
    hidden_ =
        at::randn({12, c_.d_model}, at::TensorOptions().dtype(at::kFloat)) * at::linspace(0.2, 4.0, 12).unsqueeze(1);
    rows_ = LogProbs(c_, w_, hidden_).contiguous();
  }
  float Row(int64_t r, int64_t t) const { return rows_[r][t].item<float>(); }

  ModelConfig c_;
  TxlWeights w_;
  at::Tensor hidden_, rows_;
};

TEST_P(OutputLayerTest, LogProbsMatchTheTrainersRows) {
  OutputLayer out(c_, w_);
  EXPECT_LT(testing::MaxAbsDiff(out.LogProbs(hidden_), rows_), 1e-6);
}

// A constrained pick's rows (AllowedLogProbs): the clusters that hold an
// allowed token, in any row, are LogProbs' own; the others are -inf, and
// the rows end with the last cluster that holds one. Masks
// cut at every bin's edges (a word of 64 ids straddles them in these small
// vocabularies).
TEST_P(OutputLayerTest, AllowedLogProbsComputeOnlyTheClustersThatHoldAnAllowedToken) {
  OutputLayer out(c_, w_);
  const at::Tensor full = out.LogProbs(hidden_);
  std::vector<int64_t> ends = {0};
  for (int64_t cut : c_.cutoffs) ends.push_back(cut);
  ends.push_back(c_.n_token);
  for (size_t bin = 0; bin + 1 < ends.size(); ++bin) {
    for (int64_t id : {ends[bin], ends[bin + 1] - 1}) {  // one token of this bin, at either edge
      AllowedTokens one;
      one.words.assign(static_cast<size_t>((c_.n_token + 63) / 64), 0);
      one.words[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
      const std::vector<const AllowedTokens*> allowed(static_cast<size_t>(hidden_.size(0)), &one);
      const at::Tensor got = out.AllowedLogProbs(hidden_, allowed);
      ASSERT_EQ(got.size(0), full.size(0));
      ASSERT_EQ(got.size(1), ends[bin + 1]) << "up to the bin that holds the token";
      for (size_t b = 0; b <= bin; ++b) {
        const at::Tensor part = got.slice(1, ends[b], ends[b + 1]), want = full.slice(1, ends[b], ends[b + 1]);
        if (b == 0 || b == bin) {  // the head is always computed
          EXPECT_TRUE(at::equal(part, want)) << "token " << id << ", bin " << b;
        } else {
          EXPECT_TRUE(at::all(part == -INFINITY).item<bool>()) << "token " << id << ", bin " << b;
        }
      }
    }
  }
}

TEST_P(OutputLayerTest, TargetLogProbsAreTheRowsEntries) {
  OutputLayer out(c_, w_);
  std::vector<int> targets;
  for (int64_t r = 0; r < hidden_.size(0); ++r) targets.push_back(static_cast<int>((r * 11 + 3) % c_.n_token));
  targets.back() = static_cast<int>(c_.n_token - 1);  // the last cluster's last word
  targets.front() = 0;
  const std::vector<float> lp = out.TargetLogProbs(hidden_, targets);
  ASSERT_EQ(lp.size(), targets.size());
  for (size_t r = 0; r < targets.size(); ++r) EXPECT_NEAR(lp[r], Row(r, targets[r]), 1e-5) << "row " << r;
}

TEST_P(OutputLayerTest, BestTokensAreTheRowsArgmax) {
  OutputLayer out(c_, w_);
  const TokenPicks best = out.BestTokens(hidden_);
  ASSERT_EQ(best.ids.size(), static_cast<size_t>(hidden_.size(0)));
  at::Tensor argmax = rows_.argmax(1);
  for (int64_t r = 0; r < hidden_.size(0); ++r) {
    EXPECT_EQ(best.ids[r], argmax[r].item<int64_t>()) << "row " << r;
    EXPECT_NEAR(best.logprobs[r], Row(r, best.ids[r]), 1e-5);
  }
}

// The draw equals the id-order walk over the whole row, except where u
// lands within rounding of the boundary between two tokens.
TEST_P(OutputLayerTest, DrawsLandWhereTheWholeRowsWalkLands) {
  OutputLayer out(c_, w_);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const int64_t rows = hidden_.size(0), V = c_.n_token;
  std::vector<int64_t> per_bin(c_.n_clusters() + 1, 0);
  const std::vector<int64_t> ends = c_.cutoff_ends();
  for (int round = 0; round < 40; ++round) {
    std::vector<double> u(rows);
    for (double& x : u) x = round == 0 ? 0.0 : round == 1 ? std::nextafter(1.0, 0.0) : uniform(rng);
    const TokenPicks drawn = out.DrawTokens(hidden_, u);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> cdf(V);
      double acc = 0;
      for (int64_t t = 0; t < V; ++t) cdf[t] = acc += std::exp(static_cast<double>(Row(r, t)));
      const double goal = u[r] * acc;
      const int64_t want = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), goal) - cdf.begin(), V - 1);
      const int got = drawn.ids[r];
      ASSERT_GE(got, 0);
      ASSERT_LT(got, V);
      if (got != want) {
        const int64_t edge = std::min<int64_t>(got, want);  // the boundary between them is cdf[edge]
        EXPECT_NEAR(goal, cdf[edge], 1e-5) << "row " << r << " u " << u[r] << ": drew " << got << ", walk " << want;
      }
      EXPECT_NEAR(drawn.logprobs[r], Row(r, got), 1e-5);
      ++per_bin[std::upper_bound(ends.begin() + 1, ends.end(), got) - ends.begin() - 1];
    }
  }
  for (size_t b = 0; b < per_bin.size(); ++b) EXPECT_GT(per_bin[b], 0) << "no draw reached bin " << b;
}

TokenList SortedRow(const at::Tensor& rows, int64_t r) {
  at::Tensor row = rows[r].contiguous();
  return testing::SortedTokens(row.data_ptr<float>(), row.numel());
}

TEST_P(OutputLayerTest, TopTokensAreTheFirstOfTheSortedRows) {
  OutputLayer out(c_, w_);
  const int64_t rows = hidden_.size(0), V = c_.n_token;
  for (int n : {1, 3, 8, static_cast<int>(c_.cutoff_ends()[1]) + 2, static_cast<int>(V), static_cast<int>(V) + 4}) {
    const std::vector<TokenList> top = out.TopTokens(hidden_, n);
    ASSERT_EQ(top.size(), static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const TokenList want = SortedRow(rows_, r);
      ASSERT_EQ(top[r].size(), std::min<size_t>(n, V)) << "n " << n << " row " << r;
      for (size_t i = 0; i < top[r].size(); ++i) {
        EXPECT_NEAR(top[r][i].second, want[i].second, 1e-5) << "n " << n << " row " << r << " rank " << i;
        // Ids agree unless two words are within rounding of each other.
        if (top[r][i].first != want[i].first) {
          EXPECT_NEAR(Row(r, top[r][i].first), want[i].second, 1e-5);
        }
      }
    }
  }
}

// Equal log-probs across a bin's cut: the selection alone may keep any of
// the tied words; the list keeps the lower ids, as a full sort does. A zero
// hidden state with zero biases makes every shortlist word tie (and every
// word inside a cluster).
TEST_P(OutputLayerTest, TopTokensBreakTiesByTheLowerId) {
  TxlWeights w = w_;
  for (at::Tensor& b : w.out_b) b = at::zeros_like(b);
  if (w.cluster_b.defined()) w.cluster_b = at::zeros_like(w.cluster_b);
  OutputLayer out(c_, w);
  at::Tensor hidden = hidden_.clone();
  hidden.slice(0, 0, 6).zero_();  // tied rows beside untied ones
  const at::Tensor rows = LogProbs(c_, w, hidden).contiguous();
  const int64_t shortlist = c_.cutoff_ends()[1];
  for (int n : {1, 5, static_cast<int>(shortlist) + 3, static_cast<int>(c_.n_token)}) {
    const std::vector<TokenList> top = out.TopTokens(hidden, n);
    for (int64_t r = 0; r < 6; ++r) {
      const TokenList want = SortedRow(rows, r);
      ASSERT_EQ(top[r].size(), static_cast<size_t>(std::min<int64_t>(n, c_.n_token)));
      for (size_t i = 0; i < top[r].size(); ++i) {
        EXPECT_EQ(top[r][i].first, want[i].first) << "n " << n << " row " << r << " rank " << i;
        EXPECT_EQ(top[r][i].second, want[i].second);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, OutputLayerTest, ::testing::ValuesIn(Configs()),
                         [](const auto& info) { return info.param.name; });

// Download (model/net/download.h), the readout's way to the host: each
// tensor back in its type and values, contiguous. On a GPU (the unit step)
// the copies queued without waiting must have landed once it returns: a
// large first tensor, whose copy takes longest, then two small ones and an
// empty one.
TEST(DownloadTest, BringsEveryTensorBackInItsTypeAndValues) {
  std::vector<at::Device> devices = {at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    SCOPED_TRACE(device.str());
    at::manual_seed(3);
    const at::Tensor big = at::randn({1 << 22}), ids = at::arange(7, at::kLong) * 3;
    const at::Tensor strided = at::randn({4, 6}).t();  // not contiguous
    // An empty tensor last: the copy before it is the one that waits.
    const std::vector<at::Tensor> host =
        Download({big.to(device), ids.to(device), strided.to(device), at::empty({0}).to(device)});
    ASSERT_EQ(host.size(), 4u);
    for (const at::Tensor& t : host) {
      EXPECT_TRUE(t.device().is_cpu());
      EXPECT_TRUE(t.is_contiguous());
    }
    EXPECT_EQ(host[1].scalar_type(), at::kLong);
    EXPECT_TRUE(at::equal(host[0], big));
    EXPECT_TRUE(at::equal(host[1], ids));
    EXPECT_TRUE(at::equal(host[2], strided));
  }
  EXPECT_TRUE(Download({}).empty());
}

}  // namespace
}  // namespace txl

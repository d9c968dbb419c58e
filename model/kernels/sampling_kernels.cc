#include "model/kernels/sampling_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/kernels/simd.h"

namespace txl {

namespace {

using simd::V8;

// Weights of row[i, i + 8): zero for a log-prob of -inf, or far enough
// below the best that float has nothing for it (Exp clamps at e^-87).
__attribute__((always_inline)) inline V8 Weights8(const float* p, float best, float inv_t, V8* x) {
  *x = (simd::Load8(p) - best) * inv_t;
  const V8 w = simd::Exp8(*x);
  return *x < V8{} - 87.f ? V8{} : w;
}

inline float Weight1(float lp, float best, float inv_t, float* x) {
  *x = (lp - best) * inv_t;
  return *x < -87.f ? 0.f : std::exp(*x);
}

// Buckets of 1/64 nat below the best: monotone in the log-prob; the last
// one also takes -inf and NaN.
constexpr int kBuckets = 4096;
inline int BucketOf(float x) {
  const float d = -x * 64.f;
  return d < kBuckets - 1 ? static_cast<int>(d) : kBuckets - 1;
}

float Best(const float* row, int64_t n) { return *std::max_element(row, row + n); }

}  // namespace

NucleusList NucleusOf(const float* row, int64_t n, float temperature, float top_p) {
  NucleusList out;
  if (n <= 0) return out;
  const float best = Best(row, n), inv_t = 1.f / temperature;
  std::vector<double> buckets(kBuckets, 0.0);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 x;
    const V8 w = Weights8(row + i, best, inv_t, &x);
    for (int l = 0; l < 8; ++l) {
      out.total += w[l];
      buckets[BucketOf(x[l])] += w[l];
    }
  }
  for (; i < n; ++i) {
    float x;
    const float w = Weight1(row[i], best, inv_t, &x);
    out.total += w;
    buckets[BucketOf(x)] += w;
  }
  if (!std::isfinite(out.total)) return out;  // NaN or +inf in the row: no list
  // Slack over top_p for the float weights the host weighs again in double.
  const double goal = (static_cast<double>(top_p) + 1e-5) * out.total;
  // A goal at the total takes every bucket at once: summed in another order,
  // a prefix could fall short of it by rounding, bucket after bucket.
  int last = kBuckets - 1;
  if (goal < out.total) {
    last = 0;
    for (double mass = buckets[0]; mass < goal && last < kBuckets - 1;) mass += buckets[++last];
  }
  for (;;) {
    out.tokens.clear();
    for (int64_t j = 0; j < n; ++j) {
      if (BucketOf((row[j] - best) * inv_t) <= last) out.tokens.emplace_back(static_cast<int>(j), row[j]);
    }
    std::sort(out.tokens.begin(), out.tokens.end(), Likelier);
    if (last == kBuckets - 1) break;
    double mass = 0;
    for (const auto& [id, lp] : out.tokens) {
      float x;
      mass += Weight1(lp, best, inv_t, &x);
    }
    if (mass >= goal) break;
    // The buckets summed in another order: the next bucket that holds any.
    do ++last;
    while (last < kBuckets - 1 && buckets[last] == 0);
  }
  return out;
}

int DrawInIdOrder(const float* row, int64_t n, float temperature, double u) {
  if (n <= 0) return -1;
  const float best = Best(row, n), inv_t = 1.f / temperature;
  // Blocks of 8, each summed once: the walk meets the same partial sums the
  // total was made of, and computes weights again only for the block the
  // goal falls in (and for the last possible token, when u rounds up).
  auto block_weights = [&](int64_t i) {
    V8 x;
    return Weights8(row + i, best, inv_t, &x);
  };
  auto block_sum = [](const V8& w) {
    double s = 0;
    for (int l = 0; l < 8; ++l) s += w[l];
    return s;
  };
  const int64_t full = n / 8 * 8;
  thread_local std::vector<double> sums;
  sums.resize(static_cast<size_t>(full / 8));
  double total = 0;
  for (int64_t i = 0; i < full; i += 8) {
    const double s = block_sum(block_weights(i));
    sums[static_cast<size_t>(i / 8)] = s;
    total += s;
  }
  for (int64_t i = full; i < n; ++i) {
    float x;
    total += Weight1(row[i], best, inv_t, &x);
  }
  if (!std::isfinite(total)) return -1;  // NaN or +inf in the row
  const double goal = u * total;
  double acc = 0;
  int64_t last_possible = -1;  // the last token with weight, in blocks walked token by token
  int64_t last_block = -1;     // the last block passed whole that holds any weight
  for (int64_t i = 0; i < full; i += 8) {
    const double s = sums[static_cast<size_t>(i / 8)];
    if (acc + s <= goal) {
      acc += s;
      if (s > 0) last_block = i;
      continue;
    }
    const V8 w = block_weights(i);
    for (int l = 0; l < 8; ++l) {
      acc += w[l];
      if (w[l] > 0) last_possible = i + l;
      if (goal < acc) return static_cast<int>(i + l);
    }
  }
  for (int64_t i = full; i < n; ++i) {
    float x;
    const float wi = Weight1(row[i], best, inv_t, &x);
    acc += wi;
    if (wi > 0) last_possible = i;
    if (goal < acc) return static_cast<int>(i);
  }
  // u * total rounded up to the total: the last token with weight.
  if (last_block > last_possible) {
    const V8 w = block_weights(last_block);
    for (int l = 7; l >= 0; --l) {
      if (w[l] > 0) return static_cast<int>(last_block + l);
    }
  }
  return static_cast<int>(last_possible);
}

int ConstrainedPick(const float* row, int64_t n, const SamplingPlan& plan, int first) {
  if (plan.allowed == nullptr || plan.allowed->contains(first)) return first;
  const AllowedTokens& allowed = *plan.allowed;
  // The allowed tokens' log-probs, -inf between
  // them, over the mask's span [lo, hi): the tokens outside weigh nothing
  // in either pick.
  const int64_t words = std::min<int64_t>(static_cast<int64_t>(allowed.words.size()), (n + 63) / 64);
  int64_t lo = n, hi = 0;
  for (int64_t w = 0; w < words; ++w) {
    if (const uint64_t word = allowed.words[static_cast<size_t>(w)]; word != 0) {
      lo = std::min(lo, w * 64 + __builtin_ctzll(word));
      hi = std::min(n, w * 64 + 64 - __builtin_clzll(word));
    }
  }
  if (lo >= hi) return -1;
  thread_local std::vector<float> masked;
  masked.assign(static_cast<size_t>(hi - lo), -INFINITY);
  bool any = false;
  for (int64_t w = lo / 64; w * 64 < hi; ++w) {
    const uint64_t word = allowed.words[static_cast<size_t>(w)];
    if (word == 0) continue;  // most of a narrow mask
    for (int64_t i = std::max(lo, w * 64); i < std::min(hi, w * 64 + 64); ++i) {
      if (((word >> (i - w * 64)) & 1) == 0) continue;
      if (std::isnan(row[i]) || row[i] == INFINITY) return -1;  // a damaged row, as DrawInIdOrder says
      if (row[i] > -INFINITY) {
        masked[static_cast<size_t>(i - lo)] = row[i];
        any = true;
      }
    }
  }
  if (!any) return -1;
  if (plan.pick == SamplingPlan::Pick::kArgmax) {
    return static_cast<int>(lo + (std::max_element(masked.begin(), masked.end()) - masked.begin()));
  }
  const int drawn =
      DrawInIdOrder(masked.data(), static_cast<int64_t>(masked.size()), plan.temperature, plan.fallback_uniform);
  return drawn < 0 ? -1 : static_cast<int>(lo + drawn);
}

}  // namespace txl

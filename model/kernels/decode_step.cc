#include "model/kernels/decode_step.h"

#include <algorithm>
#include <cmath>

namespace txl {

namespace {

// Attention items per claim: small enough to even out a preempted thread,
// large enough that neighbouring items (one head's sessions) share the
// position rows in cache.
constexpr int64_t kClaim = 4;

// y = layer_norm(x) over n (eps 1e-5, as txl_math's LayerNorm), the moments
// accumulated in double.
void Normalize(const float* x, const float* w, const float* b, int64_t n, float* y) {
  double sum = 0.0, squares = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    squares += d * d;
  }
  const float rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + 1e-5));
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * rstd * w[i] + b[i];
}

// x += the parts' shares [parts, n] (+ bias), summed in part order; then,
// post-norm, x = layer_norm(x).
void AddShares(const float* shares, int64_t parts, const float* bias, int64_t n, float* x, const float* ln_w,
               const float* ln_b) {
  for (int64_t i = 0; i < n; ++i) {
    float sum = bias != nullptr ? bias[i] : 0.0f;
    for (int64_t p = 0; p < parts; ++p) sum += shares[p * n + i];
    x[i] += sum;
  }
  if (ln_w != nullptr) Normalize(x, ln_w, ln_b, n, x);
}

// h = a block's input from the residual stream x: layer_norm(x) before
// the block (pre-norm), else x itself.
void BlockInput(const float* x, bool pre_lnorm, const float* ln_w, const float* ln_b, int64_t n, float* h) {
  if (pre_lnorm) {
    Normalize(x, ln_w, ln_b, n, h);
  } else {
    std::copy(x, x + n, h);
  }
}

// Where part p's block of the inner layer starts: an even column, so that
// ff2's bfloat16 panels (column pairs) split between parts.
int64_t InnerSplit(int64_t p, int64_t inner, int64_t parts) { return p == parts ? inner : p * inner / parts / 2 * 2; }

}  // namespace

int64_t DecodeStepScratch(const DecodeStepArgs& a) {
  const int64_t hd = a.attention.H * a.attention.dh;
  if (a.batch > 1) return a.batch * (a.d_model + 3 * hd + hd + a.d_model + a.d_inner);
  return a.d_model + 3 * hd + hd + a.d_inner + a.parts * a.d_model;
}

void DecodeStepLayers(const DecodeStepArgs& a, int64_t begin, int64_t end, TeamBarrier& barrier, KernelIsa isa) {
  const int64_t D = a.d_model, I = a.d_inner, H = a.attention.H, dh = a.attention.dh, parts = a.parts;
  const int64_t mine = end - begin;
  const bool leader = begin == 0;
  float* h = a.scratch;  // the input of the attention, then of the feed-forward
  float* qkv = h + D;
  float* attended = qkv + 3 * H * dh;
  float* inner = attended + H * dh;
  float* shares = inner + I;
  DecodeAttentionArgs att = a.attention;
  att.batch = 1;
  att.qkv = qkv;
  att.out = attended;
  for (int64_t l = 0; l < a.n_layer; ++l) {
    const DecodeStepLayer& L = a.layers[l];
    if (leader) BlockInput(a.x, a.pre_lnorm, L.attn_ln_w, L.attn_ln_b, D, h);
    barrier.Arrive(mine);
    att.sessions = L.sessions;
    att.u = L.u;
    att.v = L.v;
    att.rel = L.rel;
    for (int64_t p = begin; p < end; ++p) {
      const int64_t h0 = p * H / parts, h1 = (p + 1) * H / parts;
      for (int64_t which = 0; which < 3; ++which) {
        GemvRows(L.qkv, h, nullptr, false, qkv, D, (which * H + h0) * dh, (which * H + h1) * dh, isa);
      }
      DecodeAttention(att, h0, h1, isa);
      GemvRows(L.o.Block(0, h0 * dh), attended + h0 * dh, nullptr, false, shares + p * D, (h1 - h0) * dh, 0, D, isa);
    }
    barrier.Arrive(mine);
    if (leader) {
      AddShares(shares, parts, nullptr, D, a.x, a.pre_lnorm ? nullptr : L.attn_ln_w, L.attn_ln_b);
      BlockInput(a.x, a.pre_lnorm, L.ff_ln_w, L.ff_ln_b, D, h);
    }
    barrier.Arrive(mine);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i0 = InnerSplit(p, I, parts), i1 = InnerSplit(p + 1, I, parts);
      GemvRows(L.ff1, h, L.ff1_b, true, inner, D, i0, i1, isa);
      GemvRows(L.ff2.Block(0, i0), inner + i0, nullptr, false, shares + p * D, i1 - i0, 0, D, isa);
    }
    barrier.Arrive(mine);
    if (leader) AddShares(shares, parts, L.ff2_b, D, a.x, a.pre_lnorm ? nullptr : L.ff_ln_w, L.ff_ln_b);
  }
}

void DecodeBatchLayers(const DecodeStepArgs& a, int64_t begin, int64_t end, TeamBarrier& barrier, KernelIsa isa) {
  const int64_t B = a.batch, D = a.d_model, H = a.attention.H, dh = a.attention.dh;
  const int64_t parts = a.parts, mine = end - begin;
  float* h = a.scratch;  // [B, D]: the input of the attention, then of the feed-forward
  float* qkv = h + B * D;
  float* attended = qkv + B * 3 * H * dh;
  float* out = attended + B * H * dh;  // [B, D]: a block's output before the residual
  float* inner = out + B * D;          // [B, d_inner]
  // This thread's sessions (residuals and norms).
  const int64_t b0 = begin * B / parts, b1 = end * B / parts;
  auto panels = [&](const PackedMatrix& w, const float* in, const float* bias, bool relu, float* y) {
    const int64_t n = (w.rows + kPanel - 1) / kPanel;
    PackedProduct(w, in, B, bias, relu, y, begin * n / parts, end * n / parts, isa);
  };
  auto attention_input = [&](const DecodeStepLayer& L, int64_t b) {
    BlockInput(a.x + b * D, a.pre_lnorm, L.attn_ln_w, L.attn_ln_b, D, h + b * D);
  };
  DecodeAttentionArgs att = a.attention;
  att.batch = B;
  att.qkv = qkv;
  att.out = attended;
  for (int64_t b = b0; b < b1; ++b) attention_input(a.layers[0], b);
  for (int64_t l = 0; l < a.n_layer; ++l) {
    const DecodeStepLayer& L = a.layers[l];
    barrier.Arrive(mine);
    panels(L.packed[0], h, nullptr, false, qkv);
    barrier.Arrive(mine);
    att.sessions = L.sessions;
    att.u = L.u;
    att.v = L.v;
    att.rel = L.rel;
    // Claimed in chunks rather than split evenly: on a loaded machine a
    // preempted thread's share would hold every other thread at the barrier.
    // Items are independent, so the results do not depend on who takes them.
    for (int64_t t = a.claimed[l].fetch_add(kClaim); t < B * H; t = a.claimed[l].fetch_add(kClaim)) {
      DecodeAttention(att, t, std::min(t + kClaim, B * H), isa);
    }
    barrier.Arrive(mine);
    panels(L.packed[1], attended, nullptr, false, out);
    barrier.Arrive(mine);
    for (int64_t b = b0; b < b1; ++b) {
      AddShares(out + b * D, 1, nullptr, D, a.x + b * D, a.pre_lnorm ? nullptr : L.attn_ln_w, L.attn_ln_b);
      BlockInput(a.x + b * D, a.pre_lnorm, L.ff_ln_w, L.ff_ln_b, D, h + b * D);
    }
    barrier.Arrive(mine);
    panels(L.packed[2], h, L.ff1_b, true, inner);
    barrier.Arrive(mine);
    panels(L.packed[3], inner, L.ff2_b, false, out);
    barrier.Arrive(mine);
    for (int64_t b = b0; b < b1; ++b) {
      AddShares(out + b * D, 1, nullptr, D, a.x + b * D, a.pre_lnorm ? nullptr : L.ff_ln_w, L.ff_ln_b);
      if (l + 1 < a.n_layer) attention_input(a.layers[l + 1], b);
    }
  }
}

}  // namespace txl

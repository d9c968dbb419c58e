#include "model/decode_step.h"

#include <cmath>

namespace txl {

namespace {

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

}  // namespace

int64_t DecodeStepScratch(const DecodeStepArgs& a) {
  const int64_t hd = a.attention.H * a.attention.dh;
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
    if (leader) {
      if (a.pre_lnorm) {
        Normalize(a.x, L.attn_ln_w, L.attn_ln_b, D, h);
      } else {
        for (int64_t i = 0; i < D; ++i) h[i] = a.x[i];
      }
    }
    barrier.Arrive(mine);
    att.sessions = &L.session;
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
      if (a.pre_lnorm) {
        Normalize(a.x, L.ff_ln_w, L.ff_ln_b, D, h);
      } else {
        for (int64_t i = 0; i < D; ++i) h[i] = a.x[i];
      }
    }
    barrier.Arrive(mine);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i0 = p * I / parts, i1 = (p + 1) * I / parts;
      GemvRows(L.ff1, h, L.ff1_b, true, inner, D, i0, i1, isa);
      GemvRows(L.ff2.Block(0, i0), inner + i0, nullptr, false, shares + p * D, i1 - i0, 0, D, isa);
    }
    barrier.Arrive(mine);
    if (leader) AddShares(shares, parts, L.ff2_b, D, a.x, a.pre_lnorm ? nullptr : L.ff_ln_w, L.ff_ln_b);
  }
}

}  // namespace txl

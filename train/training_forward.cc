#include "train/training_forward.h"

#include <cmath>

#include "model/net/txl_math.h"

namespace txl {
namespace {

// The original _rel_shift, on scores laid out [..., qlen, klen]: row i is
// shifted left by qlen-1-i, so column j ends up holding distance
// (klen - qlen + i) - j. (The original lays scores out [qlen, klen, b, n];
// batch and heads first keeps the softmax and matmuls contiguous.)
at::Tensor RelShift(const at::Tensor& x) {
  const int64_t q = x.size(-2), k = x.size(-1);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = 1;
  at::Tensor padded = at::cat({at::zeros(shape, x.options()), x}, -1);  // [..., q, k+1]
  shape.back() = q;
  shape[shape.size() - 2] = k + 1;
  return padded.view(shape).slice(-2, 1).reshape(x.sizes());
}

at::Tensor Attention(const ModelConfig& c, const TxlWeights& w, int64_t layer, const at::Tensor& x,
                     const at::Tensor& pos_emb, const at::Tensor& mask, const at::Tensor& mem, bool train) {
  const LayerWeights& L = w.layers[layer];
  const int64_t qlen = x.size(0), bsz = x.size(1), H = c.n_head, dh = c.d_head;
  at::Tensor cat = mem.defined() && mem.size(0) > 0 ? at::cat({mem, x}, 0) : x;
  const int64_t klen = cat.size(0);
  at::Tensor in = c.pre_lnorm ? LayerNorm(cat, L.attn_ln_w, L.attn_ln_b) : cat;
  std::vector<at::Tensor> qkv = at::linear(in, L.qkv_w).chunk(3, -1);
  // [len, bsz, H, dh] -> [bsz, H, len, dh]
  at::Tensor q = qkv[0].slice(0, klen - qlen).reshape({qlen, bsz, H, dh}).permute({1, 2, 0, 3});
  at::Tensor k = qkv[1].reshape({klen, bsz, H, dh}).permute({1, 2, 3, 0});  // [bsz, H, dh, klen]
  at::Tensor v = qkv[2].reshape({klen, bsz, H, dh}).permute({1, 2, 0, 3});
  at::Tensor rk = at::linear(pos_emb, L.r_w).view({klen, H, dh}).permute({1, 2, 0});  // [H, dh, klen]

  at::Tensor ac = at::matmul(q + w.u(c, layer).view({1, H, 1, dh}), k);  // [bsz, H, qlen, klen]
  at::Tensor bd = RelShift(at::matmul(q + w.v(c, layer).view({1, H, 1, dh}), rk));
  at::Tensor score = (ac + bd).mul_(1.0 / std::sqrt(static_cast<double>(dh)));
  score.masked_fill_(mask.view({1, 1, qlen, klen}), -INFINITY);
  at::Tensor prob = at::dropout(at::softmax(score, -1), c.dropatt, train);
  at::Tensor vec = at::matmul(prob, v).permute({2, 0, 1, 3}).reshape({qlen, bsz, H * dh});
  at::Tensor out = at::dropout(at::linear(vec, L.o_w), c.dropout, train);
  if (c.pre_lnorm) return x + out;
  return LayerNorm(x + out, L.attn_ln_w, L.attn_ln_b);
}

}  // namespace

SegmentOutput TrainingForward(const ModelConfig& c, const TxlWeights& w, const at::Tensor& tokens,
                              const std::vector<at::Tensor>& mems, bool train) {
  const int64_t qlen = tokens.size(0);
  const int64_t mlen = mems.empty() ? 0 : mems[0].size(0);
  const int64_t klen = mlen + qlen;
  at::Tensor word_emb = Embed(c, w, tokens);
  const auto opts = word_emb.options();

  at::Tensor ones = at::ones({qlen, klen}, opts.dtype(at::kBool));
  at::Tensor mask = at::triu(ones, 1 + mlen);
  if (c.same_length && c.mem_len > 0) {
    const int64_t mask_len = klen - c.mem_len;
    const int64_t mask_shift_len = mask_len > 0 ? qlen - mask_len : qlen;
    mask = mask | at::tril(ones, -mask_shift_len);
  }

  // Distances klen-1 .. 0 for keys 0 .. klen-1.
  at::Tensor pos_seq = ClampedDistances(c, klen, opts).flip(0);
  at::Tensor pos_emb = at::dropout(PositionEmbedding(w, pos_seq), c.dropout, train);
  at::Tensor core = at::dropout(word_emb, c.dropout, train);

  std::vector<at::Tensor> hids;
  hids.reserve(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    hids.push_back(core);
    core = Attention(c, w, l, core, pos_emb, mask, mems.empty() ? at::Tensor() : mems[l], train);
    core = FeedForward(c, w.layers[l], core, c.dropout, train);
  }

  SegmentOutput out;
  out.hidden = at::dropout(core, c.dropout, train);
  if (c.mem_len > 0) {
    for (int64_t l = 0; l < c.n_layer; ++l) {
      at::Tensor cat = mlen > 0 ? at::cat({mems[l], hids[l]}, 0) : hids[l];
      const int64_t keep = std::min<int64_t>(c.mem_len, cat.size(0));
      out.mems.push_back(cat.slice(0, cat.size(0) - keep).detach());
    }
  }
  return out;
}

}  // namespace txl

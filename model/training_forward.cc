#include "model/training_forward.h"

#include <cmath>

#include "model/txl_math.h"

namespace txl {
namespace {

// The original _rel_shift: row i of x[qlen, klen, ...] is shifted left by
// qlen-1-i, so column j ends up holding distance (klen - qlen + i) - j.
at::Tensor RelShift(const at::Tensor& x) {
  std::vector<int64_t> pad_shape = x.sizes().vec();
  pad_shape[1] = 1;
  at::Tensor padded = at::cat({at::zeros(pad_shape, x.options()), x}, 1);
  std::vector<int64_t> view_shape = x.sizes().vec();
  view_shape[0] = x.size(1) + 1;
  view_shape[1] = x.size(0);
  return padded.view(view_shape).slice(0, 1).view_as(x);
}

at::Tensor Attention(const ModelConfig& c, const TxlWeights& w, int64_t layer, const at::Tensor& x,
                     const at::Tensor& pos_emb, const at::Tensor& mask, const at::Tensor& mem,
                     bool train) {
  const LayerWeights& L = w.layers[layer];
  const int64_t qlen = x.size(0), bsz = x.size(1), H = c.n_head, dh = c.d_head;
  at::Tensor cat = mem.defined() && mem.size(0) > 0 ? at::cat({mem, x}, 0) : x;
  const int64_t klen = cat.size(0);
  at::Tensor in = c.pre_lnorm ? LayerNorm(cat, L.attn_ln_w, L.attn_ln_b) : cat;
  std::vector<at::Tensor> qkv = at::linear(in, L.qkv_w).chunk(3, -1);
  at::Tensor q = qkv[0].slice(0, klen - qlen).reshape({qlen, bsz, H, dh});
  at::Tensor k = qkv[1].reshape({klen, bsz, H, dh});
  at::Tensor v = qkv[2].reshape({klen, bsz, H, dh});
  at::Tensor rk = at::linear(pos_emb, L.r_w).view({klen, H, dh});

  at::Tensor ac = at::einsum("ibnd,jbnd->ijbn", {q + w.u(c, layer), k});
  at::Tensor bd = RelShift(at::einsum("ibnd,jnd->ijbn", {q + w.v(c, layer), rk}));
  at::Tensor score = (ac + bd) * (1.0 / std::sqrt(static_cast<double>(dh)));
  score = score.masked_fill(mask.view({qlen, klen, 1, 1}), -INFINITY);
  at::Tensor prob = at::dropout(at::softmax(score, 1), c.dropatt, train);
  at::Tensor vec = at::einsum("ijbn,jbnd->ibnd", {prob, v}).reshape({qlen, bsz, H * dh});
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

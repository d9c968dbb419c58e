"""Independent functional reference of Transformer-XL (MemTransformerLM, attn_type 0).

Written from the math in docs/MODEL.md, "What is computed" (Dai et al. 2019, the authors' PyTorch
code), with no dependency on the C++ model. It reads a config dict (original key
names) and a dict of tensors under the original names, and computes the per-token
log-probabilities the way the original evaluation does:

  * the sequence t_0..t_{n-1} is split into inputs t_0..t_{n-2} and targets
    t_1..t_{n-1}; inputs are fed in segments of tgt_len;
  * per-layer memories (the input of every layer, the embedding output for layer 0)
    hold the last mem_len positions and are carried from segment to segment;
  * the attention mask is the same_length=True mask, relative scores use the
    `_rel_shift` trick (zero column, reshape, drop the first row), and the
    position sequence klen-1..0 is clamped to clamp_len when clamp_len > 0.

`windowed_log_probs` is a second, independent formulation of the same function
(whole sequence at once, explicit band mask, direct distance indexing, no
memories, no rel_shift) used to cross-check the first.

Everything is computed in float64 by default so that it is a precise yardstick
for the float32 C++ model.

Only the checkpoint format's facts (config keys and defaults, tensor names and shapes,
tied pairs) come from tools/txl_checkpoint_format.py, which the importer uses too; the
C++ loader checks the same facts on its own. The math (embedding, positions, rel_shift,
masks, attention, memories, adaptive softmax) and inv_freq are this file's alone,
shared with nothing it checks.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

# tools/txl_checkpoint_format.py (the format's facts only), found from this file's place.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tools"))
import txl_checkpoint_format as fmt  # noqa: E402
from txl_checkpoint_format import cutoff_ends, embed_dim  # noqa: E402

CONFIG_KEYS = fmt.CONFIG_KEYS

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, as in the original code


def resolve_config(cfg):
    """Returns a copy of cfg with defaults filled in and a few derived values checked."""
    c = fmt.with_defaults(cfg)  # ValueError for unknown keys
    if cfg.get("n_token") is None:
        raise ValueError("config has no n_token")
    if c["tie_projs"] and len(c["tie_projs"]) != len(c["cutoffs"]) + 1:
        raise ValueError("tie_projs must have len(cutoffs)+1 entries")
    if c["tail_cluster_order"] not in ("reversed", "sequential"):
        raise ValueError("tail_cluster_order must be 'reversed' or 'sequential'")
    if not c["same_length"]:
        raise ValueError("this reference implements same_length=True only")
    return c


def expected_shapes(cfg):
    """Ordered {name: shape} of every tensor of the original MemTransformerLM."""
    return fmt.expected_shapes(resolve_config(cfg))


def tied_names(cfg):
    """[(crit_name, word_emb_name)] pairs that hold the same tensor when tied."""
    return fmt.tied_pairs(resolve_config(cfg))


def inv_freq(d_model, dtype=torch.float32):
    """1/10000^(2i/d_model), the reference's own (the power in float64): the stored buffer
    is checked against it, and the float64 forward uses it."""
    return 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=torch.float64) / d_model)).to(dtype)


def rel_shift(x):
    """The original `_rel_shift` on x[qlen, klen, ...]: zero column, reshape, drop the first row."""
    zero_pad = torch.zeros((x.size(0), 1) + tuple(x.size()[2:]), dtype=x.dtype)
    x_padded = torch.cat([zero_pad, x], dim=1)
    x_padded = x_padded.view((x.size(1) + 1, x.size(0)) + tuple(x.size()[2:]))
    return x_padded[1:].reshape(x.size())


def same_length_mask(qlen, mlen, mem_len):
    """Bool [qlen, klen], True = masked, exactly as MemTransformerLM builds it."""
    klen = mlen + qlen
    all_ones = torch.ones(qlen, klen)
    mask_len = klen - mem_len
    mask_shift_len = qlen - mask_len if mask_len > 0 else qlen
    return (torch.triu(all_ones, 1 + mlen) + torch.tril(all_ones, -mask_shift_len)).bool()


class Reference:
    """Functional TXL; `tensors` maps original names to tensors (any float dtype)."""

    def __init__(self, cfg, tensors, dtype=torch.float64):
        self.c = resolve_config(cfg)
        self.dtype = dtype
        shapes = expected_shapes(self.c)
        missing = [k for k in shapes if k not in tensors]
        if missing:
            raise ValueError("missing tensors: %s" % missing)
        self.w = {}
        for k, shape in shapes.items():
            t = tensors[k].detach().to(dtype)
            if tuple(t.shape) != tuple(shape):
                raise ValueError("%s has shape %s, expected %s" % (k, tuple(t.shape), shape))
            self.w[k] = t
        # Tying: the crit tensor *is* the embedding tensor in the original model; a
        # checkpoint stores it under both names, so both copies must agree.
        for crit_name, emb_name in tied_names(self.c):
            if not torch.equal(self.w[crit_name], self.w[emb_name]):
                raise ValueError("%s is tied to %s but differs" % (crit_name, emb_name))
            self.w[crit_name] = self.w[emb_name]
        if not torch.allclose(tensors["pos_emb.inv_freq"].to(torch.float64),
                              inv_freq(self.c["d_model"], torch.float64), rtol=1e-6, atol=0):
            raise ValueError("pos_emb.inv_freq differs from 1/10000^(2i/d)")

    # ---------------------------------------------------------------- pieces
    def embed(self, ids):
        """AdaptiveEmbedding: ids [T] -> [T, d_model], scaled by sqrt(d_model)."""
        c, w = self.c, self.w
        d = c["d_model"]
        if c["div_val"] == 1:
            emb = w["word_emb.emb_layers.0.weight"][ids]
            if embed_dim(c) != d:
                emb = F.linear(emb, w["word_emb.emb_projs.0"])
        else:
            ends = cutoff_ends(c)
            emb = torch.zeros(ids.numel(), d, dtype=self.dtype)
            for i in range(len(ends) - 1):
                lo, hi = ends[i], ends[i + 1]
                sel = ((ids >= lo) & (ids < hi)).nonzero().squeeze(1)
                if sel.numel() == 0:
                    continue
                e = w["word_emb.emb_layers.%d.weight" % i][ids[sel] - lo]
                emb[sel] = F.linear(e, w["word_emb.emb_projs.%d" % i])
        return emb * (d ** 0.5)

    def pos_emb(self, pos_seq):
        sinusoid = torch.outer(pos_seq.to(self.dtype), self.w["pos_emb.inv_freq"])
        return torch.cat([sinusoid.sin(), sinusoid.cos()], dim=-1)

    def _layer_norm(self, x, prefix):
        d = self.c["d_model"]
        return F.layer_norm(x, (d,), self.w[prefix + ".weight"], self.w[prefix + ".bias"],
                            LAYER_NORM_EPS)

    def _biases(self, l):
        u, v = self.w["r_w_bias"], self.w["r_r_bias"]
        if self.c["untie_r"]:
            u, v = u[l], v[l]
        return u, v

    def attention(self, l, x, mem, pos_emb, mask):
        """RelPartialLearnableMultiHeadAttn: x [qlen, d], mem [mlen, d], pos_emb [klen, d]."""
        c, w = self.c, self.w
        p = "layers.%d.dec_attn." % l
        H, dh = c["n_head"], c["d_head"]
        qlen = x.size(0)
        cat = torch.cat([mem, x], dim=0)
        klen = cat.size(0)
        if c["pre_lnorm"]:
            heads = F.linear(self._layer_norm(cat, p + "layer_norm"), w[p + "qkv_net.weight"])
        else:
            heads = F.linear(cat, w[p + "qkv_net.weight"])
        r_head_k = F.linear(pos_emb, w[p + "r_net.weight"]).view(klen, H, dh)
        q, k, v = torch.chunk(heads, 3, dim=-1)
        q = q[-qlen:].reshape(qlen, H, dh)
        k = k.reshape(klen, H, dh)
        v = v.reshape(klen, H, dh)
        u, vb = self._biases(l)
        ac = torch.einsum("ihd,jhd->ijh", q + u, k)
        bd = rel_shift(torch.einsum("ihd,jhd->ijh", q + vb, r_head_k))
        score = (ac + bd) * (1.0 / math.sqrt(dh))
        score = score.masked_fill(mask[:, :, None], float("-inf"))
        prob = torch.softmax(score, dim=1)
        vec = torch.einsum("ijh,jhd->ihd", prob, v).reshape(qlen, H * dh)
        out = F.linear(vec, w[p + "o_net.weight"])
        if c["pre_lnorm"]:
            return x + out
        return self._layer_norm(x + out, p + "layer_norm")

    def feed_forward(self, l, x):
        w = self.w
        p = "layers.%d.pos_ff." % l

        def core(h):
            h = F.relu(F.linear(h, w[p + "CoreNet.0.weight"], w[p + "CoreNet.0.bias"]))
            return F.linear(h, w[p + "CoreNet.3.weight"], w[p + "CoreNet.3.bias"])

        if self.c["pre_lnorm"]:
            return x + core(self._layer_norm(x, p + "layer_norm"))
        return self._layer_norm(x + core(x), p + "layer_norm")

    def segment(self, ids, mems, mem_len, clamp_len):
        """One MemTransformerLM._forward step: ids [qlen], mems list of n_layer+1 [mlen, d]."""
        qlen = ids.numel()
        mlen = mems[0].size(0)
        klen = mlen + qlen
        mask = same_length_mask(qlen, mlen, mem_len)
        pos_seq = torch.arange(klen - 1, -1, -1.0, dtype=torch.float64)
        if clamp_len > 0:
            pos_seq = pos_seq.clamp(max=clamp_len)
        pos_emb = self.pos_emb(pos_seq)
        h = self.embed(ids)
        hids = [h]
        for l in range(self.c["n_layer"]):
            h = self.attention(l, h, mems[l], pos_emb, mask)
            h = self.feed_forward(l, h)
            hids.append(h)
        # _update_mems (ext_len 0): keep the last mem_len positions of cat(mems, hids).
        end = mlen + qlen
        beg = max(0, end - mem_len)
        new_mems = [torch.cat([m, x], dim=0)[beg:end] for m, x in zip(mems, hids)]
        return h, new_mems

    def log_prob_table(self, hidden):
        """ProjectedAdaptiveLogSoftmax as a full table: hidden [T, d] -> log p [T, n_token]."""
        c, w = self.c, self.w
        de = embed_dim(c)
        div1 = c["div_val"] == 1

        def logit(h, weight, bias, proj_name):
            if proj_name is not None:
                h = h @ w[proj_name]  # F.linear(h, proj.t())
            return F.linear(h, weight, bias)

        def proj_name(i):
            name = "crit.out_projs.%d" % i
            if div1 and de == c["d_model"]:
                return None
            return name

        ends = cutoff_ends(c)
        n_clusters = len(c["cutoffs"])
        if n_clusters == 0:
            return torch.log_softmax(logit(hidden, w["crit.out_layers.0.weight"],
                                           w["crit.out_layers.0.bias"], proj_name(0)), dim=-1)

        def weight_bias(i):
            if div1:
                lo, hi = ends[i], ends[i + 1]
                return w["crit.out_layers.0.weight"][lo:hi], w["crit.out_layers.0.bias"][lo:hi]
            return w["crit.out_layers.%d.weight" % i], w["crit.out_layers.%d.bias" % i]

        hw, hb = weight_bias(0)
        hw = torch.cat([hw, w["crit.cluster_weight"]], dim=0)
        hb = torch.cat([hb, w["crit.cluster_bias"]], dim=0)
        head = torch.log_softmax(logit(hidden, hw, hb, proj_name(0)), dim=-1)
        parts = [head[:, : ends[1]]]
        for i in range(1, n_clusters + 1):
            if c["tail_cluster_order"] == "reversed":
                col = head.size(1) - i  # original PyTorch: head_logprob[:, -i]
            else:
                col = c["cutoffs"][0] + i - 1  # TF / Hugging Face
            tw, tb = weight_bias(i)
            tail = torch.log_softmax(logit(hidden, tw, tb, proj_name(i)), dim=-1)
            parts.append(head[:, col : col + 1] + tail)
        return torch.cat(parts, dim=1)

    # ---------------------------------------------------------------- drivers
    def _settings(self, mem_len, clamp_len):
        mem_len = self.c["mem_len"] if mem_len is None else mem_len
        clamp_len = self.c["clamp_len"] if clamp_len is None else clamp_len
        if mem_len < 1:
            raise ValueError("same_length evaluation needs mem_len >= 1")
        return mem_len, clamp_len

    def hidden_states(self, tokens, tgt_len=None, mem_len=None, clamp_len=None):
        """Final hidden state of every input position, feeding segments of tgt_len."""
        mem_len, clamp_len = self._settings(mem_len, clamp_len)
        ids = torch.as_tensor(tokens, dtype=torch.long)
        n = ids.numel()
        tgt_len = n if not tgt_len else tgt_len
        d = self.c["d_model"]
        mems = [torch.zeros(0, d, dtype=self.dtype) for _ in range(self.c["n_layer"] + 1)]
        outs = []
        for beg in range(0, n, tgt_len):
            h, mems = self.segment(ids[beg : beg + tgt_len], mems, mem_len, clamp_len)
            outs.append(h)
        return torch.cat(outs, dim=0)

    def log_probs(self, tokens, tgt_len=None, mem_len=None, clamp_len=None):
        """[n-1] tensor: entry i-1 = log p(t_i | t_0..t_{i-1}), the original evaluation."""
        ids = torch.as_tensor(tokens, dtype=torch.long)
        if ids.numel() < 2:
            return torch.zeros(0, dtype=self.dtype)
        hidden = self.hidden_states(ids[:-1], tgt_len, mem_len, clamp_len)
        table = self.log_prob_table(hidden)
        return table.gather(1, ids[1:, None]).squeeze(1)

    def windowed_log_probs(self, tokens, mem_len=None, clamp_len=None):
        """Same function, second formulation: the whole sequence at once, each query
        attending to keys j with i - mem_len < j <= i at distance i - j (clamped),
        gathered directly (no memories, no rel_shift)."""
        mem_len, clamp_len = self._settings(mem_len, clamp_len)
        c, w = self.c, self.w
        ids = torch.as_tensor(tokens, dtype=torch.long)
        inp = ids[:-1]
        T = inp.numel()
        H, dh = c["n_head"], c["d_head"]
        i_idx = torch.arange(T)[:, None]
        j_idx = torch.arange(T)[None, :]
        dist = i_idx - j_idx
        allowed = (dist >= 0) & (dist < mem_len)
        dist_c = dist.clamp(min=0)
        if clamp_len > 0:
            dist_c = dist_c.clamp(max=clamp_len)
        r = self.pos_emb(torch.arange(T, dtype=torch.float64))  # r[p] = embedding of distance p
        h = self.embed(inp)
        for l in range(c["n_layer"]):
            p = "layers.%d.dec_attn." % l
            src = self._layer_norm(h, p + "layer_norm") if c["pre_lnorm"] else h
            q, k, v = [t.reshape(T, H, dh) for t in
                       torch.chunk(F.linear(src, w[p + "qkv_net.weight"]), 3, dim=-1)]
            rk = F.linear(r, w[p + "r_net.weight"]).view(T, H, dh)
            u, vb = self._biases(l)
            ac = torch.einsum("ihd,jhd->ijh", q + u, k)
            # bd[i, j, h] = (q_i + v) . rk[dist(i, j)]
            all_bd = torch.einsum("ihd,phd->iph", q + vb, rk)
            bd = all_bd.gather(1, dist_c[:, :, None].expand(T, T, H))
            score = (ac + bd) / math.sqrt(dh)
            score = score.masked_fill(~allowed[:, :, None], float("-inf"))
            prob = torch.softmax(score, dim=1)
            out = F.linear(torch.einsum("ijh,jhd->ihd", prob, v).reshape(T, H * dh),
                           w[p + "o_net.weight"])
            h = h + out if c["pre_lnorm"] else self._layer_norm(h + out, p + "layer_norm")
            h = self.feed_forward(l, h)
        table = self.log_prob_table(h)
        return table.gather(1, ids[1:, None]).squeeze(1)

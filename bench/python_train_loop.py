#!/usr/bin/python3
"""The Python side of bench P6: Transformer-XL trained the way the original
authors' PyTorch code trains it, for a tokens/s comparison with txl-train.

The model math is tests/python/txl_reference.py's (embedding, sinusoid
position embedding, `rel_shift`, layer norms, feed-forward, output softmax),
with its weights turned into autograd leaves; only the attention is written
here again, batched in the original layout ([len, batch, heads, d_head],
einsum 'ibnd,jbnd->ijbn'), because the reference's attention handles one
stream. The training scheme is txl-train's (and the original's):

  * the corpus cut into batch_size parallel streams (LMOrderedIterator), read in
    consecutive segments of tgt_len; step k reads segment k mod segments, and a
    new pass over the data starts without memory;
  * per-layer memories (the input of every layer) of the last mem_len
    positions, carried to the next segment detached (no gradient through them);
  * the causal mask over cat(memory, segment) (same_length off, as txl-train
    trains by default), dropout / dropatt as configured;
  * loss = mean next-token NLL over the segment; Adam (0.9, 0.999, eps 1e-8),
    gradient-norm clipping, linear warm-up then cosine decay (txl-train's
    schedule).

It starts from a checkpoint (written by txl-init with the seed txl-train uses),
so its first loss must equal txl-train's first loss: the sanity check that
both compute the same quantity.

    python_train_loop.py --init INIT.pt --text CORPUS --threads 2 --max_steps 25 --skip 5 --json OUT

Prints one JSON line: tokens_per_second (steps after --skip only), losses, times.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import txl_reference  # noqa: E402  (the team's independent reference)


def load_checkpoint(path):
    extra = {"config.json": "", "tokenizer.json": ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    tensors = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return json.loads(extra["config.json"]), json.loads(extra["tokenizer.json"]), tensors


def encode(text, tokenizer):
    if tokenizer.get("type") != "char":
        raise SystemExit("python_train_loop.py: only char tokenizers are supported, got %r" % tokenizer.get("type"))
    index = {s: i for i, s in enumerate(tokenizer["symbols"])}
    try:
        return [index[ch] for ch in text]
    except KeyError as e:
        raise SystemExit("python_train_loop.py: character %r is not in the checkpoint's vocabulary" % e.args[0])


class TrainableReference(txl_reference.Reference):
    """The reference's functional model with its weights as trainable leaves."""

    def __init__(self, cfg, tensors, device):
        cfg = dict(cfg)
        cfg["same_length"] = True  # the reference checks it; training below uses the causal mask
        super().__init__(cfg, tensors, dtype=torch.float32)
        leaves = {}  # one leaf per distinct tensor, so tied weights stay tied
        for name, t in list(self.w.items()):
            key = id(t)
            if key not in leaves:
                leaf = t.to(device).clone()
                if name != "pos_emb.inv_freq":  # a buffer in the original model
                    leaf.requires_grad_(True)
                leaves[key] = leaf
            self.w[name] = leaves[key]
        self.params = [t for t in leaves.values() if t.requires_grad]
        self.device = device

    def pos_emb(self, pos_seq):
        sinusoid = torch.outer(pos_seq.to(self.dtype), self.w["pos_emb.inv_freq"])
        return torch.cat([sinusoid.sin(), sinusoid.cos()], dim=-1)

    def batched_attention(self, l, x, mem, pos_emb, mask, train):
        """RelPartialLearnableMultiHeadAttn.forward: x [qlen, b, d], mem [mlen, b, d] or None."""
        c, w = self.c, self.w
        p = "layers.%d.dec_attn." % l
        H, dh = c["n_head"], c["d_head"]
        qlen, bsz = x.size(0), x.size(1)
        cat = torch.cat([mem, x], dim=0) if mem is not None else x
        klen = cat.size(0)
        src = self._layer_norm(cat, p + "layer_norm") if c["pre_lnorm"] else cat
        w_heads = F.linear(src, w[p + "qkv_net.weight"])
        r_head_k = F.linear(pos_emb, w[p + "r_net.weight"]).view(klen, H, dh)
        q, k, v = torch.chunk(w_heads, 3, dim=-1)
        q = q[-qlen:].view(qlen, bsz, H, dh)
        k = k.view(klen, bsz, H, dh)
        v = v.view(klen, bsz, H, dh)
        u, vb = self._biases(l)
        ac = torch.einsum("ibnd,jbnd->ijbn", q + u, k)
        bd = txl_reference.rel_shift(torch.einsum("ibnd,jnd->ijbn", q + vb, r_head_k))
        score = (ac + bd) * (1.0 / math.sqrt(dh))
        score = score.masked_fill(mask[:, :, None, None], float("-inf"))
        prob = F.dropout(torch.softmax(score, dim=1), c["dropatt"], train)
        vec = torch.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, bsz, H * dh)
        out = F.dropout(F.linear(vec, w[p + "o_net.weight"]), c["dropout"], train)
        if c["pre_lnorm"]:
            return x + out
        return self._layer_norm(x + out, p + "layer_norm")

    def feed_forward_train(self, l, x, train):
        w = self.w
        p = "layers.%d.pos_ff." % l

        def core(h):
            h = F.relu(F.linear(h, w[p + "CoreNet.0.weight"], w[p + "CoreNet.0.bias"]))
            h = F.dropout(h, self.c["dropout"], train)
            h = F.linear(h, w[p + "CoreNet.3.weight"], w[p + "CoreNet.3.bias"])
            return F.dropout(h, self.c["dropout"], train)

        if self.c["pre_lnorm"]:
            return x + core(self._layer_norm(x, p + "layer_norm"))
        return self._layer_norm(x + core(x), p + "layer_norm")

    def segment_loss(self, inp, target, mems, mem_len, train=True):
        """MemTransformerLM.forward on one segment: inp/target [qlen, b]; returns (mean NLL, new mems)."""
        c = self.c
        qlen, bsz = inp.shape
        mlen = mems[0].size(0) if mems else 0
        klen = mlen + qlen
        d = c["d_model"]
        word_emb = self.embed(inp.reshape(-1)).view(qlen, bsz, d)
        mask = torch.triu(torch.ones(qlen, klen, device=self.device), diagonal=1 + mlen).bool()
        pos_seq = torch.arange(klen - 1, -1, -1.0, device=self.device)
        if c["clamp_len"] > 0:
            pos_seq = pos_seq.clamp(max=c["clamp_len"])
        pos_emb = F.dropout(self.pos_emb(pos_seq), c["dropout"], train)
        core = F.dropout(word_emb, c["dropout"], train)
        hids = []
        for l in range(c["n_layer"]):
            hids.append(core)
            core = self.batched_attention(l, core, mems[l] if mems else None, pos_emb, mask, train)
            core = self.feed_forward_train(l, core, train)
        hidden = F.dropout(core, c["dropout"], train)
        new_mems = []
        if mem_len > 0:
            with torch.no_grad():
                for l in range(c["n_layer"]):
                    cat = torch.cat([mems[l], hids[l]], dim=0) if mems else hids[l]
                    new_mems.append(cat[-mem_len:].detach())
        logp = self.log_prob_table(hidden.view(-1, d))
        loss = -logp.gather(1, target.reshape(-1, 1)).mean()
        return loss, new_mems


def learning_rate(step, lr, warmup, max_steps, min_lr=0.0):
    """txl-train's schedule: linear warm-up, then cosine decay to min_lr."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, max_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", required=True, help="initial checkpoint (txl-init, same config and seed as txl-train)")
    ap.add_argument("--text", required=True, help="training text (the same file txl-train gets)")
    ap.add_argument("--valid_fraction", type=float, default=0.1, help="tail held out, as txl-train does")
    ap.add_argument("--tgt_len", type=int, default=128)
    ap.add_argument("--mem_len", type=int, default=128)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--max_steps", type=int, default=25, help="optimizer steps run (and the schedule's length)")
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--dropout", type=float, default=None, help="override the checkpoint's dropout")
    ap.add_argument("--dropatt", type=float, default=None, help="override the checkpoint's dropatt")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of tokens/s")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args()
    if args.skip >= args.max_steps:
        raise SystemExit("python_train_loop.py: --skip must be < --max_steps")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("python_train_loop.py: --device %s: this torch has no CUDA or no GPU is visible" % args.device)
    device = torch.device(args.device)

    cfg, tokenizer, tensors = load_checkpoint(args.init)
    if args.dropout is not None:
        cfg["dropout"] = args.dropout
    if args.dropatt is not None:
        cfg["dropatt"] = args.dropatt
    model = TrainableReference(cfg, tensors, device)

    with open(args.text, encoding="utf-8") as f:
        ids = encode(f.read(), tokenizer)
    n_valid = int(len(ids) * args.valid_fraction)
    train_ids = torch.tensor(ids[: len(ids) - n_valid], dtype=torch.long)
    B, T = args.batch_size, args.tgt_len
    stream_len = train_ids.numel() // B
    if stream_len < T + 1:
        raise SystemExit("python_train_loop.py: the training text is shorter than one segment")
    streams = train_ids[: B * stream_len].view(B, stream_len).t().contiguous().to(device)  # [stream_len, B]
    segments = (stream_len - 1 + T - 1) // T

    opt = torch.optim.Adam(model.params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    mems = []
    losses, step_seconds = [], []
    for step in range(args.max_steps):
        start = time.perf_counter()
        k = step % segments
        if k == 0:
            mems = []
        beg = k * T
        seq = min(T, stream_len - 1 - beg)
        inp, target = streams[beg : beg + seq], streams[beg + 1 : beg + 1 + seq]
        loss, new_mems = model.segment_loss(inp, target, mems, args.mem_len, train=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.params, args.clip)
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, args.lr, args.warmup, args.max_steps)
        opt.step()
        mems = new_mems
        losses.append(loss.item())  # also waits for the device
        step_seconds.append(time.perf_counter() - start)

    measured = step_seconds[args.skip :]
    tokens = B * T * len(measured)
    result = {
        "tokens_per_second": tokens / sum(measured),
        "measured_steps": len(measured),
        "skipped_steps": args.skip,
        "step_seconds": step_seconds,
        "losses": losses,
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.params),
        "torch": torch.__version__,
        "device": str(device),
    }
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()

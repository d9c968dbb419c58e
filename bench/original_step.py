#!/usr/bin/python3
"""Times the original authors' MemTransformerLM per token at a full memory (bench/run.py P9).

    python3 bench/original_step.py --original DIR --model CKPT --tokens IDS
                                   [--mem 800] [--steps 20] [--check 8] [--threads 2]

DIR is the original code's pytorch/ folder (mem_transformer.py, utils/); it is not part
of txl-serve and is never committed here. The model is built with the original
constructor from the checkpoint's config and loaded (strict) with the checkpoint's
tensors, which are stored under the original names (tools/txl_checkpoint_format.py).
Then, under torch.no_grad() in eval mode with bsz 1:

  * fill: one forward of the first `mem` ids of IDS at once (mems from nothing to `mem`
    positions; with same_length the fill attends exactly as token-by-token would);
  * `steps` timed forwards of one token each, the original's way of serving: data and
    target [1, 1], the mems returned by the previous call passed back; each call
    projects the keys and values of the whole memory again (hidden-state memory).

Each forward returns [loss] + new_mems; the loss of step i is -log p(ids[mem+i+1] |
ids[..mem+i]), which bench/run.py compares with txl-eval's log-probabilities of the same
ids (--check steps) to show that both sides run the same weights and math.

The original code uses uint8 ("byte") attention masks, which newer PyTorch refuses in
masked_fill; when its source has `.byte()` it is loaded with `.bool()` in their place
(the same masks) and the JSON says so ("patched"). Nothing else is changed.

Prints one JSON line: median_step_seconds, step_seconds, nll (the first --check steps),
patched, torch.
"""
import argparse
import json
import os
import statistics
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import txl_checkpoint_format as fmt  # noqa: E402


def load_original(directory):
    """The original mem_transformer module, its `.byte()` masks as `.bool()`; (module, patches)."""
    path = os.path.join(directory, "mem_transformer.py")
    if not os.path.exists(path):
        raise SystemExit("original_step.py: no mem_transformer.py in %s (--original: the pytorch/ folder)" % directory)
    # The original imports its helpers with sys.path.append('utils'): relative to the cwd.
    for p in (os.path.join(directory, "utils"), directory):
        if p not in sys.path:
            sys.path.insert(0, p)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    patches = []
    if ".byte()" in source:
        source = source.replace(".byte()", ".bool()")
        patches.append(".byte() -> .bool() (masked_fill masks)")
    module = types.ModuleType("mem_transformer")
    module.__file__ = path
    sys.modules["mem_transformer"] = module
    cwd = os.getcwd()
    os.chdir(directory)  # sys.path.append('utils') at import time
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    finally:
        os.chdir(cwd)
    return module, patches


def build(module, cfg, mem):
    """MemTransformerLM from the checkpoint's config (original names), dropout off."""
    c = fmt.with_defaults(cfg)
    if c["untie_r"]:
        raise SystemExit("original_step.py: untie_r=true: the original PyTorch code has no untied biases")
    if c["tail_cluster_order"] != "reversed":
        raise SystemExit("original_step.py: tail_cluster_order %s: the original code orders its tail clusters "
                         "'reversed'" % c["tail_cluster_order"])
    tie_projs = list(c["tie_projs"]) or [False] * (len(c["cutoffs"]) + 1)
    return module.MemTransformerLM(
        n_token=c["n_token"], n_layer=c["n_layer"], n_head=c["n_head"], d_model=c["d_model"], d_head=c["d_head"],
        d_inner=c["d_inner"], dropout=0.0, dropatt=0.0, tie_weight=c["tie_weight"], d_embed=fmt.embed_dim(c),
        div_val=c["div_val"], tie_projs=tie_projs, pre_lnorm=c["pre_lnorm"], tgt_len=1, ext_len=0, mem_len=mem,
        cutoffs=list(c["cutoffs"]), same_length=c["same_length"], attn_type=0, clamp_len=c["clamp_len"],
        sample_softmax=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--original", required=True, help="the original code's pytorch/ folder")
    ap.add_argument("--model", required=True, help="txl-serve checkpoint (its tensors under the original names)")
    ap.add_argument("--tokens", required=True, help="whitespace-separated ids: mem + steps + 1 of them at least")
    ap.add_argument("--mem", type=int, default=800, help="memory positions (mem_len) before each timed step")
    ap.add_argument("--steps", type=int, default=20, help="timed one-token steps")
    ap.add_argument("--check", type=int, default=8, help="report the loss of the first N steps")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = ap.parse_args()
    torch.set_num_threads(max(1, args.threads))
    with open(args.tokens) as f:
        ids = [int(x) for x in f.read().split()]
    if len(ids) < args.mem + args.steps + 1:
        raise SystemExit("original_step.py: %s has %d ids; --mem %d --steps %d need %d" %
                         (args.tokens, len(ids), args.mem, args.steps, args.mem + args.steps + 1))

    module, patches = load_original(os.path.abspath(args.original))
    ckpt, cfg, _ = fmt.read_checkpoint(args.model)
    if cfg is None:
        raise SystemExit("original_step.py: %s has no config.json" % args.model)
    model = build(module, cfg, args.mem)
    state = {k: v.detach().clone().float() for k, v in ckpt.state_dict().items()}
    # strict: every tensor of the original model comes from the checkpoint, and no
    # checkpoint tensor is left over (tied copies are stored under both names).
    model.load_state_dict(state, strict=True)
    model.eval()

    steps, check = args.steps, min(args.check, args.steps)
    data = torch.tensor(ids, dtype=torch.long).view(-1, 1)  # [len, bsz 1]
    times, nll = [], []
    with torch.no_grad():
        out = model(data[: args.mem], data[1 : args.mem + 1])  # fill: mems of `mem` positions
        mems = out[1:]
        if not mems or mems[0].size(0) != args.mem:
            raise SystemExit("original_step.py: after the fill the mems hold %s positions, expected %d" %
                             (mems[0].size(0) if mems else "no", args.mem))
        for i in range(steps):
            p = args.mem + i
            t0 = time.perf_counter()
            out = model(data[p : p + 1], data[p + 1 : p + 2], *mems)
            loss = out[0]
            mems = out[1:]
            times.append(time.perf_counter() - t0)
            if i < check:
                nll.append(float(loss.reshape(-1)[0]))
        if mems[0].size(0) != args.mem:
            raise SystemExit("original_step.py: the mems hold %d positions after the steps, expected %d" %
                             (mems[0].size(0), args.mem))
    print(json.dumps({"median_step_seconds": statistics.median(times), "step_seconds": times, "steps": steps,
                      "mem": args.mem, "threads": args.threads, "nll": nll, "patched": patches,
                      "torch": torch.__version__, "original": os.path.basename(os.path.abspath(args.original))}))


if __name__ == "__main__":
    main()

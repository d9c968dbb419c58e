#!/usr/bin/python3
"""Random Transformer-XL checkpoints in txl-serve's format (docs/FORMATS.md, "Checkpoint").

The format (tensor names and shapes, tied pairs, config.json and tokenizer.json in a
TorchScript archive) is tools/txl_checkpoint_format.py's, the importer's writer; what
is this file's own is the random values and the test tokenizers.

The random weights are deliberately far from the usual normal(0, 0.02) init, so
that attention patterns, positions and memories change the log-probs visibly.

As a module: random_weights(), save_checkpoint(), load_checkpoint().
As a script:
  make_checkpoint.py --config CFG.json --out M.pt [--seed S] [--n_token N]
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
import txl_checkpoint_format as fmt  # noqa: E402
import txl_reference as ref  # noqa: E402


def char_tokenizer(n_token):
    """{"type": "char"} with n_token distinct single-character symbols (CJK block)."""
    return {"type": "char", "symbols": [chr(0x4E00 + i) for i in range(n_token)]}


def default_tokenizer(n_token):
    return {"type": "byte"} if n_token == 256 else char_tokenizer(n_token)


def random_weights(cfg, seed=0):
    """{original name: float32 tensor} with discriminative random values."""
    c = ref.resolve_config(cfg)
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean

    # Pre-norm has no final layer norm: the residual stream (and so the logits) grows
    # with every layer. Smaller residual writers keep its log-probs in the same range
    # as post-norm's (mean around -5..-8), away from float32 trouble.
    pre = c["pre_lnorm"]
    out = {}
    for name, shape in fmt.expected_shapes(c).items():
        leaf = name.rsplit(".", 1)[-1]
        if name == "pos_emb.inv_freq":
            t = ref.inv_freq(c["d_model"], torch.float32)
        elif ".layer_norm." in name:
            t = normal(shape, 0.2, 1.0) if leaf == "weight" else normal(shape, 0.1)
        elif name in ("r_w_bias", "r_r_bias"):
            t = normal(shape, 0.5)
        elif "dec_attn." in name:  # qkv_net, r_net, o_net
            t = normal(shape, 0.3 if "o_net" not in name else (0.08 if pre else 0.2))
        elif "pos_ff.CoreNet.0" in name:
            t = normal(shape, 0.25) if leaf == "weight" else normal(shape, 0.2)
        elif "pos_ff.CoreNet.3" in name:
            t = normal(shape, 0.08 if pre else 0.25) if leaf == "weight" else normal(shape, 0.2)
        elif name.startswith("word_emb.emb_layers"):
            t = normal(shape, 0.12 if pre else 0.3)
        elif "emb_projs" in name or "out_projs" in name:
            t = normal(shape, 1.0 / shape[1] ** 0.5)
        elif name.startswith("crit.out_layers"):
            t = normal(shape, 0.12 if pre else 0.3) if leaf == "weight" else normal(shape, 0.5)
        elif name == "crit.cluster_weight":
            t = normal(shape, 0.3)
        elif name == "crit.cluster_bias":
            t = normal(shape, 0.5)
        else:
            raise AssertionError("no init rule for " + name)
        out[name] = t.float().contiguous()
    for crit_name, emb_name in fmt.tied_pairs(c):
        out[crit_name] = out[emb_name].clone()
    return out


def save_checkpoint(path, cfg, tensors, tokenizer=None):
    """Writes a TorchScript archive with config.json and tokenizer.json inside."""
    c = ref.resolve_config(cfg)
    tokenizer = default_tokenizer(c["n_token"]) if tokenizer is None else tokenizer
    fmt.write_checkpoint(path, c, tensors, tokenizer)


def load_checkpoint(path):
    """(config dict, {name: tensor}, tokenizer dict) from any archive of our format."""
    module, cfg, tok = fmt.read_checkpoint(path)
    tensors = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return cfg, tensors, tok


def make_random_checkpoint(path, cfg, seed=0, tokenizer=None):
    tensors = random_weights(cfg, seed)
    save_checkpoint(path, cfg, tensors, tokenizer)
    return tensors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="JSON config (original key names)")
    ap.add_argument("--out", required=True, help="archive to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n_token", type=int, default=None, help="overrides/sets n_token")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)
    if args.n_token is not None:
        cfg["n_token"] = args.n_token
    tensors = make_random_checkpoint(args.out, cfg, args.seed)
    n = sum(t.numel() for t in tensors.values())
    print("wrote %s (%d tensors, %d values)" % (args.out, len(tensors), n))


if __name__ == "__main__":
    main()

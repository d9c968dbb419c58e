#!/usr/bin/python3
"""txl-import: converts Transformer-XL weights trained elsewhere into a txl-serve checkpoint.

  txl-import --source original|hf|nvidia --weights FILE --config CFG.json
             (--vocab FILE | --tokenizer byte | --corpus FILE) --out M.pt

FILE is what Python's torch.save wrote (a state_dict, a dict holding one under
'model_state', 'state_dict' or 'model', or a pickled whole nn.Module, whose class
need not be importable here), or a TorchScript archive. A leading `module.`
(DistributedDataParallel) prefix is stripped. A torch.save file is unpickled: import
only files you trust.

Namings (--source):
  original  the authors' PyTorch MemTransformerLM names (`word_emb.emb_layers.0.weight`,
            `layers.0.dec_attn.qkv_net.weight`, `crit.out_layers.0.weight`, ...).
  hf        Hugging Face TransfoXLLMHeadModel: everything but `crit.` under `transformer.`;
            with untie_r the biases are per layer (`transformer.layers.{i}.dec_attn.r_w_bias`
            [H, dh]) and are stacked into `r_w_bias` [n_layer, H, dh].
  nvidia    NVIDIA DeepLearningExamples PyTorch Transformer-XL: the original names but
            `crit.out_layers_weights.{i}` / `crit.out_layers_biases.{i}`; tied output
            tables and projections are simply absent, and `crit.shared_out_projs.{i}`
            (a second registration of `word_emb.emb_projs`) must equal the embedding's.
            For their TorchScript export the tensors kept in list attributes
            (`word_emb.emb_projs`, `crit.out_projs`, `crit.out_layers_weights`,
            `crit.out_layers_biases`) are read too.

Tail-cluster order (which head column holds the log-prob of tail cluster i):
  original  column -i ("reversed"): `head_logprob_i[:, -i]` in the authors' code.
  hf        column cutoffs[0] + i - 1 ("sequential"): `cluster_prob_idx = self.cutoffs[0]
            + i - 1` in ProjectedAdaptiveLogSoftmax.forward (transformers,
            models/transfo_xl/modeling_transfo_xl_utilities.py), as in the TF code.
  nvidia    column -i ("reversed"): NVIDIA/DeepLearningExamples,
            PyTorch/LanguageModeling/Transformer-XL/pytorch/utils/proj_adaptive_softmax.py
            (`logprob_i = head_logprob_i[:, -i] + ...`), and the same line in their
            TorchScript variant pytorch/inference/proj_adaptive_softmax_jit.py.
A `tail_cluster_order` in CFG.json that contradicts the source is an error.

CFG.json takes the original constructor names (n_token n_layer n_head d_model d_head
d_inner d_embed div_val cutoffs tie_weight tie_projs pre_lnorm untie_r mem_len clamp_len
same_length dropout dropatt). What the tensors determine (n_token, n_layer, n_head,
d_head, d_model, d_inner, d_embed, div_val and cutoffs when there are several embedding
tables, the number of clusters, untie_r, tie_weight / tie_projs when a tied copy is
absent or differs) is inferred and checked against CFG.json; the rest (pre_lnorm,
mem_len, clamp_len, same_length, dropout, dropatt, and cutoffs with div_val 1) comes
from CFG.json or txl-serve's defaults.

Errors (exit 1, message on stderr prefixed `txl-import: `): unreadable input, unknown,
missing or misshapen tensors (named, with expected and actual shapes), a config that
contradicts the tensors (naming the key, its value and the value the tensors imply),
tied copies that differ, non-finite weights, a tokenizer whose size is not n_token.
Usage errors exit 2. The output is written atomically (temporary file + rename).
"""

import argparse
import json
import os
import re
import sys
from collections import OrderedDict

import torch

# The checkpoint format (config keys and defaults, tensor names and shapes, tied pairs,
# writing the archive) lives beside this file, wherever it is run from; so do the
# importer's parts: reading the weights and their naming (txl_import_weights.py) and
# the config (txl_import_config.py).
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from txl_checkpoint_format import (  # noqa: E402
    TENSOR_NAME_RE, embed_dim, expected_shapes, inv_freq, tied_pairs, write_checkpoint)
from txl_import_config import read_config, resolve_config  # noqa: E402
from txl_import_weights import (  # noqa: E402
    ImportFailure, _hint, load_weights, normalize_names, shape_str)

PROG = "txl-import"

SOURCES = ("original", "hf", "nvidia")


# ----------------------------------------------------------------------------- conversion


def convert(raw, source, user_cfg):
    """(config, {original name: float32 tensor}) from a source state dict."""
    t, origin, aliases = normalize_names(raw, source)
    # NVIDIA's TorchScript model always holds word_emb.emb_projs[0], unused when
    # d_embed == d_model with div_val 1 (their forward checks d_proj != d_embed).
    if source == "nvidia" and "word_emb.emb_projs.0" in t and \
            "word_emb.emb_layers.1.weight" not in t and user_cfg.get("div_val", 1) == 1:
        e0, p0 = t.get("word_emb.emb_layers.0.weight"), t["word_emb.emb_projs.0"]
        if e0 is not None and e0.dim() == 2 and p0.dim() == 2 and \
                p0.shape[0] == p0.shape[1] == e0.shape[1]:
            del t["word_emb.emb_projs.0"]
    strange = [origin.get(k, k) for k in t if not TENSOR_NAME_RE.match(k)]
    if strange:
        raise ImportFailure("unknown key%s %s: not a Transformer-XL tensor in the %s naming%s" % (
            "s" if len(strange) > 1 else "", ", ".join("'%s'" % k for k in strange[:10]) +
            (" and %d more" % (len(strange) - 10) if len(strange) > 10 else ""), source,
            _hint(strange, source)))
    c = resolve_config(t, user_cfg, source)
    want = expected_shapes(c)

    def src(name):
        o = origin.get(name, name)
        return "'%s'" % name if o == name else "'%s' (source key '%s')" % (name, o)

    unknown = [k for k in t if k not in want]
    if unknown:
        raise ImportFailure(
            "unknown key%s %s: no such tensor in a model with n_layer=%d, d_model=%d, "
            "d_embed=%d, div_val=%d, cutoffs=%s%s" % (
                "s" if len(unknown) > 1 else "", ", ".join(src(k) for k in unknown[:10]),
                c["n_layer"], c["d_model"], embed_dim(c), c["div_val"], c["cutoffs"],
                _hint([origin.get(k, k) for k in unknown], source)))
    for alias_key, alias_t, owner in aliases:
        if owner not in t:
            raise ImportFailure("unknown key '%s' ('%s' is not in the model)" % (alias_key, owner))
        if alias_t.shape != t[owner].shape or not torch.equal(alias_t.float(), t[owner].float()):
            raise ImportFailure("'%s' should be the same tensor as '%s' but differs"
                                % (alias_key, owner))
    copies = dict(tied_pairs(c))
    out = OrderedDict()
    for name, shape in want.items():
        x = t.get(name)
        if x is None:
            if name == "pos_emb.inv_freq":
                out[name] = inv_freq(c["d_model"])
                continue
            if name in copies and copies[name] in t:
                continue  # filled from its owner below
            sname = _source_name(source, name, c)
            raise ImportFailure("missing key '%s'%s (expected shape %s)" % (
                name, "" if sname == name else " (source key '%s')" % sname, shape_str(shape)))
        if tuple(x.shape) != tuple(shape):
            raise ImportFailure("shape mismatch: %s has shape %s, expected %s"
                                % (src(name), shape_str(x.shape), shape_str(shape)))
        if not x.is_floating_point():
            raise ImportFailure("%s is not floating point (%s)" % (src(name), x.dtype))
        x = x.detach().to(torch.float32).contiguous().clone()
        if not torch.isfinite(x).all():
            bad = (~torch.isfinite(x)).sum().item()
            raise ImportFailure("%s has %d non-finite value%s (NaN or Inf)"
                                % (src(name), bad, "s" if bad > 1 else ""))
        out[name] = x
    for copy, owner in copies.items():
        if copy in out:
            if not torch.equal(out[copy], out[owner]):
                raise ImportFailure("%s is tied to %s (tie_weight/tie_projs) but their values "
                                    "differ" % (src(copy), src(owner)))
        out[copy] = out[owner].clone()
    # The buffer is a function of d_model: check it. A half-precision copy is replaced
    # by the float32 value, so that its rounding does not reach the checkpoint.
    if not torch.allclose(out["pos_emb.inv_freq"].double(), inv_freq(c["d_model"]).double(),
                          rtol=2e-3, atol=0):
        raise ImportFailure("%s differs from 1/10000^(2i/d_model)" % src("pos_emb.inv_freq"))
    if "pos_emb.inv_freq" in t and t["pos_emb.inv_freq"].dtype not in (torch.float32,
                                                                       torch.float64):
        out["pos_emb.inv_freq"] = inv_freq(c["d_model"])
    out = OrderedDict((k, out[k]) for k in want)
    return c, out


def _source_name(source, name, c):
    """The key under which the source naming stores the tensor `name` (for messages)."""
    if source == "hf":
        if name in ("r_w_bias", "r_r_bias") and c["untie_r"]:
            return "transformer.layers.N.dec_attn." + name
        return name if name.startswith("crit.") else "transformer." + name
    if source == "nvidia":
        m = re.match(r"^crit\.out_layers\.(\d+)\.(weight|bias)$", name)
        if m:
            return "crit.out_layers_%s.%s" % ("weights" if m.group(2) == "weight" else "biases",
                                             m.group(1))
    return name


# ----------------------------------------------------------------------------- tokenizer


def _symbol_json(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _has_space(b):
    s = b.decode("utf-8", errors="surrogateescape")
    return any(ch.isspace() for ch in s)


def _read_nonempty(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImportFailure("%s '%s' cannot be opened (%s)" % (what, path, e.strerror or e))
    if not data:
        raise ImportFailure("%s '%s' is empty" % (what, path))
    return data


def vocab_tokenizer(path):
    data = _read_nonempty(path, "vocab file")
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    symbols, seen = [], {}
    for i, line in enumerate(lines):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            raise ImportFailure("vocab file '%s': line %d is empty" % (path, i + 1))
        if _has_space(line):
            raise ImportFailure("vocab file '%s': line %d contains whitespace: %r"
                                % (path, i + 1, line))
        if line in seen:
            raise ImportFailure("vocab file '%s': line %d duplicates line %d (%r)"
                                % (path, i + 1, seen[line] + 1, line))
        seen[line] = i
        symbols.append(line)
    return {"type": "word", "symbols": [_symbol_json(s) for s in symbols]}


def corpus_tokenizer(path):
    data = _read_nonempty(path, "corpus")
    # surrogateescape turns every byte outside well-formed UTF-8 into its own code
    # point, so each stray byte becomes a one-byte symbol (as Tokenizer::CharFromCorpus).
    chars = set(data.decode("utf-8", errors="surrogateescape"))
    symbols = sorted(ch.encode("utf-8", errors="surrogateescape") for ch in chars)
    return {"type": "char", "symbols": [_symbol_json(s) for s in symbols]}


def tokenizer_size(tok):
    return 256 if tok["type"] == "byte" else len(tok["symbols"])


# ----------------------------------------------------------------------------- CLI


def build_tokenizer(args):
    if args.vocab:
        return vocab_tokenizer(args.vocab)
    if args.corpus:
        return corpus_tokenizer(args.corpus)
    return {"type": "byte"}


def run(args):
    user = read_config(args.config)
    tok = build_tokenizer(args)
    raw = load_weights(args.weights, args.source)
    config, tensors = convert(raw, args.source, user)
    size = tokenizer_size(tok)
    if size != config["n_token"]:
        what = {"byte": "--tokenizer byte has 256 ids",
                "word": "the vocab file '%s' has %d tokens" % (args.vocab, size),
                "char": "the corpus '%s' has %d distinct characters" % (args.corpus, size)}
        raise ImportFailure("tokenizer size mismatch: %s, but the model has n_token=%d"
                            % (what[tok["type"]], config["n_token"]))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ImportFailure("%s: the output directory does not exist" % args.out)
    try:
        write_checkpoint(args.out, config, tensors, tok)
    except OSError as e:
        raise ImportFailure("%s: cannot write (%s)" % (args.out, e.strerror or e))
    n = sum(x.numel() for x in tensors.values())
    print(json.dumps(OrderedDict([
        ("out", args.out), ("source", args.source), ("tensors", len(tensors)), ("values", n),
        ("n_token", config["n_token"]), ("n_layer", config["n_layer"]),
        ("d_model", config["d_model"]), ("cutoffs", config["cutoffs"]),
        ("tail_cluster_order", config["tail_cluster_order"]), ("tokenizer", tok["type"])])))


def parser():
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(
        prog=PROG, description=doc[0].split(": ", 1)[1][:1].upper() + doc[0].split(": ", 1)[1][1:],
        epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, choices=SOURCES,
                    help="naming of the weights: original (authors' PyTorch), hf (Hugging "
                         "Face TransfoXLLMHeadModel) or nvidia (DeepLearningExamples)")
    ap.add_argument("--weights", required=True, metavar="FILE",
                    help="torch.save file (state_dict, wrapper dict, pickled module) or "
                         "TorchScript archive")
    ap.add_argument("--config", required=True, metavar="CFG.json",
                    help="hyperparameters under the original constructor names")
    tok = ap.add_mutually_exclusive_group(required=True)
    tok.add_argument("--vocab", metavar="FILE", help="word tokenizer: one token per line")
    tok.add_argument("--tokenizer", choices=("byte",), help="byte tokenizer (n_token 256)")
    tok.add_argument("--corpus", metavar="FILE",
                     help="char tokenizer: the sorted distinct characters of FILE")
    ap.add_argument("--out", required=True, metavar="M.pt", help="checkpoint to write")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)  # usage errors exit 2
    try:
        run(args)
    except ImportFailure as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

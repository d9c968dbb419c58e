#!/usr/bin/python3
"""txl-import against the independent Python reference (txl_reference.py).

Run by CTest as
  /usr/bin/python3 tests/python/test_import.py --txl-import PATH --txl-eval PATH [unittest args]

Random models (make_checkpoint.random_weights) are saved with torch.save in the three
namings (original, Hugging Face, NVIDIA), as wrapped / pickled-module variants and as
TorchScript archives, imported with txl-import, and scored with `txl-eval --logprobs`;
the log-probs must match the reference within 1e-4. Without --txl-import the tool is run
as `python3 tools/txl_import.py`; without --txl-eval only the archives are checked.
Error cases check exit code 1, the `txl-import: ` prefix and the key named. Every
comparison prints its max |diff|.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from collections import OrderedDict
from typing import List, Optional

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_checkpoint as mc  # noqa: E402
import txl_checkpoint_format as fmt  # noqa: E402
import txl_reference as ref  # noqa: E402
from driver_args import take_flag  # noqa: E402

TXL_IMPORT = None  # command list
TXL_EVAL = None

CPP_TOL = 1e-4
SEQ_LEN = 64
_BASE = dict(n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, dropout=0.0, dropatt=0.0)

CONFIGS = {
    # div_val 1, no cutoffs, tied output layer, clamped distances.
    "plain": dict(_BASE, n_token=48, tie_weight=True, mem_len=20, clamp_len=12),
    # Adaptive embedding/softmax, div_val 2, two tail clusters (the cluster order
    # matters), tied projections for the tails, per-layer u/v biases.
    "adaptive": dict(_BASE, n_token=60, div_val=2, cutoffs=[15, 30], tie_weight=True,
                     tie_projs=[False, True, True], untie_r=True, mem_len=18),
    # As NVIDIA's code trains it: shared u/v, one tied and two untied projections.
    "adaptive_nv": dict(_BASE, n_token=60, div_val=2, cutoffs=[15, 30], tie_weight=True,
                        tie_projs=[False, True, False], mem_len=18),
    # d_embed != d_model with div_val 1 and cutoffs (given by the config: one table),
    # untied output layer, pre-norm, per-layer biases.
    "proj_div1": dict(_BASE, n_token=56, d_model=40, d_head=12, d_embed=24, cutoffs=[14, 28],
                      tie_weight=False, tie_projs=[False, True, False], pre_lnorm=True,
                      untie_r=True, clamp_len=10, mem_len=22),
}

# What each test's CFG.json says: the keys the tensors cannot tell, plus (for some) the
# whole config, so that agreeing values are accepted too.
NON_INFERABLE = ("pre_lnorm", "mem_len", "clamp_len", "same_length", "dropout", "dropatt")

_tmp = None
_results = []


def setUpModule():
    global _tmp
    _tmp = tempfile.TemporaryDirectory(prefix="txl_import_")


def tearDownModule():
    _tmp.cleanup()


def tmp_path(name):
    return os.path.join(_tmp.name, name)


def report(test, what, diff):
    tid = test.id().rsplit(".", 1)[-1]
    _results.append((tid, what, diff))
    print("  [%s] %s: max|diff| = %.3g" % (tid, what, diff), file=sys.stderr, flush=True)


def max_diff(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.0


def tokens_for(n_token, seed, n=SEQ_LEN):
    g = torch.Generator().manual_seed(2000 + seed)
    return torch.randint(0, n_token, (n,), generator=g).tolist()


# ---------------------------------------------------------------------------------------
# The three namings, written here from their definitions (independently of the tool).


def to_hf(w, cfg):
    """Hugging Face TransfoXLLMHeadModel: `transformer.` before everything but `crit.`;
    with untie_r the u/v biases live in each layer's dec_attn, [H, dh] each."""
    c = ref.resolve_config(cfg)
    out = OrderedDict()
    for k, v in w.items():
        if k.startswith("crit."):
            out[k] = v
        elif k in ("r_w_bias", "r_r_bias") and c["untie_r"]:
            for i in range(c["n_layer"]):
                out["transformer.layers.%d.dec_attn.%s" % (i, k)] = v[i].clone()
        else:
            out["transformer." + k] = v
    return out


def to_nvidia(w, cfg):
    """NVIDIA DeepLearningExamples: crit.out_layers_weights.{i} / out_layers_biases.{i};
    tied output tables and tied projections are not registered in crit (absent), and
    crit.shared_out_projs.{i} is a second registration of word_emb.emb_projs."""
    c = ref.resolve_config(cfg)
    tied = dict(ref.tied_names(c))
    out = OrderedDict()
    for k, v in w.items():
        if k in tied:
            continue
        parts = k.split(".")
        if k.startswith("crit.out_layers."):
            kind = "weights" if parts[3] == "weight" else "biases"
            out["crit.out_layers_%s.%s" % (kind, parts[2])] = v
        else:
            out[k] = v
    for k in list(w):
        if k.startswith("word_emb.emb_projs."):
            out["crit.shared_out_projs." + k.rsplit(".", 1)[1]] = w[k].clone()
    return out


class NvCrit(nn.Module):
    """crit of NVIDIA's TorchScript model: tables, biases, projections in list attributes."""
    out_projs: List[Optional[torch.Tensor]]
    out_layers_weights: List[torch.Tensor]
    out_layers_biases: List[torch.Tensor]

    def __init__(self, weights, biases, projs, cluster):
        super().__init__()
        self.out_layers_weights = weights
        self.out_layers_biases = biases
        self.out_projs = projs
        if cluster is not None:
            self.cluster_weight = nn.Parameter(cluster[0], requires_grad=False)
            self.cluster_bias = nn.Parameter(cluster[1], requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class NvWordEmb(nn.Module):
    emb_projs: List[torch.Tensor]

    def __init__(self, tables, projs):
        super().__init__()
        self.emb_layers = nn.ModuleList([nn.Embedding(t.shape[0], t.shape[1]) for t in tables])
        with torch.no_grad():
            for e, t in zip(self.emb_layers, tables):
                e.weight.copy_(t)
        self.emb_projs = projs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def nvidia_torchscript(path, w, cfg):
    """A TorchScript archive laid out like NVIDIA's inference/mem_transformer_jit.py."""
    c = ref.resolve_config(cfg)
    n_bins = len(c["cutoffs"]) + 1
    div1 = c["div_val"] == 1
    n_tab = 1 if div1 else n_bins
    tables = [w["word_emb.emb_layers.%d.weight" % i] for i in range(n_tab)]
    if div1:  # their jit model always holds emb_projs[0], unused when d_embed == d_model
        de = ref.embed_dim(c)
        projs = [w.get("word_emb.emb_projs.0", torch.zeros(c["d_model"], de))]
    else:
        projs = [w["word_emb.emb_projs.%d" % i] for i in range(n_bins)]
    tied = dict(ref.tied_names(c))
    outw = [w[tied["crit.out_layers.%d.weight" % i]] if "crit.out_layers.%d.weight" % i in tied
            else w["crit.out_layers.%d.weight" % i] for i in range(n_tab)]
    outb = [w["crit.out_layers.%d.bias" % i] for i in range(n_tab)]
    if div1 and ref.embed_dim(c) == c["d_model"]:
        oprojs = [None] * n_bins
    else:
        oprojs = [w[tied.get("crit.out_projs.%d" % i, "crit.out_projs.%d" % i)]
                  for i in range(n_bins)]
    cluster = (w["crit.cluster_weight"], w["crit.cluster_bias"]) if c["cutoffs"] else None
    rest = OrderedDict((k, v) for k, v in w.items()
                       if not k.startswith("word_emb.") and not k.startswith("crit."))
    root = fmt.module_tree(rest)
    root.add_module("word_emb", NvWordEmb(tables, projs))
    root.add_module("crit", NvCrit(outw, outb, oprojs, cluster))
    torch.jit.script(root).save(path)


class TrainingCodeModel(nn.Module):
    """Stands for a training codebase's model class: pickled whole, it is not importable
    from txl-import's process (it lives in this script's __main__)."""

    def forward(self, x):
        return x


class TrainingCodeVocab:
    """Stands for NVIDIA's pickled vocabulary object in their checkpoints."""

    def __init__(self, n):
        self.idx2sym = ["w%d" % i for i in range(n)]


def pickled_module(w):
    """A TrainingCodeModel tree whose state_dict() is w."""
    return fmt.module_tree(w, node_class=TrainingCodeModel)


# ---------------------------------------------------------------------------------------
# Running the tools.


def write_json(name, obj):
    path = tmp_path(name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def vocab_file(n, name=None):
    path = tmp_path(name or "vocab%d.txt" % n)
    with open(path, "w") as f:
        f.write("".join("w%d\n" % i for i in range(n)))
    return path


def run_import(source, weights, cfg_path, out, tok=None):
    tok = tok if tok is not None else ["--tokenizer", "byte"]
    cmd = TXL_IMPORT + ["--source", source, "--weights", weights, "--config", cfg_path] + \
        tok + ["--out", out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def run_eval(model, tokens=None, text=None, tag="x"):
    out_path = tmp_path("%s.logprobs.txt" % tag)
    cmd = [TXL_EVAL, "--model", model, "--logprobs", out_path]
    if text is not None:
        cmd += ["--text", text]
    else:
        tok_path = tmp_path("%s.tokens.txt" % tag)
        with open(tok_path, "w") as f:
            f.write(" ".join(str(t) for t in tokens) + "\n")
        cmd += ["--tokens", tok_path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                          p.stdout, p.stderr))
    with open(out_path) as f:
        return [float(x) for x in f.read().split()]


_weights = {}


def weights_for(name):
    if name not in _weights:
        _weights[name] = mc.random_weights(CONFIGS[name], seed=sorted(CONFIGS).index(name) + 21)
    return _weights[name]


# ---------------------------------------------------------------------------------------


class ImportTest(unittest.TestCase):
    """Each naming imported, checked tensor by tensor and scored by txl-eval."""

    def import_ok(self, source, weights_path, cfg_name, cfg_json, tag, tok=None):
        out = tmp_path(tag + ".out.pt")
        p = run_import(source, weights_path, write_json(tag + ".cfg.json", cfg_json), out,
                       tok if tok is not None else ["--vocab", vocab_file(CONFIGS[cfg_name]["n_token"])])
        self.assertEqual(p.returncode, 0, "txl-import failed:\n%s\n%s" % (p.stdout, p.stderr))
        summary = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["out"], out)
        self.assertEqual([f for f in os.listdir(_tmp.name) if f.endswith(".tmp")], [],
                         "the temporary file of the atomic write was left behind")
        return out

    def check_archive(self, out, cfg_name, order, tag):
        """The archive's layout, config and tensors; returns the expected config."""
        cfg = dict(CONFIGS[cfg_name], tail_cluster_order=order)
        want_cfg = ref.resolve_config(cfg)
        m, conf, tok = fmt.read_checkpoint(out)
        self.assertEqual(list(conf), list(ref.CONFIG_KEYS))
        got_cfg = ref.resolve_config(conf)
        for k in ref.CONFIG_KEYS:
            if k == "tie_projs":
                continue  # equal copies may be stored tied or not: same tensors either way
            if k == "d_embed":
                self.assertEqual(ref.embed_dim(got_cfg), ref.embed_dim(want_cfg))
                continue
            self.assertEqual(got_cfg[k], want_cfg[k], "config.json %s" % k)
        self.assertEqual(tok["type"], "word")
        self.assertEqual(len(tok["symbols"]), want_cfg["n_token"])
        sd = m.state_dict()
        expected = ref.expected_shapes(want_cfg)
        self.assertEqual(sorted(sd), sorted(expected))
        self.assertEqual([n for n, _ in m.named_buffers()], ["pos_emb.inv_freq"])
        w = weights_for(cfg_name)
        worst = 0.0
        for k, shape in expected.items():
            self.assertEqual(tuple(sd[k].shape), tuple(shape), k)
            self.assertEqual(sd[k].dtype, torch.float32, k)
            if k == "pos_emb.inv_freq":  # computed by the tool when the source lacks it
                d = max_diff(sd[k], ref.inv_freq(want_cfg["d_model"], torch.float64))
                report(self, "%s: pos_emb.inv_freq vs 1/10000^(2i/d)" % tag, d)
                self.assertLess(d, 1e-6)
                continue
            worst = max(worst, max_diff(sd[k], w[k]))
        report(self, "%s: archive tensors vs source tensors" % tag, worst)
        self.assertEqual(worst, 0.0)
        return cfg, {k: v.detach().clone() for k, v in sd.items()}

    def check_eval(self, out, cfg, tensors, tag, seed=1):
        toks = tokens_for(cfg["n_token"], seed)
        want = ref.Reference(cfg, tensors).log_probs(toks)
        if TXL_EVAL is None:
            return want, None
        got = run_eval(out, toks, tag=tag)
        self.assertEqual(len(got), len(toks) - 1)
        d = max_diff(got, want)
        report(self, "%s: txl-eval vs reference" % tag, d)
        self.assertLess(d, CPP_TOL)
        return want, got

    def roundtrip(self, source, cfg_name, state, tag, cfg_json=None, as_file=None):
        path = as_file or tmp_path(tag + ".src.pt")
        if as_file is None:
            torch.save(state, path)
        if cfg_json is None:
            cfg_json = {k: CONFIGS[cfg_name][k] for k in NON_INFERABLE if k in CONFIGS[cfg_name]}
        out = self.import_ok(source, path, cfg_name, cfg_json, tag)
        cfg, tensors = self.check_archive(out, cfg_name, "sequential" if source == "hf"
                                          else "reversed", tag)
        return out, cfg, tensors, self.check_eval(out, cfg, tensors, tag)

    # ---- original naming
    def test_original_plain(self):
        self.roundtrip("original", "plain", weights_for("plain"), "original_plain")

    def test_original_adaptive_full_config(self):
        # CFG.json with every key (agreeing with the tensors) is accepted, the original
        # constructor's other arguments (at values serving honours) included.
        cfg = dict(CONFIGS["adaptive"], tail_cluster_order="reversed", tgt_len=128, ext_len=0,
                   adapt_inp=True, attn_type=0, sample_softmax=-1)
        self.roundtrip("original", "adaptive", weights_for("adaptive"), "original_adaptive",
                       cfg_json=cfg)

    def test_original_wrapped_without_tied_copies(self):
        # {'model_state': ...} with the tied crit copies left out, DDP `module.` prefix.
        w = weights_for("adaptive")
        tied = dict(ref.tied_names(CONFIGS["adaptive"]))
        sd = OrderedDict(("module." + k, v) for k, v in w.items() if k not in tied)
        self.roundtrip("original", "adaptive", {"model_state": sd, "epoch": 3}, "wrapped")

    def test_original_pickled_module(self):
        # torch.save(model) of a class txl-import cannot import, under {'model': ...}.
        self.roundtrip("original", "proj_div1", {"model": pickled_module(weights_for("proj_div1"))},
                       "pickled_module",
                       cfg_json=dict({k: CONFIGS["proj_div1"][k] for k in NON_INFERABLE
                                      if k in CONFIGS["proj_div1"]}, cutoffs=[14, 28]))

    def test_original_torchscript(self):
        # A TorchScript archive (module tree under `module.`) without pos_emb.inv_freq.
        w = weights_for("plain")
        tree = fmt.module_tree(OrderedDict(("module." + k, v) for k, v in w.items()
                                           if k != "pos_emb.inv_freq"), buffers=())
        path = tmp_path("ts_in.pt")
        torch.jit.script(tree).save(path)
        self.roundtrip("original", "plain", None, "torchscript", as_file=path)

    # ---- Hugging Face naming
    def test_hf_plain(self):
        self.roundtrip("hf", "plain", to_hf(weights_for("plain"), CONFIGS["plain"]), "hf_plain")

    def test_hf_adaptive_cluster_order(self):
        """HF weights (per-layer u/v stacked, sequential order) match the reference; the same
        tensors imported as original (reversed order) give other log-probs."""
        w = weights_for("adaptive")
        hf = to_hf(w, CONFIGS["adaptive"])
        self.assertIn("transformer.layers.1.dec_attn.r_r_bias", hf)
        out, cfg, tensors, (want_seq, got_seq) = self.roundtrip("hf", "adaptive", hf, "hf_adaptive")
        # Same weights, original naming: reversed order.
        out2, cfg2, tensors2, (want_rev, got_rev) = self.roundtrip(
            "original", "adaptive", w, "hf_weights_as_original")
        d = max_diff(want_seq, want_rev)
        report(self, "reference sequential vs reversed", d)
        self.assertGreater(d, 0.05)
        if got_rev is not None:
            d = max_diff(got_rev, want_seq)
            report(self, "HF weights imported as --source original vs HF reference", d)
            self.assertGreater(d, 0.05)

    def test_hf_proj_div1(self):
        cfg_json = {k: CONFIGS["proj_div1"][k] for k in NON_INFERABLE if k in CONFIGS["proj_div1"]}
        cfg_json["cutoffs"] = [14, 28]  # one table with div_val 1: the config must say
        self.roundtrip("hf", "proj_div1", to_hf(weights_for("proj_div1"), CONFIGS["proj_div1"]),
                       "hf_proj_div1", cfg_json=cfg_json)

    # ---- NVIDIA naming
    def test_nvidia_plain(self):
        self.roundtrip("nvidia", "plain", to_nvidia(weights_for("plain"), CONFIGS["plain"]),
                       "nvidia_plain")

    def test_nvidia_adaptive_checkpoint(self):
        # Their checkpoint dict: model_state + model_config + a pickled vocab object.
        nv = to_nvidia(weights_for("adaptive_nv"), CONFIGS["adaptive_nv"])
        self.assertNotIn("crit.out_projs.1", nv)
        self.assertIn("crit.out_projs.2", nv)
        self.assertIn("crit.shared_out_projs.1", nv)
        state = {"model_state": nv, "model_config": dict(CONFIGS["adaptive_nv"]),
                 "vocab": TrainingCodeVocab(60), "epoch": 1}
        self.roundtrip("nvidia", "adaptive_nv", state, "nvidia_adaptive")

    def test_nvidia_torchscript(self):
        for name in ("plain", "adaptive_nv"):
            path = tmp_path("nv_ts_%s.pt" % name)
            nvidia_torchscript(path, weights_for(name), CONFIGS[name])
            sd = torch.jit.load(path).state_dict()
            self.assertFalse(any(k.startswith("crit.out_layers") for k in sd), list(sd))
            self.roundtrip("nvidia", name, None, "nvidia_ts_" + name, as_file=path)

    # ---- tokenizers
    def test_tokenizer_byte_text(self):
        cfg = dict(_BASE, n_token=256, mem_len=16)
        w = mc.random_weights(cfg, 5)
        src = tmp_path("byte_src.pt")
        torch.save(w, src)
        out = tmp_path("byte.pt")
        p = run_import("original", src, write_json("byte.cfg.json", {"mem_len": 16}), out,
                       ["--tokenizer", "byte"])
        self.assertEqual(p.returncode, 0, p.stderr)
        _, conf, tok = fmt.read_checkpoint(out)
        self.assertEqual(tok, {"type": "byte"})
        text = "Byte level: caf\u00e9, \u4e2d\u6587.\n".encode("utf-8") + b"\xff\xfe end"
        self.check_text(out, cfg, w, text, list(text), "byte")

    def test_tokenizer_char_corpus(self):
        corpus = "abc ab\u00e9\u4e2d\n".encode("utf-8") + b"\xff x\xe4\xb8!"
        symbols = sorted({bytes([b]) for b in b"abc \n!x"} |
                         {"\u00e9".encode(), "\u4e2d".encode(), b"\xff", b"\xe4", b"\xb8"})
        cfg = dict(_BASE, n_token=len(symbols), mem_len=16)
        w = mc.random_weights(cfg, 6)
        src = tmp_path("char_src.pt")
        torch.save(w, src)
        corpus_path = tmp_path("corpus.txt")
        with open(corpus_path, "wb") as f:
            f.write(corpus)
        out = tmp_path("char.pt")
        p = run_import("original", src, write_json("char.cfg.json", {"mem_len": 16}), out,
                       ["--corpus", corpus_path])
        self.assertEqual(p.returncode, 0, p.stderr)
        _, conf, tok = fmt.read_checkpoint(out)
        want = [s.decode("utf-8") if _utf8(s) else list(s) for s in symbols]
        self.assertEqual(tok, {"type": "char", "symbols": want})
        ids = {s: i for i, s in enumerate(symbols)}
        # E4 B8 followed by 'c' is no character: two one-byte symbols.
        pieces = [b"a", b"b", "\u4e2d".encode(), b"\xe4", b"\xb8", b"c", b"\xff", b"\n", b"!"]
        self.check_text(out, cfg, w, b"".join(pieces), [ids[x] for x in pieces], "char")

    def test_tokenizer_vocab(self):
        path = tmp_path("words.txt")
        with open(path, "wb") as f:
            f.write(b"<eos>\r\nthe\ncaf\xc3\xa9\nbad\xff\n")
        cfg = dict(_BASE, n_token=4, mem_len=8)
        src = tmp_path("word_src.pt")
        torch.save(mc.random_weights(cfg, 7), src)
        out = tmp_path("word.pt")
        p = run_import("original", src, write_json("word.cfg.json", {}), out, ["--vocab", path])
        self.assertEqual(p.returncode, 0, p.stderr)
        _, _, tok = fmt.read_checkpoint(out)
        self.assertEqual(tok, {"type": "word",
                               "symbols": ["<eos>", "the", "caf\u00e9", list(b"bad\xff")]})
        if TXL_EVAL is not None:  # txl-eval accepts the archive (and its tokenizer)
            text = tmp_path("word_text.txt")
            with open(text, "wb") as f:
                f.write("the caf\u00e9 the\nthe\n".encode())
            self.assertEqual(len(run_eval(out, text=text, tag="word")), 5)  # 6 tokens

    def check_text(self, out, cfg, w, text, ids, tag):
        want = ref.Reference(cfg, w).log_probs(ids)
        if TXL_EVAL is None:
            return
        path = tmp_path(tag + "_text.txt")
        with open(path, "wb") as f:
            f.write(text)
        got = run_eval(out, text=path, tag=tag)
        d = max_diff(got, want)
        report(self, "%s tokenizer: txl-eval --text vs reference on our ids" % tag, d)
        self.assertLess(d, CPP_TOL)


def _utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class ImportErrorTest(unittest.TestCase):
    """Bad input: exit 1, `txl-import: ` on stderr, the key named, no output file."""

    def fail_import(self, state, cfg_json=None, source="original", tok=None, expect=(),
                    weights_path=None, code=1, cfg_path=None):
        tag = self.id().rsplit(".", 1)[-1]
        path = weights_path or tmp_path(tag + ".src.pt")
        if weights_path is None:
            torch.save(state, path)
        if cfg_path is None:
            cfg_path = write_json(tag + ".cfg.json", {"mem_len": 20} if cfg_json is None
                                  else cfg_json)
        out_dir = tmp_path(tag + "_out")
        os.makedirs(out_dir, exist_ok=True)
        out = os.path.join(out_dir, "m.pt")
        p = run_import(source, path, cfg_path, out,
                       tok if tok is not None else ["--vocab", vocab_file(48)])
        print("  [%s] %s" % (tag, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""),
              file=sys.stderr)
        self.assertEqual(p.returncode, code, p.stdout + p.stderr)
        self.assertTrue(p.stderr.startswith("txl-import: ") or
                        (code == 2 and "txl-import: error:" in p.stderr), p.stderr)
        for s in expect:
            self.assertIn(s, p.stderr)
        self.assertEqual(os.listdir(out_dir), [], "a failed import left files behind")
        return p.stderr

    def plain(self):
        return OrderedDict(weights_for("plain"))

    def test_unknown_key(self):
        w = self.plain()
        w["layers.0.dec_attn.extra.weight"] = torch.zeros(3, 3)
        self.fail_import(w, expect=("unknown key", "'layers.0.dec_attn.extra.weight'"))

    def test_hf_file_as_original(self):
        self.fail_import(to_hf(self.plain(), CONFIGS["plain"]),
                         expect=("unknown key", "transformer.", "--source hf"))

    def test_missing_key(self):
        w = self.plain()
        del w["layers.1.pos_ff.CoreNet.3.bias"]
        self.fail_import(w, expect=("missing key 'layers.1.pos_ff.CoreNet.3.bias'",
                                    "expected shape [32]"))

    def test_missing_key_hf_per_layer_bias(self):
        hf = to_hf(weights_for("adaptive"), CONFIGS["adaptive"])
        del hf["transformer.layers.1.dec_attn.r_w_bias"]
        self.fail_import(hf, source="hf", tok=["--vocab", vocab_file(60)],
                         expect=("missing key 'transformer.layers.1.dec_attn.r_w_bias'",))

    def test_shape_mismatch(self):
        w = self.plain()
        w["layers.1.pos_ff.CoreNet.0.weight"] = torch.zeros(65, 32)
        self.fail_import(w, expect=("shape mismatch", "'layers.1.pos_ff.CoreNet.0.weight'",
                                    "[65, 32]", "[64, 32]"))

    def test_shape_mismatch_nvidia_names_source_key(self):
        nv = to_nvidia(self.plain(), CONFIGS["plain"])
        nv["crit.out_layers_biases.0"] = torch.zeros(47)
        self.fail_import(nv, source="nvidia",
                         expect=("shape mismatch", "crit.out_layers_biases.0", "[47]", "[48]"))

    def test_config_contradicts_tensors(self):
        self.fail_import(self.plain(), cfg_json={"n_layer": 3},
                         expect=("n_layer is 3 in the config", "tensors imply 2"))
        self.fail_import(self.plain(), cfg_json={"d_inner": 128},
                         expect=("d_inner is 128", "imply 64", "CoreNet.0.weight"))
        self.fail_import(self.plain(), cfg_json={"untie_r": True},
                         expect=("untie_r is true", "imply false", "r_w_bias [2, 16]"))

    def test_config_cluster_order_contradicts_source(self):
        self.fail_import(self.plain(), cfg_json={"tail_cluster_order": "sequential"},
                         expect=("tail_cluster_order is \"sequential\"", "\"reversed\""))

    def test_config_tie_weight_contradicts_tensors(self):
        w = self.plain()
        w["crit.out_layers.0.weight"] = w["crit.out_layers.0.weight"] + 1.0
        self.fail_import(w, cfg_json={"tie_weight": True},
                         expect=("tie_weight is true", "differs from 'word_emb.emb_layers.0.weight'"))

    def test_unknown_config_key(self):
        self.fail_import(self.plain(), cfg_json={"n_layers": 2}, expect=("'n_layers'",
                                                                          "not a known key"))

    def test_original_constructor_arguments_it_cannot_honour(self):
        # Regression (issue 14): the original constructor's other arguments were "not a known key".
        for key, value, why in (("ext_len", 16, "no extended context"), ("attn_type", 2, "attn_type 0"),
                                ("sample_softmax", 1000, "sampled softmax"), ("tgt_len", "x", "an integer")):
            err = self.fail_import(self.plain(), cfg_json={"mem_len": 20, key: value},
                                   expect=("config key '%s'" % key, why))
            self.assertIn(json.dumps(value), err)

    def test_tokenizer_size_mismatch(self):
        self.fail_import(self.plain(), tok=["--vocab", vocab_file(47)],
                         expect=("tokenizer size mismatch", "47 tokens", "n_token=48"))
        self.fail_import(self.plain(), tok=["--tokenizer", "byte"],
                         expect=("tokenizer size mismatch", "256", "n_token=48"))

    def test_non_finite_weight(self):
        w = self.plain()
        w["layers.0.dec_attn.o_net.weight"] = w["layers.0.dec_attn.o_net.weight"].clone()
        w["layers.0.dec_attn.o_net.weight"][3, 4] = float("nan")
        self.fail_import(w, expect=("'layers.0.dec_attn.o_net.weight'", "non-finite"))
        w = self.plain()
        w["r_r_bias"] = w["r_r_bias"].clone()
        w["r_r_bias"][0, 0] = float("inf")
        self.fail_import(w, expect=("'r_r_bias'", "non-finite"))

    def test_unreadable_weights(self):
        path = tmp_path("garbage.pt")
        with open(path, "wb") as f:
            f.write(b"not a torch file")
        self.fail_import(None, weights_path=path, expect=("garbage.pt",))
        self.fail_import(None, weights_path=tmp_path("nope.pt"), expect=("no such file",))

    def test_usage_errors(self):
        p = subprocess.run(TXL_IMPORT + ["--source", "original"], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("txl-import: error:", p.stderr)
        p = subprocess.run(TXL_IMPORT + ["--source", "tf", "--weights", "x", "--config", "y",
                                         "--tokenizer", "byte", "--out", "z"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        p = subprocess.run(TXL_IMPORT + ["--source", "hf", "--weights", "x", "--config", "y",
                                         "--tokenizer", "byte", "--vocab", "v", "--out", "z"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("not allowed with", p.stderr)
        p = subprocess.run(TXL_IMPORT + ["--help"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0)
        self.assertIn("proj_adaptive_softmax.py", p.stdout)  # where the NVIDIA order comes from


def main():
    global TXL_IMPORT, TXL_EVAL
    argv = list(sys.argv)
    imp = take_flag(argv, "--txl-import")
    ev = take_flag(argv, "--txl-eval")
    for flag, path in (("--txl-import", imp), ("--txl-eval", ev)):
        if path is not None and not os.access(path, os.X_OK):
            sys.exit("%s %s is not an executable file" % (flag, path))
    TXL_IMPORT = [os.path.abspath(imp)] if imp else \
        [sys.executable, os.path.join(ROOT, "tools", "txl_import.py")]
    TXL_EVAL = os.path.abspath(ev) if ev else None
    torch.set_num_threads(1)
    prog = unittest.main(argv=argv, exit=False, verbosity=2)
    if _results:
        print("\nmax |diff| per check:", file=sys.stderr)
        for test, what, diff in _results:
            print("  %-44s %-62s %.3g" % (test, what, diff), file=sys.stderr)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()

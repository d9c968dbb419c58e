#!/usr/bin/python3
"""Checks the C++ model tools against the independent Python reference (txl_reference.py).

Run by CTest as
  /usr/bin/python3 tests/python/test_reference.py --txl-eval PATH --txl-init PATH [unittest args]

Without --txl-eval / --txl-init only the reference's self-consistency tests run (the
C++ tests are skipped); a path that is given but does not exist is a failure.
Every comparison prints its max |diff|.
"""

import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_checkpoint as mc  # noqa: E402
import txl_reference as ref  # noqa: E402
from driver_args import take_flag  # noqa: E402

TXL_EVAL = None
EVAL_FLAGS = []  # --eval-flags: more txl-eval flags for every run (e.g. "--kernels generic")
TXL_INIT = None

CPP_TOL = 1e-4  # C++ (float32) vs reference (float64)
SEGMENT_TOL_F32 = 1e-5  # reference vs itself with other segmentations, float32
SEGMENT_TOL_F64 = 1e-9
FLOAT32_TOL = 5e-5  # float32 reference vs float64 reference (the C++ gets 2x that)
SEQ_LEN = 80
CHUNKS = (None, 1, 7)  # None: all at once (no --chunk)

_BASE = dict(n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, dropout=0.0, dropatt=0.0)

CONFIGS = {
    # Post-norm, div_val 1, no cutoffs, tied weights.
    "post_norm": dict(_BASE, n_token=48, tie_weight=True, mem_len=20),
    # Pre-norm, 3 layers, 4 heads x 8, untied output layer.
    "pre_norm": dict(_BASE, n_token=50, n_layer=3, n_head=4, d_head=8, pre_lnorm=True,
                     tie_weight=False, mem_len=16),
    # Adaptive embedding / softmax, div_val 2, two tail clusters, both cluster orders.
    "adaptive_reversed": dict(_BASE, n_token=60, div_val=2, cutoffs=[15, 30], tie_weight=True,
                              tie_projs=[False, True, True], tail_cluster_order="reversed",
                              mem_len=18),
    "adaptive_sequential": dict(_BASE, n_token=60, div_val=2, cutoffs=[15, 30], tie_weight=True,
                                tie_projs=[False, True, True], tail_cluster_order="sequential",
                                mem_len=18),
    # Distances clamped below mem_len.
    "clamp_len": dict(_BASE, n_token=48, mem_len=20, clamp_len=6),
    # Per-layer u/v biases [n_layer, H, dh].
    "untie_r": dict(_BASE, n_token=48, n_layer=3, untie_r=True, mem_len=20),
    # d_embed != d_model with div_val 1: emb_projs.0 / out_projs.0 (tied).
    "proj_div1": dict(_BASE, n_token=44, n_head=3, d_model=48, d_head=12, d_embed=24,
                      tie_projs=[True], mem_len=20),
    # Same with cutoffs: one out_layers.0 sliced per cluster, out_projs.1..2 (one tied to
    # emb_projs.0), plus pre-norm, untie_r and clamping together.
    "proj_div1_cutoffs": dict(_BASE, n_token=56, d_model=40, d_head=12, d_embed=24,
                              cutoffs=[14, 28], tie_projs=[False, True, False], pre_lnorm=True,
                              untie_r=True, clamp_len=10, mem_len=22),
}

# Configs for txl-init (n_token comes from `--tokenizer byte`: 256).
INIT_CONFIGS = {
    "init_plain": dict(_BASE, mem_len=16),
    "init_adaptive": dict(_BASE, div_val=2, cutoffs=[64, 128], tie_projs=[False, True, True],
                          untie_r=True, mem_len=16, clamp_len=8),
}

_tmp = None
_results = []  # (test id, what, max |diff|)


def setUpModule():
    global _tmp
    _tmp = tempfile.TemporaryDirectory(prefix="txl_ref_")


def tearDownModule():
    _tmp.cleanup()


def tmp_path(name):
    return os.path.join(_tmp.name, name)


def report(test, what, diff):
    _results.append((test.id().rsplit(".", 1)[-1], what, diff))
    print("  [%s] %s: max|diff| = %.3g" % (test.id().rsplit(".", 1)[-1], what, diff),
          file=sys.stderr, flush=True)


def max_diff(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.0


def tokens_for(n_token, seed, n=SEQ_LEN):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, n_token, (n,), generator=g).tolist()


_archives = {}


def python_archive(name):
    """(path, config, tensors) of a Python-made random checkpoint for CONFIGS[name]."""
    if name not in _archives:
        cfg = dict(CONFIGS[name])
        path = tmp_path(name + ".pt")
        seed = sorted(CONFIGS).index(name) + 1
        mc.make_random_checkpoint(path, cfg, seed=seed)
        _, tensors, _ = mc.load_checkpoint(path)
        _archives[name] = (path, cfg, tensors)
    return _archives[name]


# ---------------------------------------------------------------------------------------
# The reference on its own.


class ReferenceSelfTest(unittest.TestCase):
    """Self-consistency of the reference: segmentation, second formulation, softmax."""

    def check_config(self, name):
        path, cfg, tensors = python_archive(name)
        toks = tokens_for(cfg["n_token"], 7)
        r64 = ref.Reference(cfg, tensors, torch.float64)
        r32 = ref.Reference(cfg, tensors, torch.float32)
        full = r64.log_probs(toks)
        self.assertEqual(full.numel(), len(toks) - 1)
        self.assertTrue(torch.isfinite(full).all())
        for tgt in (1, 3, 11):
            d = max_diff(r64.log_probs(toks, tgt_len=tgt), full)
            report(self, "float64 tgt_len %d vs all-at-once" % tgt, d)
            self.assertLess(d, SEGMENT_TOL_F64)
        a3, a11 = r32.log_probs(toks, tgt_len=3), r32.log_probs(toks, tgt_len=11)
        d = max_diff(a3, a11)
        report(self, "float32 tgt_len 3 vs tgt_len 11", d)
        self.assertLess(d, SEGMENT_TOL_F32)
        d = max_diff(a3, full)
        report(self, "float32 tgt_len 3 vs float64", d)
        self.assertLess(d, FLOAT32_TOL)
        # Independent formulation: no memories, band mask, direct distance gather.
        d = max_diff(r64.windowed_log_probs(toks), full)
        report(self, "windowed (no memory, no rel_shift) vs segmented", d)
        self.assertLess(d, SEGMENT_TOL_F64)
        # Memories matter: a shorter window changes the later log-probs.
        m = ref.resolve_config(cfg)["mem_len"]
        d = max_diff(r64.log_probs(toks, mem_len=m - 6)[m:], full[m:])
        report(self, "mem_len %d vs %d (later targets)" % (m - 6, m), d)
        self.assertGreater(d, 0.05)
        # The adaptive softmax is a normalised distribution over all n_token ids.
        table = r64.log_prob_table(r64.hidden_states(toks[:-1]))
        d = table.logsumexp(dim=1).abs().max().item()
        report(self, "|log sum_w p(w)|", d)
        self.assertLess(d, 1e-10)
        # Spot-check the cluster arithmetic with a plain per-token formula.
        hidden = r64.hidden_states(toks[:-1])
        for pos in range(0, len(toks) - 1, 9):
            want = spot_log_prob(r64, hidden[pos], toks[pos + 1])
            self.assertAlmostEqual(table[pos, toks[pos + 1]].item(), want, places=10)

    def test_archive_layout(self):
        for name in CONFIGS:
            path, cfg, tensors = python_archive(name)
            m = torch.jit.load(path)
            sd = m.state_dict()
            expected = ref.expected_shapes(cfg)
            self.assertEqual(sorted(sd), sorted(expected), name)
            for k, shape in expected.items():
                self.assertEqual(tuple(sd[k].shape), tuple(shape), k)
                self.assertEqual(sd[k].dtype, torch.float32, k)
            self.assertEqual([n for n, _ in m.named_buffers()], ["pos_emb.inv_freq"])
            for a, b in ref.tied_names(cfg):
                self.assertTrue(torch.equal(sd[a], sd[b]), (name, a, b))
            extra = {"config.json": "", "tokenizer.json": ""}
            torch.jit.load(path, _extra_files=extra)
            conf = json.loads(extra["config.json"])
            self.assertEqual(set(conf), set(ref.CONFIG_KEYS))
            self.assertEqual(ref.resolve_config(conf), ref.resolve_config(cfg))
            tok = json.loads(extra["tokenizer.json"])
            self.assertEqual(tok["type"], "char")
            self.assertEqual(len(tok["symbols"]), cfg["n_token"])
            self.assertEqual(len(set(tok["symbols"])), cfg["n_token"])
            self.assertTrue(all(len(s) == 1 for s in tok["symbols"]))
        self.assertEqual(mc.default_tokenizer(256), {"type": "byte"})

    def test_make_checkpoint_script(self):
        cfg_path = tmp_path("script_cfg.json")
        with open(cfg_path, "w") as f:
            json.dump({k: v for k, v in CONFIGS["clamp_len"].items() if k != "n_token"}, f)
        out = tmp_path("script.pt")
        subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoint.py"), "--config",
                        cfg_path, "--out", out, "--seed", "5", "--n_token", "40"],
                       check=True, capture_output=True, timeout=120)
        cfg, tensors, tok = mc.load_checkpoint(out)
        self.assertEqual(cfg["n_token"], 40)
        self.assertEqual(len(tok["symbols"]), 40)
        want = mc.random_weights(cfg, 5)
        for k in want:
            self.assertTrue(torch.equal(tensors[k], want[k]), k)

    def test_rel_shift(self):
        # The literal trick equals direct indexing by distance on every unmasked entry.
        g = torch.Generator().manual_seed(3)
        for qlen, mlen in ((1, 0), (5, 0), (4, 9), (7, 3)):
            klen = qlen + mlen
            x = torch.randn(qlen, klen, 2, generator=g, dtype=torch.float64)
            y = ref.rel_shift(x)
            for i in range(qlen):
                for j in range(mlen + i + 1):
                    dist = mlen + i - j  # column klen-1-dist of x holds distance dist
                    self.assertTrue(torch.equal(y[i, j], x[i, klen - 1 - dist]), (qlen, mlen, i, j))

    def test_same_length_mask(self):
        for mem_len in (1, 4, 9):
            for qlen in (1, 3, 12):
                for mlen in range(0, mem_len + 1):
                    mask = ref.same_length_mask(qlen, mlen, mem_len)
                    for i in range(qlen):
                        pos = mlen + i
                        want = [not (pos - mem_len < j <= pos) for j in range(mlen + qlen)]
                        self.assertEqual(mask[i].tolist(), want, (mem_len, qlen, mlen, i))

    def test_memory_matters(self):
        """A model that ignored memories, or used another mem_len, must not pass."""
        _, cfg, tensors = python_archive("post_norm")
        r = ref.Reference(cfg, tensors)
        toks = tokens_for(cfg["n_token"], 7)
        base = r.log_probs(toks)  # mem_len 20
        other = r.log_probs(toks, mem_len=12)
        # Identical while the history fits in both windows, different afterwards.
        d_early = max_diff(base[:12], other[:12])
        d_late = max_diff(base[12:], other[12:])
        report(self, "mem_len 20 vs 12, first 12 targets", d_early)
        report(self, "mem_len 20 vs 12, later targets", d_late)
        self.assertLess(d_early, 1e-12)
        self.assertGreater(d_late, 0.05)
        # Segments of 7 with memories dropped between them.
        ids = torch.tensor(toks)
        hid = []
        for beg in range(0, len(toks) - 1, 7):
            hid.append(r.hidden_states(ids[:-1][beg:beg + 7]))
        no_mem = r.log_prob_table(torch.cat(hid)).gather(1, ids[1:, None]).squeeze(1)
        d = max_diff(no_mem, base)
        report(self, "segments of 7 without memory vs with", d)
        self.assertGreater(d, 0.05)

    def test_settings_matter(self):
        """Clamping, cluster order and per-layer biases each change the result."""
        _, cfg, tensors = python_archive("clamp_len")
        toks = tokens_for(cfg["n_token"], 7)
        r = ref.Reference(cfg, tensors)
        d = max_diff(r.log_probs(toks), r.log_probs(toks, clamp_len=-1))
        report(self, "clamp_len 6 vs none", d)
        self.assertGreater(d, 0.01)
        _, cfg, tensors = python_archive("adaptive_reversed")
        toks = tokens_for(cfg["n_token"], 7)
        seq = dict(cfg, tail_cluster_order="sequential")
        d = max_diff(ref.Reference(cfg, tensors).log_probs(toks),
                     ref.Reference(seq, tensors).log_probs(toks))
        report(self, "tail_cluster_order reversed vs sequential", d)
        self.assertGreater(d, 0.05)
        _, cfg, tensors = python_archive("untie_r")
        toks = tokens_for(cfg["n_token"], 7)
        shared = dict(tensors, r_w_bias=tensors["r_w_bias"][0], r_r_bias=tensors["r_r_bias"][0])
        d = max_diff(ref.Reference(cfg, tensors).log_probs(toks),
                     ref.Reference(dict(cfg, untie_r=False), shared).log_probs(toks))
        report(self, "per-layer u/v vs layer 0's for all", d)
        self.assertGreater(d, 0.05)


def spot_log_prob(r, h, w):
    """log p(w | h) for one token, written out per cluster without slicing tricks."""
    c, W = r.c, r.w
    ends = ref.cutoff_ends(c)
    n_cl = len(c["cutoffs"])
    div1 = c["div_val"] == 1
    has_proj = not (div1 and ref.embed_dim(c) == c["d_model"])

    def logits(i):
        x = h @ W["crit.out_projs.%d" % i] if has_proj else h
        if div1:
            lo, hi = ends[i], ends[i + 1]
            wt, b = W["crit.out_layers.0.weight"][lo:hi], W["crit.out_layers.0.bias"][lo:hi]
        else:
            wt, b = W["crit.out_layers.%d.weight" % i], W["crit.out_layers.%d.bias" % i]
        z = [float(wt[k] @ x + b[k]) for k in range(wt.size(0))]
        if i == 0 and n_cl:
            z += [float(W["crit.cluster_weight"][k] @ x + W["crit.cluster_bias"][k])
                  for k in range(n_cl)]
        return z

    def log_softmax_at(z, k):
        m = max(z)
        return z[k] - m - math.log(sum(math.exp(v - m) for v in z))

    head = logits(0)
    if w < ends[1]:
        return log_softmax_at(head, w)
    i = max(k for k in range(len(ends) - 1) if ends[k] <= w)
    col = len(head) - i if c["tail_cluster_order"] == "reversed" else c["cutoffs"][0] + i - 1
    return log_softmax_at(head, col) + log_softmax_at(logits(i), w - ends[i])


# ---------------------------------------------------------------------------------------
# The C++ tools against the reference.


def need_tool(test, path, flag):
    if path is None:
        test.skipTest("%s not given" % flag)
    if not os.access(path, os.X_OK):
        test.fail("%s %s is not an executable file" % (flag, path))


def run_eval(model, tokens, chunk=None, mem_len=None, tag="x"):
    """Runs txl-eval; returns (log-probs list, the JSON summary dict)."""
    tok_path = tmp_path("%s.tokens.txt" % tag)
    out_path = tmp_path("%s.logprobs.txt" % tag)
    with open(tok_path, "w") as f:
        f.write(" ".join(str(t) for t in tokens) + "\n")
    if os.path.exists(out_path):
        os.remove(out_path)
    cmd = [TXL_EVAL, "--model", model, "--tokens", tok_path, "--logprobs", out_path]
    if chunk is not None:
        cmd += ["--chunk", str(chunk)]
    if mem_len is not None:
        cmd += ["--mem_len", str(mem_len)]
    cmd += EVAL_FLAGS
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                          p.stdout, p.stderr))
    with open(out_path) as f:
        lps = [float(line) for line in f.read().split()]
    summary = None
    for line in reversed(p.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            summary = json.loads(line)
            break
    if summary is None:
        raise AssertionError("%s printed no JSON summary; stdout:\n%s" % (" ".join(cmd), p.stdout))
    return lps, summary


class CppCheck(unittest.TestCase):
    def compare_eval(self, model, cfg, tensors, toks, mem_len=None, label=""):
        want = ref.Reference(cfg, tensors).log_probs(toks, mem_len=mem_len)
        tag = self.id().rsplit(".", 1)[-1]
        # The runs are independent processes (mostly libtorch start-up): run them together.
        with ThreadPoolExecutor(max_workers=len(CHUNKS)) as pool:
            runs = [pool.submit(run_eval, model, toks, chunk, mem_len, "%s.%s" % (tag, chunk))
                    for chunk in CHUNKS]
        for chunk, run in zip(CHUNKS, runs):
            got, summary = run.result()
            self.assertEqual(len(got), len(toks) - 1, "txl-eval wrote a wrong number of lines")
            d = max_diff(got, want)
            report(self, "%schunk %s vs reference" % (label, chunk or "all"), d)
            self.assertLess(d, CPP_TOL, "chunk %s" % chunk)
            self.check_summary(summary, want, len(toks))

    def check_summary(self, s, want, n):
        for key in ("tokens", "nll", "bpc", "ppl"):
            self.assertIn(key, s)
        self.assertIn(s["tokens"], (n, n - 1))
        # "nll" may be the total over the n-1 predictions or their mean; bpc and ppl are
        # per predicted token.
        nll = -want.mean().item()
        total = -want.sum().item()
        if abs(s["nll"] - nll) > CPP_TOL:
            self.assertAlmostEqual(s["nll"], total, delta=CPP_TOL * (n - 1),
                                   msg="nll is neither the mean %g nor the total %g" % (nll, total))
        self.assertAlmostEqual(s["bpc"], nll / math.log(2), delta=2 * CPP_TOL)
        self.assertLess(abs(s["ppl"] - math.exp(nll)) / math.exp(nll), 2 * CPP_TOL)


class CppEvalTest(CppCheck):
    """txl-eval on Python-made archives: log-probs for chunks 1, 7, all within 1e-4."""

    def check_config(self, name):
        need_tool(self, TXL_EVAL, "--txl-eval")
        path, cfg, tensors = python_archive(name)
        self.compare_eval(path, cfg, tensors, tokens_for(cfg["n_token"], 11))

    def test_eval_mem_len_override(self):
        need_tool(self, TXL_EVAL, "--txl-eval")
        path, cfg, tensors = python_archive("post_norm")
        toks = tokens_for(cfg["n_token"], 12)
        self.compare_eval(path, cfg, tensors, toks, mem_len=12, label="--mem_len 12, ")


class CppInitTest(CppCheck):
    """Python opens txl-init's archives; the reference on their weights matches txl-eval."""

    def make_init(self, name, seed, tag):
        need_tool(self, TXL_INIT, "--txl-init")
        cfg_path = tmp_path(name + ".config.json")
        with open(cfg_path, "w") as f:
            json.dump(INIT_CONFIGS[name], f)
        out = tmp_path("%s.%s.pt" % (name, tag))
        cmd = [TXL_INIT, "--config", cfg_path, "--tokenizer", "byte", "--out", out,
               "--seed", str(seed)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                              p.stdout, p.stderr))
        return out

    def check_init(self, name):
        path = self.make_init(name, 3, "a")
        extra = {"config.json": "", "tokenizer.json": ""}
        module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
        self.assertTrue(extra["config.json"], "config.json missing from the archive")
        self.assertTrue(extra["tokenizer.json"], "tokenizer.json missing from the archive")
        cfg = json.loads(extra["config.json"])
        self.assertEqual(cfg.get("n_token"), 256)
        self.assertEqual(json.loads(extra["tokenizer.json"]).get("type"), "byte")
        want_cfg = ref.resolve_config(dict(INIT_CONFIGS[name], n_token=256))
        self.assertEqual(ref.resolve_config(cfg), want_cfg)
        sd = module.state_dict()
        expected = ref.expected_shapes(cfg)
        self.assertEqual(sorted(sd), sorted(expected))
        for k, shape in expected.items():
            self.assertEqual(tuple(sd[k].shape), tuple(shape), k)
        for a, b in ref.tied_names(cfg):
            self.assertTrue(torch.equal(sd[a], sd[b]), (a, b))
        d = max_diff(sd["pos_emb.inv_freq"], ref.inv_freq(cfg["d_model"], torch.float64))
        report(self, "pos_emb.inv_freq vs 1/10000^(2i/d)", d)
        self.assertLess(d, 1e-6)
        # Same seed, same weights.
        again = torch.jit.load(self.make_init(name, 3, "b")).state_dict()
        for k in expected:
            self.assertTrue(torch.equal(sd[k], again[k]), "txl-init --seed 3 twice differs: " + k)
        tensors = {k: v.detach().clone() for k, v in sd.items()}
        if TXL_EVAL is not None:
            need_tool(self, TXL_EVAL, "--txl-eval")
            self.compare_eval(path, cfg, tensors, tokens_for(256, 13))


def _add_config_tests():
    for name in CONFIGS:
        setattr(ReferenceSelfTest, "test_self_" + name,
                lambda self, n=name: self.check_config(n))
        setattr(CppEvalTest, "test_eval_" + name, lambda self, n=name: self.check_config(n))
    for name in INIT_CONFIGS:
        setattr(CppInitTest, "test_" + name, lambda self, n=name: self.check_init(n))


_add_config_tests()


def main():
    global TXL_EVAL, TXL_INIT, EVAL_FLAGS
    argv = list(sys.argv)
    TXL_EVAL = take_flag(argv, "--txl-eval")
    EVAL_FLAGS = shlex.split(take_flag(argv, "--eval-flags") or "")
    TXL_INIT = take_flag(argv, "--txl-init")
    TXL_EVAL = os.path.abspath(TXL_EVAL) if TXL_EVAL else None
    TXL_INIT = os.path.abspath(TXL_INIT) if TXL_INIT else None
    torch.set_num_threads(min(2, torch.get_num_threads()))
    prog = unittest.main(argv=argv, exit=False, verbosity=2)
    if _results:
        print("\nmax |diff| per check:", file=sys.stderr)
        for test, what, diff in _results:
            print("  %-32s %-50s %.3g" % (test, what, diff), file=sys.stderr)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()

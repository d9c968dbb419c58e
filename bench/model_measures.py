"""The benchmark harness's measurements of the model code itself (bench/run.py runs them):
engine_bench's groups (P1, P2, P3, P5, Q1..Q5, W1..W5), training speed against a Python
loop (P6), the reduced modes' quality (Q0), and the engine step against the original
authors' MemTransformerLM (P9).
"""
import json
import os
import random
import re
import subprocess
import sys
import time

from harness_base import (BASE_CONFIG, BASE_VOCAB, ENGINE_GROUPS, REPO, HarnessBase, HarnessError,
                          last_json_line, log, make_row, median, run, tail)


class ModelMeasures(HarnessBase):
    # ------------------------------------------------------------------ engine
    def engine(self, ids):
        """engine_bench --shape base (or --engine-shape): the groups of `ids`, its rows and its
        JSON (nested under "engine")."""
        exe = self.tools.engine_bench
        self.tools.need(exe)
        out = self.path("engine.json")
        groups = sorted({ENGINE_GROUPS[i] for i in ids})
        cmd = [exe, "--shape", self.args.engine_shape, "--threads", str(max(1, self.threads)),
               "--device", self.device, "--json", out, "--only", ",".join(groups)]
        if self.args.quick:
            cmd.append("--quick")
        log("engine_bench: " + " ".join(cmd))
        t = time.perf_counter()
        proc = run(cmd, self.z["engine_timeout"], "engine_bench")
        with open(out) as f:
            data = json.load(f)
        data["wall_seconds"] = time.perf_counter() - t
        # Its own Markdown rows, verbatim, for the combined table.
        data["markdown_rows"] = [l for l in proc.stdout.splitlines() if re.match(r"^\| [PQW]\d", l)]
        rows = []
        for r in data.get("rows", []):
            row = dict(r)
            row["source"] = "engine_bench"
            rows.append(row)
        if not rows:
            raise HarnessError("engine_bench wrote no rows: " + out)
        return rows, data

    # ------------------------------------------------------------------ P6
    def p6(self):
        """txl-train tokens/s vs the Python reference loop, same model, data, settings, threads."""
        t = self.tools
        t.need(t.init, t.train)
        corpus = self.args.corpus
        if not os.path.exists(corpus):
            raise HarnessError("corpus %s not found (--corpus)" % corpus)
        with open(corpus, encoding="utf-8") as f:
            text = f.read(self.z["p6_corpus_chars"])
        slice_path, cfg_path, init = self.path("p6_corpus.txt"), self.path("p6_config.json"), self.path("p6_init.pt")
        with open(slice_path, "w", encoding="utf-8") as f:
            f.write(text)
        cfg = self.small_config()
        cfg["dropout"] = 0.0
        cfg["dropatt"] = 0.0
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        seed = 1
        # txl-train initialises from --seed exactly as txl-init does (InitWeights(config, seed),
        # std 0.02): the Python loop starts from the same weights, so the first losses agree.
        run([t.init, "--config", cfg_path, "--tokenizer", "char", "--corpus", slice_path, "--seed", str(seed),
             "--out", init], 300, "txl-init (small)")
        skip, measure = self.z["p6_skip"], self.z["p6_measure"]
        measure = max(skip, measure - measure % skip)  # whole log intervals of `skip` steps
        steps = skip + measure
        common = {"tgt_len": 128, "mem_len": 128, "batch_size": 16, "lr": 2e-3, "warmup": 200, "clip": 0.25}
        threads = max(1, self.threads)

        def cxx(rep):
            loss_log = self.path("p6_loss_%d.log" % rep)
            cmd = [t.train, "--train", slice_path, "--tokenizer", "char", "--config", cfg_path,
                   "--dropout", "0", "--dropatt", "0", "--seed", str(seed), "--max_steps", str(steps),
                   "--log_interval", str(skip), "--eval_interval", "0", "--checkpoint_interval", "0",
                   "--eval_max_tokens", "256", "--threads", str(threads), "--out", self.path("p6_out.pt"),
                   "--loss_log", loss_log, "--device", self.device]
            for k, v in common.items():
                cmd += ["--" + k, str(v)]
            out = run(cmd, self.z["step_timeout"], "txl-train").stdout
            rates = [float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ \|.*\| (\d+(?:\.\d+)?) tok/s", out, re.M)]
            if len(rates) != steps // skip:
                raise HarnessError("txl-train: expected %d progress lines:\n%s" % (steps // skip, tail(out)))
            measured = rates[1:]  # the first interval is the warm-up
            tps = len(measured) / sum(1.0 / r for r in measured)  # equal tokens per interval
            with open(loss_log) as f:
                losses = [float(l.split()[1]) for l in f if l.strip()]
            return tps, losses

        def python():
            cmd = [sys.executable, os.path.join(REPO, "bench", "python_train_loop.py"), "--init", init,
                   "--text", slice_path, "--max_steps", str(steps), "--skip", str(skip), "--threads", str(threads),
                   "--device", self.device]
            for k, v in common.items():
                cmd += ["--" + k, str(v)]
            j = last_json_line(run(cmd, self.z["step_timeout"], "python_train_loop.py").stdout,
                               "python_train_loop.py")
            return j["tokens_per_second"], j["losses"]

        a_reps, b_reps, pair = [], [], []
        for r in range(self.z["p6_reps"]):
            a, a_losses = cxx(r)
            b, b_losses = python()
            a_reps.append(a)
            b_reps.append(b)
            pair.append(a / b)
            log("P6 rep %d: txl-train %.0f tok/s, Python loop %.0f tok/s" % (r + 1, a, b))
        loss_diff = max(abs(x - y) for x, y in zip(a_losses, b_losses))
        extra = {"config": cfg, "train": dict(common, threads=threads, dropout=0.0, optimizer="Adam",
                                               steps=steps, skipped_warmup_steps=skip),
                 "corpus_chars": len(text),
                 "initial_loss_txl_train": a_losses[0], "initial_loss_python": b_losses[0],
                 "final_loss_txl_train": a_losses[-1], "final_loss_python": b_losses[-1],
                 "max_abs_loss_diff": loss_diff, "median_pair_ratio": median(pair), "pair_ratios": pair}
        if self.device != "cpu":
            extra["note"] = "P6 runs both sides on %s" % self.device
        if abs(a_losses[0] - b_losses[0]) > 1e-3:
            raise HarnessError("P6: the two loops do not compute the same loss: initial %.6f (txl-train) vs %.6f "
                               "(Python)" % (a_losses[0], b_losses[0]))
        return [make_row("P6", "training tokens/s, small model (bundled config), batch 16 x tgt_len 128, mem_len 128, "
                         "Adam, clip 0.25, dropout 0; initial loss %.4f vs %.4f" % (a_losses[0], b_losses[0]),
                         "txl-train", "Python reference loop", "tokens/s", a_reps, b_reps, 1.5, True, extra)]

    # ------------------------------------------------------------------ Q0
    # The gates of tests/model/precision_test.cc (QualityGateTest), by the name it prints.
    QUALITY_GATES = (("bfloat16", "Q0-bf16", "bf16 weights + bf16 memories", 0.005),
                     ("int8", "Q0-int8", "int8 weights + bf16 memories", 0.015))

    def q0(self):
        """Quality of the reduced-precision modes: precision_test's QualityGateTest.

        One run of the test (the bundled model over the last 10% of its corpus, in
        chunks of 2048 with its mem_len, float32 and each reduced mode); its
        `quality ...` lines are the figures. A: the mode's bits per character, B:
        float32's; the ratio column is the relative change (the test's own, from
        unrounded bpc) and the target its gate, |change| < 0.5% (bf16) or < 1.5%
        (int8). A gate the test fails still gives its row (met: NO); the test's
        exit status is in extra.
        """
        exe = self.tools.precision_test
        self.tools.need(exe)
        cmd = [exe, "--gtest_filter=QualityGateTest.*"]
        log("Q0: " + " ".join(cmd))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.z["quality_timeout"])
        except subprocess.TimeoutExpired:
            raise HarnessError("precision_test: timed out after %d s" % self.z["quality_timeout"])
        except OSError as e:
            raise HarnessError("cannot run %s: %s" % (exe, e))
        out = proc.stdout + proc.stderr
        m = re.search(r"^quality float32: bpc (\d+(?:\.\d+)?) over (\d+) tokens", out, re.M)
        if not m:
            raise HarnessError("precision_test printed no float32 quality line (exit %d):\n%s" %
                               (proc.returncode, tail(out)))
        f32_bpc, tokens = float(m.group(1)), int(m.group(2))
        modes = {}
        for m in re.finditer(r"^quality (\S+) weights, (\S+) memories: bpc (\d+(?:\.\d+)?) \(([+-]?\d+(?:\.\d+)?)%\), "
                             r"KL mean (\S+) max (\S+) nats", out, re.M):
            modes[m.group(1)] = {"memories": m.group(2), "bpc": float(m.group(3)), "relative": float(m.group(4)) / 100,
                                 "kl_mean": float(m.group(5)), "kl_max": float(m.group(6))}
        rows = []
        for name, rid, label, gate in self.QUALITY_GATES:
            q = modes.get(name)
            if q is None:
                raise HarnessError("precision_test printed no quality line for %s weights (exit %d):\n%s" %
                                   (name, proc.returncode, tail(out)))
            extra = {"tokens": tokens, "weights": name, "memories": q["memories"], "relative_change": q["relative"],
                     "kl_mean_nats": q["kl_mean"], "kl_max_nats": q["kl_max"], "max_relative_change": gate,
                     "test_exit_status": proc.returncode, "command": "tests/precision_test " + cmd[1],
                     "corpus": "last 10% of data/tinyshakespeare.txt", "model": "model/bundled/shakespeare_char.pt"}
            row = make_row(rid, "bits per character, bundled model, %d tokens (last 10%% of the corpus): %s vs "
                           "float32" % (tokens, label), label, "float32", "bpc", [q["bpc"]], [f32_bpc], 1 + gate,
                           False, extra)
            row["ratio"] = 1 + q["relative"]
            row["met"] = abs(q["relative"]) < gate
            row["ratio_format"] = "relative"
            row["note"] = "KL mean %.2e, max %.2e nats" % (q["kl_mean"], q["kl_max"])
            rows.append(row)
            log("Q0: %s bpc %.4f vs float32 %.4f (%+.3f%%), KL mean %.2e max %.2e" %
                (label, q["bpc"], f32_bpc, 100 * q["relative"], q["kl_mean"], q["kl_max"]))
        if proc.returncode != 0 and all(r["met"] for r in rows):
            raise HarnessError("precision_test failed (exit %d) although its gates are met:\n%s" %
                               (proc.returncode, tail(out)))
        return rows

    # ------------------------------------------------------------------ P9
    def p9(self):
        """The engine step vs the original authors' MemTransformerLM, per token at memory 800.

        A: build/bench/step_loop --sessions 1 --mem 800 (the median of its timed
           single-token steps of one session whose window is full), "base" model.
        B: bench/original_step.py: the original MemTransformerLM built from the same
           checkpoint's config and loaded (strict) with its tensors, filled with 800
           ids, then the median of one-token forwards with the mems it returns
           (torch.no_grad, eval, the same --threads).
        Interleaved A B A B. Before timing, B's losses on its first steps are
        compared with txl-eval --chunk 1 --mem_len 800 log-probabilities of the
        same ids: they must agree to 1e-3 nats, else the row is an error (not the
        same weights or not the same math).
        """
        t = self.tools
        t.need(t.step_loop, t.eval)
        original = self.args.original
        if not os.path.isfile(os.path.join(original, "mem_transformer.py")):
            raise HarnessError("--original %s has no mem_transformer.py (the original code's pytorch/ folder)" %
                               original)
        model = self.base_model()
        mem, steps, engine_steps = BASE_CONFIG["mem_len"], self.z["p9_steps"], self.z["p9_engine_steps"]
        check = min(self.z["p9_check"], steps)
        rng = random.Random(9)
        ids = [rng.randrange(BASE_VOCAB) for _ in range(mem + steps + 1)]
        ids_path, check_path, lp_path = self.path("p9_ids.txt"), self.path("p9_check.txt"), self.path("p9_lp.txt")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        with open(check_path, "w") as f:
            f.write(" ".join(map(str, ids[: mem + check + 1])) + "\n")
        threads = max(1, self.threads)

        def original_step():
            cmd = [sys.executable, os.path.join(REPO, "bench", "original_step.py"), "--original", original,
                   "--model", model, "--tokens", ids_path, "--mem", str(mem), "--steps", str(steps), "--check",
                   str(check), "--threads", str(threads)]
            return last_json_line(run(cmd, self.z["step_timeout"], "original_step.py").stdout, "original_step.py")

        def engine_step():
            cmd = [t.step_loop, "--model", model, "--sessions", "1", "--mem", str(mem), "--steps",
                   str(engine_steps), "--threads", str(threads)]
            out = run(cmd, self.z["step_timeout"], "step_loop").stdout
            m = re.search(r"sessions 1, memory %d: median step (\d+(?:\.\d+)?) ms" % mem, out)
            if not m:
                raise HarnessError("step_loop printed no median step:\n" + tail(out))
            return float(m.group(1)) / 1e3

        # Same weights, same math: the original's losses vs the engine's log-probabilities.
        first = original_step()
        run([t.eval, "--model", model, "--tokens", check_path, "--chunk", "1", "--mem_len", str(mem), "--threads",
             str(threads), "--device", "cpu", "--logprobs", lp_path], self.z["step_timeout"], "txl-eval (P9 check)")
        with open(lp_path) as f:
            lps = [float(x) for x in f.read().split()]
        # Line j is log p(t_{j+1} | t_0..t_j); step i predicts t_{mem+i+1}: line mem+i.
        engine_nll = [-x for x in lps[mem: mem + check]]
        if len(engine_nll) != check or len(first["nll"]) != check:
            raise HarnessError("P9 check: %d engine and %d original losses, expected %d" %
                               (len(engine_nll), len(first["nll"]), check))
        diff = max(abs(a - b) for a, b in zip(engine_nll, first["nll"]))
        log("P9 check: original vs engine loss over %d steps: max |diff| %.2e nats" % (check, diff))
        if diff > 1e-3:
            raise HarnessError("P9: the original model's losses differ from the engine's by %.3g nats "
                               "(original %s, engine %s): not the same weights or not the same math" %
                               (diff, first["nll"], engine_nll))
        a_reps, b_reps = [], []
        for r in range(self.z["reps"]):
            a_reps.append(engine_step())
            b_reps.append(original_step()["median_step_seconds"])
            log("P9 rep %d: engine step %.2f ms, original MemTransformerLM %.2f ms" %
                (r + 1, a_reps[-1] * 1e3, b_reps[-1] * 1e3))
        extra = {"mem": mem, "original_steps_per_rep": steps, "engine_steps_per_rep": engine_steps,
                 "threads": threads, "check_steps": check, "check_max_abs_diff_nats": diff,
                 "original_patched": first["patched"], "torch": first["torch"],
                 "a": "step_loop --sessions 1 median step", "b": "original MemTransformerLM forward median per token",
                 "harness_note": "this row's plumbing was tested against a stand-in mem_transformer.py with the "
                                 "original's constructor and forward, not against the original code"}
        row = make_row("P9", "1 session, 1 token/step, memory %d, base: engine step vs the original authors' "
                       "MemTransformerLM (mems %d, same weights and threads)" % (mem, mem), "engine step",
                       "original MemTransformerLM", "seconds/step", a_reps, b_reps, 15.0, True, extra,
                       ratio_of=lambda a, b: b / a)
        row["note"] = "losses agree to %.1e nats" % diff
        return [row]

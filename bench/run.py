#!/usr/bin/python3
"""One command for every performance figure of txl-serve (P1..P9, Q0, R1, W1..W5).

    /usr/bin/python3 bench/run.py [--build-dir build] [--quick] [--json OUT] [--md OUT]
                                  [--only P4,P6,...] [--device cpu|cuda] [--threads 2]
                                  [--original DIR]

Runs build/bench/engine_bench (P1, P1f, P2, P3, P5: the engine's step against the
original code's ways of serving; Q1, Q1f, Q3, Q3f, Q4, Q5: the reduced-precision modes
against float32, on the CPU only; W1, W3, W5: the output side of a large vocabulary, meant
for --engine-shape wt103: one session's greedy step vs its bandwidth floor at memories 800
and 1600, 32 sessions' step share after the last layer per readout (greedy, draw, Score,
top-p, whole rows), start-up; see bench/engine_bench.cc) and, here:

  P4  gRPC end to end, 1 session, one token per step: txl-client bench against
      txl-server vs the bare engine step (txl-eval --chunk 1), same model and
      window. Target: ratio <= 1.10.
  P6  training tokens/s: txl-train vs a Python reference training loop
      (bench/python_train_loop.py: tests/python/txl_reference.py's math, torch
      autograd, the same TXL scheme). Target: ratio >= 1.5.
  P7  txl-server process start to the first streamed token ("base" model),
      client connecting with wait-for-ready. Target: < 2 s.
  P8  what durability costs: txl-client bench throughput (8 sessions, bundled
      model) with --state_dir --fsync=always (P8) and --fsync=interval (P8i)
      vs the same server without a state store. Target: ratio >= 0.90.
  P9  only with --original DIR (the original authors' pytorch/ folder, which
      holds mem_transformer.py; never part of this repository): the engine step
      (build/bench/step_loop, 1 session, memory 800) vs the original
      MemTransformerLM's per-token forward with 800 positions of mems
      (bench/original_step.py), same "base" weights, same threads. Their losses
      on the first steps are checked against txl-eval's log-probabilities of the
      same ids (same weights, same math). Target: ratio >= 15x, P1's (whose
      baseline (b) re-implements this way of serving in C++).
  R1  RewindSession one turn back on the base model: from the turn checkpoint there vs by
      replaying the history (a server with --checkpoint_budget=0); ratio replay / checkpoint
      seconds (>= 10)
  Q0  quality of reduced precision (not a speed): build/tests/precision_test
      --gtest_filter=QualityGateTest.* (the bundled model over the last 10% of
      data/tinyshakespeare.txt) prints the bits per character of float32 and of
      each reduced mode; rows Q0-bf16 (bfloat16 weights + bfloat16 memories) and
      Q0-int8 (int8 weights + bfloat16 memories) report bpc vs float32, the
      relative change, KL(float32 || mode) mean and max. Targets: |change| <
      0.5% (bf16) and < 1.5% (int8), the test's own gates. About 35 s; it runs
      in --quick mode too (the test has no smaller size). engine_bench's Q1..Q5
      rows are the speed of the same modes.

Every ratio is measured in one run: A and B interleaved (A B A B ...), the
median of the repetitions; absolute figures are printed for reference only.
Prints one combined Markdown table and writes JSON (--json) and Markdown (--md).
Exit status: 0 when every measurement ran (whether or not targets are met),
1 when one failed (or --check-ids found an id missing), 2 for bad arguments or
an unavailable --device.

Model shapes: "base" = random weights, 12 layers, d_model 512, 8 heads x 64,
d_inner 2048, 204 tokens (a 204-entry word vocabulary), mem_len 800, written
with txl-init; "small" = the bundled model's config (model/bundled/shakespeare_char.pt).
"""
import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_IDS = ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "Q0", "Q1", "Q3", "Q4", "Q5", "R1", "W1", "W3",
           "W5"]
# Measured by engine_bench, by its groups (Q*: group Q, CPU only; P5 comes with P3).
ENGINE_GROUPS = {"P1": "P1", "P2": "P2", "P3": "P3", "P5": "P3", "Q1": "Q", "Q3": "Q", "Q4": "Q", "Q5": "Q",
                 "W1": "W", "W3": "W", "W5": "W"}
ENGINE_IDS = set(ENGINE_GROUPS)
BASE_CONFIG = {"n_layer": 12, "n_head": 8, "d_model": 512, "d_head": 64, "d_inner": 2048, "mem_len": 800}
BASE_VOCAB = 204

# Sizes per mode. Default: about 5 minutes for P4+P6+P7 on the 2-core reference
# machine when it is otherwise idle (engine_bench takes about as long again);
# quick: only checks that every path works.
SIZES = {
    "default": {
        "reps": 5,
        "p4_turns": 4, "p4_new_tokens": 64,
        "p6_reps": 4, "p6_skip": 5, "p6_measure": 20, "p6_corpus_chars": 200000,
        "p7_reps": 5,
        "p8_sessions": 8, "p8_turns": 8, "p8_new_tokens": 64,
        "p9_steps": 20, "p9_engine_steps": 200, "p9_check": 8,
        "r1_turns": 8, "r1_turn_tokens": 200,
        "engine_timeout": 1200, "step_timeout": 600, "quality_timeout": 900,
    },
    "quick": {
        "reps": 2,
        "p4_turns": 1, "p4_new_tokens": 8,
        "p6_reps": 1, "p6_skip": 1, "p6_measure": 2, "p6_corpus_chars": 60000,
        "p7_reps": 1,
        "p8_sessions": 2, "p8_turns": 1, "p8_new_tokens": 8,
        "p9_steps": 3, "p9_engine_steps": 10, "p9_check": 3,
        "r1_turns": 3, "r1_turn_tokens": 20,
        "engine_timeout": 300, "step_timeout": 300, "quality_timeout": 900,
    },
}


class HarnessError(Exception):
    pass


def log(msg):
    print("run.py: " + msg, file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else None


def tail(text, n=1500):
    text = text or ""
    return text if len(text) <= n else "..." + text[-n:]


def run(cmd, timeout, what, env=None):
    """Runs cmd; returns the CompletedProcess; raises HarnessError with its output on failure."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise HarnessError("%s: timed out after %d s: %s" % (what, timeout, " ".join(cmd)))
    except OSError as e:
        raise HarnessError("%s: cannot run %s: %s" % (what, cmd[0], e))
    if proc.returncode != 0:
        raise HarnessError("%s failed (exit %d): %s\n%s%s" % (what, proc.returncode, " ".join(cmd),
                                                              tail(proc.stdout), tail(proc.stderr)))
    return proc


def last_json_line(text, what):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise HarnessError("%s printed no JSON line:\n%s" % (what, tail(text)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_row(rid, measurement, a_name, b_name, unit, a_reps, b_reps, target, lower_bound, extra=None,
             ratio_of=None):
    """A row in engine_bench's JSON layout. ratio_of(a, b) gives the ratio (default a / b)."""
    a, b = median(a_reps), median(b_reps)
    ratio = (ratio_of or (lambda x, y: x / y))(a, b)
    met = ratio >= target if lower_bound else ratio <= target
    return {"id": rid, "measurement": measurement, "a_name": a_name, "b_name": b_name, "unit": unit,
            "a": a, "b": b, "ratio": ratio, "target": target, "target_is_lower_bound": lower_bound,
            "met": met, "a_reps": a_reps, "b_reps": b_reps, "extra": extra or {}}


class Tools:
    def __init__(self, build_dir):
        self.build = build_dir
        self.init = os.path.join(build_dir, "tools", "txl-init")
        self.eval = os.path.join(build_dir, "tools", "txl-eval")
        self.train = os.path.join(build_dir, "tools", "txl-train")
        self.server = os.path.join(build_dir, "server", "txl-server")
        self.client = os.path.join(build_dir, "client", "txl-client")
        self.engine_bench = os.path.join(build_dir, "bench", "engine_bench")
        self.step_loop = os.path.join(build_dir, "bench", "step_loop")
        self.precision_test = os.path.join(build_dir, "tests", "precision_test")
        self.stubs = os.path.join(build_dir, "client", "python", "gen")

    def stale(self):
        """Tools linked before the current model library: their figures would compare different code."""
        lib = os.path.join(self.build, "model", "libtxl_model.a")
        if not os.path.exists(lib):
            return []
        newest = os.path.getmtime(lib)
        return [os.path.relpath(p, self.build) for p in (self.eval, self.train, self.init, self.server,
                                                          self.engine_bench, self.step_loop, self.precision_test)
                if os.path.exists(p) and os.path.getmtime(p) < newest]

    def need(self, *paths):
        for p in paths:
            if not os.access(p, os.X_OK):
                raise HarnessError("%s is not built (cmake --build %s --target %s)" %
                                   (p, self.build, os.path.basename(p)))


class Server:
    """A txl-server child on loopback; its output lines are kept with arrival times."""

    def __init__(self, tools, model, threads, device, port=0, metrics=False, flags=()):
        self.lines = []  # (perf_counter, line)
        self.listening = threading.Event()
        self.address = self.metrics_address = None
        cmd = [tools.server, "--model", model, "--listen", "127.0.0.1:%d" % port, "--metrics_listen",
               "127.0.0.1:0" if metrics else "", "--http_listen=", "--device", device]
        if threads > 0:
            cmd += ["--threads", str(threads)]
        cmd += list(flags)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            now = time.perf_counter()
            self.lines.append((now, line.rstrip("\n")))
            m = re.search(r"listening on (\S+)", line)
            if m and not self.listening.is_set():
                self.address = m.group(1).rstrip(",")
                mm = re.search(r"metrics on (\S+)", line)
                self.metrics_address = mm.group(1) if mm else None
                self.listening_at = now
                self.listening.set()

    def wait_listening(self, timeout=120):
        deadline = time.time() + timeout
        while not self.listening.wait(0.05):
            if self.proc.poll() is not None or time.time() > deadline:
                self.reader.join(2)
                raise HarnessError("txl-server did not start:\n" + "\n".join(l for _, l in self.lines[-20:]))
        return self.address

    def step_seconds(self):
        """(sum, count) of the server's own txl_engine_step_seconds histogram."""
        with urllib.request.urlopen("http://%s/metrics" % self.metrics_address, timeout=30) as r:
            text = r.read().decode()
        total = count = None
        for line in text.splitlines():
            if line.startswith("txl_engine_step_seconds_sum"):
                total = float(line.split()[-1])
            elif line.startswith("txl_engine_step_seconds_count"):
                count = float(line.split()[-1])
        if total is None or count is None:
            raise HarnessError("txl-server /metrics has no txl_engine_step_seconds")
        return total, count

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)


class Harness:
    def __init__(self, args, sizes, tmp):
        self.args = args
        self.z = sizes
        self.tmp = tmp
        self.tools = Tools(args.build_dir)
        self.threads = args.threads
        self.device = args.device
        self._base = None

    def path(self, name):
        return os.path.join(self.tmp, name)

    # ------------------------------------------------------------------ models
    def base_model(self):
        """The "base" checkpoint: random weights, a 204-entry word vocabulary, mem_len 800."""
        if self._base:
            return self._base
        self.tools.need(self.tools.init)
        config, vocab, out = self.path("base.json"), self.path("base_vocab.txt"), self.path("base.pt")
        with open(config, "w") as f:
            json.dump(BASE_CONFIG, f)
        with open(vocab, "w") as f:  # 204 distinct words: n_token 204 (no <eos>/<unk>: none needed)
            f.write("".join("w%d\n" % i for i in range(BASE_VOCAB)))
        proc = run([self.tools.init, "--config", config, "--tokenizer", "word", "--vocab", vocab, "--seed", "1",
                    "--out", out], 300, "txl-init (base)")
        if "n_token=%d" % BASE_VOCAB not in proc.stdout:
            raise HarnessError("txl-init wrote an unexpected base model: " + proc.stdout)
        self._base = out
        return out

    def small_config(self):
        """The bundled model's config (its n_token dropped: the tokenizer of the corpus slice decides)."""
        bundled = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")
        with zipfile.ZipFile(bundled) as z:
            name = next(n for n in z.namelist() if n.endswith("extra/config.json"))
            cfg = json.loads(z.read(name))
        cfg.pop("n_token", None)
        return cfg

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

    # ------------------------------------------------------------------ P4
    def p4(self):
        """gRPC end to end vs the bare engine step, per generated token.

        A: txl-client bench, 1 session, T turns of 1 input token + G greedy tokens,
           against one txl-server started once; per token = wall time of the run
           (first Generate's start to the last one's end: every RPC, the scheduler,
           sampling, streaming, the client) / generated tokens.
        B: txl-eval --chunk 1 over T*(G+1) random ids with the same mem_len: the
           same model, one token per step, through the same LanguageModel::Step
           the engine thread calls, with the same history lengths (the server's
           session holds T*(G+1) tokens at the end), timing only the step loop
           (its "seconds": no model load). Per token = seconds / tokens.
        Both ask for one next-token distribution per step over a single session;
        the ratio is therefore everything serving adds to the bare step. The
        server is warmed once before the interleaved pairs.
        Also reported (extra "in_server"): A against the server's own engine step
        time over the same run (txl_engine_step_seconds sum / count from its
        /metrics): the same steps in the same process, so a second view of the
        overhead that no difference between the two processes can bias.
        """
        t = self.tools
        t.need(t.server, t.client, t.eval)
        model = self.base_model()
        T, G = self.z["p4_turns"], self.z["p4_new_tokens"]
        n = T * (G + 1)
        rng = random.Random(4)
        ids = self.path("p4_tokens.txt")
        with open(ids, "w") as f:
            f.write(" ".join(str(rng.randrange(BASE_VOCAB)) for _ in range(n)) + "\n")
        server = Server(t, model, self.threads, self.device, metrics=True)
        try:
            addr = server.wait_listening()
            bench_json = self.path("p4_bench.json")

            def bench(turns, new):
                run([t.client, "--server", addr, "--timeout", "600", "bench", "--sessions", "1", "--turns",
                     str(turns), "--input-tokens", "1", "--new-tokens", str(new), "--json", bench_json],
                    self.z["step_timeout"], "txl-client bench")
                with open(bench_json) as f:
                    j = json.load(f)
                if j["errors_total"] or j["generated_tokens"] != turns * new:
                    raise HarnessError("txl-client bench: unexpected result %s" % json.dumps(j))
                return j

            def bare():
                cmd = [t.eval, "--model", model, "--tokens", ids, "--chunk", "1", "--mem_len",
                       str(BASE_CONFIG["mem_len"]), "--device", self.device]
                if self.threads > 0:
                    cmd += ["--threads", str(self.threads)]
                return last_json_line(run(cmd, self.z["step_timeout"], "txl-eval").stdout, "txl-eval")

            bench(1, min(G, 8))  # warm-up: first-request allocations, the relative-position table
            a_reps, b_reps, itl, ttft, pair, in_server = [], [], [], [], [], []
            for r in range(self.z["reps"]):
                s0, c0 = server.step_seconds()
                j = bench(T, G)
                s1, c1 = server.step_seconds()
                in_server.append((s1 - s0) / max(1.0, c1 - c0))
                a = j["wall_seconds"] / j["generated_tokens"]
                e = bare()
                b = e["seconds"] / e["tokens"]
                a_reps.append(a)
                b_reps.append(b)
                pair.append(a / b)
                itl.append(j["inter_token_ms"]["p50"])
                ttft.append(j["time_to_first_token_ms"]["p50"])
                log("P4 rep %d: gRPC %.2f ms/token, bare step %.2f ms/token (in-server step %.2f ms)" %
                    (r + 1, a * 1e3, b * 1e3, in_server[-1] * 1e3))
        finally:
            server.stop()
        extra = {"turns": T, "new_tokens": G, "input_tokens": 1, "bare_tokens": n, "mem_len": BASE_CONFIG["mem_len"],
                 "median_pair_ratio": median(pair), "pair_ratios": pair,
                 "inter_token_ms_p50": itl, "time_to_first_token_ms_p50": ttft,
                 "in_server_step_seconds": in_server, "in_server_step_median_seconds": median(in_server),
                 "ratio_to_in_server_step": median(a_reps) / median(in_server),
                 "a": "txl-client bench wall_seconds / generated_tokens",
                 "b": "txl-eval --chunk 1 seconds / tokens"}
        row = make_row("P4", "gRPC end to end per token (1 session, %d turns x %d tokens, base, mem_len %d) "
                       "vs bare engine step (txl-eval --chunk 1)" % (T, G, BASE_CONFIG["mem_len"]),
                       "gRPC", "bare step", "seconds/token", a_reps, b_reps, 1.10, False, extra)
        row["note"] = "in-server engine step %.3f ms: ratio %.3f" % (median(in_server) * 1e3,
                                                                     extra["ratio_to_in_server_step"])
        return [row]

    # ------------------------------------------------------------------ P8
    def p8(self):
        """Throughput with a state store vs without, the same bench against each.

        Three servers on the bundled model run at once (one without a state
        store, one with --state_dir --fsync=always, one with --fsync=interval,
        each its own directory under the run's temporary directory); each
        repetition runs the same txl-client bench (N sessions, T greedy turns of
        32 input + G generated tokens; every token is journaled and each answer
        waits for its write) against each server in turn, interleaved.
        Ratio: generated tokens/s with the store / without (>= 0.90).
        """
        t = self.tools
        t.need(t.server, t.client)
        model = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")
        N, T, G = self.z["p8_sessions"], self.z["p8_turns"], self.z["p8_new_tokens"]
        servers = {}
        try:
            servers["none"] = Server(t, model, self.threads, self.device)
            for mode in ("always", "interval"):
                servers[mode] = Server(t, model, self.threads, self.device,
                                       flags=["--state_dir", self.path("p8_state_" + mode), "--fsync", mode,
                                              "--replica_name", "bench"])
            addrs = {k: s.wait_listening() for k, s in servers.items()}
            bench_json = self.path("p8_bench.json")

            def bench(addr, turns):
                run([t.client, "--server", addr, "--timeout", "600", "bench", "--sessions", str(N), "--turns",
                     str(turns), "--input-tokens", "32", "--new-tokens", str(G), "--json", bench_json],
                    self.z["step_timeout"], "txl-client bench")
                with open(bench_json) as f:
                    j = json.load(f)
                if j["errors_total"] or j["generated_tokens"] != N * turns * G:
                    raise HarnessError("txl-client bench: unexpected result %s" % json.dumps(j))
                return j["generated_tokens"] / j["wall_seconds"]

            for addr in addrs.values():
                bench(addr, 1)  # warm-up
            reps = {k: [] for k in servers}
            for r in range(self.z["reps"]):
                for k in ("none", "always", "interval"):
                    reps[k].append(bench(addrs[k], T))
                log("P8 rep %d: %s tokens/s" % (r + 1, ", ".join("%s %.0f" % (k, v[-1]) for k, v in reps.items())))
        finally:
            for s in servers.values():
                s.stop()
        extra = {"sessions": N, "turns": T, "new_tokens": G, "input_tokens": 32}
        rows = []
        for rid, mode in (("P8", "always"), ("P8i", "interval")):
            rows.append(make_row(rid, "txl-client bench tokens/s (%d sessions x %d turns x %d tokens, small) with "
                                 "--state_dir --fsync=%s vs no state store" % (N, T, G, mode),
                                 "fsync=" + mode, "no store", "tokens/s", reps[mode], reps["none"], 0.90, True,
                                 dict(extra)))
        return rows

    # ------------------------------------------------------------------ R1
    def r1(self):
        """Going back one turn: RewindSession served from a turn checkpoint vs by replay.

        Two servers on the base model (window 800): one with the default
        --checkpoint_budget, one with --checkpoint_budget=0 (every rewind replays
        the history from an empty session, which is also what a client without
        RewindSession must do: recreate the session and feed the text again).
        A session of T turns of N tokens (Score, commit) on each; each repetition
        rewinds it to the end of its second-to-last turn and feeds that last turn
        again, interleaved between the servers. Ratio: replay seconds /
        checkpoint seconds (>= 10)."""
        t = self.tools
        t.need(t.server, t.init)
        model = self.base_model()
        sys.path.insert(0, t.stubs)
        try:
            import grpc
            from txl.v1 import txl_pb2, txl_pb2_grpc
        except ImportError as e:
            raise HarnessError("R1 needs Debian's python3-grpcio and the built stubs: %s" % e)
        T, N = self.z["r1_turns"], self.z["r1_turn_tokens"]
        rng = random.Random(7)
        turns = [[rng.randrange(BASE_VOCAB) for _ in range(N)] for _ in range(T)]
        servers, stubs, sessions = {}, {}, {}
        try:
            servers["checkpoint"] = Server(t, model, self.threads, self.device)
            servers["replay"] = Server(t, model, self.threads, self.device, flags=["--checkpoint_budget", "0"])
            for k, srv in servers.items():
                stubs[k] = txl_pb2_grpc.TransformerXLStub(grpc.insecure_channel(srv.wait_listening()))
                sessions[k] = stubs[k].CreateSession(txl_pb2.CreateSessionRequest(), timeout=60).session_id
                for ids in turns:
                    stubs[k].Score(txl_pb2.ScoreRequest(session_id=sessions[k], commit=True, input=txl_pb2.Input(
                        tokens=txl_pb2.TokenIds(ids=ids))), timeout=600)
            back = (T - 1) * N

            def once(k):
                t0 = time.perf_counter()
                r = stubs[k].RewindSession(txl_pb2.RewindSessionRequest(session_id=sessions[k], position=back),
                                           timeout=600)
                took = time.perf_counter() - t0
                if r.position != back:
                    raise HarnessError("R1: rewound to %d, not %d" % (r.position, back))
                stubs[k].Score(txl_pb2.ScoreRequest(session_id=sessions[k], commit=True, input=txl_pb2.Input(
                    tokens=txl_pb2.TokenIds(ids=turns[-1]))), timeout=600)
                return took

            reps = {k: [] for k in servers}
            for r in range(self.z["reps"]):
                for k in ("checkpoint", "replay"):
                    reps[k].append(once(k))
                log("R1 rep %d: checkpoint %.4f s, replay %.3f s" % (r + 1, reps["checkpoint"][-1],
                                                                      reps["replay"][-1]))
        except grpc.RpcError as e:
            raise HarnessError("R1: %s %s" % (e.code(), e.details()))
        finally:
            for srv in servers.values():
                srv.stop()
        extra = {"turns": T, "turn_tokens": N, "rewind_to": (T - 1) * N, "mem_len": BASE_CONFIG["mem_len"]}
        return [make_row("R1", "RewindSession one turn back (%d turns of %d tokens, base model, window %d): replay "
                         "vs turn checkpoint" % (T, N, BASE_CONFIG["mem_len"]), "replay", "checkpoint", "s",
                         reps["replay"], reps["checkpoint"], 10.0, True, extra)]

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

    # ------------------------------------------------------------------ P7
    def p7(self):
        """Process start to the first streamed token: spawn txl-server (base model), a
        client calling Generate with wait-for-ready at once. The client's reconnect
        backoff is set to 20-50 ms so that waiting costs at most that much more than
        the server's readiness. Breakdown from the server's output: spawn -> the
        "listening" line (model load, server start), then -> first token (connect,
        first engine step, streaming)."""
        t = self.tools
        t.need(t.server)
        model = self.base_model()
        if not os.path.isdir(t.stubs):
            raise HarnessError("Python stubs not built: %s (target txl_python_stubs)" % t.stubs)
        sys.path.insert(0, t.stubs)
        try:
            import grpc
            from txl.v1 import txl_pb2, txl_pb2_grpc
        except ImportError as e:
            raise HarnessError("P7 needs Debian's python3-grpcio and the built stubs: %s" % e)
        options = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                   ("grpc.max_reconnect_backoff_ms", 50)]
        request = txl_pb2.GenerateRequest(input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=[1, 2, 3])),
                                          max_new_tokens=4, sampling=txl_pb2.SamplingParams(temperature=0.0))

        def once():
            port = free_port()
            server = Server(t, model, self.threads, self.device, port)
            t0 = server.started
            try:
                channel = grpc.insecure_channel("127.0.0.1:%d" % port, options=options)
                stub = txl_pb2_grpc.TransformerXLStub(channel)
                call = stub.Generate(request, wait_for_ready=True, timeout=120)
                first = None
                for resp in call:
                    if len(resp.tokens) > 0:
                        first = time.perf_counter()
                        break
                call.cancel()
                channel.close()
                if first is None:
                    raise HarnessError("P7: the stream ended without a token")
                server.wait_listening(5)
                return first - t0, server.listening_at - t0
            except grpc.RpcError as e:
                raise HarnessError("P7: Generate failed: %s %s\n%s" % (e.code(), e.details(),
                                                                      "\n".join(l for _, l in server.lines[-10:])))
            finally:
                server.stop()

        once()  # warm-up: the checkpoint into the page cache, as on a node that has pulled it
        firsts, readies = [], []
        for r in range(self.z["p7_reps"]):
            f, ready = once()
            firsts.append(f)
            readies.append(ready)
            log("P7 rep %d: first token %.3f s after spawn (listening at %.3f s)" % (r + 1, f, ready))
        extra = {"load_and_start_seconds": readies, "first_request_seconds": [f - r for f, r in zip(firsts, readies)],
                 "median_load_and_start_seconds": median(readies),
                 "median_first_request_seconds": median([f - r for f, r in zip(firsts, readies)]),
                 "model_bytes": os.path.getsize(model), "reconnect_backoff_ms": [20, 50],
                 "target_applies_to": "a (seconds, absolute)"}
        row = make_row("P7", "txl-server spawn to first streamed token (base model, %.0f MB checkpoint; "
                       "client waits for ready)" % (os.path.getsize(model) / 1e6),
                       "first token", "listening (load + start)", "seconds", firsts, readies, 2.0, False, extra,
                       ratio_of=lambda a, b: a)
        row["ratio"] = None  # an absolute target: met when A < 2 s
        row["met"] = row["a"] < 2.0
        return [row]

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


# ---------------------------------------------------------------------- output
def fmt_value(unit, v):
    if v is None:
        return "-"
    if unit in ("seconds/step", "seconds/token"):
        return "%.3f ms" % (v * 1e3)
    if unit == "seconds":
        return "%.3f s" % v
    if unit == "tokens/s":
        return "%.1f tok/s" % v
    if unit.startswith("MB"):
        return "%.3f MB" % v
    if unit == "bpc":
        return "%.4f bpc" % v
    return "%.4g %s" % (v, unit)


def markdown_row(r):
    rid = r["id"]
    if "error" in r:
        return "| %s | %s | - | - | - | - | ERROR: %s |" % (rid, r.get("measurement", ""), r["error"].splitlines()[0])
    unit = r.get("unit", "")
    if r.get("ratio_format") == "relative":  # Q0: a change from float32 within a gate
        ratio = "%+.3f%%" % (100 * (r["ratio"] - 1))
        target = "abs < %g%%" % (100 * r["extra"]["max_relative_change"])
    elif r.get("ratio") is None:
        ratio = "-"
        target = "< %g s" % r["target"]
    elif r.get("target_is_lower_bound"):
        ratio = "%.2fx" % r["ratio"]
        target = ">= %gx" % r["target"]
    else:
        ratio = "%.3f" % r["ratio"]
        target = "<= %g" % r["target"]
    measurement = r["measurement"] + ("; " + r["note"] if r.get("note") else "")
    return "| %s | %s | %s: %s | %s: %s | %s | %s | %s |" % (
        rid, measurement, r["a_name"], fmt_value(unit, r["a"]), r["b_name"], fmt_value(unit, r["b"]),
        ratio, target, "yes" if r["met"] else "NO")


def base_id(rid):
    m = re.match(r"[PQRW]\d+", rid)
    return m.group(0) if m else rid


def id_key(rid):
    """P1 < P1f < P2-800 < ... < P9 < Q0 < Q1-bf16 ... by letter and number only: a stable sort keeps
    engine_bench's order within an id."""
    m = re.match(r"([PQRW])(\d+)", rid)
    return (m.group(1), int(m.group(2))) if m else ("Z", 999)


def markdown(result):
    lines = ["| id | measurement | A | B | ratio | target | met |", "|---|---|---|---|---|---|---|"]
    engine_md = {}
    for l in (result.get("engine") or {}).get("markdown_rows", []):
        engine_md[l.split("|")[1].strip()] = l
    for r in result["rows"]:
        if r.get("source") == "engine_bench" and r["id"] in engine_md:
            lines.append(engine_md[r["id"]])  # engine_bench's own row, verbatim
        else:
            lines.append(markdown_row(r))
    return "\n".join(lines)


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "loadavg_start": list(os.getloadavg())}


def check_device(tools, device):
    """--device cuda: fail early and clearly when the tools cannot use it."""
    if device == "cpu":
        return
    tools.need(tools.eval)
    with tempfile.TemporaryDirectory(prefix="txl_bench_dev_") as d:
        ids = os.path.join(d, "t.txt")
        with open(ids, "w") as f:
            f.write("1 2 3\n")
        proc = subprocess.run([tools.eval, "--model", os.path.join(REPO, "model", "bundled", "shakespeare_char.pt"),
                               "--tokens", ids, "--device", device], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["unknown error"]
        print("run.py: --device %s: CUDA is not usable on this machine (%s); run with --device cpu" %
              (device, msg[0]), file=sys.stderr)
        sys.exit(2)


def main():
    # Every process measured (server, txl-eval, txl-train, engine_bench) gets the wait policy
    # the Dockerfile sets: spinning OpenMP workers distort figures on shared cores.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(description="Runs every txl-serve performance measurement (P1..P9, Q0).")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1-2 repetitions: only checks that all works")
    ap.add_argument("--json", default="", help="write the combined results here")
    ap.add_argument("--md", default="", help="write the combined Markdown table here")
    ap.add_argument("--only", default="", help="comma-separated ids, e.g. P4,P6 (default: all)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N], passed to the tools")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every side of every measurement")
    ap.add_argument("--reps", type=int, default=0, help="interleaved repetitions for P4 / P6 / P7 (0: per mode)")
    ap.add_argument("--engine-shape", default="base", choices=["base", "wt103", "small"],
                    help="engine_bench --shape (wt103: the WikiText-103 model's shape, random weights, 1.1 GB)")
    ap.add_argument("--corpus", default=os.environ.get("TXL_CORPUS", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                         "data", "tinyshakespeare.txt")),
                    help="training corpus for P6 (a slice of it is used)")
    ap.add_argument("--check-ids", default="",
                    help="exit 1 unless the JSON written has a row without error for each of these ids")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory (models, logs)")
    ap.add_argument("--original", default="",
                    help="the original authors' pytorch/ folder (mem_transformer.py): adds P9, the engine step vs "
                         "their MemTransformerLM per token at mems 800 (not part of this repository)")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if args.device != "cpu" and not args.device.startswith("cuda"):
        ap.error("--device must be cpu or cuda[:N]")
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()] or list(ALL_IDS)
    bad = [s for s in only if s not in ALL_IDS]
    if bad:
        ap.error("--only: unknown id(s) %s (known: %s)" % (",".join(bad), ",".join(ALL_IDS)))
    if args.original:
        args.original = os.path.abspath(args.original)
        if not os.path.isfile(os.path.join(args.original, "mem_transformer.py")):
            ap.error("--original %s: no mem_transformer.py there (the original code's pytorch/ folder)" %
                     args.original)
    elif "P9" in only:
        if args.only:
            ap.error("--only P9 needs --original DIR (the original code's pytorch/ folder)")
        only.remove("P9")  # P9 runs only against the original code
    if "Q0" in only and args.device != "cpu":
        log("Q0 measures the CPU kernels (precision_test runs on the CPU whatever --device says)")
    sizes = dict(SIZES["quick" if args.quick else "default"])
    if args.reps > 0:
        sizes["reps"] = sizes["p6_reps"] = sizes["p7_reps"] = args.reps
    tools = Tools(args.build_dir)
    check_device(tools, args.device)

    warnings = []
    stale = tools.stale()
    if stale:
        warnings.append("built before build/model/libtxl_model.a (rebuild them, or the ratios compare different "
                        "code): " + ", ".join(stale))
        log("WARNING: " + warnings[-1])
    tmp = tempfile.mkdtemp(prefix="txl_bench_")
    started = time.time()
    result = {"harness": "bench/run.py", "quick": args.quick, "device": args.device, "threads": args.threads,
              "only": only, "sizes": sizes, "machine": machine_info(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
              "engine": None, "rows": [], "errors": [], "warnings": warnings}
    h = Harness(args, sizes, tmp)
    steps = []
    if ENGINE_IDS & set(only):
        engine_ids = ENGINE_IDS & set(only)
        steps.append(("engine", engine_ids, lambda: h.engine(engine_ids)))
    for rid, fn in (("P4", h.p4), ("P6", h.p6), ("P7", h.p7), ("P8", h.p8), ("P9", h.p9), ("Q0", h.q0),
                    ("R1", h.r1)):
        if rid in only:
            steps.append((rid, {rid}, fn))
    try:
        for name, ids, fn in steps:
            t = time.perf_counter()
            log("%s ..." % name)
            try:
                out = fn()
                if name == "engine":
                    rows, data = out
                    result["engine"] = data
                    rows = [r for r in rows if base_id(r["id"]) in only]
                else:
                    rows = out
                for r in rows:
                    r.setdefault("source", "run.py")
                result["rows"] += rows
            except HarnessError as e:
                log("%s FAILED: %s" % (name, e))
                result["errors"].append({"step": name, "error": str(e)})
                for rid in sorted(ids):
                    result["rows"].append({"id": rid, "measurement": name, "error": str(e), "met": None})
                if name == "engine":
                    result["engine"] = {"error": str(e)}
            log("%s done in %.0f s" % (name, time.perf_counter() - t))
    finally:
        if args.keep_tmp:
            log("temporary files kept in " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["rows"].sort(key=lambda r: id_key(r["id"]))
    result["seconds"] = time.time() - started
    result["machine"]["loadavg_end"] = list(os.getloadavg())

    table = markdown(result)
    header = ("txl-serve benchmarks: device %s, %d threads%s, %s (%s cpus), load average %.1f -> %.1f, %.0f s. "
              "A and B interleaved; medians of repetitions; absolute figures for reference only." %
              (args.device, args.threads, ", quick" if args.quick else "", result["machine"]["cpu"],
               result["machine"]["cpus"], result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0],
               result["seconds"]))
    if warnings:
        header += "\n\nWARNING: " + "\nWARNING: ".join(warnings)
    print("\n" + header + "\n\n" + table + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(header + "\n\n" + table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    status = 1 if result["errors"] else 0
    if args.check_ids:
        if not args.json:
            ap.error("--check-ids needs --json")
        with open(args.json) as f:
            written = json.load(f)  # well-formed JSON, read back
        present = {base_id(r["id"]) for r in written["rows"] if "error" not in r}
        missing = [i for i in args.check_ids.split(",") if i.strip() and i.strip() not in present]
        if missing:
            log("--check-ids: no result for %s" % ",".join(missing))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

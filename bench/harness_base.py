"""What the benchmark harness (bench/run.py) shares: the ids it measures, the sizes per
mode, running tools and reading their output, rows in engine_bench's JSON layout, the
built tools (Tools), a txl-server child (Server), and HarnessBase: the run's settings,
its temporary directory and the models measured ("base", the bundled model's config).
The measurements are methods of mixins on HarnessBase: model_measures.py (engine_bench,
P6, P9, Q0) and server_measures.py (P4, P7, P8, R1).
"""
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
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


class HarnessBase:
    """The run's settings, tools and temporary directory, and the models it measures."""

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

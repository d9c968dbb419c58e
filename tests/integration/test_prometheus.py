"""deploy/prometheus against a real Prometheus scraping a real txl-server (loopback only).

Renders deploy/prometheus/prometheus.yml for the server's metrics port (1 s scrape and rule
evaluation), loads deploy/prometheus/rules.yml, then checks through Prometheus' HTTP API that the
target is up, that txl_tokens_generated_total rises by what txl-client generated, that every rule
loaded and the recording rules evaluate, and that every query of the Grafana dashboard runs and
returns series. Everything is polled with deadlines; the whole test stays well under 2 minutes.

Run by CTest: /usr/bin/python3 test_prometheus.py --source-dir SRC --bin-dir BUILD
"""
import argparse
import json
import os
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
PROMETHEUS = "/usr/bin/prometheus"
TOTAL_SECONDS = 200   # every wait below also stops at this overall deadline
DEADLINE = None       # set when the class starts
BUDGET = 100_000_000  # --session_memory_budget of the test server
MAX_SESSIONS = 2      # small, so that a third session gets RESOURCE_EXHAUSTED


def wait_for(what, probe, timeout, interval=0.2):
    """Calls probe() until it returns something truthy; fails with the last value after `timeout` s.
    `what` may be a callable, for a description made at the time of failure."""
    deadline = min(time.monotonic() + timeout, DEADLINE)
    last = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except (OSError, ValueError) as e:  # connection refused, bad JSON while starting
            last = e
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            raise AssertionError(f"timed out waiting for {what} ({timeout} s, or the test's {TOTAL_SECONDS} s "
                                 f"in all); last: {last!r}")
        time.sleep(interval)


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global DEADLINE
        cls.started = time.monotonic()
        DEADLINE = cls.started + TOTAL_SECONDS
        cls.procs = []
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_prometheus_")
        try:
            cls.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls):
        if not os.access(PROMETHEUS, os.X_OK):
            raise RuntimeError(f"{PROMETHEUS} is missing: install the Debian package `prometheus` "
                               "(scripts/install-deps.sh does)")
        tmp = cls.tmp.name
        # A tiny model, a server with metrics on a free loopback port.
        cls.server = txl_procs.Server(ARGS.bin_dir, txl_procs.tiny_model(ARGS.bin_dir, tmp), "--threads", "1",
                                      "--max_sessions", str(MAX_SESSIONS), "--session_memory_budget", str(BUDGET),
                                      metrics=True)
        cls.procs.append(cls.server.proc)
        cls.address, cls.metrics_target = cls.server.address, cls.server.metrics_address

        # The scrape configuration, rendered the documented way; 1 s intervals for the test.
        with open(os.path.join(ARGS.source_dir, "deploy", "prometheus", "prometheus.yml")) as f:
            rendered = string.Template(f.read()).substitute(TXL_METRICS_TARGET=cls.metrics_target)
        cfg = yaml.safe_load(rendered)
        cfg["global"]["scrape_interval"] = "1s"
        cfg["global"]["evaluation_interval"] = "1s"
        cls.job = cfg["scrape_configs"][0]["job_name"]
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(cfg, f)
        shutil.copy(os.path.join(ARGS.source_dir, "deploy", "prometheus", "rules.yml"), tmp)
        with open(os.path.join(tmp, "rules.yml")) as f:
            cls.rules = yaml.safe_load(f)

        port = txl_procs.free_port()
        cls.api = f"http://127.0.0.1:{port}"
        cls.prom_log = open(os.path.join(tmp, "prometheus.log"), "w")
        cls.prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={os.path.join(tmp, 'prometheus.yml')}",
             f"--storage.tsdb.path={os.path.join(tmp, 'data')}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=cls.prom_log, stderr=subprocess.STDOUT, cwd=tmp)
        cls.procs.append(cls.prometheus)

        def ready():
            if cls.prometheus.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + open(os.path.join(tmp, "prometheus.log")).read())
            with urllib.request.urlopen(cls.api + "/-/ready", timeout=2) as r:
                return r.status == 200
        wait_for("Prometheus to be ready", ready, 30)

    @classmethod
    def tearDownClass(cls):
        for p in reversed(cls.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if getattr(cls, "prom_log", None):
            cls.prom_log.close()
        cls.tmp.cleanup()

    # --- helpers --------------------------------------------------------------------------

    def api_get(self, path, **params):
        url = self.api + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # a bad query: fail now, with Prometheus' reason
            raise AssertionError(f"{params or path}: HTTP {e.code} {e.read().decode(errors='replace')}")
        self.assertEqual(body["status"], "success", body)
        return body["data"]

    def query(self, expr):
        """Instant vector result as {frozenset(labels without __name__): value}."""
        data = self.api_get("/api/v1/query", query=expr)
        self.assertEqual(data["resultType"], "vector", expr)
        return {frozenset((k, v) for k, v in s["metric"].items() if k != "__name__"): float(s["value"][1])
                for s in data["result"]}

    def scalar(self, expr):
        result = self.query(expr)
        return next(iter(result.values())) if len(result) == 1 else None

    def client(self, *args):
        r = subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", self.address] +
                           list(args), capture_output=True, text=True, timeout=60)
        return r

    # --- the test -------------------------------------------------------------------------

    def test_prometheus_sees_the_server_and_evaluates_the_rules(self):
        # 1. The target is scraped.
        wait_for("up == 1", lambda: self.scalar(f'up{{job="{self.job}"}}') == 1, 30)
        targets = self.api_get("/api/v1/targets")["activeTargets"]
        self.assertEqual([(t["labels"]["job"], t["health"]) for t in targets], [(self.job, "up")])
        self.assertEqual(targets[0]["scrapeUrl"], f"http://{self.metrics_target}/metrics")
        before = wait_for("txl_tokens_generated_total", lambda: self.query(
            f'txl_tokens_generated_total{{job="{self.job}"}}'), 15)
        before = next(iter(before.values()))
        print(f"\nthrough Prometheus before generation: up=1, txl_tokens_generated_total={before:g}",
              file=sys.stderr)

        # 2. Generation through the server shows up in Prometheus.
        gen = self.client("--max_new_tokens", "24", "--temperature", "0", "generate", "to be or not")
        self.assertEqual(gen.returncode, 0, gen.stderr)
        self.assertIn("24 generated", gen.stderr)
        after = wait_for("txl_tokens_generated_total to rise by 24", lambda: (lambda v: v if v is not None and
                         v >= before + 24 else None)(self.scalar(f'txl_tokens_generated_total{{job="{self.job}"}}')), 15)
        self.assertEqual(after, before + 24)
        print(f"after generating 24 tokens: txl_tokens_generated_total={after:g}", file=sys.stderr)

        # Sessions up to the limit (once the throw-away session of the generation is gone), then
        # refusals (RESOURCE_EXHAUSTED) and an unknown session (NOT_FOUND).
        wait_for("the throw-away session to go", lambda: self.client("sessions", "list").stdout.strip() == "", 10)
        for _ in range(MAX_SESSIONS):
            created = self.client("--mem_len", "16", "create")
            self.assertEqual(created.returncode, 0, created.stderr)

        def refuse():
            refused = self.client("create")
            self.assertEqual(refused.returncode, 1)
            self.assertIn("RESOURCE_EXHAUSTED", refused.stderr)
        refuse()
        # A counter's first sample gives rate() nothing: refuse again once Prometheus has seen it.
        wait_for("the RESOURCE_EXHAUSTED series", lambda: self.query(
            f'txl_requests_total{{job="{self.job}", code="RESOURCE_EXHAUSTED"}}'), 15)
        refuse()
        missing = self.client("sessions", "get", "0" * 32)
        self.assertIn("NOT_FOUND", missing.stderr)

        # 3. Every rule of rules.yml is loaded and healthy.
        groups = self.api_get("/api/v1/rules")["groups"]
        loaded = {(g["name"], r["name"]): r for g in groups for r in g["rules"]}
        expected = {(g["name"], r.get("record") or r.get("alert")) for g in self.rules["groups"] for r in g["rules"]}
        self.assertEqual(set(loaded), expected)
        wait_for("every rule evaluated without error",
                 lambda: all(r.get("health") == "ok" for g in self.api_get("/api/v1/rules")["groups"]
                             for r in g["rules"]), 15)

        # The alerts on `up` select this scrape job.
        up_selectors = {m for g in self.rules["groups"] for r in g["rules"]
                        for m in re.findall(r"\bup\{[^}]*\}", r["expr"])}
        self.assertTrue(up_selectors)
        for selector in up_selectors:
            self.assertEqual(list(self.query(selector).values()), [1.0], selector)

        # 4. The recording rules produce what the raw metrics say.
        # One session at mem_len 16 reserves its full ring: 2 layers * 2 * 16 slots * 2 heads * 16 * 4 bytes.
        reserved = MAX_SESSIONS * 2 * 2 * 16 * 2 * 16 * 4
        checks = {
            "txl:tokens_generated:rate1m": lambda v: v > 0,
            "txl:sessions:saturation": lambda v: v == 1.0,
            "txl:queue:saturation": lambda v: v == 0.0,
            "txl:session_memory_budget:reserved_ratio": lambda v: abs(v - reserved / BUDGET) < 1e-12,
            "txl:requests_rejected:ratio_rate5m": lambda v: 0 < v <= 1,
            "txl:time_to_first_token_seconds:p95_5m": lambda v: v > 0,
        }
        seen = {}

        def recorded():
            for name, ok in checks.items():
                v = self.scalar(name)
                seen[name] = v
                if v is None or not ok(v):
                    return False
            return True
        wait_for(lambda: f"recording rules to match the server (saw {seen})", recorded, 90)
        print("recording rules: " + ", ".join(f"{k}={v:.6g}" for k, v in seen.items()), file=sys.stderr)
        requests = self.query(f'txl_requests_total{{job="{self.job}"}}')
        codes = {dict(k)["code"] for k in requests}
        self.assertTrue({"OK", "RESOURCE_EXHAUSTED", "NOT_FOUND"} <= codes, codes)

        # 5. Every query of the Grafana dashboard parses in Prometheus and returns series.
        with open(os.path.join(ARGS.source_dir, "deploy", "grafana", "txl-serve.json")) as f:
            dashboard = json.load(f)
        exprs = []
        for p in dashboard["panels"]:
            for q in (p.get("panels", []) if p["type"] == "row" else [p]):
                for t in q["targets"]:
                    e = (t["expr"].replace("$__rate_interval", "30s").replace('"$job"', '".*"')
                         .replace('"$instance"', '".*"'))
                    self.assertNotIn("$", e, "a dashboard variable the test does not know")
                    exprs.append((q["title"], e))
        empty = []

        def all_answer():
            empty.clear()
            for title, e in exprs:
                if not self.query(e):  # fails on a PromQL error
                    empty.append((title, e))
            return not empty
        wait_for(lambda: f"every dashboard query to return series (empty: {empty})", all_answer, 20)
        print(f"{len(exprs)} dashboard queries all returned series; "
              f"{time.monotonic() - self.started:.1f} s in all", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

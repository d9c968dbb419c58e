"""`txl-client bench` (the load generator) against a real txl-server (loopback, tiny model).

Run by CTest: /usr/bin/python3 test_client_bench.py --bin-dir BUILD
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None


class ClientBenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_bench_")
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)
        cls.server = txl_procs.Server(ARGS.bin_dir, cls.model)
        cls.address = cls.server.address

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def client(self, *args, address=None, timeout=120):
        return subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server",
                               address or self.address] + list(args),
                              capture_output=True, text=True, timeout=timeout)

    def bench(self, *args, address=None, timeout=120):
        """Runs bench with --json; returns (completed process, parsed report)."""
        path = os.path.join(self.tmp.name, "report.json")
        if os.path.exists(path):
            os.remove(path)
        r = self.client("bench", *args, "--json", path, address=address, timeout=timeout)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        with open(path) as f:
            return r, json.load(f)

    def assertNoSessions(self, address=None):
        listed = self.client("sessions", "list", address=address)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.strip(), "", "bench left sessions behind")

    def assertLatencies(self, latency, count):
        self.assertEqual(latency["count"], count)
        self.assertGreater(latency["p50"], 0)
        self.assertLessEqual(latency["p50"], latency["p95"])
        self.assertLessEqual(latency["p95"], latency["p99"])

    def test_counts_tokens_and_latencies_then_deletes_its_sessions(self):
        r, report = self.bench("--sessions", "4", "--turns", "3", "--input-tokens", "8", "--new-tokens", "5")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(report["sessions_created"], 4)
        self.assertEqual(report["requests"], 12)
        self.assertEqual(report["requests_ok"], 12)
        self.assertEqual(report["requests_cut"], 0)
        self.assertEqual(report["generated_tokens"], 4 * 3 * 5)  # no stop tokens: exactly --new-tokens
        self.assertEqual(report["fed_tokens"], 4 * 3 * 8)
        self.assertEqual(report["errors_total"], 0)
        self.assertEqual(report["errors"], {})
        self.assertEqual(report["stopped_by"], "turns")
        self.assertGreater(report["wall_seconds"], 0)
        self.assertAlmostEqual(report["generated_tokens_per_second"], 60 / report["wall_seconds"], places=6)
        self.assertAlmostEqual(report["fed_tokens_per_second"], 96 / report["wall_seconds"], places=6)
        self.assertLatencies(report["time_to_first_token_ms"], 12)  # one per request
        self.assertLatencies(report["inter_token_ms"], 12 * 4)  # the server streams one token per response
        # The table carries the same figures.
        self.assertIn("requests      12 (ok 12, cut by the duration 0, failed 0)", r.stdout)
        self.assertRegex(r.stdout, r"generated +60 tokens, [0-9.]+ tokens/s")
        self.assertRegex(r.stdout, r"time to first token +12 +[0-9.]+ +[0-9.]+ +[0-9.]+")
        self.assertIn("errors        none", r.stdout)
        self.assertNoSessions()

    def test_duration_bounds_the_run(self):
        began = time.monotonic()
        r, report = self.bench("--sessions", "2", "--turns", "1000000000", "--input-tokens", "4",
                               "--new-tokens", "64", "--duration", "2")
        elapsed = time.monotonic() - began
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # calls cut at the end are not errors
        self.assertLess(elapsed, 30)
        self.assertEqual(report["stopped_by"], "duration")
        self.assertEqual(report["duration_seconds"], 2)
        self.assertGreater(report["requests"], 0)
        self.assertLess(report["requests"], 2 * 1000000000)
        self.assertLessEqual(report["requests_cut"], 2)  # at most the one in flight per session
        self.assertEqual(report["requests"], report["requests_ok"] + report["requests_cut"])
        self.assertEqual(report["errors_total"], 0)
        self.assertGreaterEqual(report["wall_seconds"], 1.5)
        self.assertLess(report["wall_seconds"], 5)
        self.assertGreaterEqual(report["generated_tokens"], 64 * report["requests_ok"])
        self.assertNoSessions()  # sessions of cut calls are deleted too

    def test_duration_cuts_calls_in_flight(self):
        # Calls of 10^6 tokens each, against a server that allows them: at the
        # tiny model's tens of thousands of tokens/s in all (4 x 4096 tokens
        # once fitted in 0.5 s), every call is still running at 0.5 s and gets
        # cut by its deadline.
        server = txl_procs.Server(ARGS.bin_dir, self.model, "--max_new_tokens", "1000000")
        try:
            r, report = self.bench("--sessions", "4", "--turns", "3", "--input-tokens", "4", "--new-tokens",
                                   "1000000", "--duration", "0.5", address=server.address)
        finally:
            server.stop()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(report["stopped_by"], "duration")
        self.assertEqual((report["requests"], report["requests_ok"], report["requests_cut"]), (4, 0, 4))
        self.assertLess(report["wall_seconds"], 2)
        self.assertGreater(report["generated_tokens"], 0)
        self.assertLess(report["generated_tokens"], 4 * 1000000)
        self.assertEqual(report["errors_total"], 0)
        self.assertNoSessions()  # deleted once the server has let go of the cut calls

    def test_server_errors_are_counted_by_status_code(self):
        # Past the server's limit on max_new_tokens (4096): every Generate fails,
        # the session goes on with its next turn and is still deleted.
        r, report = self.bench("--sessions", "2", "--turns", "3", "--input-tokens", "4", "--new-tokens", "5000")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(report["requests"], 6)
        self.assertEqual(report["requests_ok"], 0)
        self.assertEqual(report["errors"], {"INVALID_ARGUMENT": 6})
        self.assertEqual(report["errors_total"], 6)
        self.assertIn("max_new_tokens", report["error_examples"]["INVALID_ARGUMENT"])
        self.assertEqual(report["time_to_first_token_ms"], {"count": 0, "p50": None, "p95": None, "p99": None})
        self.assertRegex(r.stdout, r"INVALID_ARGUMENT +6 +e\.g\. Generate: max_new_tokens")
        self.assertNoSessions()

    def test_session_limit_is_resource_exhausted(self):
        with txl_procs.Server(ARGS.bin_dir, self.model, "--max_sessions", "2") as server:
            address = server.address
            r, report = self.bench("--sessions", "4", "--turns", "2", "--input-tokens", "4", "--new-tokens", "3",
                                   address=address)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            # All four creations are answered before any session is deleted.
            self.assertEqual(report["sessions_created"], 2)
            self.assertEqual(report["errors"], {"RESOURCE_EXHAUSTED": 2})
            self.assertIn("CreateSession", report["error_examples"]["RESOURCE_EXHAUSTED"])
            self.assertEqual(report["requests"], 2 * 2)
            self.assertEqual(report["requests_ok"], 2 * 2)
            self.assertEqual(report["generated_tokens"], 2 * 2 * 3)
            self.assertNoSessions(address)

    def test_unreachable_server_exits_1(self):
        r = self.client("bench", "--sessions", "1", address="127.0.0.1:1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)

    def test_bad_flags_exit_2_naming_the_flag(self):
        cases = [
            (["--sessions", "0"], "--sessions"),
            (["--sessions", "100000"], "--sessions"),
            (["--turns", "-1"], "--turns"),
            (["--input-tokens", "x"], "--input-tokens"),
            (["--new-tokens=0"], "--new-tokens"),
            (["--duration", "0"], "--duration"),
            (["--duration", "soon"], "--duration"),
            (["--turns"], "--turns"),
            (["--json", os.path.join(self.tmp.name, "no", "such", "dir.json")], "--json"),
            (["--frobnicate", "1"], "--frobnicate"),
            (["stray"], "stray"),
        ]
        for args, named in cases:
            with self.subTest(args=args):
                r = self.client("bench", *args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(named, r.stderr)
                self.assertEqual(r.stdout, "")  # nothing ran
        self.assertNoSessions()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

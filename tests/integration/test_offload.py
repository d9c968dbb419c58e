"""Session offload (--session_memory_budget with --host_memory_budget and --state_dir) against a real
txl-server on loopback (tiny model).

The server's device budget holds the full windows of 3 sessions and its host budget about 3
offloaded ones; 30 sessions (10x the device budget) are created, each with a distinct prompt and a
greedy turn, then driven round-robin for 3 rounds (a greedy turn on session i, then a
Score(commit=false) probe of session i-2, which least-recently-used offload has just moved to host
memory). Every turn and probe equals a control server's without budgets (same tokens, logprobs
within 1e-4). The metrics show offloads to host and to the store and restores from both (at least
one restore per session per round), sessions by tier with at most 3 + 1 in device memory, and the
host tier within its budget. Then 6 clients drive 5 sessions each concurrently, 2 turns each, again
equal to the control's.

With --repository the budgeted server serves the model as a repository of one: on the generic
path its session pools then count against the device budget (SharedSlotPools::Limit), which
offload lets the running sessions pass.

Run by CTest: /usr/bin/python3 test_offload.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import concurrent.futures
import os
import re
import shutil
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

TOL = 1e-4
SESSIONS, ROUNDS, DEVICE_SESSIONS, HOST_SESSIONS = 30, 3, 3, 3
NEW_TOKENS = 24          # prompt + 24 tokens > the default window (32): every session's window is full
CONCURRENCY = 6
PROBE_BACK = 2           # the probe's session, counted back from the turn's
PROBE = [ord(c) for c in " a probe, never committed"]


def metrics(address):
    """{(name, frozenset(labels)): value} from the Prometheus text format."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if m and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(values, name, **labels):
    return values.get((name, frozenset(labels.items())), 0.0)


class Node:
    def __init__(self, server):
        self.server = server
        self.channel = grpc.insecure_channel(server.address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    def close(self):
        self.channel.close()
        return self.server.stop()

    def create(self, sid):
        return self.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=sid), timeout=30).session_id

    def get(self, sid):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30)

    def turn(self, sid, text):
        req = txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text=text), max_new_tokens=NEW_TOKENS,
                                      sampling=txl_pb2.SamplingParams(temperature=0))
        got, position = [], None
        for r in self.stub.Generate(req, timeout=60):
            got += [(t.id, t.logprob) for t in r.tokens]
            position = r.position
        return got, position

    def probe(self, sid):
        r = self.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=PROBE)),
                                                 commit=False), timeout=60)
        return [(t.id, t.logprob) for t in r.tokens], r.position


class OffloadTest(unittest.TestCase):
    def assert_equal_to_control(self, got, want, what):
        self.assertEqual([i for i, _ in got[0]], [i for i, _ in want[0]], f"{what}: tokens differ from control")
        for k, ((_, a), (_, b)) in enumerate(zip(got[0], want[0])):
            self.assertLess(abs(a - b), TOL, f"{what}: token {k} logprob {a} vs control {b}")
        self.assertEqual(got[1], want[1], f"{what}: position differs from control")

    def test_sessions_beyond_the_budgets(self):
        with tempfile.TemporaryDirectory(prefix="txl_offload_") as tmp:
            model = txl_procs.tiny_model(ARGS.bin_dir, tmp)
            control = Node(txl_procs.Server(ARGS.bin_dir, model))
            try:
                self.run_sessions(model, tmp, control)
            finally:
                control.close()

    def run_sessions(self, model, tmp, control):
        # A full window's bytes, from the control (no budgets): what the device budget counts.
        probe_sid = control.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=30).session_id
        control.turn(probe_sid, "measuring the window: " + "x" * 40)
        info = control.get(probe_sid)
        self.assertEqual(info.memory_tokens, info.mem_len - 1, "the measuring session's window is not full")
        window = info.memory_bytes
        control.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=probe_sid), timeout=30)
        # An offloaded session takes about its window's bytes (plus a small header) in host memory.
        device_budget, host_budget = DEVICE_SESSIONS * window, HOST_SESSIONS * (window + 256)
        print(f"window {window} bytes: device budget {device_budget}, host budget {host_budget}", file=sys.stderr)

        flags = ["--state_dir", os.path.join(tmp, "state"), "--session_memory_budget", str(device_budget),
                 "--host_memory_budget", str(host_budget)]
        if ARGS.repository:
            # The same model as a repository of one: its session pools then count against the
            # session memory budget (SharedSlotPools::Limit), which offload lets sessions pass.
            version = os.path.join(tmp, "repository", "tiny", "1")
            os.makedirs(version)
            shutil.copy(model, os.path.join(version, "model.pt"))
            server = txl_procs.Server.from_argv(txl_procs.Server.test_argv(
                [os.path.join(ARGS.bin_dir, "server", "txl-server"), "--model_repository", os.path.dirname(
                    os.path.dirname(version)), "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
                 "--http_listen", "", *flags]))
        else:
            server = txl_procs.Server(ARGS.bin_dir, model, *flags, metrics=True)
        node = Node(server)
        try:
            sids = [f"{i + 1:02x}" * 16 for i in range(SESSIONS)]
            for i, sid in enumerate(sids):
                self.assertEqual(node.create(sid), sid, f"session {i}: created beyond the device budget")
                self.assertEqual(control.create(sid), sid)
                text = f"Session number {i} says: {'abcdefghij'[i % 10] * (i % 7 + 1)}."
                self.assert_equal_to_control(node.turn(sid, text), control.turn(sid, text), f"session {i} turn 0")

            for r in range(ROUNDS):
                for i, sid in enumerate(sids):
                    text = f" Round {r + 1}, session {i}:"
                    self.assert_equal_to_control(node.turn(sid, text), control.turn(sid, text),
                                                 f"round {r + 1}, session {i} turn")
                    back = sids[(i - PROBE_BACK) % SESSIONS]
                    self.assert_equal_to_control(node.probe(back), control.probe(back),
                                                 f"round {r + 1}, probe of session {(i - PROBE_BACK) % SESSIONS}")

            for i, sid in enumerate(sids):  # GetSession of a session out of device memory
                self.assertEqual(node.get(sid).position, control.get(sid).position, f"session {i}: position")

            # The tier gauges are set once a second: wait (bounded) for a tick that sees all 30.
            deadline = time.monotonic() + 30
            while True:
                values = metrics(node.server.metrics_address)
                tiers = {t: metric(values, "txl_sessions_by_tier", tier=t) for t in ("device", "host", "store")}
                if sum(tiers.values()) == SESSIONS:
                    break
                self.assertLess(time.monotonic(), deadline, f"sessions by tier never add up to {SESSIONS}: {tiers}")
                time.sleep(0.2)  # polling for the metrics tick
            offloads = {t: metric(values, "txl_session_offloads_total", to=t) for t in ("host", "store")}
            restores = {f: metric(values, "txl_session_restores_total", **{"from": f}) for f in ("host", "store")}
            restore_count = {f: metric(values, "txl_session_restore_seconds_count", **{"from": f})
                             for f in ("host", "store")}
            print(f"tiers {tiers}, offloads {offloads}, restores {restores}", file=sys.stderr)
            self.assertGreater(offloads["host"], 0, "no session was offloaded to host memory")
            self.assertGreater(offloads["store"], 0, "no session was dropped to the state store")
            self.assertGreater(restores["host"], 0, "no session was restored from host memory")
            self.assertGreater(restores["store"], 0, "no session was restored from the state store")
            self.assertGreaterEqual(restores["host"] + restores["store"], ROUNDS * SESSIONS,
                                    "fewer restores than turns on sessions that cannot all fit")
            self.assertEqual(restore_count, restores, "txl_session_restore_seconds counts differ from the restores")
            self.assertLessEqual(tiers["device"], DEVICE_SESSIONS + 1, f"too many sessions in device memory: {tiers}")
            self.assertGreater(tiers["store"], 0, tiers)
            host_bytes = metric(values, "txl_session_host_bytes")
            self.assertLessEqual(host_bytes, host_budget, "host memory over --host_memory_budget")
            self.assertLessEqual(metric(values, "txl_session_memory_reserved_bytes"),
                                 (DEVICE_SESSIONS + 1) * window, "device memory far over the budget")

            # Concurrent turns: sessions busy on the engine cannot be offloaded, the rest still are,
            # and each session's turns come out the same whatever runs beside them.
            def drive(group):
                out = []
                for k in range(2):
                    for sid in group:
                        out.append((sid, k, node.turn(sid, f" Together {k}.")))
                return out

            groups = [sids[g::CONCURRENCY] for g in range(CONCURRENCY)]
            with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
                results = [x for part in pool.map(drive, groups) for x in part]
            for group in groups:  # the control, one at a time, in each group's order
                for k in range(2):
                    for sid in group:
                        want = control.turn(sid, f" Together {k}.")
                        got = next(g for s2, k2, g in results if s2 == sid and k2 == k)
                        self.assert_equal_to_control(got, want, f"concurrent turn {k} of session {sids.index(sid)}")
            after = metrics(node.server.metrics_address)
            self.assertGreater(metric(after, "txl_session_restores_total", **{"from": "store"}), restores["store"])
        finally:
            code = node.close()
        self.assertEqual(code, 0, node.server.output)
        self.assertNotIn("quarantined", node.server.output)


def main():
    txl_procs.run_stub_tests(globals(), __doc__, [("--repository", dict(
        action="store_true", help="serve the model as a repository of one (--model_repository)"))])


if __name__ == "__main__":
    main()

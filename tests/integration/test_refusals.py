"""A session changes only by what its client was told was done (issue 13): every refusal path
against a real txl-server (tiny model) with a state directory.

For each path, a session S with some history is measured before and after the refused request:
its position, Score(commit=false) of a probe (ids and logprobs, exactly), its exported bytes, and
the bytes of its journal files (DIR/sessions/S/*). All four must be identical. The paths:
  queue full, draining, state store failure (a full tmpfs and an immutable directory), busy,
  invalid argument, deadline, cancel, and the memory budget.

Then what a store failure must do beyond a refusal (docs/ROBUSTNESS.md, "When the state store
fails"): a stream cut by a full disk ends UNAVAILABLE and the session keeps exactly what the
client was told, also after kill -9; a CreateSession refused on a full disk leaves its id free; a
DeleteSession refused by an unwritable directory leaves the session, also after a restart; once
the store takes writes again, the session takes requests again.

Needs root (mount, chattr), which CI has. Run by CTest:
/usr/bin/python3 test_refusals.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

PROBE = [ord(c) for c in " a probe, scored and never committed"]
HISTORY = [10, 11, 12, 13]
LONG = 1000000  # tokens a throw-away generation asks for: it runs until cancelled


def tokens(ids):
    return txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=ids))


class Node:
    def __init__(self, tmp, *flags, metrics=False):
        self.flags = flags
        self.server = txl_procs.Server(ARGS.bin_dir, ARGS.model, "--max_new_tokens", str(LONG), *flags,
                                       metrics=metrics)
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    def close(self, kill=False):
        if kill:
            self.server.proc.kill()
        code = self.server.stop(check=False)
        self.channel.close()
        return code

    def create(self, sid):
        self.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=sid), timeout=30)
        r = self.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=tokens(HISTORY), commit=True), timeout=30)
        assert r.position == len(HISTORY)
        return sid

    def measure(self, sid, state_dir=None):
        """(position, probe scores, export bytes, journal files) of session `sid`."""
        position = self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).position
        probe = self.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=tokens(PROBE), commit=False), timeout=30)
        scores = [(t.id, t.has_logprob, t.logprob) for t in probe.tokens]
        exported = b"".join(c.data for c in self.stub.ExportSession(
            txl_pb2.ExportSessionRequest(session_id=sid), timeout=30))
        return position, scores, exported, journal_files(state_dir, sid)

    def throwaway(self):
        """A generation on a throw-away session that runs until cancelled; returns (call, first token
        seen: an Event)."""
        call = self.stub.Generate(txl_pb2.GenerateRequest(input=tokens([1, 2]), max_new_tokens=LONG), timeout=300)
        started = threading.Event()

        def drain():
            try:
                for _ in call:
                    started.set()
            except grpc.RpcError:
                pass
            started.set()
        threading.Thread(target=drain, daemon=True).start()
        return call, started

    def metric(self, name):
        body = urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address, timeout=10).read().decode()
        m = re.search(r"^%s(?:\{\})? (\S+)$" % re.escape(name), body, re.M)
        return float(m.group(1)) if m else None


def journal_files(state_dir, sid):
    if state_dir is None:
        return None
    d = os.path.join(state_dir, "sessions", sid)
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    # The holder's fencing token is new at every claim (a restart claims again): its replica is what
    # must not change.
    if "holder" in out:
        out["holder"] = out["holder"].split(b"#")[0]
    return out


def greedy(sid, ids, n):
    req = txl_pb2.GenerateRequest(session_id=sid, max_new_tokens=n, sampling=txl_pb2.SamplingParams(temperature=0))
    req.input.tokens.ids.extend(ids)
    return req


class RefusalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_refusals_")
        cls.ids = (f"{i:02x}" * 16 for i in range(0x10, 0x100))
        cls.mounts = []

    @classmethod
    def tearDownClass(cls):
        for m in cls.mounts:
            subprocess.run(["chattr", "-R", "-i", m], capture_output=True)
            subprocess.run(["umount", "-l", m], capture_output=True)
        subprocess.run(["chattr", "-R", "-i", cls.tmp.name], capture_output=True)
        cls.tmp.cleanup()

    def setUp(self):
        self.nodes = []

    def tearDown(self):
        for node in self.nodes:
            node.close(kill=True)

    def node(self, *flags, metrics=False):
        n = Node(self.tmp.name, *flags, metrics=metrics)
        self.nodes.append(n)
        return n

    def state_dir(self, name):
        d = os.path.join(self.tmp.name, name)
        os.makedirs(d, exist_ok=True)
        return d

    def tmpfs(self, name, size="1m"):
        d = self.state_dir(name)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, "mount a tmpfs (this test needs root): " + r.stderr)
        self.mounts.append(d)
        return d

    def assertRefused(self, code, fn):
        with self.assertRaises(grpc.RpcError) as cm:
            fn()
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        return cm.exception

    def assertUnchanged(self, before, after, path):
        self.assertEqual(after[0], before[0], f"{path}: the position changed")
        self.assertEqual(after[1], before[1], f"{path}: Score of the probe changed")
        self.assertEqual(after[2], before[2], f"{path}: the exported session changed")
        self.assertEqual(after[3], before[3], f"{path}: the journal changed")

    # ---- the refusal paths ----

    def test_queue_full(self):
        d = self.state_dir("queue")
        n = self.node("--state_dir", d, "--max_batch", "1", "--max_queue", "1", metrics=True)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        running, started = n.throwaway()
        self.assertTrue(started.wait(60))
        queued, _ = n.throwaway()
        deadline = time.time() + 30
        while n.metric("txl_queue_depth") != 1 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(n.metric("txl_queue_depth"), 1)
        for req in (greedy(s, [], 3), greedy(s, [20], 3)):
            err = self.assertRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: list(n.stub.Generate(req, timeout=30)))
            self.assertIn("max_queue=1", err.details())
        self.assertRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: n.stub.Score(
            txl_pb2.ScoreRequest(session_id=s, input=tokens([5]), commit=True), timeout=30))
        queued.cancel()
        running.cancel()
        deadline = time.time() + 30
        while n.metric("txl_queue_depth") != 0 and time.time() < deadline:
            time.sleep(0.01)
        self.assertUnchanged(before, n.measure(s, d), "queue full")
        # Regression (issue 13, 1): the session goes on from its last token, not the one before.
        got = [t.id for r in n.stub.Generate(greedy(s, [], 3), timeout=30) for t in r.tokens]
        self.assertEqual(len(got), 3)

    def test_draining(self):
        d = self.state_dir("drain")
        flags = ("--state_dir", d, "--max_batch", "1", "--drain_timeout", "60")
        n = self.node(*flags)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        running, started = n.throwaway()
        self.assertTrue(started.wait(60))
        n.server.proc.send_signal(15)  # SIGTERM: the server drains while `running` goes on
        while True:  # server/serve.cc says "draining" once it refuses new work
            line = n.server.proc.stdout.readline()
            self.assertTrue(line, "the server exited before draining")
            n.server.lines.append(line)
            if "draining" in line:
                break
        for req in (greedy(s, [], 3), greedy(s, [20], 3)):
            err = self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: list(n.stub.Generate(req, timeout=30)))
            self.assertIn("shutting down", err.details())
        self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.Score(
            txl_pb2.ScoreRequest(session_id=s, input=tokens([5]), commit=True), timeout=30))
        self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.CreateSession(
            txl_pb2.CreateSessionRequest(), timeout=30))
        self.assertEqual(n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).position, before[0])
        self.assertEqual(journal_files(d, s), before[3], "draining: the journal changed")
        running.cancel()
        self.assertEqual(n.close(), 0, n.server.output)
        self.nodes.remove(n)
        # A graceful stop snapshots S (its journal files change form); what they hold does not.
        after = self.node(*flags).measure(s, d)
        self.assertUnchanged(before[:3] + (None,), after[:3] + (None,), "draining, after the restart")

    def test_busy(self):
        d = self.state_dir("busy")
        n = self.node("--state_dir", d)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        # A long Score without commit holds S busy and changes nothing.
        holder = n.stub.Score.future(txl_pb2.ScoreRequest(session_id=s, input=tokens([7] * 60000), commit=False),
                                     timeout=120)
        deadline = time.time() + 30
        while not n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).busy:
            self.assertLess(time.time(), deadline, "the Score never held the session")
        err = self.assertRefused(grpc.StatusCode.ABORTED, lambda: list(n.stub.Generate(greedy(s, [1], 3), timeout=30)))
        self.assertIn("busy", err.details())
        self.assertRefused(grpc.StatusCode.ABORTED, lambda: n.stub.Score(
            txl_pb2.ScoreRequest(session_id=s, input=tokens([5]), commit=True), timeout=30))
        self.assertRefused(grpc.StatusCode.ABORTED, lambda: n.stub.DeleteSession(
            txl_pb2.DeleteSessionRequest(session_id=s), timeout=30))
        holder.result()
        self.assertUnchanged(before, n.measure(s, d), "busy")

    def test_invalid_argument(self):
        d = self.state_dir("invalid")
        n = self.node("--state_dir", d)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        bad = [
            txl_pb2.GenerateRequest(session_id=s, input=tokens([1 << 20]), max_new_tokens=3),
            txl_pb2.GenerateRequest(session_id=s, input=tokens([1]), max_new_tokens=3,
                                    sampling=txl_pb2.SamplingParams(temperature=-1)),
            txl_pb2.GenerateRequest(session_id=s, input=tokens([1]), max_new_tokens=-5),
            txl_pb2.GenerateRequest(session_id=s, input=tokens([1]), max_new_tokens=3,
                                    sampling=txl_pb2.SamplingParams(top_p=7)),
        ]
        for req in bad:
            self.assertRefused(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(n.stub.Generate(req, timeout=30)))
        self.assertRefused(grpc.StatusCode.INVALID_ARGUMENT, lambda: n.stub.Score(
            txl_pb2.ScoreRequest(session_id=s, input=tokens([-1]), commit=True), timeout=30))
        self.assertUnchanged(before, n.measure(s, d), "invalid argument")

    def queued_behind_a_generation(self, n, s, fn):
        """Runs fn while S's request must wait in the queue behind a throw-away generation (max_batch 1)."""
        running, started = n.throwaway()
        self.assertTrue(started.wait(60))
        try:
            fn()
        finally:
            running.cancel()

    def test_deadline(self):
        d = self.state_dir("deadline")
        n = self.node("--state_dir", d, "--max_batch", "1")
        s = n.create(next(self.ids))
        before = n.measure(s, d)

        def idle():  # an expired request leaves the queue at once: S is not kept busy behind the generation
            deadline = time.time() + 10
            while n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).busy:
                self.assertLess(time.time(), deadline, "S stayed busy after its request's deadline")
                time.sleep(0.01)

        def expire():
            self.assertRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                               lambda: list(n.stub.Generate(greedy(s, [3, 4], 5), timeout=0.3)))
            idle()
            self.assertRefused(grpc.StatusCode.DEADLINE_EXCEEDED, lambda: n.stub.Score(
                txl_pb2.ScoreRequest(session_id=s, input=tokens([5, 6]), commit=True), timeout=0.3))
            idle()
        self.queued_behind_a_generation(n, s, expire)
        self.assertUnchanged(before, n.measure(s, d), "deadline")

    def test_cancel(self):
        d = self.state_dir("cancel")
        n = self.node("--state_dir", d, "--max_batch", "1")
        s = n.create(next(self.ids))
        before = n.measure(s, d)

        def cancel():
            call = n.stub.Generate(greedy(s, [3, 4], 5), timeout=60)
            score = n.stub.Score.future(txl_pb2.ScoreRequest(session_id="", input=tokens([1])), timeout=60)
            # Neither can run before the generation ends. Cancel S's only once the server holds it
            # (S busy): a cancel that overtakes the request would leave the server taking it later,
            # after the wait for S to be idle below (seen with grpcio 1.85 as the client).
            deadline = time.time() + 10
            while not n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).busy:
                self.assertLess(time.time(), deadline, "S's request never reached the server")
                time.sleep(0.01)
            call.cancel()
            self.assertRefused(grpc.StatusCode.CANCELLED, lambda: list(call))
            score.cancel()
            deadline = time.time() + 10
            while n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).busy:
                self.assertLess(time.time(), deadline, "S stayed busy after its request was cancelled")
                time.sleep(0.01)
        self.queued_behind_a_generation(n, s, cancel)
        self.assertUnchanged(before, n.measure(s, d), "cancel")

    def test_memory_budget(self):
        d = self.state_dir("budget")
        n = self.node("--state_dir", d, "--session_memory_budget", str(full_window_bytes(self)))  # room for one
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        for refused in (lambda: n.stub.ForkSession(txl_pb2.ForkSessionRequest(session_id=s), timeout=30),
                        lambda: n.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=30),
                        lambda: list(n.stub.Generate(txl_pb2.GenerateRequest(input=tokens([1]), max_new_tokens=2),
                                                     timeout=30))):
            err = self.assertRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            self.assertIn("budget", err.details())
        self.assertUnchanged(before, n.measure(s, d), "memory budget")


    # ---- the state store fails ----

    def fill(self, d):
        """Fills the tmpfs at d to the brim; returns the filler's path."""
        path = os.path.join(d, "filler%d" % len(os.listdir(d)))
        try:
            with open(path, "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        return path

    def unfill(self, d):
        for name in os.listdir(d):
            if name.startswith("filler"):
                os.unlink(os.path.join(d, name))

    def wait_writable(self, n, s):
        """Commits one token to s once the store takes writes again; returns the new position."""
        deadline = time.time() + 60
        while True:
            try:
                return n.stub.Score(txl_pb2.ScoreRequest(session_id=s, input=tokens([5]), commit=True),
                                    timeout=30).position
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                self.assertLess(time.time(), deadline, "the store never became writable again")
                time.sleep(0.1)

    def test_state_store_full(self):
        d = self.tmpfs("full", "2m")
        flags = ("--state_dir", d, "--holder_timeout", "2", "--fsync", "always")
        n = self.node(*flags)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        self.fill(d)
        # 12 KB of log: more than the slack left in the log file's last page (a few tokens still fit
        # there, and are then written and acknowledged, as they should be).
        err = self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.Score(
            txl_pb2.ScoreRequest(session_id=s, input=tokens([1, 2] * 1500), commit=True), timeout=30))
        self.assertIn("state store", err.details())
        for _ in range(2):  # the second is refused before it runs: read-only
            self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: list(n.stub.Generate(greedy(s, [3], 4), timeout=30)))
        spare = next(self.ids)
        self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.CreateSession(
            txl_pb2.CreateSessionRequest(session_id=spare), timeout=30))
        self.assertUnchanged(before, n.measure(s, d), "a full state store")
        self.unfill(d)
        self.assertEqual(self.wait_writable(n, s), before[0] + 1)
        # The refused create left its id free.
        n.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=spare), timeout=30)

        # Mid-stream: the disk fills while S streams. The stream ends UNAVAILABLE and S keeps exactly
        # what the client was told, here and after kill -9.
        told, tokens_seen = None, 0
        call = n.stub.Generate(greedy(s, [7], LONG), timeout=120)
        with self.assertRaises(grpc.RpcError) as cm:
            for r in call:
                if r.tokens:
                    told = r.position
                    tokens_seen += len(r.tokens)
                    if tokens_seen == 20:
                        self.fill(d)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        self.assertGreaterEqual(tokens_seen, 20)
        self.assertEqual(n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=s), timeout=30).position, told)
        mid = n.measure(s, d)
        self.unfill(d)
        n.close(kill=True)
        self.nodes.remove(n)
        n = self.node(*flags)
        after = n.measure(s, d)
        self.assertEqual(after[0], told, "after kill -9: not the position the client was told")
        self.assertEqual(after[1], mid[1], "after kill -9: Score of the probe differs")
        # (Its export bytes may differ: a state rebuilt by replaying the log lays its memory ring out
        # afresh. What it computes may not, and the probe checks that exactly.)

    def test_state_store_unwritable(self):
        d = self.state_dir("immutable")
        flags = ("--state_dir", d, "--holder_timeout", "2")
        n = self.node(*flags)
        s = n.create(next(self.ids))
        before = n.measure(s, d)
        r = subprocess.run(["chattr", "-R", "+i", d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, "chattr +i (this test needs root): " + r.stderr)
        try:
            self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.Score(
                txl_pb2.ScoreRequest(session_id=s, input=tokens([1, 2]), commit=True), timeout=30))
            self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: list(n.stub.Generate(greedy(s, [3], 4), timeout=30)))
            self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.DeleteSession(
                txl_pb2.DeleteSessionRequest(session_id=s), timeout=30))
            self.assertRefused(grpc.StatusCode.UNAVAILABLE, lambda: n.stub.ForkSession(
                txl_pb2.ForkSessionRequest(session_id=s), timeout=30))
            self.assertUnchanged(before, n.measure(s, d), "an unwritable state directory")
        finally:
            subprocess.run(["chattr", "-R", "-i", d], check=True)
        n.close(kill=True)
        self.nodes.remove(n)
        n = self.node(*flags)  # the refused delete did not happen, here or in the store
        self.assertUnchanged(before, n.measure(s, d), "an unwritable state directory, after kill -9")
        self.assertEqual(self.wait_writable(n, s), before[0] + 1)

    # ---- smaller promises ----

    def test_quarantined_session_answers_data_loss_once(self):
        d = self.state_dir("quarantine")
        n = self.node("--state_dir", d)
        s = n.create(next(self.ids))
        self.assertEqual(n.close(), 0)
        self.nodes.remove(n)
        snap = os.path.join(d, "sessions", s, "snap")
        with open(snap, "r+b") as f:
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0x5A
            f.seek(0)
            f.write(data)
        n = self.node("--state_dir", d)
        err = self.assertRefused(grpc.StatusCode.DATA_LOSS, lambda: n.stub.GetSession(
            txl_pb2.GetSessionRequest(session_id=s), timeout=30))
        self.assertIn("quarantined", err.details())
        self.assertRefused(grpc.StatusCode.NOT_FOUND, lambda: n.stub.GetSession(
            txl_pb2.GetSessionRequest(session_id=s), timeout=30))

    def test_error_messages_echo_a_short_id(self):
        n = self.node()
        long_id = "x" * 7000 + "\u00e9"
        err = self.assertRefused(grpc.StatusCode.NOT_FOUND, lambda: n.stub.GetSession(
            txl_pb2.GetSessionRequest(session_id=long_id), timeout=30))
        self.assertLess(len(err.details()), 200, err.details()[:300])
        self.assertIn("7001 bytes", err.details().replace("7002", "7001"))
        err = self.assertRefused(grpc.StatusCode.NOT_FOUND, lambda: n.stub.DeleteSession(
            txl_pb2.DeleteSessionRequest(), metadata=[("txl-session-id", "y" * 7000)], timeout=30))
        self.assertLess(len(err.details()), 200, err.details()[:300])


def full_window_bytes(test):
    """The reserved bytes of one session of the default window, read from a server's metrics."""
    n = test.node("--max_sessions", "4", metrics=True)
    n.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=30)
    deadline = time.time() + 10  # the gauge is refreshed about once a second
    while not n.metric("txl_session_memory_reserved_bytes") and time.time() < deadline:
        time.sleep(0.05)
    value = n.metric("txl_session_memory_reserved_bytes")
    test.assertTrue(value and value > 0, "no txl_session_memory_reserved_bytes")
    n.close()
    test.nodes.remove(n)
    return int(value)


def main():
    parser_args = [("--model", dict(default=None, help="a model (default: a tiny one made with txl-init)"))]

    def run():
        txl_procs.run_stub_tests(globals(), __doc__, parser_args)
    # The model is made once, before the tests, in main's own temp directory.
    tmp = tempfile.mkdtemp(prefix="txl_refusals_model_")
    try:
        bin_dir = sys.argv[sys.argv.index("--bin-dir") + 1]
        if "--model" not in sys.argv:
            sys.argv += ["--model", txl_procs.tiny_model(bin_dir, tmp)]
        run()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Durable sessions (--state_dir) against a real txl-server on loopback (tiny model, byte tokenizer).

a) kill -9 loop: a session on a server with --state_dir --fsync always --snapshot_tokens 50 is
   killed (SIGKILL) again and again in the middle of a greedy Generate stream, at a random point
   (a random delay, or right as the k-th token arrives), and restarted with the same flags. After
   each restart its position is at least the last position the client was told, and its history is
   exactly what the client was told plus, possibly, more of the request that was in flight: a
   control server (no state dir) replays that request greedily up to the same position, after which
   Score(commit=false) of a probe and a greedy continuation agree with the control (ids equal,
   logprobs within 1e-4).
b) a crash in the middle of a snapshot write (a stale ".snap.tmp.*" beside the snap) and a torn
   last log record: the session recovers with its position and logprobs, and stays durable for the
   next crash.
c) damage: bytes flipped in a session's snap, or in the middle of its log records, are reported on
   stderr and the files quarantined (DIR/quarantine/...); requests for those sessions get DATA_LOSS
   or NOT_FOUND, the server keeps running, and the other sessions are unharmed.

Run by CTest: /usr/bin/python3 test_durability.py --bin-dir BUILD --stubs BUILD/client/python/gen
[--seed N] [--kills N]
"""
import glob
import os
import random
import struct
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

TOL = 1e-4
MAX_NEW = 40               # tokens per Generate in the kill loop
SNAPSHOT_TOKENS = 50
PROBE = [ord(c) for c in " the probe, scored but never committed."]
SEED_TEXT = [ord(c) for c in "A durable session begins here."]
# u32 n, i64 start, u64 checksum of those; then i32 tokens[n], u64 checksum of the record
LOG_HEADER = struct.calcsize("<IqQ")


def snapshot_position(data):
    """The position of a session export (docs/FORMATS.md, "Session export"): after the magic, version and
    fingerprint."""
    (n,) = struct.unpack_from("<I", data, 12)
    (position,) = struct.unpack_from("<q", data, 16 + n)
    return position


def log_records(data):
    """(offset, n, start) of each whole record of a session log (server/durability/session_journal.h)."""
    out, off = [], 0
    while off + LOG_HEADER <= len(data):
        n, start = struct.unpack_from("<Iq", data, off)
        if off + LOG_HEADER + 4 * n + 8 > len(data):
            break
        out.append((off, n, start))
        off += LOG_HEADER + 4 * n + 8
    return out


class Node:
    """A server and a stub on it."""

    live = []  # every Node started, for the test's cleanup

    def __init__(self, model, *flags):
        self.model, self.flags = model, flags
        self.server = txl_procs.Server(ARGS.bin_dir, model, *flags)
        Node.live.append(self)
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    @property
    def output(self):
        return self.server.output

    def kill(self):
        """SIGKILL; returns once the process is gone."""
        self.server.proc.kill()
        self.server.stop(check=False)
        self.channel.close()

    def stop(self):
        code = self.server.stop()
        self.channel.close()
        return code

    def restart(self):
        return Node(self.model, *self.flags)

    # ---- calls ----

    def create(self, sid):
        return self.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=sid), timeout=30).session_id

    def position(self, sid):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).position

    def score(self, sid, ids, commit):
        r = self.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=ids)),
                                                 commit=commit), timeout=60)
        return [(t.id, t.logprob if t.has_logprob else None) for t in r.tokens], r.position

    def generate(self, sid, ids, n):
        """Greedy; returns ([(id, logprob)], last position)."""
        got, position = [], None
        for r in self.stub.Generate(greedy_request(sid, ids, n), timeout=60):
            got += [(t.id, t.logprob) for t in r.tokens]
            position = r.position
        return got, position


def greedy_request(sid, ids, n):
    req = txl_pb2.GenerateRequest(session_id=sid, max_new_tokens=n, sampling=txl_pb2.SamplingParams(temperature=0))
    if ids:
        req.input.tokens.ids.extend(ids)
    return req


class DurabilityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_durability_")
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)
        cls.control = Node(cls.model)
        cls.ids = (f"{i:02x}" * 16 for i in range(0x10, 0x100))  # distinct explicit session ids

    def tearDown(self):
        # A failed test leaves its durable server running: SIGKILL it (it is durable, after all).
        for node in Node.live:
            if node is not self.control and node.server.proc.poll() is None:
                node.kill()
        Node.live = [self.control]

    @classmethod
    def tearDownClass(cls):
        cls.control.stop()
        cls.tmp.cleanup()

    def durable_flags(self, name):
        return ("--state_dir", os.path.join(self.tmp.name, name), "--replica_name", "r1", "--fsync", "always",
                "--snapshot_tokens", str(SNAPSHOT_TOKENS))

    def new_session(self, node):
        """A session of the same id on `node` and the control, both fed SEED_TEXT."""
        sid = next(self.ids)
        self.assertEqual(node.create(sid), sid)
        self.assertEqual(self.control.create(sid), sid)
        node.score(sid, SEED_TEXT, True)
        self.control.score(sid, SEED_TEXT, True)
        return sid

    def assert_tokens_close(self, got, want, what):
        self.assertEqual([i for i, _ in got], [i for i, _ in want], f"{what}: token ids differ")
        for k, ((_, a), (_, b)) in enumerate(zip(got, want)):
            if a is None or b is None:
                self.assertEqual(a, b, f"{what}: token {k} has a logprob on one side only")
            else:
                self.assertLess(abs(a - b), TOL, f"{what}: token {k} logprob {a} vs control {b}")

    def assert_same_as_control(self, node, sid, what, continue_tokens=10):
        """Same position, same probe logprobs, same greedy continuation (which both then keep)."""
        self.assertEqual(node.position(sid), self.control.position(sid), f"{what}: position differs from control")
        self.assert_tokens_close(node.score(sid, PROBE, False)[0], self.control.score(sid, PROBE, False)[0],
                                 f"{what}: Score(commit=false) of the probe")
        if continue_tokens:
            got, p1 = node.generate(sid, [], continue_tokens)
            want, p2 = self.control.generate(sid, [], continue_tokens)
            self.assert_tokens_close(got, want, f"{what}: greedy continuation")
            self.assertEqual(p1, p2, f"{what}: position after the continuation")

    def assert_clean_start(self, node, recovered):
        self.assertIn(f"as replica r1: {recovered} session(s) recovered", node.output)
        self.assertNotIn("quarantined", node.output)

    # ---- a) kill -9 loop ----

    def test_a_kill_loop(self):
        rng = random.Random(ARGS.seed)
        print(f"kill loop: seed {ARGS.seed}, {ARGS.kills} kills", file=sys.stderr)
        node = Node(self.model, *self.durable_flags("kill_loop"))
        sid = self.new_session(node)
        known = node.position(sid)  # the position both sides agree on
        # How long a whole turn takes here (on a scratch session), to aim some kills inside one.
        scratch = next(self.ids)
        node.create(scratch)
        node.score(scratch, SEED_TEXT, True)
        durations = []
        for _ in range(3):
            start = time.monotonic()
            node.generate(scratch, [ord("t")], MAX_NEW)
            durations.append(time.monotonic() - start)
        turn_seconds = sorted(durations)[1]
        node.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=scratch), timeout=30)
        print(f"kill loop: a turn of {MAX_NEW} tokens takes {turn_seconds * 1000:.1f} ms", file=sys.stderr)
        snap = os.path.join(self.tmp.name, "kill_loop", "sessions", sid, "snap")
        snap_versions = set()
        stats = {"before any token": 0, "mid-stream": 0, "after the last token": 0, "server ahead of client": 0}
        survived = 0
        for it in range(ARGS.kills):
            ids = [rng.randrange(32, 127) for _ in range(rng.randint(1, 4))]
            # The kill point: a random delay after the request is sent (0-150 ms, or within the time
            # a whole turn takes here), or right as the k-th token arrives (k = 0: at once).
            pick = rng.random()
            if pick < 1 / 3:
                mode, kill_after_tokens, delay = "delay", None, rng.uniform(0.0, 0.15)
            elif pick < 2 / 3:
                mode, kill_after_tokens, delay = "delay", None, rng.uniform(0.0, 1.2 * turn_seconds)
            else:
                mode, kill_after_tokens, delay = "tokens", rng.randint(0, MAX_NEW - 1), None
            seen, acked, finished, errors = [], [known], [False], []
            proc = node.server.proc

            def reader():
                try:
                    call = node.stub.Generate(greedy_request(sid, ids, MAX_NEW), timeout=60)
                    if kill_after_tokens == 0:
                        proc.kill()  # the request may not even have arrived
                    for r in call:
                        seen.extend((t.id, t.logprob) for t in r.tokens)
                        acked.append(r.position)
                        if r.finish_reason:
                            finished[0] = True
                        if kill_after_tokens is not None and len(seen) >= kill_after_tokens and proc.poll() is None:
                            proc.kill()  # as the k-th token arrives
                except grpc.RpcError as e:
                    errors.append(e)

            t = threading.Thread(target=reader)
            t.start()
            if mode == "delay":
                time.sleep(delay)  # the random kill point itself, not a wait for anything
                node.kill()
            t.join(timeout=60)
            self.assertFalse(t.is_alive(), f"kill {it}: the stream did not end after the server was killed")
            node.kill()  # reaps it (mode tokens: killed by the reader)
            for e in errors:
                self.assertIn(e.code(), (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                         grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN),
                              f"kill {it}: unexpected error {e.code()}: {e.details()}")
            if os.path.exists(snap):
                with open(snap, "rb") as f:
                    snap_versions.add(hash(f.read()))

            node = node.restart()
            self.assert_clean_start(node, 1)
            last_acked = max(acked)
            position = node.position(sid)
            what = (f"kill {it} (mode {mode}, {'delay %.3f s' % delay if delay is not None else 'after %d tokens' % kill_after_tokens}"
                    f", input {len(ids)} tokens, {len(seen)} tokens seen, last acknowledged position {last_acked})")
            stats["before any token" if not seen else "after the last token" if finished[0] else "mid-stream"] += 1
            stats["server ahead of client"] += position > last_acked
            self.assertGreaterEqual(position, last_acked, f"{what}: recovered position {position} < acknowledged")
            self.assertLessEqual(position, known + len(ids) + MAX_NEW, f"{what}: recovered position {position} "
                                 f"is past everything the request could add")
            if finished[0]:
                self.assertEqual(position, known + len(ids) + MAX_NEW, f"{what}: a finished turn is incomplete")

            # The control catches up: the durable history is the known one, then a prefix of
            # (input, greedy tokens); replaying the same greedy request up to that length rebuilds it.
            delta = position - known
            if 0 < delta <= len(ids):
                self.assertEqual(seen, [], f"{what}: tokens were seen but the input is not all recorded")
                self.control.score(sid, ids[:delta], True)
            elif delta > len(ids):
                replay, p = self.control.generate(sid, ids, delta - len(ids))
                self.assertEqual(p, position)
                self.assertLessEqual(len(seen), len(replay), what)
                self.assert_tokens_close(seen, replay[:len(seen)], f"{what}: the tokens streamed before the kill")
            self.assert_same_as_control(node, sid, what)
            # The continuation (10 tokens) plus the next turn (41 to 44) cross --snapshot_tokens even
            # when the count of logged tokens restarts with the process: some kills land on snapshots.
            known = position + 10
            survived += 1
            print(f"kill {it}: {mode} {delay if delay is not None else kill_after_tokens}: seen {len(seen)}, "
                  f"acknowledged {last_acked}, recovered {position}", file=sys.stderr)

        self.assertGreater(len(snap_versions), 2, "no snapshot was written during the loop (--snapshot_tokens 50)")
        self.assertEqual(node.stop(), 0, node.output)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "kill_loop", "quarantine")))
        print(f"kill loop: survived {survived} kills (seed {ARGS.seed}; {stats}; "
              f"{len(snap_versions)} snapshot versions seen)", file=sys.stderr)

    def test_a2_log_folded_across_restarts(self):
        """--snapshot_tokens counts the tokens in the log, also those logged before a restart: a session
        whose server crashes between snapshots still gets a snapshot, instead of replaying an ever
        longer log. (The log itself keeps the whole history, for rewinds: what a recovery replays is
        the part after the snapshot.)"""
        state_dir = os.path.join(self.tmp.name, "fold")
        node = Node(self.model, *self.durable_flags("fold"))
        sid = self.new_session(node)  # SEED_TEXT: 30 tokens logged
        turn = 30
        for _ in range(4):
            node.generate(sid, [ord("f")], turn)  # turn + 1 tokens logged, acknowledged
            node.kill()
            node = node.restart()
            self.assert_clean_start(node, 1)
        with open(os.path.join(state_dir, "sessions", sid, "log"), "rb") as f:
            records = log_records(f.read())
        with open(os.path.join(state_dir, "sessions", sid, "snap"), "rb") as f:
            snapshot = snapshot_position(f.read())
        end = max(start + n for _, n, start in records)
        self.assertEqual(end, 30 + 4 * (turn + 1), "the log holds the whole history")
        self.assertLess(end - snapshot, SNAPSHOT_TOKENS + turn + 1,
                        f"{end - snapshot} tokens to replay after 4 crashes: no snapshot was taken "
                        f"(--snapshot_tokens {SNAPSHOT_TOKENS}), the count of logged tokens restarting with "
                        f"each process")
        self.assertEqual(node.stop(), 0, node.output)

    # ---- b) a crash mid-snapshot and a torn log tail ----

    def crash_with_snapshot_and_log(self, name):
        """A session with a real snapshot and log records after it, and the server SIGKILLed."""
        node = Node(self.model, *self.durable_flags(name))
        sid = self.new_session(node)
        for n in (SNAPSHOT_TOKENS + 10, 15):  # the first turn crosses --snapshot_tokens; the second is logged
            got, _ = node.generate(sid, [ord("x")], n)
            want, _ = self.control.generate(sid, [ord("x")], n)
            self.assert_tokens_close(got, want, "setup turn")
        position = node.position(sid)
        node.kill()
        session_dir = os.path.join(self.tmp.name, name, "sessions", sid)
        with open(os.path.join(session_dir, "snap"), "rb") as f:
            snap = f.read()
        with open(os.path.join(session_dir, "log"), "rb") as f:
            log = f.read()
        self.assertGreater(len(snap), 1000, "the session has no real snapshot")
        self.assertGreaterEqual(len(log_records(log)), 10, "the session has no log records after its snapshot")
        return node, sid, position, session_dir, snap

    def torn_tail(self, position):
        """A 5-token record cut short after its header and two tokens: a write a crash interrupted."""
        header = struct.pack("<Iq", 5, position)
        return header + struct.pack("<Q", txl_procs.hash64(header)) + struct.pack("<ii", 65, 66)

    def test_b1_stale_temp_and_torn_log_tail(self):
        node, sid, position, session_dir, snap = self.crash_with_snapshot_and_log("torn")
        # A snapshot write of this replica (r1) cut short: server/durability/state_backend_dir.cc names it so.
        temp = os.path.join(session_dir, ".snap.tmp.r1.999999.0")
        with open(temp, "wb") as f:
            f.write(snap[:len(snap) // 2])
        with open(os.path.join(session_dir, "log"), "ab") as f:
            f.write(self.torn_tail(position))
        node = node.restart()
        self.assert_clean_start(node, 1)
        self.assertEqual(node.position(sid), position, "recovered position")
        self.assertFalse(os.path.exists(temp), "the stale temp file of the cut-short snapshot write was left behind")
        self.assert_same_as_control(node, sid, "after the torn tail", continue_tokens=10)
        self.assertEqual(node.stop(), 0, node.output)

    def test_b2_torn_log_tail_then_another_crash(self):
        """What the client is told after recovering from a torn tail survives the next crash too."""
        node, sid, position, session_dir, _ = self.crash_with_snapshot_and_log("torn_twice")
        with open(os.path.join(session_dir, "log"), "ab") as f:
            f.write(self.torn_tail(position))
        node = node.restart()
        self.assert_clean_start(node, 1)
        self.assert_same_as_control(node, sid, "after the torn tail", continue_tokens=10)  # acknowledged
        position = node.position(sid)
        node.kill()
        node = node.restart()
        self.assertNotIn("quarantined", node.output,
                         "tokens acknowledged after a torn tail was recovered were lost at the next crash")
        self.assert_clean_start(node, 1)
        self.assertEqual(node.position(sid), position, "position after the second crash")
        self.assert_same_as_control(node, sid, "after the second crash")
        self.assertEqual(node.stop(), 0, node.output)

    # ---- c) damage ----

    def assert_gone(self, node, sid, what, first_code=None):
        """GetSession, Score and Generate of `sid` fail with DATA_LOSS or NOT_FOUND (the first one,
        GetSession, with `first_code` if given)."""
        codes = (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND)
        calls = {
            "GetSession": lambda: node.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30),
            "Score": lambda: node.score(sid, PROBE, False),
            "Generate": lambda: node.generate(sid, [ord("a")], 3),
        }
        for name, call in calls.items():
            with self.assertRaises(grpc.RpcError, msg=f"{what}: {name} of a damaged session answered") as cm:
                call()
            self.assertIn(cm.exception.code(), (first_code,) if first_code else codes,
                          f"{what}: {name}: {cm.exception.details()}")
            first_code = None

    def assert_quarantined(self, node, state_dir, sid, part):
        self.assertRegex(node.output, rf"session {sid}: .*quarantined")
        found = glob.glob(os.path.join(state_dir, "quarantine", "sessions", sid, part + ".*"))
        self.assertTrue(found, f"no quarantined {part} of {sid} under {state_dir}/quarantine: "
                        f"{sorted(glob.glob(os.path.join(state_dir, 'quarantine', '**'), recursive=True))}")
        self.assertFalse(os.path.exists(os.path.join(state_dir, "sessions", sid, part)),
                         f"the damaged {part} of {sid} is still live state")

    def test_c1_damaged_snapshot_and_log(self):
        state_dir = os.path.join(self.tmp.name, "damage")
        node = Node(self.model, *self.durable_flags("damage"))
        snap_bad, log_bad, healthy, later = (self.new_session(node) for _ in range(4))
        for sid in (snap_bad, log_bad, healthy, later):
            node.generate(sid, [ord("q")], 20)
            self.control.generate(sid, [ord("q")], 20)
        self.assertEqual(node.stop(), 0, node.output)  # final snapshots: real snaps, empty logs
        node = node.restart()
        self.assert_clean_start(node, 4)
        for sid in (log_bad, healthy):  # log records after the snapshot
            node.generate(sid, [ord("r")], 12)
            self.control.generate(sid, [ord("r")], 12)
        node.kill()

        snap_path = os.path.join(state_dir, "sessions", snap_bad, "snap")
        with open(snap_path, "r+b") as f:
            data = bytearray(f.read())
            self.assertGreater(len(data), 1000)
            for k in range(len(data) // 2, len(data) // 2 + 4):
                data[k] ^= 0x5A
            f.seek(0)
            f.write(data)
        log_path = os.path.join(state_dir, "sessions", log_bad, "log")
        with open(log_path, "r+b") as f:
            data = bytearray(f.read())
            records = log_records(data)
            self.assertGreaterEqual(len(records), 5)
            off = records[len(records) // 2][0] + LOG_HEADER  # the first token of a record in the middle
            data[off] ^= 0x01
            f.seek(0)
            f.write(data)

        node = node.restart()  # starts: damage is reported, never fatal
        self.assertIn("as replica r1: 2 session(s) recovered", node.output)
        self.assert_quarantined(node, state_dir, snap_bad, "snap")
        self.assert_quarantined(node, state_dir, log_bad, "log")
        self.assert_gone(node, snap_bad, "damaged snap")
        self.assert_gone(node, log_bad, "damaged log")
        self.assert_same_as_control(node, healthy, "the healthy session beside the damaged ones")
        self.assertIsNone(node.server.proc.poll(), "the server exited")
        self.assertEqual(node.stop(), 0, node.output)

        # Damage found later, on a request (another replica adopts the sessions of r1, which is gone):
        # the request gets DATA_LOSS, the rest are adopted intact.
        snap_path = os.path.join(state_dir, "sessions", later, "snap")
        with open(snap_path, "r+b") as f:
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0xFF
            f.seek(0)
            f.write(data)
        flags = list(self.durable_flags("damage"))
        flags[flags.index("r1")] = "r2"
        node = Node(self.model, *flags)
        self.assertIn("as replica r2: 0 session(s) recovered", node.output)
        self.assert_gone(node, later, "damaged snap found on adoption", first_code=grpc.StatusCode.DATA_LOSS)
        self.assert_same_as_control(node, healthy, "the healthy session, adopted by r2")
        self.assertEqual(node.stop(), 0, node.output)
        self.assert_quarantined(node, state_dir, later, "snap")

    def test_c2_damaged_log_record_length(self):
        """A flipped bit in the length of a record in the middle of the log is damage, not a torn tail:
        the session is quarantined or recovered whole, never silently cut short."""
        state_dir = os.path.join(self.tmp.name, "damage_length")
        node = Node(self.model, *self.durable_flags("damage_length"))
        sid = self.new_session(node)
        node.generate(sid, [ord("z")], 12)
        self.control.generate(sid, [ord("z")], 12)
        position = node.position(sid)
        node.kill()
        log_path = os.path.join(state_dir, "sessions", sid, "log")
        with open(log_path, "r+b") as f:
            data = bytearray(f.read())
            records = log_records(data)
            self.assertGreaterEqual(len(records), 5)
            data[records[len(records) // 2][0] + 3] ^= 0x40  # the length's high byte
            f.seek(0)
            f.write(data)
        node = node.restart()
        try:
            got = node.position(sid)
        except grpc.RpcError as e:
            self.assertIn(e.code(), (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND), e.details())
            self.assert_quarantined(node, state_dir, sid, "log")
        else:
            self.assertEqual(got, position, f"the damaged log was replayed only in part, silently (acknowledged "
                             f"position {position}, recovered {got}); stderr:\n{node.output}")
            self.assert_same_as_control(node, sid, "recovered whole")
        self.assertEqual(node.stop(), 0, node.output)


def main():
    txl_procs.run_stub_tests(globals(), __doc__, [
        ("--seed", dict(type=int, default=int(time.time() * 1000) % 1000000,
                        help="the kill loop's random seed (default: from the clock)")),
        ("--kills", dict(type=int, default=40, help="kills in the kill loop (at least 20)"))])


if __name__ == "__main__":
    main()

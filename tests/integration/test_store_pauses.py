"""No split histories when the Redis state store or a replica pauses, or a store write's reply or request
is lost (issue 29), against real txl-server replicas (tiny model) and a real redis-server on loopback.

The contract: a request whose journal write's outcome is unknown is not answered until the server has
re-fenced the session and read back what landed: if the write landed the request succeeds (late); a
generation's write that did not land is sent again (nobody was told anything yet) and the request
succeeds too; other writes that did not land (create, fork, rewind, delete) are refused UNAVAILABLE
and the session is unchanged; meanwhile the session is busy (ABORTED) or the store
unwritable (UNAVAILABLE). Nothing ever gets DATA_LOSS for it. Every session continues exactly like a
control server (no store) fed exactly the requests that succeeded, in order (greedy: the same token
ids, logprobs within 1e-4; GetSession's position agrees). Clients use 60 s deadlines and retry
UNAVAILABLE (and ABORTED while a session is undecided), which never changes anything.

a) The store pauses (SIGSTOP of redis-server for 10 s) while a request is in flight on a server with
   --fsync always; a second request on the session meanwhile is refused (ABORTED or UNAVAILABLE).
   After SIGCONT the session continues like the control, and again after kill -9 of the server and
   a restart on the same store (same --replica_name). Once through gRPC, once through HTTP (an
   OpenAI-style completion with session_id: 200 if it succeeded, 503 unavailable if refused, never
   500).
b) Two replicas a and b share the store (--holder_timeout 5). a is paused (SIGSTOP) 8 s; b takes
   the session over and serves a turn; a resumes and is asked for the session: it must never answer
   from its stale copy; retrying UNAVAILABLE it gets the session back and continues b's history.
c) The same two replicas; the store pauses 8 s while a request to a is in flight; right after
   SIGCONT b is asked for the session. Whichever replica ends up with it, there is one history:
   a's request is in it if and only if a's client was told it succeeded.
d) A proxy between the server and Redis (redis_reply_proxy.py) loses one chosen write, its reply
   ("reply lost": it landed) or the write itself ("request lost": it did not), for each kind of
   write: append (Generate), snapshot (--snapshot_tokens 8), rewind, fork, create, delete, the
   hand-over of a session between two replicas (release), and an append of a session just restored
   from the store (offload: --host_memory_budget 1 and a device budget of one window). A request
   whose own write's reply was lost succeeds; a Generate whose write was lost succeeds (sent again);
   any other request whose write was lost is refused UNAVAILABLE;
   then everything continues like the control, and (except the hand-over) again after kill -9 and
   a restart: a refused delete leaves the session, a successful one makes it NOT_FOUND; a refused
   create leaves the id free, a successful one makes it exist; a refused fork leaves no session.

Run by CTest: /usr/bin/python3 test_store_pauses.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import control_case  # noqa: E402
import redis_procs  # noqa: E402
import redis_reply_proxy  # noqa: E402
import txl_procs  # noqa: E402
from redis_reply_proxy import REPLY_LOST, REQUEST_LOST  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

KEY = "txl-session-id"
DEADLINE = 60            # s, every call's deadline: outlives any pause here
SETTLE = 40              # s, retrying UNAVAILABLE (and ABORTED) until a call goes through
NEW_TOKENS = 5
STORE_PAUSE = 10         # s, a)
HOLDER_TIMEOUT = 5       # s, b) c) and the hand-over
REPLICA_PAUSE = 8        # s, b) c): longer than the holder timeout
FIRED_WAIT = 15          # s, for a write that follows the request's answer (a snapshot)
SNAPSHOT_TOKENS = 8
TEXTS = ["ROMEO:\n", " and", " or", " thou", " art", " not", " so"]


def code_name(e):
    return f"{e.code().name}: {e.details()}"


class Client:
    """gRPC calls on one server; every session call carries the id as routing metadata."""

    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    def close(self):
        self.channel.close()

    def create(self, sid):
        return self.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=sid), metadata=[(KEY, sid)],
                                       timeout=DEADLINE)

    def get(self, sid):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), metadata=[(KEY, sid)],
                                    timeout=DEADLINE)

    def delete(self, sid):
        return self.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=sid), metadata=[(KEY, sid)],
                                       timeout=DEADLINE)

    def fork(self, sid):
        return self.stub.ForkSession(txl_pb2.ForkSessionRequest(session_id=sid), metadata=[(KEY, sid)],
                                     timeout=DEADLINE)

    def rewind(self, sid, position):
        return self.stub.RewindSession(txl_pb2.RewindSessionRequest(session_id=sid, position=position),
                                       metadata=[(KEY, sid)], timeout=DEADLINE)

    def sessions(self):
        return {s.session_id for s in self.stub.ListSessions(txl_pb2.ListSessionsRequest(), timeout=DEADLINE).sessions}

    def turn(self, sid, text, max_new=NEW_TOKENS):
        """One greedy turn: ([(id, logprob)], position). Raises the call's error if it failed before any
        token (nothing happened); an error after tokens is an AssertionError (a client told half)."""
        req = txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text=text), max_new_tokens=max_new,
                                      sampling=txl_pb2.SamplingParams(temperature=0))
        got, position = [], None
        try:
            for r in self.stub.Generate(req, metadata=[(KEY, sid)], timeout=DEADLINE):
                got += [(t.id, t.logprob) for t in r.tokens]
                position = r.position
        except grpc.RpcError as e:
            if got:
                raise AssertionError(f"session {sid}: {text!r} failed after {len(got)} tokens: {code_name(e)}")
            raise
        return got, position


def attempt(fn, what, allowed=("UNAVAILABLE",)):
    """fn() once: (True, its value), or (False, "CODE: details") for a refusal whose code is allowed;
    any other failure (DATA_LOSS above all) is an AssertionError naming it."""
    try:
        return True, fn()
    except grpc.RpcError as e:
        if e.code().name not in allowed:
            raise AssertionError(f"{what}: {code_name(e)} (allowed: success or {', '.join(allowed)})") from e
        return False, code_name(e)


def settle(fn, what, deadline_s=SETTLE):
    """fn() until it is not refused UNAVAILABLE or ABORTED (refusals that change nothing: the store or
    the session not ready yet, the session held elsewhere), up to the deadline; any other failure is
    an AssertionError naming it."""
    deadline = time.monotonic() + deadline_s
    while True:
        ok, value = attempt(fn, what, ("UNAVAILABLE", "ABORTED"))
        if ok:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still refused after {deadline_s} s: {value}")
        time.sleep(0.1)  # polling for a state change, bounded by the deadline


class InFlight:
    """fn() on a thread: done (an Event), outcome (attempt's), error (an AssertionError it raised)."""

    def __init__(self, fn, what, allowed=("UNAVAILABLE",)):
        self.done = threading.Event()
        self.outcome = self.error = None

        def run():
            try:
                self.outcome = attempt(fn, what, allowed)
            except AssertionError as e:
                self.error = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, test):
        test.assertTrue(self.done.wait(DEADLINE + 10), "a call outlived its deadline")
        if self.error is not None:
            raise self.error
        return self.outcome


def store_gauge(address, name, **labels):
    """One sample of the Prometheus text at http://address/metrics (0 when absent)."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=30).read().decode()
    want = set(labels.items())
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if m and m.group(1) == name and set(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")) == want:
            return float(m.group(3))
    return 0.0


class StorePausesTest(control_case.ControlCase):
    make_client = Client

    @classmethod
    def setUpClass(cls):
        cls.bin_dir = ARGS.bin_dir
        super().setUpClass()

    def setUp(self):
        super().setUp()
        self.redis = redis_procs.Redis(self.work)
        self.cleanups.append(self.redis.stop)

    # ---- servers ----

    def server(self, port, name, *flags, metrics=False):
        """A durable replica on redis at `port` (the store itself or a proxy to it), and a client."""
        server = txl_procs.Server(ARGS.bin_dir, self.model, "--state_store", f"redis://127.0.0.1:{port}/sp",
                                  "--replica_name", name, "--fsync", "always", *flags, metrics=metrics)
        self.cleanups.append(lambda: self.stop_server(server))
        client = Client(server.address)
        self.cleanups.append(client.close)
        return server, client

    @staticmethod
    def stop_server(server):
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGCONT)  # a paused replica would not see SIGTERM
        server.stop(timeout=30, check=False)

    def kill_and_restart(self, server):
        """kill -9, then the same command line again (same store, same --replica_name)."""
        server.proc.kill()
        server.stop(check=False)
        restarted = txl_procs.Server.from_argv(server.argv)
        self.cleanups.append(lambda: self.stop_server(restarted))
        client = Client(restarted.address)
        self.cleanups.append(client.close)
        return restarted, client

    def proxy(self):
        proxy = redis_reply_proxy.RedisReplyProxy(self.redis.port)
        self.cleanups.append(proxy.stop)
        return proxy

    # ---- histories ----

    def new_session(self, client, sid=None, turns=1):
        """A session on `client` and the control, fed TEXTS[:turns] (equal on both)."""
        sid = sid or os.urandom(16).hex()
        self.assertEqual(client.create(sid).session_id, sid)
        self.assertEqual(self.control.create(sid).session_id, sid)
        for text in TEXTS[:turns]:
            self.assert_turns_equal(client.turn(sid, text), self.control.turn(sid, text), f"session {sid}: {text!r}")
        return sid

    def assert_continues(self, client, sid, what, control_sid=None, text=" again"):
        """The session's position (GetSession) and a greedy turn equal the control's."""
        control_sid = control_sid or sid
        info = settle(lambda: client.get(sid), f"{what}: GetSession {sid}")
        self.assertEqual(info.position, self.control.get(control_sid).position,
                         f"{what}: session {sid}: GetSession position differs from the control's")
        got = settle(lambda: client.turn(sid, text), f"{what}: {text!r} on {sid}")
        self.assert_turns_equal(got, self.control.turn(control_sid, text), f"{what}: {text!r} on {sid}")

    def assert_not_found(self, client, sid, what):
        def get():
            try:
                client.get(sid)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
            self.fail(f"{what}: session {sid} still exists")
        settle(get, f"{what}: GetSession {sid}")

    # ---- a) the store pauses ----

    def test_store_paused_under_a_request(self):
        server, client = self.server(self.redis.port, "r1")
        sid = self.new_session(client, turns=0)
        self.assert_turns_equal(client.turn(sid, "ROMEO:\n", 20), self.control.turn(sid, "ROMEO:\n", 20), "ROMEO")

        self.redis.pause()
        paused = time.monotonic()
        first = InFlight(lambda: client.turn(sid, " and"), "' and' while the store is paused")
        # A second request while the first is undecided: busy (ABORTED), or the store unwritable.
        deadline = time.monotonic() + 5
        busy = False
        while not busy and not first.done.is_set() and time.monotonic() < deadline:
            try:
                busy = client.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=2).busy
            except grpc.RpcError:
                pass  # a GetSession that waits for the store tells nothing here
            time.sleep(0.05)  # polling for the first request to reach the session
        second = InFlight(lambda: client.turn(sid, " or"), "' or' while ' and' is undecided",
                          ("ABORTED", "UNAVAILABLE"))
        second_answer_before_first = second.done.wait(STORE_PAUSE) and not first.done.is_set()
        if second_answer_before_first:
            self.assertFalse(second.result(self)[0], "' or' succeeded while ' and' on the same session was still "
                                                     "unanswered")
        answered_while_paused = first.done.wait(max(0.0, paused + STORE_PAUSE - time.monotonic()))
        time.sleep(max(0.0, paused + STORE_PAUSE - time.monotonic()))  # the pause itself (the scenario)
        self.redis.resume()
        resumed = time.monotonic()
        results = [("' and'", " and", first.result(self)), ("' or'", " or", second.result(self))]
        print(f"store paused {resumed - paused:.1f} s; busy seen: {busy}; ' and': {results[0][2][0]} "
              f"({'while paused' if answered_while_paused else 'after the resume'}); ' or': {results[1][2]}",
              file=sys.stderr)
        if answered_while_paused:
            self.assertFalse(results[0][2][0], "' and' succeeded while the store was paused (--fsync always)")
        succeeded = [(name, text, value) for name, text, (ok, value) in results if ok]
        self.assertLessEqual(len(succeeded), 1, "both requests on the session succeeded: they ran at once")
        for name, text, got in succeeded:
            self.assert_turns_equal(got, self.control.turn(sid, text), f"{name}, acknowledged after the pause")

        self.assert_continues(client, sid, "after the store resumed", text=" thou")
        self.assert_continues(client, sid, "after the store resumed, again", text=" art")
        _, client = self.kill_and_restart(server)
        self.assert_continues(client, sid, "after kill -9 and a restart", text=" not")

    def test_store_paused_under_an_http_request(self):
        """a) through HTTP: an OpenAI-style completion on the session (session_id) while the store pauses."""
        server = txl_procs.Server(ARGS.bin_dir, self.model, "--state_store",
                                  f"redis://127.0.0.1:{self.redis.port}/sp", "--replica_name", "h", "--fsync", "always",
                                  http=True)
        self.cleanups.append(lambda: self.stop_server(server))
        client = Client(server.address)
        self.cleanups.append(client.close)
        sid = self.new_session(client, turns=0)

        def complete(prompt, max_tokens):
            body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "session_id": sid}).encode()
            req = urllib.request.Request(f"http://{server.http_address}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=DEADLINE) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, first = complete("ROMEO:\n", 20)
        self.assertEqual(status, 200, first)
        control_first = self.control.turn(sid, "ROMEO:\n", 20)
        self.assertEqual(first["position"], control_first[1], "ROMEO: the position differs from the control's")

        self.redis.pause()
        paused = time.monotonic()
        outcome = {}
        worker = threading.Thread(target=lambda: outcome.update(answer=complete(" and", NEW_TOKENS)), daemon=True)
        worker.start()
        worker.join(STORE_PAUSE)  # the pause itself (the scenario): a completion answered meanwhile is refused
        answered_while_paused = "answer" in outcome
        self.redis.resume()
        worker.join(DEADLINE)
        self.assertIn("answer", outcome, "the completion outlived its deadline")
        status, body = outcome["answer"]
        print(f"HTTP: store paused {time.monotonic() - paused:.1f} s; ' and': {status} "
              f"({'while paused' if answered_while_paused else 'after the resume'})", file=sys.stderr)
        self.assertIn(status, (200, 503), f"' and' while the store was paused: {status} {body}")
        if answered_while_paused:
            self.assertEqual(status, 503, f"' and' succeeded while the store was paused (--fsync always): {body}")
        if status == 200:
            control = self.control.turn(sid, " and")
            self.assertEqual(body["position"], control[1], "' and': the position differs from the control's")
        else:
            self.assertEqual(body["error"]["code"], "unavailable", body)

        self.assert_continues(client, sid, "HTTP, after the store resumed", text=" thou")
        _, client = self.kill_and_restart(server)
        self.assert_continues(client, sid, "HTTP, after kill -9 and a restart", text=" art")

    # ---- b) a replica pauses ----

    def test_replica_paused_while_another_takes_over(self):
        a, ca = self.server(self.redis.port, "a", "--holder_timeout", str(HOLDER_TIMEOUT))
        _, cb = self.server(self.redis.port, "b", "--holder_timeout", str(HOLDER_TIMEOUT))
        sid = self.new_session(ca, turns=0)
        self.assert_turns_equal(ca.turn(sid, "ROMEO:\n", 10), self.control.turn(sid, "ROMEO:\n", 10), "ROMEO on a")

        a.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        got = settle(lambda: cb.turn(sid, " and"), "b taking over a's session while a is paused")
        took = time.monotonic() - stopped
        self.assert_turns_equal(got, self.control.turn(sid, " and"), "' and' on b, which took the session over")
        time.sleep(max(0.0, stopped + REPLICA_PAUSE - time.monotonic()))  # the pause itself (the scenario)
        a.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        print(f"a paused {resumed - stopped:.1f} s; b took over after {took:.1f} s", file=sys.stderr)

        # a still has its copy at the old position: it must never answer from it.
        got = settle(lambda: ca.turn(sid, " or"), "' or' on a after its pause")
        print(f"a served the session again {time.monotonic() - resumed:.1f} s after its resume", file=sys.stderr)
        self.assert_turns_equal(got, self.control.turn(sid, " or"),
                                "' or' on a after its pause (a stale copy on a continues an older history)")
        self.assert_continues(ca, sid, "on a", text=" thou")
        self.assert_continues(cb, sid, "back on b", text=" art")

    # ---- c) the store pauses under two replicas ----

    def test_store_paused_under_two_replicas(self):
        _, ca = self.server(self.redis.port, "a", "--holder_timeout", str(HOLDER_TIMEOUT))
        _, cb = self.server(self.redis.port, "b", "--holder_timeout", str(HOLDER_TIMEOUT))
        sid = self.new_session(ca, turns=1)

        self.redis.pause()
        paused = time.monotonic()
        on_a = InFlight(lambda: ca.turn(sid, " and"), "' and' on a while the store is paused")
        time.sleep(REPLICA_PAUSE)  # the pause itself (the scenario): longer than the holder timeout
        self.redis.resume()
        on_b = settle(lambda: cb.turn(sid, " or"), "' or' on b right after the store resumed")
        (a_ok, a_value) = on_a.result(self)
        print(f"store paused {REPLICA_PAUSE} s under a's request: {'succeeded' if a_ok else a_value}; "
              f"b served {time.monotonic() - paused - REPLICA_PAUSE:.1f} s after the resume", file=sys.stderr)
        if a_ok:
            self.assert_turns_equal(a_value, self.control.turn(sid, " and"), "' and' on a, acknowledged")
        self.assert_turns_equal(on_b, self.control.turn(sid, " or"),
                                "' or' on b (the control has ' and' only if a acknowledged it)")
        self.assert_continues(cb, sid, "on b", text=" thou")
        self.assert_continues(ca, sid, "back on a", text=" art")

    # ---- d) one write lost ----

    def assert_outcome(self, outcome, variant, what, resent=False):
        """resent: a generation's write, which the server sends again once it knows it did not land."""
        ok, value = outcome
        if variant == REPLY_LOST or resent:
            self.assertTrue(ok, f"{what}: its write landed (only the reply was lost), so it must succeed; got {value}")
        else:
            self.assertFalse(ok, f"{what}: its write never reached the store, so it must be refused UNAVAILABLE; "
                                 "it succeeded")

    def assert_fired(self, proxy, kind, sid, wait=0.0):
        self.assertTrue(proxy.fired.wait(wait),
                        f"no {kind!r} write for session {sid} went through the proxy "
                        f"(the writes it saw, by kind: {dict(proxy.seen)})")

    def lost_write(self, kind, variant):
        what = f"{kind} ({variant})"
        if kind == "release":
            return self.lost_release(variant, what)
        if kind == "offload":
            return self.lost_append_after_restore(variant, what)
        proxy = self.proxy()
        server, client = self.server(proxy.port, "r1", "--snapshot_tokens", str(SNAPSHOT_TOKENS))
        sid = os.urandom(16).hex()
        gone, fork = None, None  # a session that must be NOT_FOUND; (the fork's id, the control fork's id)

        if kind == "create":
            proxy.arm("create", variant, match=sid)
            outcome = attempt(lambda: client.create(sid), f"CreateSession, {what}")
            self.assert_fired(proxy, kind, sid)
            self.assert_outcome(outcome, variant, f"CreateSession, {what}")
            if outcome[0]:
                ok, value = attempt(lambda: client.create(sid), f"CreateSession again, {what}",
                                    ("ALREADY_EXISTS", "UNAVAILABLE"))
                self.assertFalse(ok, f"CreateSession again, {what}: the id was created twice")
            else:
                self.assertEqual(settle(lambda: client.create(sid), f"CreateSession again, {what}").session_id, sid,
                                 f"{what}: the refused id is not free")
            self.control.create(sid)
        else:
            self.new_session(client, sid, turns=2)
            if kind == "append":
                proxy.arm("append", variant, match=sid)
                outcome = attempt(lambda: client.turn(sid, " thou"), f"Generate, {what}")
                self.assert_fired(proxy, kind, sid)
                self.assert_outcome(outcome, variant, f"Generate, {what}", resent=True)
                if outcome[0]:
                    self.assert_turns_equal(outcome[1], self.control.turn(sid, " thou"), f"Generate, {what}")
            elif kind == "snapshot":
                proxy.arm("snapshot", variant, match=sid)
                # A turn logs more than --snapshot_tokens: a snapshot follows it (then, or at the next).
                for text in (" thou", " art"):
                    ok, value = attempt(lambda: client.turn(sid, text), f"Generate with a snapshot, {what}")
                    if ok:
                        self.assert_turns_equal(value, self.control.turn(sid, text), f"Generate, {what}")
                    if proxy.fired.is_set():
                        break
                self.assert_fired(proxy, kind, sid, wait=FIRED_WAIT)
            elif kind == "rewind":
                back = client.get(sid).position - 3  # inside the last turn: a snapshot is later
                proxy.arm("rewind", variant, match=sid)
                outcome = attempt(lambda: client.rewind(sid, back), f"RewindSession to {back}, {what}")
                self.assert_fired(proxy, kind, sid)
                self.assert_outcome(outcome, variant, f"RewindSession, {what}")
                if outcome[0]:
                    self.assertEqual(outcome[1].position, back)
                    self.control.rewind(sid, back)
            elif kind == "fork":
                before = client.sessions()
                proxy.arm("fork", variant, match=sid[:8])  # the fork's id starts like its source's
                outcome = attempt(lambda: client.fork(sid), f"ForkSession, {what}")
                self.assert_fired(proxy, kind, sid)
                self.assert_outcome(outcome, variant, f"ForkSession, {what}")
                if outcome[0]:
                    fork = (outcome[1].session_id, self.control.fork(sid).session_id)
                    self.assertEqual(settle(client.sessions, "ListSessions"), before | {fork[0]},
                                     f"{what}: the sessions after a fork")
                else:
                    self.assertEqual(settle(client.sessions, "ListSessions"), before,
                                     f"{what}: a refused fork left a session")
            elif kind == "delete":
                proxy.arm("delete", variant, match=sid)
                outcome = attempt(lambda: client.delete(sid), f"DeleteSession, {what}")
                self.assert_fired(proxy, kind, sid)
                self.assert_outcome(outcome, variant, f"DeleteSession, {what}")
                if outcome[0]:
                    gone = sid
                    self.control.delete(sid)
            else:
                raise ValueError(kind)

        self.assertEqual(proxy.errors, [], "the proxy could not parse the RESP it forwarded")
        for label, c in (("after the lost write", client), ("after kill -9 and a restart", None)):
            if c is None:
                _, c = self.kill_and_restart(server)
            if gone:
                self.assert_not_found(c, gone, f"{what}, {label}")
            else:
                self.assert_continues(c, sid, f"{what}, {label}")
            if fork:
                self.assert_continues(c, fork[0], f"{what}, the fork, {label}", control_sid=fork[1])
            elif kind == "fork":
                self.assertEqual(settle(c.sessions, "ListSessions"), {sid}, f"{what}, {label}: the sessions")

    def lost_release(self, variant, what):
        """a hands its session over to b (asked by b); the hand-over's release write is lost."""
        proxy = self.proxy()
        _, ca = self.server(proxy.port, "a", "--holder_timeout", str(HOLDER_TIMEOUT))
        _, cb = self.server(self.redis.port, "b", "--holder_timeout", str(HOLDER_TIMEOUT))
        sid = self.new_session(ca, turns=2)
        proxy.arm("release", variant, match=sid)
        ok, value = attempt(lambda: cb.get(sid), f"b asked for a's session, {what}")
        self.assertFalse(ok, f"{what}: b answered for a session that a, which is up, holds")
        info = settle(lambda: cb.get(sid), f"a handing the session over to b, {what}")
        self.assert_fired(proxy, "release", sid)
        self.assertEqual(proxy.errors, [], "the proxy could not parse the RESP it forwarded")
        self.assertEqual(info.position, self.control.get(sid).position, f"{what}: the position on b")
        self.assert_continues(cb, sid, f"{what}, on b", text=" thou")
        self.assert_continues(ca, sid, f"{what}, back on a", text=" art")

    def lost_append_after_restore(self, variant, what):
        """A session offloaded to the store (host budget 1 byte) is restored by a Generate whose append
        is lost."""
        # One session's full window: what the device budget counts per session.
        probe = self.control.create("").session_id
        self.control.turn(probe, "measuring the window: " + "x" * 40)
        window = self.control.get(probe).memory_bytes
        self.control.delete(probe)
        proxy = self.proxy()
        server, client = self.server(proxy.port, "r1", "--snapshot_tokens", str(SNAPSHOT_TOKENS),
                                     "--session_memory_budget", str(window), "--host_memory_budget", "1",
                                     metrics=True)
        sids = [self.new_session(client, turns=2) for _ in range(3)]
        target = sids[0]  # the least recently used: in the store only by now
        restores = store_gauge(server.metrics_address, "txl_session_restores_total", **{"from": "store"})
        proxy.arm("append", variant, match=target)
        outcome = attempt(lambda: client.turn(target, " thou"), f"Generate on a restored session, {what}")
        self.assertGreater(store_gauge(server.metrics_address, "txl_session_restores_total", **{"from": "store"}),
                           restores, f"{what}: the session was not restored from the store")
        self.assert_fired(proxy, "append", target)
        self.assert_outcome(outcome, variant, f"Generate on a restored session, {what}", resent=True)
        if outcome[0]:
            self.assert_turns_equal(outcome[1], self.control.turn(target, " thou"), f"Generate, {what}")
        self.assertEqual(proxy.errors, [], "the proxy could not parse the RESP it forwarded")
        for sid in sids:
            self.assert_continues(client, sid, f"{what}, after the lost write")
        _, client = self.kill_and_restart(server)
        for sid in sids:
            self.assert_continues(client, sid, f"{what}, after kill -9 and a restart", text=" art")


KINDS = ("append", "snapshot", "rewind", "fork", "create", "delete", "release", "offload")
for _kind in KINDS:
    for _variant, _suffix in ((REPLY_LOST, "reply_lost"), (REQUEST_LOST, "request_lost")):
        def _test(self, kind=_kind, variant=_variant):
            self.lost_write(kind, variant)
        _test.__doc__ = f"A lost {_kind} write ({_variant})."
        setattr(StorePausesTest, f"test_lost_{_kind}_{_suffix}", _test)


def main():
    txl_procs.run_stub_tests(globals(), __doc__)


if __name__ == "__main__":
    main()

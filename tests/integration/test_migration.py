"""Sessions move between replicas that share one state store, behind the real nginx
(deploy/nginx/nginx.conf).

Two txl-server replicas (--replica_name a and b) share a --state_dir, or a Redis server
(--state_store redis://...). At least 8 sessions are created through the proxy, with at least 2 on
each replica, and get 2 greedy turns each, mirrored on a control server. Each session is live on
one replica (ListSessions). While both are up, b answers UNAVAILABLE for one of a's sessions and
asks a to hand it over, which a does; a call through the proxy (routed to a) brings it back the
same way, unchanged. Then replica a stops:
 - SIGTERM (--holder_timeout 8): a writes final snapshots and retires its heartbeat, so b takes
   over a's sessions at once (well before the timeout);
 - SIGKILL (--holder_timeout 2): b answers UNAVAILABLE for a's sessions until a's heartbeat is
   older than the timeout, then takes them over.
Every session then gets 2 more turns through the proxy (nginx now reaches only b), each equal to
the control's (same tokens, logprobs within 1e-4), and b lists them all. Four runs: the directory
and the Redis backend, each with SIGTERM and SIGKILL. And on the directory backend, a replica that
starts beside a busy one (again and again, for 15 s) never disturbs it.

Run by CTest: /usr/bin/python3 test_migration.py --bin-dir BUILD --stubs BUILD/client/python/gen
--nginx-conf deploy/nginx/nginx.conf
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import control_case  # noqa: E402
import nginx_proxy  # noqa: E402
import redis_procs  # noqa: E402
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

KEY = "txl-session-id"
SESSIONS, PER_REPLICA, MAX_SESSIONS = 8, 2, 40
TURNS_BEFORE = ["To be, or not", " to be: that is"]
TURNS_AFTER = [" the question.", " Whether 'tis nobler"]
NEW_TOKENS = 6
ADOPT_DEADLINE = 15.0  # seconds
BESIDE_SECONDS = 15.0  # replica b starting and stopping beside a busy replica a


def retry_unavailable(fn, what, deadline_s=ADOPT_DEADLINE):
    """fn() until it does not fail with UNAVAILABLE (a replica that is gone, or whose sessions may
    not be taken over yet), up to the deadline. fn must fail before doing anything, or succeed."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {e.code()}: {e.details()}") from e
        time.sleep(0.05)  # polling for a state change, bounded by the deadline


class Client:
    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    def close(self):
        self.channel.close()

    def create(self, sid):
        return self.stub.CreateSession(txl_pb2.CreateSessionRequest(session_id=sid), metadata=[(KEY, sid)],
                                       timeout=30).session_id

    def get(self, sid):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), metadata=[(KEY, sid)], timeout=30)

    def turn(self, sid, text):
        """One greedy turn: ([(id, logprob)], position). Raises the call's error if it failed before
        any token (safe to retry); an error after tokens is an AssertionError."""
        req = txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text=text), max_new_tokens=NEW_TOKENS,
                                      sampling=txl_pb2.SamplingParams(temperature=0))
        got, position = [], None
        try:
            for r in self.stub.Generate(req, metadata=[(KEY, sid)], timeout=60):
                got += [(t.id, t.logprob) for t in r.tokens]
                position = r.position
        except grpc.RpcError as e:
            if got:
                raise AssertionError(f"session {sid}: the turn failed after {len(got)} tokens: {e.details()}")
            raise
        return got, position


class MigrationTest(control_case.ControlCase):
    make_client = Client

    @classmethod
    def setUpClass(cls):
        cls.bin_dir = ARGS.bin_dir
        super().setUpClass()

    def holders(self, replicas):
        """{session id: name of the replica that lists it} (ListSessions asks nothing of the store)."""
        out = {}
        for name, client in replicas.items():
            for s in client.stub.ListSessions(txl_pb2.ListSessionsRequest(), timeout=30).sessions:
                self.assertNotIn(s.session_id, out, f"session {s.session_id} is live on both replicas")
                out[s.session_id] = name
        return out

    def scenario(self, backend, stop):
        work = self.work
        if backend == "redis":
            redis = redis_procs.Redis(work)
            self.cleanups.append(redis.stop)
            store = ("--state_store", f"redis://127.0.0.1:{redis.port}/txlmig")
        else:
            store = ("--state_dir", os.path.join(work, "state"))
        # After SIGTERM b must not need the timeout (8 s); after SIGKILL it must wait for it (2 s).
        holder_timeout = 8 if stop == "term" else 2
        servers = {}
        for name in ("a", "b"):
            servers[name] = txl_procs.Server(ARGS.bin_dir, self.model, *store, "--replica_name", name,
                                             "--holder_timeout", str(holder_timeout))
            self.cleanups.append(lambda s=servers[name]: s.stop(check=False))
            self.assertIn(f"as replica {name}: 0 session(s) recovered", servers[name].output)
        direct = {name: Client(s.address) for name, s in servers.items()}
        proxy_nginx = nginx_proxy.NginxProxy(ARGS.nginx_conf, [s.address for s in servers.values()], work)
        proxy = Client(proxy_nginx.address)

        def ready():
            try:
                proxy.stub.GetModelInfo(txl_pb2.GetModelInfoRequest(), timeout=5)
                return True
            except grpc.RpcError:
                return False

        proxy_nginx.start(ready)
        self.cleanups.append(proxy_nginx.stop)
        for c in [proxy] + list(direct.values()):
            self.cleanups.append(c.close)

        # Sessions through the proxy, mirrored on the control, until both replicas hold some.
        sessions = {}  # id -> holder
        while len(sessions) < SESSIONS or min(list(sessions.values()).count(n) for n in servers) < PER_REPLICA:
            self.assertLess(len(sessions), MAX_SESSIONS, f"the proxy puts (nearly) every session on one replica: "
                            f"{[list(sessions.values()).count(n) for n in servers]}")
            sid = os.urandom(16).hex()
            self.assertEqual(proxy.create(sid), sid)
            self.assertEqual(self.control.create(sid), sid)
            for text in TURNS_BEFORE:
                self.assert_turns_equal(proxy.turn(sid, text), self.control.turn(sid, text),
                                        f"session {sid} before the stop, {text!r}")
            held = self.holders(direct)
            self.assertIn(sid, held, f"session {sid} is live on neither replica")
            sessions[sid] = held[sid]
        self.assertEqual(self.holders(direct), sessions, "sessions moved between replicas while both were up")
        on_a = [sid for sid, h in sessions.items() if h == "a"]
        print(f"{backend}/{stop}: {len(sessions)} sessions, {len(on_a)} on replica a", file=sys.stderr)

        # While a is up, b answers UNAVAILABLE for a's session (and asks a to hand it over, which
        # a does at a heartbeat, once it is idle); a call through the proxy (routed to a) then
        # brings it back to a the same way. Both ways, the session is unchanged.
        moved = on_a[0]
        asked = time.monotonic()
        with self.assertRaises(grpc.RpcError, msg=f"b answered for {moved}, held by a, which is up") as cm:
            direct["b"].get(moved)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        info = retry_unavailable(lambda: direct["b"].get(moved), f"a handing {moved} over to b")
        self.assertEqual(info.position, self.control.get(moved).position, f"session {moved}: position on b")
        self.assertEqual(self.holders(direct)[moved], "b")
        handed = time.monotonic()
        text = " Back and forth."
        got = retry_unavailable(lambda: proxy.turn(moved, text), f"b handing {moved} back to a")
        self.assert_turns_equal(got, self.control.turn(moved, text), f"session {moved} handed over and back")
        print(f"{backend}/{stop}: hand-over a -> b {handed - asked:.2f} s, back {time.monotonic() - handed:.2f} s",
              file=sys.stderr)
        self.assertEqual(self.holders(direct), sessions, "sessions are not where the proxy routes them")

        # Replica a goes away.
        if stop == "term":
            self.assertEqual(servers["a"].stop(), 0, servers["a"].output)
            stopped_at = time.monotonic()
        else:
            servers["a"].proc.kill()
            servers["a"].stop(check=False)
            stopped_at = time.monotonic()
            # Its heartbeat is fresh (written every holder_timeout / 4): b may not take over yet.
            with self.assertRaises(grpc.RpcError, msg="b took over a's session right after a was killed") as cm:
                direct["b"].get(on_a[0])
            if time.monotonic() - stopped_at < holder_timeout / 2:
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        first = on_a[-1]
        info = retry_unavailable(lambda: direct["b"].get(first), f"b taking over {first}")
        took = time.monotonic() - stopped_at
        print(f"{backend}/{stop}: b took over after {took:.2f} s", file=sys.stderr)
        if stop == "term":
            self.assertLess(took, holder_timeout / 2, "b waited for the holder timeout after a clean stop")
        else:
            self.assertGreaterEqual(took, holder_timeout - holder_timeout / 4 - 0.5,
                                    "b took over a killed replica's session before its holder timeout")
        self.assertEqual(info.position, self.control.get(first).position, f"session {first}: position on b")

        # Every session continues through the proxy, on b now, exactly like the control.
        for sid in sessions:
            for text in TURNS_AFTER:
                got = retry_unavailable(lambda: proxy.turn(sid, text), f"session {sid} after the stop")
                self.assert_turns_equal(got, self.control.turn(sid, text),
                                        f"session {sid} (held by {sessions[sid]}) after a stopped, {text!r}")
        listed = {s.session_id for s in direct["b"].stub.ListSessions(txl_pb2.ListSessionsRequest(),
                                                                       timeout=30).sessions}
        self.assertEqual(listed, set(sessions), "b does not list exactly every session")
        self.assertEqual(servers["b"].stop(), 0, servers["b"].output)
        self.assertNotIn("quarantined", servers["b"].output + servers["a"].output)

    def test_directory_replica_starting_beside_a_busy_one(self):
        """A replica starting on the shared directory leaves a live replica's writes alone (a scale-up,
        or a rolling restart): a keeps acknowledging while b starts and stops again and again."""
        state = os.path.join(self.work, "state")
        a = txl_procs.Server(ARGS.bin_dir, self.model, "--state_dir", state, "--replica_name", "a", "--fsync", "always")
        self.cleanups.append(lambda: a.stop(check=False))
        client = Client(a.address)
        self.cleanups.append(client.close)
        stop, errors, done = threading.Event(), [], [0]

        def busy():  # CreateSession and DeleteSession: journal writes (files put, renamed, removed)
            while not stop.is_set() and not errors:
                try:
                    sid = client.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=30).session_id
                    client.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=sid), timeout=30)
                    done[0] += 1
                except grpc.RpcError as e:
                    errors.append(e)

        threads = [threading.Thread(target=busy) for _ in range(3)]
        for t in threads:
            t.start()
        starts, deadline = 0, time.monotonic() + BESIDE_SECONDS
        try:
            while time.monotonic() < deadline and not errors:
                b = txl_procs.Server(ARGS.bin_dir, self.model, "--state_dir", state, "--replica_name", "b")
                self.assertEqual(b.stop(), 0, b.output)
                starts += 1
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        print(f"replica b started {starts} times beside a, which served {done[0]} sessions", file=sys.stderr)
        if errors:
            self.fail(f"a failed after b started {starts} times beside it ({done[0]} sessions served): "
                      f"{errors[0].code()}: {errors[0].details()}")
        self.assertEqual(a.stop(), 0, a.output)

    def test_directory_sigterm(self):
        self.scenario("dir", "term")

    def test_directory_sigkill(self):
        self.scenario("dir", "kill")

    def test_redis_sigterm(self):
        self.scenario("redis", "term")

    def test_redis_sigkill(self):
        self.scenario("redis", "kill")


def main():
    txl_procs.run_stub_tests(globals(), __doc__, [("--nginx-conf", dict(required=True, help="deploy/nginx/nginx.conf"))])


if __name__ == "__main__":
    main()

"""txl-server --model_repository over HTTP (Python's http.client) and gRPC (the generated stubs):

- /v1/models lists each ready model; a request's "model" picks it; a model not served is 404
  model_not_found, and no model at all, with two served, is 400 naming "model";
- POST /v2/repository/index, /v2/repository/models/NAME/load and .../unload, behind the bearer tokens;
- under load: 32 sessions (16 over HTTP, 16 over gRPC) stream turns on alpha version 1 while
  version 2 is published (picked up by --repository_poll_seconds) and version 1's directory is then
  removed. No request fails; every session's whole output equals that of a server that only ever had
  version 1; new sessions are on version 2; version 1 is UNLOADED once its last session is deleted;
- kill -9 after a reload, with a state store: the restarted server (whose policy serves version 2)
  loads version 1 again for the session journaled on it, which goes on exactly; a session migrated
  to version 2 (POST /v1/sessions/ID/migrate) before the kill comes back on version 2, as it was;
- kill -9 after a reload, restarted with a --model_memory_budget with no room for version 1 beside
  the versions the policy serves: the session on version 1 is not loaded but kept, its requests get
  400 saying why, and a restart with room brings it back, exactly;
- kill -9 while version 2 loads, with a state store: after the restart version 2 is ready, and each
  session is back on version 1 with every turn it was told was done, and goes on exactly;
- two architectures under one --session_memory_budget: one's sessions come and go, the other's then
  fill its pool from the first's free rows; none is refused, and a session that lived through it
  answers as its fork did before.

Every server gets TXL_TEST_SERVER_FLAGS (txl_procs.Server.test_argv): model_repository_generic runs
them all on the generic kernels, and scripts/gpu_check.sh on the GPU.

Run by CTest: /usr/bin/python3 test_model_repository.py --bin-dir BUILD --stubs BUILD/client/python/gen
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
from http_client import Http  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None

TOKEN = "repo-test-token-0123456789"
TURNS = ["Once upon", " a time", " there was"]


def publish(bin_dir, repo, name, version, seed, **config):
    """Writes NAME/.staging-VERSION/model.pt (TINY_CONFIG updated with `config`), then renames it to
    NAME/VERSION, as a publisher should."""
    staging = os.path.join(repo, name, ".staging-%d" % version)
    os.makedirs(staging, exist_ok=True)
    txl_procs.tiny_model(bin_dir, staging, name="model.pt", init_args=txl_procs.TINY_INIT_ARGS + ("--seed", str(seed)),
                         **config)
    os.remove(os.path.join(staging, "c.json"))
    os.rename(staging, os.path.join(repo, name, str(version)))


class Gate:
    """Sessions arrive after their first turn and wait; the test opens the gate once all have."""

    def __init__(self):
        self.cv, self.arrived, self.open = threading.Condition(), 0, False

    def arrive_and_wait(self):
        with self.cv:
            self.arrived += 1
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: self.open, 120), "the gate never opened"

    def wait_arrivals(self, n):
        with self.cv:
            return self.cv.wait_for(lambda: self.arrived >= n, 120)

    def release(self):
        with self.cv:
            self.open = True
            self.cv.notify_all()


def http_turns(address, model, turns, headers, between=None):
    """A session over HTTP on `model`: its id, and each turn's generated text."""
    h = Http(address)
    status, s, _ = h.json("POST", "/v1/sessions", {"model": model}, headers)
    assert status == 200, s
    texts = []
    for i, turn in enumerate(turns):
        if between is not None and i == 1:
            between.arrive_and_wait()
        status, body, _ = h.json("POST", "/v1/completions",
                                 {"session_id": s["id"], "prompt": turn, "max_tokens": 8, "temperature": 0},
                                 headers)
        assert status == 200, body
        texts.append(body["choices"][0]["text"])
    h.close()
    return s["id"], texts


def grpc_turns(address, model, turns, between=None):
    """A session over gRPC on `model`: its id, and each turn's generated token ids."""
    with grpc.insecure_channel(address) as ch:
        stub = txl_pb2_grpc.TransformerXLStub(ch)
        md = [("authorization", "Bearer " + TOKEN)]
        s = stub.CreateSession(txl_pb2.CreateSessionRequest(model=model), metadata=md)
        out = []
        for i, turn in enumerate(turns):
            if between is not None and i == 1:
                between.arrive_and_wait()
            ids = []
            req = txl_pb2.GenerateRequest(session_id=s.session_id, input=txl_pb2.Input(text=turn), max_new_tokens=8)
            for r in stub.Generate(req, metadata=md):
                ids += [t.id for t in r.tokens]
            out.append(ids)
        return s.session_id, out


class RepositoryTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.state_dir = os.path.join(self.tmp.name, "state")
        self.repo = os.path.join(self.tmp.name, "repo")
        publish(ARGS.bin_dir, self.repo, "alpha", 1, seed=3)
        publish(ARGS.bin_dir, self.repo, "beta", 1, seed=5)
        tokens = os.path.join(self.tmp.name, "tokens")
        with open(tokens, "w") as f:
            f.write("%s tester\n" % TOKEN)
        self.headers = {"Authorization": "Bearer " + TOKEN}
        self.argv = [os.path.join(ARGS.bin_dir, "server", "txl-server"), "--model_repository", self.repo,
                     "--repository_poll_seconds", "0.1", "--listen", "127.0.0.1:0", "--metrics_listen", "",
                     "--http_listen", "127.0.0.1:0", "--auth_tokens", tokens]
        if "state" in self._testMethodName:
            self.argv += ["--state_dir", self.state_dir, "--replica_name", "r1", "--metrics_listen", "127.0.0.1:0"]
        # (--kernels generic for model_repository_generic, --device cuda on a GPU: scripts/gpu_check.sh)
        self.argv = txl_procs.Server.test_argv(self.argv)
        self.server = txl_procs.Server.from_argv(self.argv)
        self.http = Http(self.server.http_address)

    def tearDown(self):
        self.http.close()
        self.server.stop(timeout=30, check=False)
        self.tmp.cleanup()

    def models(self):
        status, body, _ = self.http.json("GET", "/v1/models", None, self.headers)
        self.assertEqual(status, 200, body)
        return {m["id"]: m["txl"] for m in body["data"]}

    def index(self):
        status, body, _ = self.http.json("POST", "/v2/repository/index", None, self.headers)
        self.assertEqual(status, 200, body)
        return {(m["name"], int(m["version"])): (m["state"], m["reason"]) for m in body}

    def only_v1(self):
        """The reference: what TURNS give over HTTP (texts) and gRPC (ids) on a server that only ever had
        alpha's version 1."""
        server = txl_procs.Server(ARGS.bin_dir, os.path.join(self.repo, "alpha", "1", "model.pt"), http=True)
        try:
            return http_turns(server.http_address, "", TURNS, {})[1], grpc_turns(server.address, "", TURNS)[1]
        finally:
            server.stop(timeout=30, check=False)

    def session_with_turns(self, turns):
        """A new session on alpha, and the texts of its greedy turns over HTTP."""
        status, s, _ = self.http.json("POST", "/v1/sessions", {"model": "alpha"}, self.headers)
        self.assertEqual(status, 200, s)
        got = []
        for turn in turns:
            status, body, _ = self.http.json("POST", "/v1/completions", {"session_id": s["id"], "prompt": turn,
                                                                         "max_tokens": 8, "temperature": 0},
                                             self.headers)
            self.assertEqual(status, 200, body)
            got.append(body["choices"][0]["text"])
        return s, got

    def waiting_sessions(self):
        """txl_sessions_waiting: sessions held waiting for room for their version."""
        text = urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address, timeout=10).read().decode()
        return float(re.search(r"^txl_sessions_waiting (\S+)$", text, re.M).group(1))

    def wait_for(self, what, condition):
        deadline = time.monotonic() + 30
        while not condition():
            self.assertLess(time.monotonic(), deadline, "waited 30 s for " + what)
            time.sleep(0.05)

    def test_requests_name_their_model_over_http(self):
        # The default model memory budget, and what it leaves for later versions set aside from the
        # sessions' budget.
        budget = re.search(r"model memory budget (\d+) bytes .*: the start-up versions hold (\d+), which leaves (\d+) "
                           r"for versions loaded later", self.server.output)
        self.assertIsNotNone(budget, self.server.output)
        total, held, later = (int(g) for g in budget.groups())
        self.assertEqual(total - held, later)
        self.assertGreaterEqual(total, 2 * held)
        # Set aside only from the default session budget: the GPU check gives every server its own
        # (TXL_TEST_SERVER_DEFAULTS).
        if not any(a.startswith("--session_memory_budget") for a in self.argv):
            self.assertIn(", %d model versions loaded later (--model_memory_budget)" % later, self.server.output)
        listed = self.models()
        self.assertEqual(sorted(listed), ["alpha", "beta"])
        self.assertNotEqual(listed["alpha"]["fingerprint"], listed["beta"]["fingerprint"])
        self.assertEqual(listed["alpha"]["version"], 1)
        for model in ("alpha", "beta@1"):
            status, body, _ = self.http.json("POST", "/v1/completions",
                                             {"model": model, "prompt": "Hi", "max_tokens": 3}, self.headers)
            self.assertEqual(status, 200, body)
            self.assertEqual(body["model"], model.split("@")[0])
        status, body, _ = self.http.json("POST", "/v1/completions",
                                         {"model": "gamma", "prompt": "Hi", "max_tokens": 3}, self.headers)
        self.assertEqual((status, body["error"]["code"], body["error"]["param"]), (404, "model_not_found", "model"))
        self.assertIn("gamma", body["error"]["message"])
        status, body, _ = self.http.json("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3}, self.headers)
        self.assertEqual((status, body["error"]["param"]), (400, "model"), body)
        status, body, _ = self.http.json("GET", "/v1/models/beta@1", None, self.headers)
        self.assertEqual((status, body["id"]), (200, "beta@1"))
        status, s, _ = self.http.json("POST", "/v1/sessions", {"model": "beta"}, self.headers)
        self.assertEqual((status, s["model"]), (200, "beta@1"), s)

        # The repository's control is behind the same tokens.
        self.assertEqual(self.http.json("POST", "/v2/repository/index")[0], 401)
        self.assertEqual(self.http.json("POST", "/v2/repository/models/beta/unload")[0], 401)
        self.assertEqual(self.index()[("beta", 1)][0], "READY")
        status, body, _ = self.http.json("POST", "/v2/repository/models/beta/unload", None, self.headers)
        self.assertEqual(status, 200, body)
        self.assertEqual(sorted(self.models()), ["alpha"])
        status, body, _ = self.http.json("POST", "/v1/completions",
                                         {"model": "beta", "prompt": "Hi", "max_tokens": 3}, self.headers)
        self.assertEqual(status, 404, body)
        # The session made of beta goes on.
        status, body, _ = self.http.json("POST", "/v1/completions",
                                         {"session_id": s["id"], "prompt": "Hi", "max_tokens": 3}, self.headers)
        self.assertEqual(status, 200, body)
        status, body, _ = self.http.json("POST", "/v2/repository/models/beta/load", None, self.headers)
        self.assertEqual(status, 200, body)
        self.assertEqual(sorted(self.models()), ["alpha", "beta"])
        status, body, _ = self.http.json("POST", "/v2/repository/models/gamma/load", None, self.headers)
        self.assertEqual(status, 404, body)
        # A path that names no model, or not one segment of a name.
        for path, code in (("models/load", 404), ("models//load", 400), ("models/a%2Fb/unload", 400),
                           ("models/beta/reload", 404), ("models/beta/load/x", 404)):
            status, body, _ = self.http.json("POST", "/v2/repository/" + path, None, self.headers)
            self.assertEqual(status, code, (path, body))
        self.assertEqual(sorted(self.models()), ["alpha", "beta"])

    def test_a_reload_under_load_keeps_every_session_on_its_version(self):
        ref_http, ref_grpc = self.only_v1()

        between = Gate()  # the sessions' later turns wait for the reload
        results, errors = {}, []

        def run(kind, i):
            try:
                if kind == "http":
                    results[(kind, i)] = http_turns(self.server.http_address, "alpha", TURNS, self.headers,
                                                    between=between)
                else:
                    results[(kind, i)] = grpc_turns(self.server.address, "alpha", TURNS, between=between)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append("%s %d: %r" % (kind, i, e))

        threads = [threading.Thread(target=run, args=(kind, i)) for kind in ("http", "grpc") for i in range(16)]
        for t in threads:
            t.start()
        # Every session has made its first turn on version 1.
        self.assertTrue(between.wait_arrivals(len(threads)), errors)
        publish(ARGS.bin_dir, self.repo, "alpha", 2, seed=11)
        self.wait_for("alpha@2 ready", lambda: self.models().get("alpha", {}).get("version") == 2)
        shutil.rmtree(os.path.join(self.repo, "alpha", "1"))  # removed: retired at once, held by its sessions
        self.wait_for("alpha@1 retiring", lambda: self.index().get(("alpha", 1), ("",))[0] == "RETIRING")
        between.release()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 32)
        for (kind, i), (sid, out) in results.items():
            self.assertEqual(out, ref_http if kind == "http" else ref_grpc, "%s session %d" % (kind, i))
            status, s, _ = self.http.json("GET", "/v1/sessions/" + sid, None, self.headers)
            self.assertEqual((status, s["model"]), (200, "alpha@1"))

        # New sessions answer as version 2.
        sid, out = http_turns(self.server.http_address, "alpha", TURNS, self.headers)
        status, s, _ = self.http.json("GET", "/v1/sessions/" + sid, None, self.headers)
        self.assertEqual(s["model"], "alpha@2")
        self.assertNotEqual(out, ref_http)

        # Version 1 is freed once its last session is deleted.
        self.assertEqual(self.index()[("alpha", 1)][0], "RETIRING")
        for sid, _ in results.values():
            self.assertEqual(self.http.json("DELETE", "/v1/sessions/" + sid, None, self.headers)[0], 200)
        self.wait_for("alpha@1 unloaded", lambda: self.index()[("alpha", 1)][0] == "UNLOADED")

    def test_two_architectures_share_the_session_budget_and_give_each_other_free_rows(self):
        """alpha (2 layers) and deep (3) under one --session_memory_budget of 16 alpha windows: on the
        generic path (model_repository_generic, a GPU) each has a session pool of its own shape, and
        the pools together stay within it (docs/MODEL.md, "Pools of several shapes"). alpha's sessions
        come and go, leaving its pool's top free (on a GPU that pool was reserved for the whole budget);
        deep's then take rows from there. None is refused, and an alpha session that lived through it
        answers as its fork did before."""
        self.server.stop(timeout=30, check=False)
        self.http.close()
        publish(ARGS.bin_dir, self.repo, "deep", 1, seed=7, n_layer=txl_procs.TINY_CONFIG["n_layer"] + 1)
        c = txl_procs.TINY_CONFIG
        window = 2 * c["n_layer"] * c["mem_len"] * c["n_head"] * c["d_head"] * 4  # alpha's, float32
        budget = 16 * window
        self.server = txl_procs.Server.from_argv(self.argv + ["--session_memory_budget", str(budget),
                                                              "--metrics_listen", "127.0.0.1:0"])
        self.http = h = Http(self.server.http_address)
        pooled = "generic: libtorch ops" in self.server.output  # the CPU kernels keep no pools

        def pool_bytes():
            text = urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address, timeout=10).read().decode()
            return float(re.search(r"^txl_session_pool_bytes (\S+)$", text, re.M).group(1))

        def session(model):
            status, s, _ = h.json("POST", "/v1/sessions", {"model": model}, self.headers)
            self.assertEqual(status, 200, s)
            return s["id"]

        def turn(sid, prompt, n):
            status, body, _ = h.json("POST", "/v1/completions", {"session_id": sid, "prompt": prompt,
                                                                 "max_tokens": n, "temperature": 0}, self.headers)
            self.assertEqual(status, 200, body)
            return body["choices"][0]["text"]

        fill = "x" * (c["mem_len"] + 8)  # more than a window: every slot held
        lived = session("alpha")
        turn(lived, TURNS[0], 6)
        status, fork, _ = h.json("POST", "/v1/sessions/%s/fork" % lived, {}, self.headers)
        self.assertEqual(status, 200, fork)
        expected = turn(fork["id"], TURNS[1], 12)
        self.assertEqual(h.json("DELETE", "/v1/sessions/" + fork["id"], None, self.headers)[0], 200)
        gone = [session("alpha") for _ in range(8)]
        for sid in gone:
            turn(sid, fill, 1)
        for sid in gone:
            self.assertEqual(h.json("DELETE", "/v1/sessions/" + sid, None, self.headers)[0], 200)
        for _ in range(8):
            turn(session("deep"), fill, 1)
        self.assertEqual(turn(lived, TURNS[1], 12), expected)
        # txl_session_pool_bytes (refreshed once a second): the pools together hold at least the live
        # sessions' full windows (the lived one and 8 of deep's, whose rows are a half more), and stay
        # within the budget. 0 on the CPU kernels, which keep no pools.
        live = window + 8 * window * 3 // 2
        if pooled:
            self.wait_for("txl_session_pool_bytes", lambda: pool_bytes() >= live)
            self.assertLessEqual(pool_bytes(), budget)
        else:
            self.assertEqual(pool_bytes(), 0)

    def test_a_restart_with_a_state_store_brings_a_session_back_on_its_version(self):
        expected = self.only_v1()[0]
        h = self.http
        s, got = self.session_with_turns(TURNS[:2])
        status, moved, _ = h.json("POST", "/v1/sessions", {"model": "alpha"}, self.headers)
        self.assertEqual(status, 200, moved)
        turn = {"session_id": moved["id"], "prompt": TURNS[0], "max_tokens": 8, "temperature": 0}
        self.assertEqual(h.json("POST", "/v1/completions", turn, self.headers)[0], 200)
        publish(ARGS.bin_dir, self.repo, "alpha", 2, seed=11)
        status, body, _ = h.json("POST", "/v2/repository/models/alpha/load", None, self.headers)
        self.assertEqual(status, 200, body)
        self.assertEqual(self.models()["alpha"]["version"], 2)
        status, body, _ = h.json("POST", "/v1/sessions/%s/migrate" % moved["id"], {"model": "alpha"}, self.headers)
        self.assertEqual((status, body.get("model")), (200, "alpha@2"), body)
        # What the migrated session answers next: its fork's answer (a fork is the session as it is).
        status, fork, _ = h.json("POST", "/v1/sessions/%s/fork" % moved["id"], {}, self.headers)
        self.assertEqual((status, fork.get("model")), (200, "alpha@2"), fork)
        turn = {"prompt": TURNS[1], "max_tokens": 8, "temperature": 0}
        status, body, _ = h.json("POST", "/v1/completions", dict(turn, session_id=fork["id"]), self.headers)
        self.assertEqual(status, 200, body)
        moved_expected = body["choices"][0]["text"]
        h.close()
        self.server.proc.kill()  # kill -9: nothing is flushed on the way out
        self.server.proc.wait(30)
        self.server = txl_procs.Server.from_argv(self.argv)
        self.http = h = Http(self.server.http_address)
        self.assertIn("3 session(s) recovered", self.server.output)
        self.assertEqual(self.index()[("alpha", 1)][0], "RETIRING")  # loaded for its session only
        self.assertEqual(self.models()["alpha"]["version"], 2)
        status, info, _ = h.json("GET", "/v1/sessions/" + s["id"], None, self.headers)
        self.assertEqual((status, info["model"]), (200, "alpha@1"), info)
        status, body, _ = h.json("POST", "/v1/completions", {"session_id": s["id"], "prompt": TURNS[2],
                                                             "max_tokens": 8, "temperature": 0}, self.headers)
        self.assertEqual(status, 200, body)
        got.append(body["choices"][0]["text"])
        self.assertEqual(got, expected)
        status, info, _ = h.json("GET", "/v1/sessions/" + moved["id"], None, self.headers)
        self.assertEqual((status, info["model"]), (200, "alpha@2"), info)
        status, body, _ = h.json("POST", "/v1/completions", dict(turn, session_id=moved["id"]), self.headers)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["text"], moved_expected)

    def test_a_restart_with_a_state_store_keeps_a_session_whose_version_does_not_fit_the_budget(self):
        expected = self.only_v1()[0]
        h = self.http
        # alpha@1 and beta@1, of one shape: each holds half of this.
        held = int(re.search(r"the start-up versions hold (\d+)", self.server.output).group(1))
        s, got = self.session_with_turns(TURNS[:2])
        doomed, _ = self.session_with_turns(TURNS[:1])  # deleted while it waits
        publish(ARGS.bin_dir, self.repo, "alpha", 2, seed=11)
        self.assertEqual(h.json("POST", "/v2/repository/models/alpha/load", None, self.headers)[0], 200)
        self.assertEqual(self.models()["alpha"]["version"], 2)
        h.close()
        self.server.proc.kill()  # kill -9
        self.server.proc.wait(30)
        self.server.stop(timeout=30, check=False)
        # Room for alpha@2 and beta@1, not for alpha@1 beside them.
        self.server = txl_procs.Server.from_argv(self.argv + ["--model_memory_budget", str(held + held // 4)])
        self.http = h = Http(self.server.http_address)
        self.assertIn("0 session(s) recovered, 2 kept waiting for room for their version", self.server.output)
        self.assertNotIn(("alpha", 1), {k for k, v in self.index().items() if v[0] in ("READY", "RETIRING")})
        self.wait_for("two waiting sessions counted", lambda: self.waiting_sessions() == 2)  # at a tick
        turn = {"session_id": s["id"], "prompt": TURNS[2], "max_tokens": 8, "temperature": 0}
        for method, path, body in (("POST", "/v1/completions", turn), ("GET", "/v1/sessions/" + s["id"], None)):
            status, answer, _ = h.json(method, path, body, self.headers)
            self.assertEqual(status, 400, answer)
            message = answer["error"]["message"]
            for part in ("session " + s["id"], "its version alpha@1 does not fit", "--model_memory_budget",
                         "kept in the state store", "comes back once there is room for its version"):
                self.assertIn(part, message)
        # Its owner may delete a waiting session: it is gone from the store.
        status, body, _ = h.json("DELETE", "/v1/sessions/" + doomed["id"], None, self.headers)
        self.assertEqual(status, 200, body)
        self.assertEqual(h.json("GET", "/v1/sessions/" + doomed["id"], None, self.headers)[0], 404)
        self.wait_for("one waiting session", lambda: self.waiting_sessions() == 1)
        # A graceful stop keeps the other; the restart's budget still has no room for alpha@1.
        h.close()
        self.server.stop(timeout=30)
        self.server = txl_procs.Server.from_argv(self.server.argv)
        self.http = h = Http(self.server.http_address)
        self.assertIn("0 session(s) recovered, 1 kept waiting for room for their version", self.server.output)
        # Unloading beta makes room, with no restart: alpha@1 is loaded for the session, which comes back
        # and goes on exactly.
        status, body, _ = h.json("POST", "/v2/repository/models/beta/unload", None, self.headers)
        self.assertEqual(status, 200, body)
        self.wait_for("the session back", lambda: h.json("GET", "/v1/sessions/" + s["id"], None,
                                                         self.headers)[0] == 200)
        self.assertEqual(self.index()[("alpha", 1)][0], "RETIRING")  # loaded for its session only
        status, info, _ = h.json("GET", "/v1/sessions/" + s["id"], None, self.headers)
        self.assertEqual(info["model"], "alpha@1", info)
        self.wait_for("no waiting session", lambda: self.waiting_sessions() == 0)
        status, body, _ = h.json("POST", "/v1/completions", turn, self.headers)
        self.assertEqual(status, 200, body)
        got.append(body["choices"][0]["text"])
        self.assertEqual(got, expected)

    def test_a_kill_during_a_reload_with_a_state_store_loses_no_acknowledged_turn(self):
        ref_http, ref_grpc = self.only_v1()
        # Sessions on version 1, each told that its first two turns are done.
        sessions = [("http", *http_turns(self.server.http_address, "alpha", TURNS[:2], self.headers))
                    for _ in range(3)]
        sessions += [("grpc", *grpc_turns(self.server.address, "alpha", TURNS[:2])) for _ in range(3)]
        for kind, _, out in sessions:
            self.assertEqual(out, (ref_http if kind == "http" else ref_grpc)[:2])
        # Version 2 is large enough (46 MB) that its load takes a while; the poll picks it up, and the
        # server is killed while it loads.
        staging = os.path.join(self.repo, "alpha", ".staging-2")
        os.makedirs(staging)
        txl_procs.tiny_model(ARGS.bin_dir, staging, name="model.pt", n_layer=6, n_head=6, d_model=384, d_head=64,
                             d_inner=1536)
        os.remove(os.path.join(staging, "c.json"))
        os.rename(staging, os.path.join(self.repo, "alpha", "2"))
        seen = []
        deadline = time.monotonic() + 30
        while not seen or seen[-1] not in ("LOADING", "READY"):
            self.assertLess(time.monotonic(), deadline, "alpha@2 never began loading: %s" % seen)
            seen.append(self.index().get(("alpha", 2), ("",))[0])
        self.http.close()
        self.server.proc.kill()  # kill -9 in the middle of the reload
        self.server.proc.wait(30)
        self.assertEqual(seen[-1], "LOADING", "the kill came after the load: %s" % seen)

        self.server = txl_procs.Server.from_argv(self.argv)
        self.http = h = Http(self.server.http_address)
        self.assertIn("6 session(s) recovered", self.server.output)
        index = self.index()
        self.assertEqual(index[("alpha", 2)][0], "READY")  # the restart finishes the reload
        self.assertEqual(index[("alpha", 1)][0], "RETIRING")  # loaded again for its sessions only
        # Each session is back on version 1 with its two acknowledged turns, and goes on exactly.
        for kind, sid, _ in sessions:
            status, info, _ = h.json("GET", "/v1/sessions/" + sid, None, self.headers)
            self.assertEqual((status, info.get("model")), (200, "alpha@1"), info)
            if kind == "http":
                status, body, _ = h.json("POST", "/v1/completions", {"session_id": sid, "prompt": TURNS[2],
                                                                     "max_tokens": 8, "temperature": 0},
                                         self.headers)
                self.assertEqual(status, 200, body)
                self.assertEqual(body["choices"][0]["text"], ref_http[2])
            else:
                with grpc.insecure_channel(self.server.address) as ch:
                    stub = txl_pb2_grpc.TransformerXLStub(ch)
                    req = txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text=TURNS[2]),
                                                  max_new_tokens=8)
                    ids = [t.id for r in stub.Generate(req, metadata=[("authorization", "Bearer " + TOKEN)])
                           for t in r.tokens]
                self.assertEqual(ids, ref_grpc[2])
        status, fresh, _ = h.json("POST", "/v1/sessions", {"model": "alpha"}, self.headers)
        self.assertEqual((status, fresh.get("model")), (200, "alpha@2"), fresh)

    def test_a_session_adopted_with_a_state_store_is_read_for_its_own_model(self):
        # beta has limits of its own; alpha and beta read the same bytes.
        with open(os.path.join(self.repo, "beta", "limits.json"), "w") as f:
            f.write('{"max_new_tokens": 5}')
        self.server.stop(timeout=30, check=False)
        self.server = txl_procs.Server.from_argv(self.argv)
        self.http.close()
        self.http = h = Http(self.server.http_address)
        self.assertEqual(self.models()["beta"]["max_new_tokens"], 5)
        status, s, _ = h.json("POST", "/v1/sessions", {"model": "beta"}, self.headers)
        self.assertEqual(status, 200, s)
        turn = {"session_id": s["id"], "prompt": TURNS[0], "temperature": 0}
        status, body, _ = h.json("POST", "/v1/completions", turn, self.headers)  # no max_tokens: beta's 5
        self.assertEqual((status, body.get("usage", {}).get("completion_tokens")), (200, 5), body)
        h.close()
        self.server.stop(timeout=30, check=False)  # r1 goes; r2 adopts its sessions on request
        argv = list(self.argv)
        argv[argv.index("r1")] = "r2"
        self.server = txl_procs.Server.from_argv(argv)
        self.http = h = Http(self.server.http_address)
        # Named by no model, the request is read for the first one (alpha) until the session is live
        # here; it is on beta, whose limits differ, so it is refused once, unchanged.
        turn = dict(turn, prompt=TURNS[1], max_tokens=8)
        status, body, _ = h.json("POST", "/v1/completions", turn, self.headers)
        self.assertEqual(status, 400, body)
        self.assertIn("is on model beta@1, and the request was read for alpha@1; send it again", body["error"]["message"])
        status, info, _ = h.json("GET", "/v1/sessions/" + s["id"], None, self.headers)
        self.assertEqual((status, info.get("model"), info.get("position")), (200, "beta@1", len(TURNS[0]) + 5), info)
        # Sent again, it is read for beta: beta's limit holds.
        status, body, _ = h.json("POST", "/v1/completions", turn, self.headers)
        self.assertEqual(status, 400, body)
        self.assertIn("max_tokens: must be in [1, 5]", body["error"]["message"])
        status, body, _ = h.json("POST", "/v1/completions", dict(turn, max_tokens=5), self.headers)
        self.assertEqual((status, body.get("usage", {}).get("completion_tokens")), (200, 5), body)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__)

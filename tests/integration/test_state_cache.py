"""The state cache against a real txl-server (tiny random model, byte tokenizer, window 32):
requests without a session go on from the state an earlier one of the same principal left, and
answer exactly as a session fed everything would (docs/SESSIONS.md, "The state cache").

a) gRPC Generate without a session: turn 2 re-sends turn 1's prompt and reply and adds new tokens;
   it feeds only the new ones (txl_tokens_fed_total) after a hit (txl_state_cache_lookups_total),
   and its tokens and log-probs equal those of one session fed turn by turn, within 1e-5.
b) HTTP chat completions without a session, the whole conversation re-sent each turn: the same
   replies as the same chat on a session, and every turn after the first is a hit.
c) With --auth_tokens, another principal's identical request is a miss and feeds everything.
d) --state_cache_budget 0: no cache, every request feeds its whole prompt.
e) Two replicas sharing a state store: turn 1 on one, turn 2 on the other, which finds the first's
   state in the store (a store_hit) and answers as one session would; a third replica with
   --dtype bfloat16 misses it.

Run by CTest: /usr/bin/python3 test_state_cache.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import glob
import json
import os
import random
import re
import sys
import tempfile
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests

TOL = 1e-5
if txl_procs.decode_graphs_on():
    TOL = 3e-5  # padded decode steps sum in other orders (test_rewind.py says by how much)


def metric(text, name, labels=""):
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else 0.0


class Server:
    """A started server with helpers for gRPC Generate, HTTP JSON and its metrics."""

    def __init__(self, model, *flags, token=None):
        self.proc = txl_procs.Server(ARGS.bin_dir, model, *flags, metrics=True, http=True)
        self.channel = grpc.insecure_channel(self.proc.address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)
        self.token = token

    def close(self):
        self.channel.close()
        self.proc.stop()

    def generate(self, ids, n, session="", token=None):
        req = txl_pb2.GenerateRequest(session_id=session, input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=ids)),
                                      max_new_tokens=n)
        metadata = [("authorization", "Bearer " + token)] if token else None
        out = [(t.id, t.logprob) for r in self.stub.Generate(req, timeout=120, metadata=metadata) for t in r.tokens]
        return [i for i, _ in out], [lp for _, lp in out]

    def http(self, path, body):
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request("http://%s%s" % (self.proc.http_address, path), data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def metrics_after(self, lookups):
        """The metrics once `lookups` cache lookups are counted: the cache's counters follow its
        stats at each tick of the engine thread (about once a second)."""
        for _ in range(200):
            text = self.scrape()
            counted = sum(metric(text, "txl_state_cache_lookups_total", '{result="%s"}' % r)
                          for r in ("hit", "store_hit", "miss"))
            if counted >= lookups:
                return text
            threading.Event().wait(0.05)
        raise AssertionError("the metrics never counted %d state cache lookups" % lookups)

    def scrape(self):
        with urllib.request.urlopen("http://%s/metrics" % self.proc.metrics_address, timeout=30) as r:
            return r.read().decode()


class Counters:
    """txl_tokens_fed_total and the cache's lookups, read after `lookups` lookups have been counted."""

    def __init__(self, server, lookups):
        text = server.metrics_after(lookups)
        self.fed = metric(text, "txl_tokens_fed_total")
        self.hits = metric(text, "txl_state_cache_lookups_total", '{result="hit"}')
        self.store_hits = metric(text, "txl_state_cache_lookups_total", '{result="store_hit"}')
        self.misses = metric(text, "txl_state_cache_lookups_total", '{result="miss"}')


class StateCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_state_cache_")
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assertClose(self, a, b, what):
        worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
        self.assertEqual(len(a), len(b), what)
        self.assertLessEqual(worst, TOL, "%s: log-probs differ by %g" % (what, worst))

    def test_a_grpc_stateless_goes_on_from_the_cache(self):
        s = Server(self.model)
        try:
            rng = random.Random(1)
            turn1 = [rng.randint(32, 126) for _ in range(40)]
            ids1, lps1 = s.generate(turn1, 10)
            c1 = Counters(s, 1)
            self.assertEqual((c1.hits, c1.misses), (0, 1))
            new = [rng.randint(32, 126) for _ in range(15)]
            ids2, lps2 = s.generate(turn1 + ids1 + new, 10)
            c2 = Counters(s, 2)
            self.assertEqual(c2.hits, 1)
            # The cached reply's last token (pending), the 15 new ones, then 9 decode steps.
            self.assertEqual(c2.fed - c1.fed, 1 + 15 + 9)

            sid = s.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=60).session_id
            want1, want_lps1 = s.generate(turn1, 10, session=sid)
            want2, want_lps2 = s.generate(new, 10, session=sid)
            self.assertEqual(ids1, want1)
            self.assertEqual(ids2, want2)
            self.assertClose(lps1, want_lps1, "turn 1")
            self.assertClose(lps2, want_lps2, "turn 2 from the cache")
        finally:
            s.close()

    def test_b_http_chat_without_a_session(self):
        s = Server(self.model)
        try:
            sid = s.http("/v1/sessions", {})["id"]
            stateless, stateful = [], []
            for turn in range(3):
                for messages, sess in ((stateless, None), (stateful, sid)):
                    messages.append({"role": "user", "content": "turn %d: tell me more" % turn})
                    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
                    if sess:
                        body["session_id"] = sess
                    reply = s.http("/v1/chat/completions", body)["choices"][0]["message"]["content"]
                    messages.append({"role": "assistant", "content": reply})
            self.assertEqual(stateless, stateful)
            c = Counters(s, 3)
            self.assertEqual((c.hits, c.misses), (2, 1))
        finally:
            s.close()

    def test_c_another_principal_misses(self):
        tokens = os.path.join(self.tmp.name, "tokens.txt")
        alice, bob = "a" * 40, "b" * 40
        with open(tokens, "w") as f:
            f.write("%s alice\n%s bob\n" % (alice, bob))
        s = Server(self.model, "--auth_tokens", tokens)
        try:
            prompt = [ord(c) for c in "a prompt that both principals send, word for word"]
            ids, _ = s.generate(prompt, 4, token=alice)
            again = prompt + ids + [ord(c) for c in " and more"]
            s.generate(again, 4, token=alice)
            c1 = Counters(s, 2)
            self.assertEqual((c1.hits, c1.misses), (1, 1))
            s.generate(again, 4, token=bob)
            c2 = Counters(s, 3)
            self.assertEqual((c2.hits, c2.misses), (1, 2))
            self.assertEqual(c2.fed - c1.fed, len(again) + 3, "bob's request fed everything")
        finally:
            s.close()

    def test_d_no_cache_with_a_budget_of_0(self):
        s = Server(self.model, "--state_cache_budget", "0")
        try:
            prompt = [ord(c) for c in "the same prompt twice"]
            ids, _ = s.generate(prompt, 4)
            before = metric(s.scrape(), "txl_tokens_fed_total")
            s.generate(prompt + ids, 4)
            text = s.scrape()
            self.assertEqual(metric(text, "txl_tokens_fed_total") - before, len(prompt) + len(ids) + 3)
            self.assertEqual(metric(text, "txl_state_cache_lookups_total", '{result="hit"}'), 0)
            self.assertEqual(metric(text, "txl_state_cache_budget_bytes"), 0)
        finally:
            s.close()

    def test_e_replicas_sharing_a_state_store_share_the_cache(self):
        """A stateless call on replica a, its continuation on replica b: b finds a's state in the
        store (a store_hit), feeds only what is new, and answers as one session would."""
        state = os.path.join(self.tmp.name, "state")
        a = Server(self.model, "--state_dir", state, "--replica_name", "a")
        b = Server(self.model, "--state_dir", state, "--replica_name", "b")
        try:
            rng = random.Random(5)
            turn1 = [rng.randint(32, 126) for _ in range(40)]
            ids1, _ = a.generate(turn1, 6)
            # a writes its two entries (prompt end, reply end) to the store after it answers: wait
            # for the scope's index to list both.
            for _ in range(200):
                index = glob.glob(os.path.join(state, "statecache", "*", "index"))
                if index and len(open(index[0]).read().split()) == 2:
                    break
                threading.Event().wait(0.05)
            new = [rng.randint(32, 126) for _ in range(10)]
            fed_before = Counters(b, 0).fed
            ids2, lps2 = b.generate(turn1 + ids1 + new, 6)
            c = Counters(b, 1)
            self.assertEqual(c.store_hits, 1, "replica b never found replica a's state in the store")
            self.assertEqual(c.fed - fed_before, 1 + 10 + 5)
            sid = a.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=60).session_id
            a.generate(turn1, 6, session=sid)
            want2, want_lps2 = a.generate(new, 6, session=sid)
            self.assertEqual(ids2, want2)
            self.assertClose(lps2, want_lps2, "turn 2 on another replica")
            # A replica with other number formats computes other states: it never takes a's.
            bf16 = Server(self.model, "--state_dir", state, "--replica_name", "c", "--dtype", "bfloat16")
            try:
                bf16.generate(turn1 + ids1 + new, 2)
                c = Counters(bf16, 1)
                self.assertEqual((c.hits, c.store_hits, c.misses), (0, 0, 1))
            finally:
                bf16.close()
        finally:
            b.close()
            a.close()


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__)

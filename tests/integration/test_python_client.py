"""The Python client (client/python) against a real txl-server (loopback, tiny model).

Run by CTest: /usr/bin/python3 test_python_client.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT_DIR = os.path.join(REPO, "client", "python")
KEY = "txl-session-id"
HEX32 = r"^[0-9a-f]{32}$"

grpc = txl_client = txl_pb2 = None  # imported in main, once the stubs are on sys.path


def make_recorder():
    """A client interceptor recording (method, metadata) of every call."""

    class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def __init__(self):
            self.calls = []

        def _record(self, continuation, details, request):
            self.calls.append((details.method.rsplit("/", 1)[-1], list(details.metadata or [])))
            return continuation(details, request)

        intercept_unary_unary = intercept_unary_stream = _record
        intercept_stream_unary = intercept_stream_stream = _record

    return Recorder()


def run_turn(responses):
    """(token ids, text, [(tokens so far, position)] per response, last response) of one streamed turn."""
    ids, text, positions, last = [], "", [], None
    for r in responses:
        ids += [t.id for t in r.tokens]
        text += r.text
        positions.append((len(ids), r.position))
        last = r
    return ids, text, positions, last


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_pyclient_")
        cls.server = txl_procs.Server(ARGS.bin_dir, txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name))
        cls.address = cls.server.address
        cls.client = txl_client.TxlClient(cls.address, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        cls.tmp.cleanup()

    def encode(self, text):
        """The server's token ids for text (Score on a throw-away session)."""
        return [t.id for t in self.client.score(text).tokens]

    def example(self, *args):
        return subprocess.run([sys.executable, os.path.join(CLIENT_DIR, "example.py"), "--server", self.address,
                               "--stubs", ARGS.stubs] + list(args), capture_output=True, text=True, timeout=120)

    def check_example(self, *args):
        turns = ["first\n", "second turn\n", "3rd\n"]
        r = self.example("--max-new-tokens", "6", *[a for t in turns for a in ("--turn", t)], *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        sid = re.search(r"^session ([0-9a-f]{32}) \(mem_len (\d+)\), position 0$", r.stdout, re.M)
        self.assertIsNotNone(sid, r.stdout)
        steps = re.findall(r"^--- position (\d+) = (\d+) \+ (\d+) fed \+ (\d+) generated \(finish LENGTH",
                           r.stdout, re.M)
        self.assertEqual(len(steps), 3, r.stdout)
        before = 0
        for (after, prev, fed, gen), text in zip(steps, turns):
            after, prev, fed, gen = int(after), int(prev), int(fed), int(gen)
            self.assertEqual(prev, before)
            self.assertEqual(fed, len(self.encode(text)))
            self.assertEqual(gen, 6)
            self.assertEqual(after, prev + fed + gen)
            before = after
        self.assertRegex(r.stdout, r"position still %d\n" % before)  # Score without commit
        self.assertIn("deleted session %s; get_session now: NOT_FOUND" % sid.group(1), r.stdout)
        self.assertNotIn(sid.group(1), [s.session_id for s in self.client.list_sessions()])

    def test_example_streams_a_multi_turn_session(self):
        self.check_example()

    def test_example_over_one_converse_stream(self):
        self.check_example("--converse", "--temperature", "0")

    def test_example_reports_a_bad_server_address(self):
        r = subprocess.run([sys.executable, os.path.join(CLIENT_DIR, "example.py"), "--server", "127.0.0.1:1",
                            "--stubs", ARGS.stubs, "--timeout", "5"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)

    def test_health_and_info(self):
        self.assertEqual(self.client.health(), "SERVING")
        info = self.client.info()
        self.assertEqual(info.n_layer, 2)
        self.assertEqual(info.d_model, 32)

    def test_turns_feed_only_new_text_and_match_a_fresh_session(self):
        session = self.client.create_session()
        sid = session.session_id
        self.assertRegex(sid, HEX32)
        self.assertEqual(session.position, 0)
        history = []  # every token fed and generated, in order
        for text, n in (("hello ", 5), ("world, again", 4)):
            fed = self.encode(text)
            ids, _, positions, last = run_turn(
                self.client.generate(text, session_id=sid, max_new_tokens=n, temperature=0.0))
            # Each response's position: history + input + the tokens generated so far.
            self.assertEqual([p for _, p in positions], [len(history) + len(fed) + k for k, _ in positions])
            self.assertGreater(len(positions), 1)  # streamed, not one reply
            self.assertEqual(last.finish_reason, txl_pb2.FINISH_REASON_LENGTH)
            self.assertEqual((last.usage.input_tokens, last.usage.generated_tokens), (len(fed), n))
            self.assertEqual(len(ids), n)
            prefix = list(history) + fed
            history += fed + ids
            self.assertEqual(last.position, len(history))
            self.assertEqual(self.client.get_session(sid).position, len(history))

            # The whole history at once, in a fresh session: the same greedy tokens.
            fresh = self.client.create_session().session_id
            again, _, _, last_fresh = run_turn(
                self.client.generate(tokens=prefix, session_id=fresh, max_new_tokens=n, temperature=0.0))
            self.assertEqual(again, ids)
            self.assertEqual(last_fresh.position, len(history))
            self.client.delete_session(fresh)

        # Score without commit leaves the session as it was; with commit it grows.
        scored = self.client.score("abc", session_id=sid)
        self.assertEqual([t.has_logprob for t in scored.tokens], [True] * 3)
        self.assertEqual(scored.position, len(history))
        committed = self.client.score("abc", session_id=sid, commit=True)
        self.assertEqual(committed.position, len(history) + 3)
        self.assertAlmostEqual(committed.total_logprob, scored.total_logprob, places=3)
        self.client.delete_session(sid)

    def test_converse_turns_equal_generate_turns(self):
        turns = [("to be", 4), (" or not", 3), (" to be", 5)]
        a = self.client.create_session().session_id
        b = self.client.create_session().session_id
        by_generate = [run_turn(self.client.generate(t, session_id=a, max_new_tokens=n))[0] for t, n in turns]
        with self.client.converse(b) as conversation:
            by_converse = [run_turn(conversation.turn(t, max_new_tokens=n)) for t, n in turns]
        self.assertEqual([c[0] for c in by_converse], by_generate)
        self.assertEqual(by_converse[-1][3].position, self.client.get_session(a).position)
        self.assertEqual(self.client.get_session(b).position, self.client.get_session(a).position)
        self.client.delete_session(a)
        self.client.delete_session(b)

    def test_every_session_call_sends_the_id_as_metadata(self):
        recorder = make_recorder()
        client = txl_client.TxlClient(self.address, timeout=60, interceptors=[recorder])
        try:
            sid = client.create_session().session_id
            self.assertRegex(sid, HEX32)
            client.get_session(sid)
            run_turn(client.generate("ab", session_id=sid, max_new_tokens=2))
            client.score("c", session_id=sid)
            child = client.fork_session(sid).session_id
            with client.converse(sid) as conversation:
                run_turn(conversation.turn("d", max_new_tokens=1))
            client.delete_session(child)
            client.delete_session(sid)
            client.info()
            client.list_sessions()
            run_turn(client.generate("e", max_new_tokens=1))  # a throw-away session: no id to send
        finally:
            client.close()
        sent = [(method, [v for k, v in md if k == KEY]) for method, md in recorder.calls]
        self.assertEqual(sent, [
            ("CreateSession", [sid]), ("GetSession", [sid]), ("Generate", [sid]), ("Score", [sid]),
            ("ForkSession", [sid]), ("Converse", [sid]), ("DeleteSession", [child]), ("DeleteSession", [sid]),
            ("GetModelInfo", []), ("ListSessions", []), ("Generate", []),
        ])

    def test_the_server_reads_the_metadata(self):
        sid = self.client.create_session().session_id
        run_turn(self.client.generate("xyz", session_id=sid, max_new_tokens=2))
        # The id only as metadata: the server finds the session.
        got = self.client.stub.GetSession(txl_pb2.GetSessionRequest(), metadata=[(KEY, sid)], timeout=60)
        self.assertEqual((got.session_id, got.position), (sid, 5))
        # Field and metadata disagree: refused.
        with self.assertRaises(grpc.RpcError) as e:
            self.client.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid),
                                        metadata=[(KEY, txl_client.new_session_id())], timeout=60)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.client.delete_session(sid)

    def test_unknown_session_is_not_found(self):
        unknown = txl_client.new_session_id()
        calls = {
            "get": lambda: self.client.get_session(unknown),
            "delete": lambda: self.client.delete_session(unknown),
            "score": lambda: self.client.score("a", session_id=unknown),
            "generate": lambda: list(self.client.generate("a", session_id=unknown, max_new_tokens=1)),
            "fork": lambda: self.client.fork_session(unknown),
        }
        for name, call in calls.items():
            with self.subTest(name), self.assertRaises(grpc.RpcError) as e:
                call()
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, name)

    def test_a_taken_id_is_already_exists(self):
        sid = self.client.create_session().session_id
        with self.assertRaises(grpc.RpcError) as e:
            self.client.create_session(session_id=sid)
        self.assertEqual(e.exception.code(), grpc.StatusCode.ALREADY_EXISTS)
        self.client.delete_session(sid)

    def test_bad_arguments_are_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as e:
            list(self.client.generate("a", max_new_tokens=1, temperature=-1.0))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.temperature", e.exception.details())
        with self.assertRaises(ValueError):
            txl_client.make_input()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--stubs", required=True, help="the generated stubs (target txl_python_stubs)")
    ARGS, rest = parser.parse_known_args()
    if not os.path.isfile(os.path.join(ARGS.stubs, "txl", "v1", "txl_pb2_grpc.py")):
        sys.exit("no generated stubs in %s: build the txl_python_stubs target" % ARGS.stubs)
    sys.path[:0] = [ARGS.stubs, CLIENT_DIR]
    import grpc  # noqa: E402
    import txl_client  # noqa: E402
    from txl.v1 import txl_pb2  # noqa: E402
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

"""The Python client (client/python) against a real txl-server (loopback, tiny model).

Run by CTest: /usr/bin/python3 test_python_client.py --bin-dir BUILD --stubs BUILD/client/python/gen

PythonClientTest: a plaintext server without tokens. SecureServerTest: servers with TLS (a CA and
certificates made here with the openssl command-line tool), mutual TLS and --auth_tokens.
"""
import argparse
import os
import re
import shutil
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
        device = re.escape(txl_procs.requested_device())
        self.assertRegex(r.stdout, r"^server [^\n]*, device %s, dtype float32, kv_dtype float32\n" % device)
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

    def test_a_seeded_draw_is_the_same_with_or_without_alternatives(self):
        # The model draws the token itself (temperature 1 by clusters; another temperature over
        # the whole row), lists top-k's candidates or top-p's nucleus for the server's sampler,
        # and lists alternatives beside any of them. Asking for alternatives changes neither the
        # tokens nor the seed's uniforms, which every path takes one per token.
        def draw(logprobs, temperature=1.0, **sampling):
            tokens = []
            for r in self.client.generate("once upon a ", max_new_tokens=40, temperature=temperature, seed=77,
                                          logprobs=logprobs, **sampling):
                tokens += [(t.id, t.logprob, [a.id for a in t.top]) for t in r.tokens]
            return tokens
        greedy = draw(0, temperature=0.0)
        for temperature, sampling in ((1.0, {}), (0.7, {}), (0.8, {"top_p": 0.9}), (1.3, {"top_k": 5}),
                                      (0.9, {"top_k": 8, "top_p": 0.8})):
            drawn, listed = draw(0, temperature, **sampling), draw(2, temperature, **sampling)
            self.assertEqual([i for i, _, _ in drawn], [i for i, _, _ in listed], (temperature, sampling))
            for (_, a, _), (_, b, top) in zip(drawn, listed):
                self.assertAlmostEqual(a, b, places=4)
                self.assertEqual(len(top), 2)
            self.assertNotEqual([i for i, _, _ in drawn], [i for i, _, _ in greedy],
                                f"40 draws at {temperature} {sampling} are not greedy")
            self.assertEqual(drawn, draw(0, temperature, **sampling), "a seed gives the same tokens again")
        self.assertEqual([i for i, _, _ in greedy], [i for i, _, _ in draw(1, temperature=0.0)])
        self.assertEqual([top[0] for _, _, top in draw(2, temperature=0.0)], [i for i, _, _ in greedy],
                         "greedy's token is its first alternative")

    def test_several_choices_by_index(self):
        texts = {}
        for r in self.client.generate("once upon a ", max_new_tokens=12, temperature=1.0, seed=5, n=3):
            texts[r.index] = texts.get(r.index, "") + r.text
        self.assertEqual(sorted(texts), [0, 1, 2])
        for i in range(3):  # choice i draws as a call seeded 5 + i
            alone = "".join(r.text for r in self.client.generate("once upon a ", max_new_tokens=12,
                                                                 temperature=1.0, seed=5 + i))
            self.assertEqual(texts[i], alone)

    def test_bad_arguments_are_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as e:
            list(self.client.generate("a", max_new_tokens=1, temperature=-1.0))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.temperature", e.exception.details())
        with self.assertRaises(ValueError):
            txl_client.make_input()


TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


def make_certificates(directory):
    """ca.pem; server.{pem,key} for DNS:localhost and IP:127.0.0.1, signed by ca; client.{pem,key}
    signed by ca; other_ca.pem, which signed neither (as tests/server/grpc/security_test.cc, with the IP added)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command-line tool is missing: install the 'openssl' package "
                           "(scripts/install-deps.sh)")
    d = lambda name: os.path.join(directory, name)  # noqa: E731
    with open(d("server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    with open(d("client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        ["req", "-x509", *key, "-keyout", d("ca.key"), "-out", d("ca.pem"), "-days", "2", "-subj", "/CN=txl test CA"],
        ["req", "-x509", *key, "-keyout", d("other_ca.key"), "-out", d("other_ca.pem"), "-days", "2",
         "-subj", "/CN=txl other CA"],
    ]
    for name, cn in (("server", "localhost"), ("client", "txl test client")):
        steps += [
            ["req", *key, "-keyout", d(name + ".key"), "-out", d(name + ".csr"), "-subj", "/CN=" + cn],
            ["x509", "-req", "-in", d(name + ".csr"), "-CA", d("ca.pem"), "-CAkey", d("ca.key"), "-CAcreateserial",
             "-out", d(name + ".pem"), "-days", "2", "-extfile", d(name + ".ext")],
        ]
    for step in steps:
        r = subprocess.run(["openssl", *step], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("failed: openssl %s\n%s%s" % (" ".join(step), r.stdout, r.stderr))


class SecureServerTest(unittest.TestCase):
    """TxlClient's token and tls_* arguments against servers with TLS, mutual TLS and --auth_tokens."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_pyclient_tls_")
        cls.dir = cls.tmp.name
        make_certificates(cls.dir)
        cls.tokens_file = cls.path("tokens.txt")
        with open(cls.tokens_file, "w") as f:
            f.write("# TOKEN PRINCIPAL\n" + "".join("%s %s\n" % kv for kv in TOKENS.items()))
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.dir)
        # TLS (no client certificates) and tokens.
        cls.server = txl_procs.Server(ARGS.bin_dir, cls.model, "--tls_cert", cls.path("server.pem"),
                                      "--tls_key", cls.path("server.key"), "--auth_tokens", cls.tokens_file)
        cls.address = cls.server.address

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def client(self, address=None, **kwargs):
        """A TxlClient for `address` (default: the TLS server), trusting ca.pem unless told; closed at
        the test's end."""
        kwargs.setdefault("tls_ca", self.path("ca.pem"))
        kwargs.setdefault("timeout", 30)
        client = txl_client.TxlClient(address or self.address, **kwargs)
        self.addCleanup(client.close)
        return client

    def assertCode(self, code, call, details=None):
        with self.assertRaises(grpc.RpcError) as e:
            call()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        if details is not None:
            self.assertIn(details, e.exception.details())
        return e.exception

    def check_works(self, client):
        self.assertEqual(client.info().n_layer, 2)
        sid = client.create_session().session_id
        ids, _, _, last = run_turn(client.generate("hello", session_id=sid, max_new_tokens=3, temperature=0.0))
        self.assertEqual(len(ids), 3)
        self.assertEqual(last.finish_reason, txl_pb2.FINISH_REASON_LENGTH)
        self.assertEqual(client.get_session(sid).position, last.position)
        client.delete_session(sid)

    def test_tls_with_the_right_token_works(self):
        # The certificate names 127.0.0.1 (the address dialled) and localhost (checked instead).
        for name in (None, "localhost"):
            with self.subTest(tls_server_name=name):
                self.check_works(self.client(token="tok-alice", tls_server_name=name))

    def test_every_kind_of_call_carries_the_token(self):
        client = self.client(token="tok-bob")
        sid = client.create_session().session_id  # unary-unary
        run_turn(client.generate("abc", session_id=sid, max_new_tokens=2))  # unary-stream
        with client.converse(sid) as conversation:  # stream-stream
            run_turn(conversation.turn("d", max_new_tokens=2))
        metadata = [(txl_client.SESSION_METADATA_KEY, sid)]
        data = b"".join(c.data for c in client.stub.ExportSession(  # unary-stream, through the raw stub
            txl_pb2.ExportSessionRequest(session_id=sid), metadata=metadata, timeout=30))
        imported = client.stub.ImportSession(iter([txl_pb2.ImportSessionRequest(data=data)]),  # stream-unary
                                             timeout=30)
        self.assertEqual(imported.position, client.get_session(sid).position)
        self.assertEqual({s.session_id for s in client.list_sessions()}, {sid, imported.session_id})
        client.delete_session(imported.session_id)
        client.delete_session(sid)

    def test_the_interceptor_adds_the_token_to_all_four_kinds(self):
        interceptor = txl_client.BearerTokenInterceptor("t0k")
        details = txl_client._CallDetails("/txl.v1.TransformerXL/GetSession", 5, [(KEY, "x")], None, None, None)
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            seen = []
            result = getattr(interceptor, "intercept_" + kind)(lambda d, r: seen.append((d, r)) or "call",
                                                               details, "request")
            self.assertEqual(result, "call", kind)
            (got, request), = seen
            self.assertEqual(request, "request")
            self.assertEqual((got.method, got.timeout), (details.method, 5))
            self.assertEqual(list(got.metadata), [(KEY, "x"), ("authorization", "Bearer t0k")], kind)
        self.assertEqual(details.metadata, [(KEY, "x")])  # the caller's metadata is left as it was
        self.assertNotIn("t0k", repr(interceptor))
        with self.assertRaises(ValueError):
            txl_client.BearerTokenInterceptor("")

    def test_missing_or_unknown_token_is_unauthenticated(self):
        for token, details in ((None, "missing credentials"), ("tok-mallory", "invalid bearer token")):
            client = self.client(token=token)
            calls = {
                "info": client.info,
                "create_session": client.create_session,
                "list_sessions": client.list_sessions,
                "get_session": lambda: client.get_session(txl_client.new_session_id()),
                "generate": lambda: list(client.generate("hello", max_new_tokens=2)),
                "score": lambda: client.score("hello"),
                "converse": lambda: list(client.converse().turn("hello", max_new_tokens=2)),
            }
            for name, call in calls.items():
                with self.subTest(token=token, call=name):
                    e = self.assertCode(grpc.StatusCode.UNAUTHENTICATED, call, details)
                    self.assertNotIn("tok-mallory", e.details())  # never echoed

    def test_health_needs_no_token(self):
        self.assertEqual(self.client().health(), "SERVING")
        self.assertEqual(self.client(token="tok-mallory").health(), "SERVING")  # nor looks at one

    def test_failed_handshakes_are_unavailable(self):
        cases = {
            "plaintext": dict(tls_ca=None),
            "server not signed by the trusted CA": dict(tls_ca=self.path("other_ca.pem")),
            "certificate for another name": dict(tls_server_name="not-localhost"),
        }
        for name, kwargs in cases.items():
            with self.subTest(name):
                client = self.client(token="tok-alice", **kwargs)
                self.assertCode(grpc.StatusCode.UNAVAILABLE, client.info)
                self.assertCode(grpc.StatusCode.UNAVAILABLE, client.health)

    def test_mutual_tls_needs_a_client_certificate(self):
        with txl_procs.Server(ARGS.bin_dir, self.model, "--tls_cert", self.path("server.pem"),
                              "--tls_key", self.path("server.key"), "--tls_client_ca", self.path("ca.pem"),
                              "--auth_tokens", self.tokens_file) as server:
            without = self.client(server.address, token="tok-alice")
            self.assertCode(grpc.StatusCode.UNAVAILABLE, without.info)
            self.assertCode(grpc.StatusCode.UNAVAILABLE, without.health)
            with_cert = self.client(server.address, token="tok-alice", tls_cert=self.path("client.pem"),
                                    tls_key=self.path("client.key"), tls_server_name="localhost")
            self.check_works(with_cert)
            self.assertEqual(with_cert.health(), "SERVING")
            # The client certificate is no token: without one, still UNAUTHENTICATED.
            no_token = self.client(server.address, tls_cert=self.path("client.pem"), tls_key=self.path("client.key"))
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, no_token.info)
        # (The server reports its mode right after the line txl_procs waits for: read by stop().)
        self.assertIn("TLS, client certificates required (mutual TLS), %d bearer token(s)" % len(TOKENS),
                      server.output)

    def test_a_token_over_plaintext(self):
        with txl_procs.Server(ARGS.bin_dir, self.model, "--auth_tokens", self.tokens_file) as server:
            self.assertIn("warning: --auth_tokens without --tls_cert", server.output)
            recorder = make_recorder()
            client = self.client(server.address, tls_ca=None, token="tok-alice", interceptors=[recorder])
            self.check_works(client)
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED, self.client(server.address, tls_ca=None).info)
            # The caller's interceptors run before the token is added: they never see it.
            self.assertTrue(recorder.calls)
            self.assertFalse([md for _, md in recorder.calls if any(k == "authorization" for k, _ in md)])

    def test_a_certificate_without_its_key_is_a_value_error(self):
        for kwargs in (dict(tls_cert=self.path("client.pem")), dict(tls_key=self.path("client.key"))):
            with self.subTest(**kwargs), self.assertRaises(ValueError) as e:
                txl_client.TxlClient(self.address, **kwargs)
            self.assertIn("tls_cert", str(e.exception))
            self.assertIn("tls_key", str(e.exception))
        with self.assertRaises(ValueError) as e:
            txl_client.TxlClient(self.address, tls_ca=self.path("no-such.pem"))
        self.assertIn("tls_ca", str(e.exception))
        self.assertIn("no-such.pem", str(e.exception))

    def example(self, *args, env=None):
        return subprocess.run([sys.executable, os.path.join(CLIENT_DIR, "example.py"), "--server", self.address,
                               "--stubs", ARGS.stubs, "--max-new-tokens", "3", "--turn", "a\n", "--turn", "b\n",
                               *args], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, **(env or {})))

    def test_example_over_tls_with_a_token(self):
        tls = ["--tls-ca", self.path("ca.pem"), "--tls-server-name", "localhost"]
        for name, args, env in (("--token", tls + ["--token", "tok-alice"], {"TXL_TOKEN": ""}),
                                ("TXL_TOKEN", tls, {"TXL_TOKEN": "tok-bob"})):
            with self.subTest(name):
                r = self.example(*args, env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertRegex(r.stdout, r"deleted session [0-9a-f]{32}; get_session now: NOT_FOUND")
        r = self.example(*tls, env={"TXL_TOKEN": ""})
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAUTHENTICATED", r.stderr)
        r = self.example("--tls-cert", self.path("client.pem"), env={"TXL_TOKEN": ""})
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tls-cert and --tls-key go together", r.stderr)


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

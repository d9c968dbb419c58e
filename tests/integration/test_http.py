"""The HTTP front end (--http_listen) of a real txl-server on a tiny random model, spoken to with
Python's own http.client, as any OpenAI-style client would:

- health and models; /v1/completions whole and streamed (server-sent events), which agree;
- sessions over HTTP: a continuation feeds only the new text and equals a stateless replay;
- every refusal carries OpenAI's error shape and the mapped status (400, 401, 404, 405, 409, 413);
- bearer tokens and session ownership, as on gRPC; CORS only for named origins;
- a client that disconnects cancels its generation, and the session stays usable;
- 256 concurrent streams complete on the server's bounded threads.

Run by CTest: /usr/bin/python3 test_http.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import http.client
import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests


class Http:
    """One HTTP/1.1 connection to host:port."""

    def __init__(self, address, token=None):
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.token = token

    def request(self, method, path, body=None, headers=None):
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=data, headers=h)
        return self.conn.getresponse()

    def json(self, method, path, body=None, headers=None):
        r = self.request(method, path, body, headers)
        return r.status, json.loads(r.read() or b"null"), r

    def stream(self, path, body):
        """POSTs a streaming request; returns (status, [parsed events], raw text)."""
        r = self.request("POST", path, body)
        raw = r.read().decode()
        events = []
        for block in raw.split("\n\n"):
            if block.startswith("data: "):
                payload = block[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return r.status, events, raw

    def close(self):
        self.conn.close()


class HttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name, name="tiny.pt")
        cls.server = txl_procs.Server(ARGS.bin_dir, cls.model, "--http_max_body_bytes", "4096",
                                      "--max_new_tokens", "100000", http=True, metrics=True)
        cls.address = cls.server.http_address

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def setUp(self):
        self.http = Http(self.address)

    def tearDown(self):
        self.http.close()

    def assertError(self, status, body, want_status, param=None):
        self.assertEqual(status, want_status, body)
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"}, body)
        self.assertTrue(body["error"]["message"])
        if param is not None:
            self.assertEqual(body["error"]["param"], param, body)

    def test_health_and_models(self):
        for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
            status, body, _ = self.http.json("GET", path)
            self.assertEqual(status, 200, path)
        status, body, _ = self.http.json("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual([m["id"] for m in body["data"]], ["tiny"])
        self.assertEqual(body["data"][0]["txl"]["n_layer"], 2)
        status, body, _ = self.http.json("GET", "/v1/models/tiny")
        self.assertEqual((status, body["id"]), (200, "tiny"))
        self.assertError(*self.http.json("GET", "/v1/models/other")[:2], 404)

    def test_whole_and_streamed_completions_agree(self):
        req = {"model": "tiny", "prompt": "Hello there", "max_tokens": 12, "temperature": 0, "logprobs": 2}
        status, whole, _ = self.http.json("POST", "/v1/completions", req)
        self.assertEqual(status, 200, whole)
        self.assertEqual(whole["object"], "text_completion")
        choice = whole["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(whole["usage"], {"prompt_tokens": 11, "completion_tokens": 12, "total_tokens": 23})
        self.assertNotIn("session_id", whole)  # stateless, like OpenAI's
        self.assertEqual(len(choice["logprobs"]["tokens"]), 12)
        self.assertEqual("".join(choice["logprobs"]["tokens"]), choice["text"])
        for top in choice["logprobs"]["top_logprobs"]:
            self.assertLessEqual(len(top), 2)

        status, events, raw = self.http.stream("/v1/completions", dict(req, stream=True,
                                                                        stream_options={"include_usage": True}))
        self.assertEqual(status, 200, raw)
        self.assertEqual(events[-1], "[DONE]")
        usage = events[-2]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], 12)
        chunks = events[:-2]
        self.assertGreater(len(chunks), 1)  # streamed, not one block
        self.assertEqual("".join(c["choices"][0]["text"] for c in chunks), choice["text"])
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]))
        self.assertEqual(len({c["id"] for c in chunks}), 1)

        # Token ids as the prompt, and a stop sequence taken from the greedy text.
        ids = list(b"Hello there")
        status, by_ids, _ = self.http.json("POST", "/v1/completions", dict(req, prompt=ids))
        self.assertEqual(by_ids["choices"][0]["text"], choice["text"])
        stop = choice["text"][4:6]
        if stop and choice["text"].find(stop) == 4:
            status, stopped, _ = self.http.json("POST", "/v1/completions", dict(req, stop=stop))
            self.assertEqual(stopped["choices"][0]["finish_reason"], "stop")
            self.assertEqual(stopped["choices"][0]["text"], choice["text"][:4])

    def test_session_continuation_feeds_only_new_text(self):
        status, s, _ = self.http.json("POST", "/v1/sessions", {"labels": {"who": "test"}})
        self.assertEqual(status, 200, s)
        sid = s["id"]
        req = {"prompt": "Once upon", "max_tokens": 5, "temperature": 0}
        status, first, _ = self.http.json("POST", "/v1/completions", dict(req, session_id=sid))
        self.assertEqual((first["session_id"], first["position"]), (sid, 14))
        # The header names the session as well; only the new text is counted as prompt.
        status, second, _ = self.http.json("POST", "/v1/completions", dict(req, prompt=" a time"),
                                           headers={"txl-session-id": sid})
        self.assertEqual(status, 200, second)
        self.assertEqual(second["usage"]["prompt_tokens"], 7)
        self.assertEqual(second["position"], 26)
        # A stateless replay of the whole history (over gRPC, which returns token ids: a random
        # model's bytes need not be text) gives the same continuation.
        with grpc.insecure_channel(self.server.address) as channel:
            stub = txl_pb2_grpc.TransformerXLStub(channel)

            def generate(ids):
                out = list(stub.Generate(txl_pb2.GenerateRequest(
                    input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=ids)), max_new_tokens=5,
                    sampling=txl_pb2.SamplingParams(temperature=0))))
                return [t.id for r in out for t in r.tokens], "".join(r.text for r in out)

            ids1, text1 = generate(list(b"Once upon"))
            self.assertEqual(text1, first["choices"][0]["text"])
            _, text2 = generate(list(b"Once upon") + ids1 + list(b" a time"))
        self.assertEqual(text2, second["choices"][0]["text"])

        status, got, _ = self.http.json("GET", "/v1/sessions/" + sid)
        self.assertEqual((got["position"], got["labels"], got["busy"]), (26, {"who": "test"}, False))
        status, fork, _ = self.http.json("POST", "/v1/sessions/%s/fork" % sid)
        self.assertEqual((status, fork["position"]), (200, 26))
        self.assertNotEqual(fork["id"], sid)
        status, listed, _ = self.http.json("GET", "/v1/sessions")
        self.assertTrue({sid, fork["id"]} <= {x["id"] for x in listed["data"]})
        for i in (sid, fork["id"]):
            status, deleted, _ = self.http.json("DELETE", "/v1/sessions/" + i)
            self.assertEqual(deleted, {"id": i, "object": "session", "deleted": True})
        self.assertError(*self.http.json("GET", "/v1/sessions/" + sid)[:2], 404)

    def test_refusals_name_the_problem(self):
        post = lambda body, **kw: self.http.json("POST", "/v1/completions", body, **kw)[:2]  # noqa: E731
        self.assertError(*post("{not json"), 400)
        self.assertError(*post([1, 2]), 400)
        self.assertError(*post({"max_tokens": 3}), 400, "prompt")
        self.assertError(*post({"prompt": "x", "n": 2}), 400, "n")
        self.assertError(*post({"prompt": "x", "max_tokens": "many"}), 400, "max_tokens")
        self.assertError(*post({"prompt": "x", "temperature": "hot"}), 400, "temperature")
        self.assertError(*post({"prompt": "x", "echo": True}), 400, "echo")
        self.assertError(*post({"prompt": "x", "stream_options": {"include_usage": True}}), 400, "stream_options")
        self.assertError(*post({"prompt": "x", "model": "gpt-4"}), 404, "model")
        self.assertError(*post({"prompt": "x", "session_id": "0" * 32}), 404)
        status, body = post({"prompt": "x", "temperature": -1})  # the service's own validation
        self.assertError(status, body, 400)
        self.assertEqual(body["error"]["code"], "invalid_argument")
        self.assertError(*post({"prompt": "x" * 5000}), 413)
        self.http.close()
        self.http = Http(self.address)  # the server closes a connection after a 413
        self.assertError(*self.http.json("GET", "/v1/completions")[:2], 405)
        self.assertError(*self.http.json("GET", "/nowhere")[:2], 404)

    def test_busy_session_is_409_and_disconnect_cancels(self):
        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        # A long stream: read its first event, then hang up.
        sock = socket.create_connection(tuple([self.address.rsplit(":", 1)[0], int(self.address.rsplit(":", 1)[1])]))
        body = json.dumps({"prompt": "abc", "max_tokens": 100000, "stream": True, "session_id": sid}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, got)
            got += chunk
        self.assertIn(b"200 OK", got)
        self.assertIn(b"text/event-stream", got)
        # While it runs, the session is busy: 409.
        status, busy, _ = self.http.json("POST", "/v1/completions", {"prompt": "x", "session_id": sid})
        self.assertError(status, busy, 409)
        sock.close()
        # The generation stops: the session is released well before 100000 tokens.
        deadline = time.time() + 60
        while True:
            status, info, _ = self.http.json("GET", "/v1/sessions/" + sid)
            if not info["busy"]:
                break
            self.assertLess(time.time(), deadline, "the stream's generation did not stop after the disconnect")
            time.sleep(0.05)
        self.assertLess(info["position"], 100000)
        # ... and consistent: it takes the next request at the position it reports.
        status, more, _ = self.http.json("POST", "/v1/completions", {"prompt": "d", "max_tokens": 2,
                                                                      "session_id": sid})
        self.assertEqual(status, 200, more)
        self.assertEqual(more["position"], info["position"] + 3)

    def test_many_concurrent_streams(self):
        n, results, errors = 256, [], []
        lock = threading.Lock()

        def one(i):
            try:
                c = Http(self.address)
                status, events, raw = c.stream("/v1/completions", {"prompt": "s%d" % i, "max_tokens": 8,
                                                                   "stream": True, "seed": i + 1})
                c.close()
                with lock:
                    results.append((status, events[-1], sum(len(e["choices"][0]["text"]) > 0
                                                            for e in events[:-1])))
            except Exception as e:  # noqa: BLE001 (reported below)
                with lock:
                    errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(results), n)
        self.assertTrue(all(r[0] == 200 and r[1] == "[DONE]" for r in results), results[:3])
        with open("/proc/%d/status" % self.server.proc.pid) as f:
            threads_now = int([l for l in f if l.startswith("Threads:")][0].split()[1])
        self.assertLess(threads_now, 128)  # not a thread per stream

    def test_metrics_count_http_requests(self):
        self.http.json("GET", "/healthz")
        import urllib.request
        text = urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address).read().decode()
        self.assertRegex(text, r'txl_http_requests_total\{code="200",route="/healthz"\} [1-9]')


class HttpAuthTest(unittest.TestCase):
    """Bearer tokens and session ownership through HTTP, and CORS for named origins only."""

    def test_tokens_ownership_and_cors(self):
        with tempfile.TemporaryDirectory() as d:
            model = txl_procs.tiny_model(ARGS.bin_dir, d)
            tokens = os.path.join(d, "tokens.txt")
            alice, bob = "a" * 40, "b" * 40
            with open(tokens, "w") as f:
                f.write("%s alice\n%s bob\n" % (alice, bob))
            server = txl_procs.Server(ARGS.bin_dir, model, "--auth_tokens", tokens,
                                      "--http_allow_origin", "http://ui.example", http=True)
            try:
                anon = Http(server.http_address)
                status, body, _ = anon.json("POST", "/v1/sessions")
                self.assertEqual(status, 401, body)
                self.assertEqual(body["error"]["type"], "authentication_error")
                self.assertEqual(anon.json("GET", "/healthz")[0], 200)  # probes need no token
                a, b = Http(server.http_address, alice), Http(server.http_address, bob)
                status, s, _ = a.json("POST", "/v1/sessions")
                self.assertEqual(status, 200, s)
                self.assertEqual(b.json("GET", "/v1/sessions/" + s["id"])[0], 404)  # not bob's
                status, body, _ = b.json("POST", "/v1/completions", {"prompt": "x", "session_id": s["id"]})
                self.assertEqual(status, 404, body)
                status, body, _ = a.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2,
                                                                     "session_id": s["id"]})
                self.assertEqual(status, 200, body)
                # CORS: the named origin gets its header and a preflight; another origin gets neither.
                r = anon.request("OPTIONS", "/v1/completions", headers={"Origin": "http://ui.example"})
                r.read()
                self.assertEqual(r.status, 204)
                self.assertEqual(r.getheader("Access-Control-Allow-Origin"), "http://ui.example")
                r = anon.request("GET", "/healthz", headers={"Origin": "http://evil.example"})
                r.read()
                self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
                for c in (anon, a, b):
                    c.close()
            finally:
                self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__)

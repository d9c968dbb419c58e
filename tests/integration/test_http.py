"""The HTTP front end (--http_listen) of a real txl-server on a tiny random model, spoken to with
Python's own http.client, as any OpenAI-style client would:

- health and models; /v1/completions whole and streamed (server-sent events), which agree;
- sessions over HTTP: a continuation feeds only the new text and equals a stateless replay;
- every refusal carries OpenAI's error shape and the mapped status (400, 401, 404, 405, 409, 413);
- bearer tokens and session ownership, as on gRPC; CORS only for named origins;
- a client that disconnects cancels its generation, and the session stays usable;
- 256 concurrent streams complete on the server's bounded threads; on the bundled model each
  equals gRPC's greedy output for the same input;
- numbers beyond a double (1e999) or a float, and the service's refusals, are 400 naming the field
  as the client sent it (max_tokens or max_completion_tokens, never gRPC's max_new_tokens).
The drain's connections are test_http_connections.py's.

Run by CTest: /usr/bin/python3 test_http.py --bin-dir BUILD --stubs BUILD/client/python/gen --model M
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402
from http_client import Http  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests


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

    def test_n_choices_whole_streamed_and_best_of(self):
        """n choices of one prompt: choice i draws as a call seeded seed + i, streamed events carry their
        index, usage counts the prompt once; best_of keeps the n highest total log-probs, best first."""
        req = {"prompt": "Hello there", "max_tokens": 10, "temperature": 1, "seed": 42, "logprobs": 0}

        def alone(seed):
            status, body, _ = self.http.json("POST", "/v1/completions", dict(req, seed=seed))
            self.assertEqual(status, 200, body)
            lp = body["choices"][0]["logprobs"]["token_logprobs"]
            return body["choices"][0]["text"], sum(lp)

        singles = [alone(42 + i) for i in range(3)]
        status, whole, _ = self.http.json("POST", "/v1/completions", dict(req, n=3))
        self.assertEqual(status, 200, whole)
        self.assertEqual([c["index"] for c in whole["choices"]], [0, 1, 2])
        self.assertEqual([c["text"] for c in whole["choices"]], [t for t, _ in singles])
        self.assertEqual([c["finish_reason"] for c in whole["choices"]], ["length"] * 3)
        self.assertEqual(whole["usage"], {"prompt_tokens": 11, "completion_tokens": 30, "total_tokens": 41})
        self.assertEqual(len({t for t, _ in singles}), 3, "the seeds chosen draw three texts")

        status, events, raw = self.http.stream("/v1/completions", dict(req, n=3, stream=True,
                                                                        stream_options={"include_usage": True}))
        self.assertEqual(status, 200, raw)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["usage"], whole["usage"])
        texts, finishes = {}, {}
        for e in events[:-2]:
            (c,) = e["choices"]
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["finish_reason"]:
                self.assertNotIn(c["index"], finishes, "one finish per choice")
                finishes[c["index"]] = c["finish_reason"]
        self.assertEqual(texts, {i: c["text"] for i, c in enumerate(whole["choices"])})
        self.assertEqual(finishes, {0: "length", 1: "length", 2: "length"})
        order = [e["choices"][0]["index"] for e in events[:-2]]
        self.assertNotEqual(order, sorted(order), "the choices' events interleave")
        # A choice that ends first sends its finish_reason as it ends, while the others go on.
        status, events, raw = self.http.stream("/v1/completions", {
            "prompt": "x", "max_tokens": 20, "n": 8, "temperature": 1, "seed": 9, "stream": True,
            "grammar": 'root ::= "a" | "b" [a-z] [a-z] [a-z] [a-z] [a-z] [a-z]'})
        self.assertEqual(status, 200, raw)
        chunks = [e["choices"][0] for e in events[:-1]]
        ended_texts, finished_at, last_token_at = {}, {}, {}
        for k, c in enumerate(chunks):
            ended_texts[c["index"]] = ended_texts.get(c["index"], "") + c["text"]
            if c["text"]:
                last_token_at[c["index"]] = k
            if c["finish_reason"]:
                finished_at[c["index"]] = k
        short = [i for i, t in ended_texts.items() if t == "a"]
        long_ = [i for i, t in ended_texts.items() if len(t) == 7]
        self.assertTrue(short and long_ and len(short) + len(long_) == 8, ended_texts)
        self.assertLess(max(finished_at[i] for i in short), max(last_token_at[i] for i in long_))

        status, best, _ = self.http.json("POST", "/v1/completions", dict(req, n=2, best_of=3))
        self.assertEqual(status, 200, best)
        ranked = sorted(singles, key=lambda s: -s[1])
        self.assertEqual([c["text"] for c in best["choices"]], [t for t, _ in ranked[:2]])
        self.assertEqual(best["usage"]["completion_tokens"], 30, "every candidate's tokens count")

        status, chat, _ = self.http.json("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2, "temperature": 1,
            "seed": 3})
        self.assertEqual(status, 200, chat)
        self.assertEqual([c["index"] for c in chat["choices"]], [0, 1])
        self.assertEqual(chat["usage"]["completion_tokens"], 10)

        # gRPC: the same choices, each response marked with its index; each choice's last response
        # has its finish_reason, and the call's last the usage.
        with grpc.insecure_channel(self.server.address) as channel:
            stub = txl_pb2_grpc.TransformerXLStub(channel)
            responses = list(stub.Generate(txl_pb2.GenerateRequest(
                input=txl_pb2.Input(text="Hello there"), max_new_tokens=10, n=3,
                sampling=txl_pb2.SamplingParams(temperature=1, seed=42))))
        got = {}
        for r in responses:
            got[r.index] = got.get(r.index, "") + r.text
        self.assertEqual(got, texts)
        finals = [r for r in responses if r.finish_reason]
        self.assertEqual(sorted(r.index for r in finals), [0, 1, 2])
        self.assertEqual([r.HasField("usage") for r in responses], [False] * (len(responses) - 1) + [True])
        self.assertEqual((responses[-1].usage.input_tokens, responses[-1].usage.generated_tokens), (11, 30))

    def sampled_choices(self, fields, calls):
        """The choices of `calls` completions of 10 choices each at temperature 1, with `fields`."""
        for call in range(calls):
            status, body, _ = self.http.json("POST", "/v1/completions", dict({
                "prompt": "JSON: ", "max_tokens": 400, "temperature": 1, "seed": 1 + 10 * call, "n": 10}, **fields))
            self.assertEqual(status, 200, body)
            yield from body["choices"]

    def test_a_grammar_holds_100_sampled_texts_to_valid_json(self):
        """Constrained output at temperature 1 (the tiny model's random weights, its byte vocabulary): 10
        calls of 10 choices each; every text that ends (finish "stop") parses as JSON, and nearly all end
        before max_tokens."""
        grammar = r'''
root   ::= object
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( member ( ", " member )* )? "}"
member ::= string ": " value
array  ::= "[" ( value ( ", " value )* )? "]"
string ::= "\"" [a-z] [a-z]? [a-z]? "\""
number ::= "-"? [1-9] [0-9]? ( "." [0-9] )?
'''
        finished = 0
        for c in self.sampled_choices({"grammar": grammar}, calls=10):
            if c["finish_reason"] == "stop":
                finished += 1
                self.assertIsInstance(json.loads(c["text"]), dict, c["text"])
            else:
                self.assertEqual(c["finish_reason"], "length")
                self.assertTrue(c["text"].startswith("{"), c["text"])
        self.assertGreaterEqual(finished, 95)
        # Streamed, the same text; on a session, too (only its new tokens follow the grammar).
        req = {"prompt": "JSON: ", "max_tokens": 400, "temperature": 1, "seed": 3, "grammar": grammar}
        status, whole, _ = self.http.json("POST", "/v1/completions", req)
        status, events, raw = self.http.stream("/v1/completions", dict(req, stream=True))
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1]), whole["choices"][0]["text"])
        status, s, _ = self.http.json("POST", "/v1/sessions")
        status, on, _ = self.http.json("POST", "/v1/completions", dict(req, session_id=s["id"]))
        self.assertEqual(on["choices"][0]["text"], whole["choices"][0]["text"])

    # response_format's schemas for the test below: bounded strings, so that texts drawn at temperature
    # 1 from random weights end within max_tokens.
    SCHEMAS = [
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
         "required": ["name", "ok"], "additionalProperties": False},
        {"type": "array", "items": {"enum": ["red", "green", 3, None]}, "minItems": 1, "maxItems": 4},
        {"type": "object", "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "maxItems": 3}},
         "required": ["id"]},
        {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "x": {"type": "number"}, "y": {"const": "fixed"}}, "required": ["y"]}]},
        {"type": "object", "properties": {
            "inner": {"type": "object", "properties": {"v": {"type": ["string", "null"], "maxLength": 2}},
                      "required": ["v"]},
            "n": {"type": "integer"}}, "required": ["inner"]},
    ]

    def test_response_format_holds_100_sampled_texts_to_their_schemas(self):
        """response_format json_schema at temperature 1 (the tiny model's random weights): 5 schemas, 2 calls
        of 10 choices each; every text that ends (finish "stop") parses and validates against its schema
        (jsonschema, Debian's python3-jsonschema), and nearly all end before max_tokens. json_object gives
        objects, chat and gRPC take it too, and what is not supported is a 400 naming it."""
        import jsonschema
        finished = 0
        for k, schema in enumerate(self.SCHEMAS):
            fmt = {"type": "json_schema", "json_schema": {"name": "s%d" % k, "schema": schema, "strict": True}}
            for c in self.sampled_choices({"response_format": fmt}, calls=2):
                if c["finish_reason"] == "stop":
                    finished += 1
                    jsonschema.validate(json.loads(c["text"]), schema)
                else:
                    self.assertEqual(c["finish_reason"], "length")
        self.assertGreaterEqual(finished, 95)
        # Properties come in the schema's order (the body's, not sorted).
        fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": {
            "type": "object", "properties": {"zeta": {"const": 1}, "alpha": {"const": 2}},
            "required": ["zeta", "alpha"]}}}
        status, body, _ = self.http.json("POST", "/v1/completions", {
            "prompt": "JSON: ", "max_tokens": 40, "temperature": 1, "seed": 5, "response_format": fmt})
        self.assertEqual(status, 200, body)
        self.assertEqual(list(json.loads(body["choices"][0]["text"])), ["zeta", "alpha"])
        # json_object: any object. Biased towards '"' and '}' so that random weights end their strings.
        ended = 0
        for seed in range(10):
            status, body, _ = self.http.json("POST", "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "an object"}], "max_tokens": 400, "temperature": 1,
                "seed": seed, "response_format": {"type": "json_object"}, "logit_bias": {"34": 4, "125": 4}})
            self.assertEqual(status, 200, body)
            choice = body["choices"][0]
            if choice["finish_reason"] == "stop":
                ended += 1
                self.assertIsInstance(json.loads(choice["message"]["content"]), dict)
        self.assertGreaterEqual(ended, 8)
        # gRPC: the same field in the proto.
        with grpc.insecure_channel(self.server.address) as channel:
            stub = txl_pb2_grpc.TransformerXLStub(channel)
            out = list(stub.Generate(txl_pb2.GenerateRequest(
                input=txl_pb2.Input(text="JSON: "), max_new_tokens=400,
                sampling=txl_pb2.SamplingParams(temperature=1, seed=7),
                response_format=txl_pb2.ResponseFormat(type=txl_pb2.ResponseFormat.TYPE_JSON_SCHEMA,
                                                       json_schema=json.dumps(self.SCHEMAS[0])))))
            self.assertEqual(out[-1].finish_reason, txl_pb2.FINISH_REASON_STOP_TOKEN)
            jsonschema.validate(json.loads(b"".join(r.text.encode() for r in out)), self.SCHEMAS[0])
        # Refusals name the field and what is not supported.
        for fmt, param, says in [
                ({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "^a"}}},
                 "response_format.json_schema.schema", "'pattern' is not supported"),
                ({"type": "json_schema", "json_schema": {"schema": {"properties": {"a": {"minimum": 1}}}}},
                 "response_format.json_schema.schema", "properties.a: 'minimum' is not supported"),
                ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema", "'schema'"),
                ({"type": "yaml"}, "response_format.type", "json_schema"),
                ("json", "response_format", "object")]:
            status, body, _ = self.http.json("POST", "/v1/completions", {
                "prompt": "x", "max_tokens": 4, "response_format": fmt})
            self.assertError(status, body, 400, param)
            self.assertIn(says, body["error"]["message"])
        status, body, _ = self.http.json("POST", "/v1/completions", {
            "prompt": "x", "max_tokens": 4, "response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'})
        self.assertError(status, body, 400, "response_format")
        status, body, _ = self.http.json("POST", "/v1/completions", {
            "prompt": "x", "max_tokens": 4, "response_format": {"type": "text"}})
        self.assertEqual(status, 200, body)

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

    def test_bad_input_matrix(self):
        """Every refusal: OpenAI's error shape, the mapped status, and the field at fault."""
        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        msgs = [{"role": "user", "content": "hi"}]
        cases = [  # (method, path, body, status, param)
            ("POST", "/v1/completions", "{not json", 400, None),
            ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),  # invalid UTF-8
            ("POST", "/v1/completions", [1, 2], 400, None),
            ("POST", "/v1/completions", {"max_tokens": 3}, 400, "prompt"),
            ("POST", "/v1/completions", {"prompt": {"text": "x"}}, 400, "prompt"),
            ("POST", "/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
            ("POST", "/v1/completions", {"prompt": "x", "n": 2, "session_id": sid}, 400, "n"),  # one history
            ("POST", "/v1/completions", {"prompt": "x", "n": 17}, 400, "n"),  # over --max_n
            ("POST", "/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
            ("POST", "/v1/completions", {"prompt": "x", "n": 2, "echo": True}, 400, "n"),
            ("POST", "/v1/completions", {"prompt": "x", "n": 2, "best_of": 1}, 400, "best_of"),
            ("POST", "/v1/completions", {"prompt": "x", "grammar": "root ::= ("}, 400, "grammar"),
            ("POST", "/v1/completions", {"prompt": "x", "grammar": 5}, 400, "grammar"),
            ("POST", "/v1/completions", {"prompt": "x", "grammar": "root ::= root \"a\" | \"b\""}, 400,
             "grammar"),  # left-recursive
            ("POST", "/v1/completions", {"prompt": "x", "best_of": 2, "stream": True}, 400, "best_of"),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "best_of": 2}, 400,
             "best_of"),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
            ("POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
            ("POST", "/v1/completions", {"prompt": "x", "stop": 7}, 400, "stop"),
            ("POST", "/v1/completions", {"prompt": "x", "stop": ["s%d" % i for i in range(17)]}, 400, "stop"),
            ("POST", "/v1/completions", {"prompt": "x", "stop": ["y" * 257]}, 400, "stop"),
            ("POST", "/v1/completions", {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
            ("POST", "/v1/completions", {"prompt": "x", "seed": -3}, 400, "seed"),
            ("POST", "/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
            ("POST", "/v1/completions", {"prompt": "x", "session_id": 12}, 400, "session_id"),
            ("POST", "/v1/completions", {"prompt": "x", "echo": "yes"}, 400, "echo"),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, 400,
             "echo"),
            ("POST", "/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
             "stream_options"),
            ("POST", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),  # the service's check
            ("POST", "/v1/completions", {"prompt": "x", "top_p": 2}, 400, "top_p"),
            ("POST", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
            ("POST", "/v1/completions", {"prompt": "x", "session_id": "0" * 32}, 404, None),
            ("POST", "/v1/completions", {"prompt": "x", "session_id": "not-an-id"}, 404, None),  # as gRPC
            ("POST", "/v1/chat/completions", {"max_tokens": 3}, 400, "messages"),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400,
             "messages[0]"),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0]"),
            ("POST", "/v1/chat/completions", {"messages": msgs, "top_logprobs": 2}, 400, "top_logprobs"),
            ("POST", "/v1/chat/completions", {"messages": msgs, "tools": []}, 400, "tools"),
            ("POST", "/v1/sessions", {"mem_len": -1}, 400, "mem_len"),
            ("POST", "/v1/sessions", {"labels": {"a": 1}}, 400, "labels"),
            ("POST", "/v1/sessions", {"mem_len": 10 ** 9}, 400, "mem_len"),  # over --max_mem_len
            ("POST", "/v1/sessions/%s/score" % sid, {}, 400, "input"),
            ("POST", "/v1/sessions/%s/score" % sid, {"input": "x", "commit": 1}, 400, "commit"),
            ("POST", "/v1/sessions/%s/fork" % ("0" * 32), None, 404, None),
            ("DELETE", "/v1/sessions/%s" % ("0" * 32), None, 404, None),
            ("GET", "/v1/completions", None, 405, None),
            ("PUT", "/v1/sessions/%s" % sid, None, 405, None),
            ("GET", "/nowhere", None, 404, None),
        ]
        for method, path, body, want, param in cases:
            with self.subTest(method=method, path=path, body=body):
                status, got, _ = self.http.json(method, path, body)
                self.assertError(status, got, want, param)
        self.assertGreaterEqual(len(cases), 20)
        # A body over --http_max_body_bytes: 413, and the connection is closed after it.
        self.assertError(*self.http.json("POST", "/v1/completions", {"prompt": "x" * 5000})[:2], 413)
        self.http.close()
        self.http = Http(self.address)
        # The session the refusals named is as it was.
        status, after, _ = self.http.json("GET", "/v1/sessions/" + sid)
        self.assertEqual((after["position"], after["busy"]), (0, False))

    def test_refusals_name_the_field_the_client_sent(self):
        """Regression: a number that JSON allows but a double cannot hold (1e999) was refused as "not
        valid JSON" with no `param`, a double beyond a float reached the service as inf, and the
        service's refusals spoke gRPC: max_new_tokens for max_tokens (and `param` max_tokens when
        max_completion_tokens was sent), sampling.temperature, stop_sequences, logprobs without a
        `param`."""
        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        msgs = '[{"role": "user", "content": "hi"}]'
        cases = [  # (path, body, param)
            ("/v1/completions", '{"prompt": "x", "temperature": 1e999}', "temperature"),
            ("/v1/completions", '{"prompt": "x", "max_tokens": 1e999}', "max_tokens"),
            ("/v1/completions", '{"prompt": "x", "seed": -1e999}', "seed"),
            ("/v1/completions", '{"prompt": "x", "n": 1%s}' % ("0" * 400), "n"),
            ("/v1/completions", '{"prompt": [1, 1e999]}', "prompt[1]"),
            ("/v1/completions", '{"prompt": "x", "top_p": 1e300}', "top_p"),  # a double, not a float
            ("/v1/chat/completions", '{"messages": %s, "max_completion_tokens": 1e400}' % msgs,
             "max_completion_tokens"),
            ("/v1/sessions", '{"mem_len": 1e999}', "mem_len"),
            ("/v1/sessions/%s/rewind" % sid, '{"position": 1e999}', "position"),
            ("/v1/sessions/%s/score" % sid, '{"input": [1e999]}', "input[0]"),
            # The service's own checks (--max_new_tokens 100000 here), in the request's names.
            ("/v1/completions", '{"prompt": "x", "max_tokens": 100001}', "max_tokens"),
            ("/v1/chat/completions", '{"messages": %s, "max_tokens": 100001}' % msgs, "max_tokens"),
            ("/v1/chat/completions", '{"messages": %s, "max_completion_tokens": 100001}' % msgs,
             "max_completion_tokens"),
            ("/v1/completions", '{"prompt": "x", "logprobs": 21}', "logprobs"),
            ("/v1/chat/completions", '{"messages": %s, "logprobs": true, "top_logprobs": 21}' % msgs,
             "top_logprobs"),
            ("/v1/completions", '{"prompt": [1, 100000]}', "prompt"),  # outside the vocabulary
            ("/v1/completions", '{"prompt": "x", "stop": [""]}', "stop"),
            ("/v1/completions", '{"prompt": "x", "temperature": -1}', "temperature"),
            ("/v1/sessions/%s/score" % sid, '{"input": [100000]}', "input"),
        ]
        for path, body, param in cases:
            with self.subTest(path=path, body=body[:80]):
                status, got, _ = self.http.json("POST", path, body)
                self.assertError(status, got, 400, param)
                message = got["error"]["message"]
                self.assertIn(param.split("[")[0], message)
                for grpc_only in ("max_new_tokens", "sampling.", "stop_sequences", "input.", "(0:", "inf"):
                    self.assertNotIn(grpc_only, message)

    def test_chat_feeds_only_unseen_messages(self):
        req = {"max_tokens": 6, "temperature": 0}
        first_msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
        status, stateless, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=first_msgs))
        self.assertEqual(status, 200, stateless)
        self.assertEqual(stateless["object"], "chat.completion")
        self.assertEqual(stateless["choices"][0]["message"]["role"], "assistant")
        # The built-in template: "Be brief.\n\n" "USER: Hello\n" "ASSISTANT:".
        self.assertEqual(stateless["usage"]["prompt_tokens"], 11 + 12 + 10)

        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        status, one, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=first_msgs, session_id=sid))
        self.assertEqual(one["choices"][0]["message"]["content"], stateless["choices"][0]["message"]["content"])
        reply = {"role": "assistant", "content": one["choices"][0]["message"]["content"]}
        turn2 = first_msgs + [reply, {"role": "user", "content": "More"}]
        status, two, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=turn2, session_id=sid))
        self.assertEqual(status, 200, two)
        # Only the assistant's line end, "USER: More\n" and "ASSISTANT:" are fed.
        self.assertEqual(two["usage"]["prompt_tokens"], 1 + 11 + 10)
        self.assertEqual(two["position"], one["position"] + 22 + 6)
        # The same conversation replayed statelessly continues the same way.
        status, replay, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=turn2))
        self.assertEqual(replay["choices"][0]["message"]["content"], two["choices"][0]["message"]["content"])

        # A fork remembers what its source saw: the same next turn works on it.
        status, fork, _ = self.http.json("POST", "/v1/sessions/%s/fork" % sid)
        turn3 = turn2 + [{"role": "assistant", "content": two["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "Again"}]
        for target in (fork["id"], sid):
            status, three, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=turn3,
                                                                                 session_id=target))
            self.assertEqual(status, 200, three)
        # An edited history, or nothing new: refused, and the session is unchanged.
        status, before, _ = self.http.json("GET", "/v1/sessions/" + sid)
        edited = [{"role": "user", "content": "Goodbye"}] + turn3[1:]
        status, body, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=edited, session_id=sid))
        self.assertError(status, body, 409, "messages")
        status, body, _ = self.http.json("POST", "/v1/completions", {"prompt": "x", "session_id": sid})
        status, body, _ = self.http.json("POST", "/v1/chat/completions", dict(req, messages=turn3, session_id=sid))
        self.assertError(status, body, 409, "messages")  # another call moved the session
        status, after, _ = self.http.json("GET", "/v1/sessions/" + sid)
        self.assertEqual(after["position"], before["position"] + 1 + 16)  # only the completion's

        # Streamed chat: the first chunk carries the role, the text matches the whole reply.
        status, events, raw = self.http.stream("/v1/chat/completions", dict(req, messages=first_msgs, stream=True))
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual("".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]),
                         stateless["choices"][0]["message"]["content"])

    def test_http_and_grpc_agree_on_sessions(self):
        with grpc.insecure_channel(self.server.address) as channel:
            stub = txl_pb2_grpc.TransformerXLStub(channel)
            status, s, _ = self.http.json("POST", "/v1/sessions", {"labels": {"via": "http"}})
            sid = s["id"]
            g = stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid))
            self.assertEqual((g.position, dict(g.labels)), (0, {"via": "http"}))
            # Generate over gRPC, read over HTTP.
            list(stub.Generate(txl_pb2.GenerateRequest(session_id=sid, input=txl_pb2.Input(text="abc"),
                                                       max_new_tokens=4)))
            status, h, _ = self.http.json("GET", "/v1/sessions/" + sid)
            g = stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid))
            self.assertEqual((h["position"], h["memory_tokens"], h["memory_bytes"]),
                             (g.position, g.memory_tokens, g.memory_bytes))
            # Score over both, without commit: the same numbers, and nothing moves.
            status, hs, _ = self.http.json("POST", "/v1/sessions/%s/score" % sid, {"input": "the end"})
            gs = stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=txl_pb2.Input(text="the end")))
            self.assertEqual([t["id"] for t in hs["tokens"]], [t.id for t in gs.tokens])
            for a, b in zip(hs["tokens"], gs.tokens):
                self.assertAlmostEqual(a["logprob"], b.logprob, places=5)
            self.assertEqual(hs["position"], g.position)
            # Fork over gRPC, seen in the HTTP list; delete over HTTP, gone for gRPC.
            f = stub.ForkSession(txl_pb2.ForkSessionRequest(session_id=sid))
            status, listed, _ = self.http.json("GET", "/v1/sessions")
            self.assertIn(f.session_id, {x["id"] for x in listed["data"]})
            self.http.json("DELETE", "/v1/sessions/" + f.session_id)
            with self.assertRaises(grpc.RpcError) as e:
                stub.GetSession(txl_pb2.GetSessionRequest(session_id=f.session_id))
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_curl_reads_the_event_stream(self):
        run = subprocess.run(["curl", "-sN", "--max-time", "60", "-H", "Content-Type: application/json",
                              "-d", json.dumps({"prompt": "curl", "max_tokens": 5, "stream": True}),
                              "http://%s/v1/completions" % self.address], capture_output=True, text=True,
                             timeout=90)
        self.assertEqual(run.returncode, 0, run.stderr)
        blocks = [b for b in run.stdout.split("\n\n") if b]
        self.assertTrue(all(b.startswith("data: ") for b in blocks), run.stdout)
        self.assertEqual(blocks[-1], "data: [DONE]")
        self.assertEqual(json.loads(blocks[-2][6:])["choices"][0]["finish_reason"], "length")

    def open_long_stream(self, extra):
        """A streamed completion of 100000 tokens on a raw socket, read up to its first event:
        (the socket, the bytes read)."""
        host, port = self.address.rsplit(":", 1)
        body = json.dumps(dict({"prompt": "abc", "max_tokens": 100000, "stream": True}, **extra)).encode()
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, got)
            got += chunk
        return sock, got

    def test_clients_that_hang_up_mid_stream_never_crash_the_server(self):
        """Regression: a chunk's write could complete after the disconnect watch had found the
        client gone and cleared the write queue; its handler then took the front of the empty
        queue and called a freed callback (ASan: heap-use-after-free; a plain build: SIGSEGV,
        within about 20 such hang-ups)."""
        for _ in range(60):
            sock, _ = self.open_long_stream({})
            sock.close()
        self.assertIsNone(self.server.proc.poll(), "the server died")
        status, health, _ = self.http.json("GET", "/healthz")
        self.assertEqual(status, 200, health)

    def test_busy_session_is_409_and_disconnect_cancels(self):
        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        # A long stream: read its first event, then hang up.
        sock, got = self.open_long_stream({"session_id": sid})
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

    def test_a_stalled_reader_holds_only_itself(self):
        """A client that stops reading: its job pauses at the stream buffer; other requests run."""
        status, s, _ = self.http.json("POST", "/v1/sessions")
        sid = s["id"]
        host, port = self.address.rsplit(":", 1)
        stalled = socket.create_connection((host, int(port)))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps({"prompt": "abc", "max_tokens": 100000, "stream": True, "logprobs": 5,
                           "session_id": sid}).encode()
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body))
        # Never read. The session's position stops moving once the buffers are full...
        deadline, last, same = time.time() + 120, -1, 0
        while same < 3:
            self.assertLess(time.time(), deadline, "the stalled stream's generation never paused")
            status, info, _ = self.http.json("GET", "/v1/sessions/" + sid)
            same = same + 1 if info["position"] == last else 0
            last = info["position"]
            time.sleep(0.2)
        self.assertTrue(info["busy"])
        self.assertLess(info["position"], 100000)
        # ... while other work runs to completion.
        for i in range(3):
            status, other, _ = self.http.json("POST", "/v1/completions", {"prompt": "x%d" % i, "max_tokens": 20})
            self.assertEqual((status, other["usage"]["completion_tokens"]), (200, 20))
        stalled.close()

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

    def test_a_reused_connection_streams_without_delay(self):
        # Each event is a small write. With Nagle's algorithm on the server's socket, the first
        # write of a response on a kept-alive connection waits for the client's delayed ACK of
        # the previous one (40 ms or more on Linux), and the events then arrive together.
        conn = http.client.HTTPConnection(*self.address.rsplit(":", 1), timeout=60)
        body = json.dumps({"prompt": "ab", "max_tokens": 4, "stream": True})
        firsts = []
        for _ in range(6):
            start = time.monotonic()
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            line = r.readline()
            while not line.startswith(b"data:"):
                line = r.readline()
            firsts.append(time.monotonic() - start)
            rest = r.read().decode()
            self.assertIn("data: [DONE]", rest)
        conn.close()
        reused = sorted(firsts[1:])
        self.assertLess(reused[len(reused) // 2], 0.025,
                        "first event on a reused connection after (s): %s" % ["%.4f" % f for f in firsts])

    def test_metrics_count_http_requests(self):
        self.http.json("GET", "/healthz")
        import urllib.request
        text = urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address).read().decode()
        self.assertRegex(text, r'txl_http_requests_total\{code="200",route="/healthz"\} [1-9]')


class BundledStreamsTest(unittest.TestCase):
    """256 concurrent SSE streams of the bundled model, each equal to gRPC's greedy output."""

    def test_256_streams_equal_grpc_greedy(self):
        server = txl_procs.Server(ARGS.bin_dir, ARGS.model, http=True)
        try:
            n, results, errors = 256, {}, []
            lock = threading.Lock()
            # 256 different inputs in the bundled model's vocabulary (letters, no digits).
            prompts = ["Line %s%s: " % (chr(97 + i % 26), chr(97 + i // 26)) for i in range(n)]

            def one(i):
                try:
                    c = Http(server.http_address)
                    status, events, raw = c.stream("/v1/completions", {"prompt": prompts[i], "max_tokens": 8,
                                                                       "temperature": 0, "stream": True})
                    c.close()
                    self.assertEqual(status, 200, raw)
                    self.assertEqual(events[-1], "[DONE]")
                    with lock:
                        results[i] = "".join(e["choices"][0]["text"] for e in events[:-1])
                except Exception as e:  # noqa: BLE001 (reported below)
                    with lock:
                        errors.append(repr(e))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            with open("/proc/%d/status" % server.proc.pid) as f:
                threads_during = int([l for l in f if l.startswith("Threads:")][0].split()[1])
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(len(results), n)
            self.assertLess(threads_during, 128)  # not a thread per stream
            with grpc.insecure_channel(server.address) as channel:
                stub = txl_pb2_grpc.TransformerXLStub(channel)
                for i in range(n):
                    want = "".join(r.text for r in stub.Generate(txl_pb2.GenerateRequest(
                        input=txl_pb2.Input(text=prompts[i]), max_new_tokens=8,
                        sampling=txl_pb2.SamplingParams(temperature=0))))
                    self.assertEqual(results[i], want, i)
        finally:
            self.assertEqual(server.stop(), 0)


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

    def test_tls_with_the_grpc_certificate_flags(self):
        """--tls_cert/--tls_key serve HTTPS on the HTTP port; --tls_client_ca requires client certificates."""
        import ssl
        with tempfile.TemporaryDirectory() as d:
            model = txl_procs.tiny_model(ARGS.bin_dir, d)
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                            "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
            for mutual in (False, True):
                flags = ["--tls_cert", cert, "--tls_key", key] + (["--tls_client_ca", cert] if mutual else [])
                server = txl_procs.Server(ARGS.bin_dir, model, *flags, http=True)
                try:
                    host, port = server.http_address.rsplit(":", 1)
                    ctx = ssl.create_default_context(cafile=cert)
                    if mutual:
                        bare = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
                        with self.assertRaises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                            bare.request("GET", "/healthz")
                            bare.getresponse().read()
                        bare.close()
                        ctx.load_cert_chain(cert, key)
                    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
                    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "ab", "max_tokens": 3}),
                                 headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    self.assertEqual(r.status, 200)
                    self.assertEqual(json.loads(r.read())["usage"]["completion_tokens"], 3)
                    conn.close()
                    # Plain HTTP to the TLS port gets no answer.
                    plain = Http(server.http_address)
                    with self.assertRaises((ConnectionError, http.client.HTTPException)):
                        plain.json("GET", "/healthz")
                    plain.close()
                finally:
                    self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "the bundled model (the 256-stream test)"}),))

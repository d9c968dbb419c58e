"""The bundled JSON model (model/bundled/shakespeare_json.pt, scripts/train_json_model.sh): a byte-level
model trained on tinyshakespeare's speeches written half as the play writes them and half as JSON,
served by a real txl-server and held to response_format over HTTP:

- 100 generations at temperature 1 against 5 JSON Schemas (20 each: two calls of 10 choices), none of
  whose strings is bounded unless the schema says so: every one ends by itself ("stop", not
  max_tokens), parses, and validates (jsonschema, Debian's python3-jsonschema: not ours);
- json_object: 20 of 20 end as objects;
- without response_format the same model writes the play's text.

Run by CTest: /usr/bin/python3 test_json_model.py --bin-dir BUILD --stubs BUILD/client/python/gen
              --model model/bundled/shakespeare_json.pt
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402
from http_client import Http  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests

PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?\n\n"

# Shapes the corpus shows (speaker and line, lines with counts, a nested speaker, a pair) and one it
# does not (a play's card, with an enum).
SCHEMAS = [
    {"type": "object", "properties": {"speaker": {"type": "string"}, "line": {"type": "string"}},
     "required": ["speaker", "line"]},
    {"type": "object", "properties": {
        "speaker": {"type": "string"}, "lines": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                                 "maxItems": 3},
        "words": {"type": "integer"}, "question": {"type": "boolean"}},
     "required": ["speaker", "lines", "words", "question"]},
    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {
        "by": {"type": "object", "properties": {"name": {"type": "string"}, "first": {"type": "boolean"}},
               "required": ["name", "first"]},
        "reply": {"type": ["string", "null"]}},
     "required": ["by", "reply"]},
    {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "acts": {"type": "integer"}, "tragedy": {"type": "boolean"},
        "characters": {"type": "array", "items": {"enum": ["ROMEO", "JULIET", "MERCUTIO"]}, "minItems": 1,
                       "maxItems": 3}},
     "required": ["title", "acts", "tragedy", "characters"]},
]


class JsonModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = txl_procs.Server(ARGS.bin_dir, ARGS.model, http=True)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.http = Http(self.server.http_address)

    def tearDown(self):
        self.http.close()

    def choices(self, fmt, seed):
        status, body, _ = self.http.json("POST", "/v1/completions", {
            "prompt": PROMPT, "max_tokens": 1000, "temperature": 1, "n": 10, "seed": seed,
            "response_format": fmt})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["choices"]), 10)
        return body["choices"]

    def test_100_generations_against_5_schemas_all_end_and_validate(self):
        import jsonschema
        texts = 0
        for k, schema in enumerate(SCHEMAS):
            fmt = {"type": "json_schema", "json_schema": {"name": "s%d" % k, "schema": schema}}
            for seed in (1, 2):
                for c in self.choices(fmt, seed):
                    self.assertEqual(c["finish_reason"], "stop", c["text"])
                    jsonschema.validate(json.loads(c["text"]), schema)
                    texts += 1
        self.assertEqual(texts, 100)

    def test_json_object_and_plain_text(self):
        for seed in (1, 2):
            for c in self.choices({"type": "json_object"}, seed):
                self.assertEqual(c["finish_reason"], "stop", c["text"])
                self.assertIsInstance(json.loads(c["text"]), dict, c["text"])
        status, body, _ = self.http.json("POST", "/v1/completions", {
            "prompt": "ROMEO:\n", "max_tokens": 200, "temperature": 0})
        self.assertEqual(status, 200, body)
        text = body["choices"][0]["text"]
        self.assertGreater(sum(c.isalpha() or c.isspace() for c in text), 0.8 * len(text), text)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "model/bundled/shakespeare_json.pt"}),))

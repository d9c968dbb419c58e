"""The official OpenAI Python SDK against a running txl-server's HTTP port (TXL_BASE_URL).

Runs inside the SDK's own virtual environment, started by test_openai_sdk.py; it imports nothing
of this project. Greedy requests (temperature 0), so whole and streamed answers must agree.
"""
import json
import os
import unittest

import openai

PROMPT = "ROMEO:"  # 6 characters: 6 tokens of the bundled character model
# The bundled model's vocabulary: its corpus's characters, sorted; a token's id is its index.
VOCAB = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class SdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = openai.OpenAI(base_url=os.environ["TXL_BASE_URL"], api_key="unused", max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    def complete(self, **kw):
        return self.client.completions.create(**{"model": self.model, "temperature": 0, **kw})

    def chat(self, **kw):
        return self.client.chat.completions.create(
            **{"model": self.model, "temperature": 0, "messages": [{"role": "user", "content": "Speak."}], **kw})

    def test_a_completion_whole_and_streamed_agree_with_usage(self):
        whole = self.complete(prompt=PROMPT, max_tokens=12)
        self.assertEqual(whole.object, "text_completion")
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(len(whole.choices[0].text), 12)
        self.assertEqual((whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens),
                         (6, 12, 18))
        text, usage, chunks, finish = "", None, 0, None
        for chunk in self.complete(prompt=PROMPT, max_tokens=12, stream=True,
                                   stream_options={"include_usage": True}):
            chunks += 1
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        self.assertEqual(text, whole.choices[0].text)
        self.assertGreater(chunks, 2)
        self.assertEqual(finish, "length")
        self.assertEqual((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (6, 12, 18))

    def test_a_chat_whole_and_streamed_agree(self):
        whole = self.chat(max_tokens=8)
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertEqual(whole.usage.completion_tokens, 8)
        text, roles = "", set()
        for chunk in self.chat(max_tokens=8, stream=True):
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                if chunk.choices[0].delta.role:
                    roles.add(chunk.choices[0].delta.role)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(roles, {"assistant"})

    def test_a_session_continues_with_only_the_new_text(self):
        # The session extension goes through the SDK as extra body fields, and comes back as
        # extra response fields.
        session = self.client.post("/sessions", body={}, cast_to=object)
        sid = session["id"]
        first = self.complete(prompt=PROMPT, max_tokens=4, extra_body={"session_id": sid})
        self.assertEqual(first.session_id, sid)
        self.assertEqual(first.position, 10)
        second = self.complete(prompt=" and", max_tokens=5, extra_body={"session_id": sid})
        self.assertEqual(second.position, 10 + 4 + 5)
        self.assertEqual(second.usage.prompt_tokens, 4)  # only the new text was fed
        # The same history sent whole to a stateless request continues the same way.
        history = PROMPT + first.choices[0].text + " and"
        self.assertEqual(second.choices[0].text, self.complete(prompt=history, max_tokens=5).choices[0].text)
        streamed = "".join(c.choices[0].text for c in self.complete(
            prompt="", max_tokens=3, stream=True, extra_body={"session_id": sid}) if c.choices)
        self.assertEqual(len(streamed), 3)
        self.assertEqual(self.client.get("/sessions/" + sid, cast_to=object)["position"], 19 + 3)

    def test_logit_bias_and_penalties(self):
        # Sampled at temperature 1 with a seed: 'e' and 'E' are common; banned, they never come.
        kw = {"prompt": PROMPT, "max_tokens": 120, "temperature": 1, "seed": 11}
        plain = self.complete(**kw).choices[0].text
        self.assertTrue("e" in plain or "E" in plain, plain)
        bias = {str(VOCAB.index("e")): -100, str(VOCAB.index("E")): -100}
        banned = self.complete(**kw, logit_bias=bias).choices[0].text
        self.assertEqual(len(banned), 120)
        self.assertNotIn("e", banned.lower())
        self.assertEqual(self.complete(**kw, logit_bias=bias).choices[0].text, banned)  # seeded
        # Forced: every token, with top_p and in chat too.
        force = {str(VOCAB.index("z")): 100}
        self.assertEqual(self.complete(**dict(kw, max_tokens=20, top_p=0.9), logit_bias=force).choices[0].text,
                         "z" * 20)
        self.assertEqual(self.chat(max_tokens=10, logit_bias=force).choices[0].message.content, "z" * 10)
        # The penalties are OpenAI's fields; greedy output moves away from its repeats.
        greedy = self.complete(prompt=PROMPT, max_tokens=60).choices[0].text
        penalised = self.complete(prompt=PROMPT, max_tokens=60, frequency_penalty=2.0,
                                  presence_penalty=1.0).choices[0].text
        self.assertNotEqual(penalised, greedy)
        self.assertGreater(len(set(penalised)), len(set(greedy)))
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", max_tokens=1, logit_bias={"65": 1})  # the vocabulary has 65 tokens
        self.assertEqual(caught.exception.param, "logit_bias")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", max_tokens=1, presence_penalty=2.5)
        self.assertEqual(caught.exception.param, "presence_penalty")

    def test_echo_returns_the_prompt_and_its_log_probs(self):
        # Perplexity: max_tokens 0 with echo scores the prompt and generates nothing.
        text = "ROMEO:\nWhat light through yonder window breaks?"
        scored = self.complete(prompt=text, max_tokens=0, echo=True, logprobs=0)
        choice = scored.choices[0]
        self.assertEqual(choice.text, text)
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(choice.logprobs.tokens, list(text))
        self.assertIsNone(choice.logprobs.token_logprobs[0])  # nothing precedes the first
        self.assertTrue(all(lp < 0 for lp in choice.logprobs.token_logprobs[1:]))
        self.assertEqual(choice.logprobs.text_offset, list(range(len(text))))
        self.assertEqual((scored.usage.prompt_tokens, scored.usage.completion_tokens), (len(text), 0))
        # The prompt's log-probs are the model's: a greedy continuation, echoed back as a prompt,
        # scores each of its tokens with the log-prob its generation reported.
        generated = self.complete(prompt=PROMPT, max_tokens=10, logprobs=0).choices[0]
        again = self.complete(prompt=PROMPT + generated.text, max_tokens=0, echo=True, logprobs=0).choices[0]
        for got, want in zip(again.logprobs.token_logprobs[len(PROMPT):], generated.logprobs.token_logprobs):
            self.assertAlmostEqual(got, want, delta=1e-4)
        # With tokens generated: the prompt first, in the text and in the log-probs, whole and streamed.
        whole = self.complete(prompt=PROMPT, max_tokens=5, echo=True, logprobs=1).choices[0]
        self.assertEqual(whole.text, PROMPT + generated.text[:5])
        self.assertEqual(len(whole.logprobs.tokens), len(PROMPT) + 5)
        self.assertIsNone(whole.logprobs.top_logprobs[0])  # the prompt's tokens have no alternatives
        self.assertEqual(len(whole.logprobs.top_logprobs[-1]), 1)
        for got, want in zip(whole.logprobs.token_logprobs[1:len(PROMPT)], again.logprobs.token_logprobs[1:]):
            self.assertAlmostEqual(got, want, delta=1e-4)
        streamed = "".join(c.choices[0].text for c in self.complete(prompt=PROMPT, max_tokens=5, echo=True,
                                                                     stream=True) if c.choices)
        self.assertEqual(streamed, whole.text)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", max_tokens=0)
        self.assertEqual(caught.exception.param, "max_tokens")

    def test_n_and_best_of(self):
        # n choices of one prompt, each drawn as a call seeded seed + i; usage counts the prompt once.
        kw = {"prompt": PROMPT, "max_tokens": 20, "temperature": 1, "seed": 21}
        singles = [self.complete(**dict(kw, seed=21 + i, logprobs=0)).choices[0] for i in range(3)]
        three = self.complete(**kw, n=3)
        self.assertEqual([c.index for c in three.choices], [0, 1, 2])
        self.assertEqual([c.text for c in three.choices], [c.text for c in singles])
        self.assertEqual((three.usage.prompt_tokens, three.usage.completion_tokens), (6, 60))
        texts = {}
        for chunk in self.complete(**kw, n=3, stream=True):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        self.assertEqual(texts, {i: c.text for i, c in enumerate(three.choices)})
        # best_of: the n with the highest total log-prob, best first; every candidate's tokens billed.
        best = self.complete(**kw, n=2, best_of=3)
        ranked = sorted(singles, key=lambda c: -sum(c.logprobs.token_logprobs))
        self.assertEqual([c.text for c in best.choices], [c.text for c in ranked[:2]])
        self.assertEqual(best.usage.completion_tokens, 60)
        chat = self.chat(max_tokens=6, n=2, temperature=1, seed=4)
        self.assertEqual([c.index for c in chat.choices], [0, 1])
        self.assertTrue(all(c.message.role == "assistant" for c in chat.choices))
        # A session has one history: several choices on it are refused, naming n.
        session = self.client.post("/sessions", body={}, cast_to=object)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", n=2, extra_body={"session_id": session["id"]})
        self.assertEqual(caught.exception.param, "n")
        self.assertEqual(self.client.get("/sessions/" + session["id"], cast_to=object)["position"], 0)

    def test_response_format(self):
        # The bundled model's vocabulary can write an integer (its one digit is 3), not an object.
        fmt = {"type": "json_schema", "json_schema": {"name": "count", "schema": {"type": "integer"}, "strict": True}}
        choice = self.chat(max_tokens=8, response_format=fmt).choices[0]
        self.assertEqual(choice.finish_reason, "stop")
        self.assertIsInstance(json.loads(choice.message.content), int)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.chat(max_tokens=8, response_format={"type": "json_object"})
        self.assertEqual(caught.exception.param, "response_format")
        self.assertIn("vocabulary", str(caught.exception))
        fmt["json_schema"]["schema"] = {"type": "integer", "minimum": 1}
        with self.assertRaises(openai.BadRequestError) as caught:
            self.chat(max_tokens=8, response_format=fmt)
        self.assertEqual(caught.exception.param, "response_format.json_schema.schema")
        self.assertIn("'minimum' is not supported", str(caught.exception))

    def test_refusals_surface_as_the_sdks_exceptions(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", n=99)
        self.assertEqual(caught.exception.status_code, 400)
        self.assertEqual(caught.exception.param, "n")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.complete(prompt="x", max_tokens=-1)
        self.assertEqual(caught.exception.param, "max_tokens")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.chat(max_tokens=4, temperature=-1)
        self.assertEqual(caught.exception.param, "temperature")
        with self.assertRaises(openai.NotFoundError) as caught:
            self.complete(prompt="x", max_tokens=1, extra_body={"session_id": "no-such-session"})
        self.assertEqual(caught.exception.status_code, 404)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""Seeded sampling of a real txl-server against an independent Python sampler.

Run by CTest: /usr/bin/python3 test_sampling_reference.py --bin-dir BUILD --stubs BUILD/client/python/gen

The server streams tokens from a tiny random model with an adaptive softmax; this test computes
each next-token distribution with the Python reference model (tests/python/txl_reference.py, in
float64) and draws from it with its own sampler: mt19937_64 and libstdc++'s uniform in [0, 1),
one per token, then docs/API_GENERATION.md's rules (greedy; a plain temperature in token-id order; top-k and
top-p in probability order, ties to the lower id). Every path of the server (the model's draw,
its lists, its nucleus) must give these tokens, and their log-probs.
"""

import math
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python"))
import txl_procs  # noqa: E402

ARGS = None  # set by txl_procs.run_stub_tests, which also puts the stubs on sys.path

MASK64 = (1 << 64) - 1


class Mt19937_64:
    """std::mt19937_64, seeded as its constructor seeds it."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.index = 312

    def _twist(self):
        upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
        for i in range(312):
            x = (self.mt[i] & upper) | (self.mt[(i + 1) % 312] & lower)
            y = x >> 1
            if x & 1:
                y ^= 0xB5026F5AA96619E9
            self.mt[i] = self.mt[(i + 156) % 312] ^ y
        self.index = 0

    def next(self):
        if self.index >= 312:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64

    def uniform(self):
        """std::uniform_real_distribution<double>(0, 1) in libstdc++: one draw over 2^64."""
        u = float(self.next()) / 2.0 ** 64
        return u if u < 1.0 else math.nextafter(1.0, 0.0)


def sample(logprobs, temperature, top_k, top_p, u):
    """The token the documented rules give for log-probs (a list) and a uniform u."""
    n = len(logprobs)
    if temperature == 0:
        return max(range(n), key=lambda i: (logprobs[i], -i))
    best = max(logprobs)
    weight = [math.exp((lp - best) / temperature) for lp in logprobs]
    if not (0 < top_k < n) and not (0 < top_p < 1):
        goal, acc = u * math.fsum(weight), 0.0
        for i in range(n):
            acc += weight[i]
            if goal < acc:
                return i
        return n - 1
    order = sorted(range(n), key=lambda i: (-logprobs[i], i))
    if 0 < top_k < n:
        order = order[:top_k]
    if 0 < top_p < 1:
        total, mass = sum(weight[i] for i in order), 0.0
        for k, i in enumerate(order):
            mass += weight[i] / total
            if mass >= top_p:
                order = order[:k + 1]
                break
    goal, acc = u * sum(weight[i] for i in order), 0.0
    for i in order:
        acc += weight[i]
        if goal < acc:
            return i
    return order[-1]


class SamplingReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import make_checkpoint
        import txl_client
        import txl_reference
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_sampling_")
        # Clusters, so the model's lists skip or compute them: 256 bytes, a shortlist of 40.
        model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name, n_token=256, cutoffs=[40, 100], div_val=2)
        cfg, tensors, _ = make_checkpoint.load_checkpoint(model)
        cls.reference = txl_reference.Reference(cfg, tensors)
        cls.server = txl_procs.Server(ARGS.bin_dir, model)
        cls.client = txl_client.TxlClient(cls.server.address, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        cls.tmp.cleanup()

    def distribution(self, tokens):
        """log p(next | tokens) from the reference, as floats."""
        import torch
        hidden = self.reference.hidden_states(torch.tensor(tokens))
        return self.reference.log_prob_table(hidden)[-1].tolist()

    def check(self, temperature, top_k=0, top_p=0.0, seed=11, logprobs=0, n=20):
        prompt = [7, 99, 3, 150, 42]
        got = []
        for r in self.client.generate(tokens=prompt, max_new_tokens=n, temperature=temperature, top_k=top_k,
                                      top_p=top_p, seed=seed, logprobs=logprobs):
            got += [(t.id, t.logprob, [a.id for a in t.top]) for t in r.tokens]
        self.assertEqual(len(got), n)
        rng, seq = Mt19937_64(seed), list(prompt)
        for k, (token, logprob, top) in enumerate(got):
            lp = self.distribution(seq)
            u = rng.uniform() if temperature > 0 else 0.0
            want = sample(lp, temperature, top_k, top_p, u)
            where = f"token {k} (temperature {temperature}, top_k {top_k}, top_p {top_p}, u {u:.6f})"
            self.assertEqual(token, want, where)
            self.assertAlmostEqual(logprob, lp[token], places=4, msg=where)
            if logprobs:
                self.assertEqual(top, sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:logprobs], where)
            seq.append(token)
        return [t for t, _, _ in got]

    def test_greedy(self):
        self.check(0.0)
        self.check(0.0, logprobs=3)

    def test_temperature_one_is_the_models_draw(self):
        drawn = self.check(1.0)
        self.assertEqual(drawn, self.check(1.0, logprobs=2))

    def test_another_temperature_draws_over_the_whole_row(self):
        self.check(0.6)
        self.check(1.7, seed=5)

    def test_top_k_from_the_models_list(self):
        self.check(0.8, top_k=5)
        self.check(1.5, top_k=50, seed=3)
        self.check(1.0, top_k=2, logprobs=4)

    def test_top_p_from_the_models_nucleus(self):
        self.check(0.8, top_p=0.9)
        self.check(1.0, top_p=0.5, seed=8)
        self.check(2.0, top_p=0.97, logprobs=1)

    def test_top_k_and_top_p_together(self):
        self.check(0.9, top_k=10, top_p=0.7)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__.split("\n\n")[0])

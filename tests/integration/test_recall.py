"""The recall fixture needs memory: with it the model answers; without, chance. Also txl-eval's
--dtype/--kv_dtype flags (reported in its summary; bad names are flag errors).

Run by CTest: /usr/bin/python3 test_recall.py --txl-eval PATH --model tests/fixtures/recall.pt
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch  # Debian's python3-torch, to read the model's tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "..", "..", "scripts", "make_recall_corpus.py")
ARGS = None


def accuracy(text, predictions):
    """Share of queries "?k" whose answer (the char after k) was predicted."""
    hits = total = 0
    for q, ch in enumerate(text):
        if ch != "?":
            continue
        answer = q + 2  # predictions[i - 1] is the prediction for character i
        total += 1
        hits += predictions[answer - 1] == text[answer]
    return hits / total, total


class RecallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_recall_")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def corpus(self, name, *flags):
        path = os.path.join(self.tmp.name, name)
        subprocess.run([sys.executable, GENERATOR, "--examples", "150", "--seed", "77",
                        "--out", path] + list(flags), check=True)
        with open(path) as f:
            return path, f.read()

    def run_eval(self, path, *flags):
        pred_path = path + ".pred"
        proc = subprocess.run([ARGS.txl_eval, "--model", ARGS.model, "--text", path,
                               "--predictions", pred_path] + list(flags),
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(pred_path) as f:
            ids = [int(line) for line in f]
        # Map ids back to characters through the model's own tokenizer.
        extra = {"tokenizer.json": ""}
        torch.jit.load(ARGS.model, _extra_files=extra)
        symbols = json.loads(extra["tokenizer.json"])["symbols"]
        return [symbols[i] for i in ids], json.loads(proc.stdout)

    def test_memory_supplies_the_answer_across_requests(self):
        path, text = self.corpus("test.txt")
        # Requests of 32 characters: the pairs and their queries never share a request.
        preds, summary = self.run_eval(path, "--chunk", "32")
        acc, n = accuracy(text, preds)
        print("recall accuracy with memory (mem_len %d): %.3f over %d queries" % (summary["mem_len"], acc, n))
        # Chance is 0.1; answering from memory alone, the fixture gets (nearly) every query right.
        self.assertGreaterEqual(acc, 0.99)

    def test_cleared_memory_falls_to_chance(self):
        path, text = self.corpus("cleared.txt", "--cleared")
        preds, _ = self.run_eval(path, "--chunk", "32")
        acc, n = accuracy(text, preds)
        print("recall accuracy with the pairs cleared: %.3f over %d queries (chance 0.1)" % (acc, n))
        self.assertLessEqual(acc, 0.2)

    def test_window_too_short_for_the_pairs_falls_to_chance(self):
        path, text = self.corpus("short.txt")
        preds, _ = self.run_eval(path, "--chunk", "32", "--mem_len", "40")
        acc, n = accuracy(text, preds)
        print("recall accuracy with mem_len 40 (< filler): %.3f over %d queries" % (acc, n))
        # Near chance (0.1): with the shortest fillers the last pair is still in the
        # window for the first query or two, so a few are answered.
        self.assertLessEqual(acc, 0.2)

    def test_dtype_flags_are_reported_and_bad_names_refused(self):
        path, _ = self.corpus("dtype.txt")
        # Only what txl-eval reports: the numerics of each format are the model tests' business.
        _, summary = self.run_eval(path, "--chunk", "32")
        self.assertEqual((summary["dtype"], summary["kv_dtype"]), ("float32", "float32"))
        _, summary = self.run_eval(path, "--chunk", "32", "--dtype", "bfloat16", "--kv_dtype", "bfloat16")
        self.assertEqual((summary["dtype"], summary["kv_dtype"]), ("bfloat16", "bfloat16"))
        self.assertEqual(summary["kernels"], "auto")
        _, summary = self.run_eval(path, "--chunk", "32", "--kernels", "generic")
        self.assertEqual(summary["kernels"], "generic")
        for flags, message in [(["--dtype", "fp8"], "txl-eval: dtype: unknown 'fp8' (use float32, bfloat16 or int8)"),
                               (["--kv_dtype", "int8"], "txl-eval: kv_dtype: unknown 'int8' (use float32 or bfloat16)"),
                               (["--kernels", "fast"], "txl-eval: kernels: unknown 'fast' (use auto or generic)")]:
            proc = subprocess.run([ARGS.txl_eval, "--model", ARGS.model, "--text", path] + flags,
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 2, proc.stderr)  # a flag error, like the others
            self.assertIn(message, proc.stderr)
            self.assertEqual(proc.stdout, "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--txl-eval", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

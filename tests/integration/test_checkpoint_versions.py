"""Checkpoints cross libtorch versions both ways: an archive that one build writes (txl-init, and
txl-train with its training state) loads in the other build, which computes the same log-probs as
the writer. The two builds are this one (--this: build-cuda, libtorch 2.11 from PyPI's CUDA wheel)
and the main one (--other: build, Debian's libtorch 1.13); the bundled model, written by 1.13,
goes through both too.

Run by CTest in build-cuda (scripts/cuda_build.sh passes TXL_OTHER_BUILD):
  /usr/bin/python3 test_checkpoint_versions.py --this BUILD_CUDA --other BUILD --corpus FILE --model M
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile

ARGS = None
SMALL = ["--n_layer", "2", "--n_head", "2", "--d_model", "32", "--d_head", "16", "--d_inner", "64",
         "--tgt_len", "16", "--mem_len", "16", "--eval_mem_len", "24", "--eval_tgt_len", "16",
         "--eval_max_tokens", "500", "--eval_interval", "0", "--checkpoint_interval", "0", "--warmup", "2"]
# float32 on two libtorch builds (Debian's OpenBLAS, the wheel's MKL): the same math, summed in
# another order. Measured: up to 1.1e-5 on the bundled model.
TOLERANCE = 1e-4


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    return proc


def tool(build, name):
    return os.path.join(build, "tools", name)


class CheckpointVersionsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="txl_versions_")
        with open(ARGS.corpus, encoding="utf-8") as f:
            text = f.read()
        self.corpus = self.path("corpus.txt")
        with open(self.corpus, "w", encoding="utf-8") as f:
            f.write(text[:20000])
        self.text = self.path("eval.txt")
        with open(self.text, "w", encoding="utf-8") as f:
            f.write(text[50000:51500])

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def logprobs(self, build, model, name, chunk):
        out = self.path(name)
        run([tool(build, "txl-eval"), "--model", model, "--text", self.text, "--chunk", str(chunk), "--logprobs", out])
        with open(out) as f:
            return [float(x) for x in f]

    def assertSameModel(self, model, writer, reader):
        for chunk in (0, 7):
            want = self.logprobs(writer, model, "writer.%d" % chunk, chunk)
            got = self.logprobs(reader, model, "reader.%d" % chunk, chunk)
            self.assertEqual(len(got), len(want))
            self.assertGreater(len(got), 1000)
            worst = max(abs(a - b) for a, b in zip(want, got))
            self.assertLessEqual(worst, TOLERANCE, "%s written by %s, read by %s, chunk %d" %
                                 (os.path.basename(model), writer, reader, chunk))

    def test_a_fresh_model_crosses_both_ways(self):
        for writer, reader in ((ARGS.this, ARGS.other), (ARGS.other, ARGS.this)):
            with self.subTest(writer=writer):
                model = self.path("init-%s.pt" % os.path.basename(writer))
                config = self.path("config.json")
                with open(config, "w") as f:
                    f.write('{"n_layer": 3, "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64}')
                run([tool(writer, "txl-init"), "--tokenizer", "char", "--corpus", self.corpus, "--seed", "7",
                     "--config", config, "--init_std", "0.2", "--out", model])
                self.assertSameModel(model, writer, reader)

    def test_a_trained_model_and_its_training_state_cross_both_ways(self):
        for writer, reader in ((ARGS.this, ARGS.other), (ARGS.other, ARGS.this)):
            with self.subTest(writer=writer):
                model = self.path("trained-%s.pt" % os.path.basename(writer))
                run([tool(writer, "txl-train"), "--train", self.corpus, "--max_steps", "6", "--steps_this_run", "3",
                     "--out", model] + SMALL)
                self.assertSameModel(model, writer, reader)
                # The reader resumes the writer's training state and finishes the schedule.
                run([tool(reader, "txl-train"), "--train", self.corpus, "--max_steps", "6", "--resume",
                     "--out", model] + SMALL)
                self.assertSameModel(model, reader, writer)

    def test_the_bundled_model_reads_the_same_in_both(self):
        self.assertSameModel(ARGS.model, ARGS.other, ARGS.this)

    def test_the_two_builds_write_different_archive_versions(self):
        # Otherwise the test above would prove nothing: 2.x archives carry records 1.13 never wrote.
        names = {}
        for build in (ARGS.this, ARGS.other):
            model = self.path("names-%s.pt" % os.path.basename(build))
            run([tool(build, "txl-init"), "--out", model])
            with zipfile.ZipFile(model) as z:
                names[build] = {n.split("/", 1)[1] for n in z.namelist()}
        self.assertNotEqual(names[ARGS.this], names[ARGS.other])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--this", required=True, help="this build (libtorch 2.11)")
    parser.add_argument("--other", required=True, help="the build with the other libtorch (1.13)")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", required=True, help="the bundled model (written by libtorch 1.13)")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

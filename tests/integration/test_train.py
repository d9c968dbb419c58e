"""txl-train end to end: bad input, resume, data-parallel equivalence, --device.

The CUDA checks adapt to the machine: where txl-train's libtorch has no CUDA or
no GPU is visible, `--device cuda` must fail clearly; where it runs, its losses
must follow the CPU run's, resume must hold, and its checkpoint must load on the CPU.

Run by CTest: /usr/bin/python3 test_train.py --bin-dir BUILD/tools --corpus FILE
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
SMALL = ["--n_layer", "2", "--n_head", "2", "--d_model", "32", "--d_head", "16",
         "--d_inner", "64", "--tgt_len", "16", "--mem_len", "16", "--eval_mem_len", "24",
         "--eval_tgt_len", "16", "--eval_max_tokens", "2000", "--log_interval", "2",
         "--eval_interval", "0", "--checkpoint_interval", "0", "--warmup", "2", "--lr", "3e-3"]


def train(args, env=None, check=True):
    cmd = [os.path.join(ARGS.bin_dir, "txl-train")] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    return proc


def read_losses(path):
    with open(path) as f:
        return [(int(s), float(l)) for s, l in (line.split() for line in f)]


class TrainTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="txl_train_")
        self.dir = self.tmp.name
        with open(ARGS.corpus, encoding="utf-8") as f:
            text = f.read()[:60000]
        self.corpus = self.path("corpus.txt")
        with open(self.corpus, "w", encoding="utf-8") as f:
            f.write(text)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def expect_failure(self, args, fragment, code=None):
        proc = train(args, check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        if code is not None:
            self.assertEqual(proc.returncode, code, proc.stderr)
        self.assertIn(fragment, proc.stderr)
        self.assertIn("txl-train:", proc.stderr)

    def test_bad_input_gets_a_clear_error(self):
        empty = self.path("empty.txt")
        open(empty, "w").close()
        tiny = self.path("tiny.txt")
        with open(tiny, "w") as f:
            f.write("To be, or not to be: that is the question." * 3)
        bad_config = self.path("bad.json")
        with open(bad_config, "w") as f:
            f.write('{"n_head": 0}')
        out = ["--out", self.path("m.pt")]
        self.expect_failure(["--train", empty] + out, "is empty")
        self.expect_failure(["--train", self.path("missing.txt")] + out, "missing.txt")
        self.expect_failure(["--train", tiny, "--tgt_len", "64", "--batch_size", "4"] + out,
                            "shorter than one segment")
        self.expect_failure(["--train", self.corpus, "--config", bad_config] + out, "n_head")
        self.expect_failure(["--train", self.corpus, "--tokenizer", "morse"] + out, "--tokenizer")
        self.expect_failure(["--train", self.corpus] + out + ["--resume"], "trainstate")
        self.assertFalse(os.path.exists(self.path("m.pt")))

    def test_resume_continues_the_same_loss_curve(self):
        common = ["--train", self.corpus, "--batch_size", "4", "--max_steps", "12",
                  "--dropout", "0.1", "--seed", "5"] + SMALL
        train(common + ["--out", self.path("straight.pt"), "--loss_log", self.path("straight.log")])
        train(common + ["--out", self.path("resumed.pt"), "--loss_log", self.path("resumed.log"),
                        "--steps_this_run", "5"])
        self.assertEqual(len(read_losses(self.path("resumed.log"))), 5)
        train(common + ["--out", self.path("resumed.pt"), "--loss_log", self.path("resumed.log"),
                        "--resume"])
        straight = read_losses(self.path("straight.log"))
        resumed = read_losses(self.path("resumed.log"))
        self.assertEqual([s for s, _ in straight], list(range(1, 13)))
        self.assertEqual([s for s, _ in resumed], list(range(1, 13)))
        diff = max(abs(a - b) for (_, a), (_, b) in zip(straight, resumed))
        print("resume: max |loss diff| over 12 steps = %.3g" % diff)
        self.assertLess(diff, 1e-6)
        # The loss must actually move, or equality above proves little.
        self.assertLess(straight[-1][1], straight[0][1] - 0.3)

    def test_publish_adds_the_next_version_to_a_repository(self):
        common = ["--train", self.corpus, "--batch_size", "4", "--max_steps", "2"] + SMALL
        model_dir = os.path.join(self.path("repo"), "char")
        for version in (1, 2):
            proc = train(common + ["--out", self.path("m.pt"), "--seed", str(version), "--publish", model_dir])
            published = os.path.join(model_dir, str(version), "model.pt")
            self.assertIn("published " + published, proc.stdout)
            with open(self.path("m.pt"), "rb") as a, open(published, "rb") as b:
                self.assertEqual(a.read(), b.read())
        self.assertEqual(sorted(os.listdir(model_dir)), ["1", "2"])  # nothing staged left behind
        # A bad name is refused before any training (exit 2), and nothing is written.
        self.expect_failure(common + ["--out", self.path("n.pt"), "--publish", self.path(".hidden")],
                            "must be a model name", code=2)
        self.assertFalse(os.path.exists(self.path("n.pt")))

    def test_two_processes_match_one_with_twice_the_batch(self):
        common = ["--train", self.corpus, "--max_steps", "8", "--dropout", "0", "--seed", "3"] + SMALL
        train(common + ["--batch_size", "8", "--out", self.path("one.pt"),
                        "--loss_log", self.path("one.log")])
        port = txl_procs.free_port()
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            cmd = [os.path.join(ARGS.bin_dir, "txl-train")] + common + [
                "--batch_size", "4", "--out", self.path("two.pt"), "--loss_log", self.path("two.log"),
                "--publish", self.path("repo/two")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=600)
            self.assertEqual(p.returncode, 0, out + err)
        one = read_losses(self.path("one.log"))
        two = read_losses(self.path("two.log"))
        self.assertEqual(len(one), 8)
        self.assertEqual(len(two), 8)
        diff = max(abs(a - b) for (_, a), (_, b) in zip(one, two))
        print("data parallel: 2x4 vs 1x8 max |loss diff| over 8 steps = %.3g" % diff)
        self.assertLess(diff, 1e-4)
        self.assertTrue(os.path.exists(self.path("two.pt")))
        self.assertEqual(os.listdir(self.path("repo/two")), ["1"])  # rank 0 alone publishes

    def test_device_cpu_is_the_default_bit_for_bit(self):
        # Dropout on, so that the random stream is part of what must agree.
        common = ["--train", self.corpus, "--batch_size", "4", "--max_steps", "6",
                  "--dropout", "0.1", "--seed", "7"] + SMALL
        runs = {}
        for name, extra in (("default", []), ("cpu", ["--device", "cpu"])):
            os.mkdir(self.path(name))
            out = os.path.join(self.path(name), "m.pt")  # same file name: same archive record names
            proc = train(common + extra + ["--out", out, "--loss_log", os.path.join(self.path(name), "loss.log")])
            self.assertIn("starting at step 0, on cpu\n", proc.stdout)
            runs[name] = {}
            for f in ("loss.log", "m.pt", "m.pt.trainstate"):
                with open(os.path.join(self.path(name), f), "rb") as fh:
                    runs[name][f] = fh.read()
        self.assertEqual(len(runs["default"]["loss.log"].splitlines()), 6)
        for f in ("loss.log", "m.pt", "m.pt.trainstate"):
            self.assertEqual(runs["default"][f], runs["cpu"][f], f)

    def test_unknown_device_is_named(self):
        out = ["--out", self.path("m.pt")]
        self.expect_failure(["--train", self.corpus, "--device", "tpu"] + out, "'tpu'", code=2)
        self.expect_failure(["--train", self.corpus, "--device", "tpu"] + out, "unknown device", code=2)
        self.expect_failure(["--train", self.corpus, "--device", "xla"] + out, "'xla' is not supported", code=2)
        self.assertFalse(os.path.exists(self.path("m.pt")))

    def test_cuda_device(self):
        common = ["--train", self.corpus, "--batch_size", "4", "--max_steps", "8",
                  "--dropout", "0", "--seed", "11"] + SMALL
        proc = train(common + ["--device", "cuda", "--out", self.path("gpu.pt"),
                               "--loss_log", self.path("gpu.log")], check=False)
        if proc.returncode != 0:
            # No CUDA in this libtorch or no GPU: a bad flag, named, before any work.
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertIn("CUDA", proc.stderr)
            self.assertIn("'cuda'", proc.stderr)
            self.assertFalse(os.path.exists(self.path("gpu.pt")))
            self.expect_failure(common + ["--device", "cuda:0", "--out", self.path("gpu.pt")], "CUDA", code=2)
            print("cuda: unavailable here (%s); checked the error only" % proc.stderr.strip())
            return
        # A GPU ran it: the same losses as the CPU up to float rounding.
        self.assertRegex(proc.stdout, r"starting at step 0, on cuda:\d+")
        train(common + ["--out", self.path("cpu.pt"), "--loss_log", self.path("cpu.log")])
        gpu, cpu = read_losses(self.path("gpu.log")), read_losses(self.path("cpu.log"))
        self.assertEqual([s for s, _ in gpu], list(range(1, 9)))
        diff = max(abs(a - b) for (_, a), (_, b) in zip(gpu, cpu))
        print("cuda vs cpu: max |loss diff| over 8 steps = %.3g" % diff)
        self.assertLess(diff, 1e-3)
        # Its checkpoint loads in the CPU tools as it is.
        sample = self.path("sample.txt")
        with open(sample, "w", encoding="utf-8") as f:
            with open(self.corpus, encoding="utf-8") as src:
                f.write(src.read()[-2000:])
        ev = subprocess.run([os.path.join(ARGS.bin_dir, "txl-eval"), "--model", self.path("gpu.pt"),
                             "--text", sample], capture_output=True, text=True, timeout=120)
        self.assertEqual(ev.returncode, 0, ev.stderr)
        self.assertIn('"bpc"', ev.stdout)
        # Resume on the GPU (dropout on: the device generator's state is restored).
        resume = ["--train", self.corpus, "--batch_size", "4", "--max_steps", "10", "--dropout", "0.1",
                  "--seed", "5", "--device", "cuda"] + SMALL
        train(resume + ["--out", self.path("s.pt"), "--loss_log", self.path("s.log")])
        train(resume + ["--out", self.path("r.pt"), "--loss_log", self.path("r.log"), "--steps_this_run", "4"])
        train(resume + ["--out", self.path("r.pt"), "--loss_log", self.path("r.log"), "--resume"])
        straight, resumed = read_losses(self.path("s.log")), read_losses(self.path("r.log"))
        self.assertEqual([s for s, _ in resumed], list(range(1, 11)))
        diff = max(abs(a - b) for (_, a), (_, b) in zip(straight, resumed))
        print("cuda resume: max |loss diff| over 10 steps = %.3g" % diff)
        self.assertLess(diff, 1e-4)

    def test_checkpoint_loads_in_txl_eval(self):
        train(["--train", self.corpus, "--batch_size", "4", "--max_steps", "4",
               "--out", self.path("m.pt")] + SMALL)
        sample = self.path("sample.txt")
        with open(sample, "w", encoding="utf-8") as f:
            with open(self.corpus, encoding="utf-8") as src:
                f.write(src.read()[-3000:])
        proc = subprocess.run([os.path.join(ARGS.bin_dir, "txl-eval"), "--model", self.path("m.pt"),
                               "--text", sample], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn('"bpc"', proc.stdout)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--corpus", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

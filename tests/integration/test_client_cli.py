"""txl-client's subcommands against a real txl-server (loopback, tiny model).

Run by CTest: /usr/bin/python3 test_client_cli.py --bin-dir BUILD
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None


class ClientCliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_cli_")
        cls.server = txl_procs.Server(ARGS.bin_dir, txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name))
        cls.address = cls.server.address

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def client(self, *args, stdin=None):
        return subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", self.address] +
                              list(args), capture_output=True, text=True, input=stdin, timeout=120)

    def test_health_and_info(self):
        r = self.client("health")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "SERVING")
        r = self.client("info")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("n_layer: 2", r.stdout)

    def test_session_commands(self):
        created = self.client("--mem_len", "16", "create")
        self.assertEqual(created.returncode, 0, created.stderr)
        sid = created.stdout.strip()
        self.assertRegex(sid, r"^[0-9a-f]{32}$")
        gen = self.client("--session", sid, "--max_new_tokens", "5", "--temperature", "0", "generate", "hello")
        self.assertEqual(gen.returncode, 0, gen.stderr)
        self.assertIn("5 input, 5 generated", gen.stderr)
        self.assertIn("position 10", gen.stderr)
        got = self.client("sessions", "get", sid)
        self.assertIn("position=10 mem_len=16", got.stdout)
        fork = self.client("sessions", "fork", sid)
        self.assertEqual(fork.returncode, 0, fork.stderr)
        child = fork.stdout.split()[0]
        self.assertIn(child, self.client("sessions", "list").stdout)
        self.assertEqual(self.client("sessions", "delete", child).returncode, 0)
        missing = self.client("sessions", "get", child)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("NOT_FOUND", missing.stderr)

    def test_score_file(self):
        path = os.path.join(self.tmp.name, "text.txt")
        with open(path, "w") as f:
            f.write("to be or not to be")
        r = self.client("score", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        result = json.loads(r.stdout)
        self.assertEqual(result["tokens"], 18)
        self.assertEqual(result["predicted"], 17)  # a throw-away session: the first has no prediction
        self.assertGreater(result["bpc"], 0)

    def test_chat_sends_each_line_to_one_session(self):
        r = self.client("--max_new_tokens", "3", "chat", stdin="first\nsecond\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        positions = [int(p) for p in re.findall(r"position (\d+)", r.stderr)]
        self.assertEqual(positions, [6 + 3, 9 + 7 + 3])  # "first\\n" + 3, then "second\\n" + 3 more

    def test_errors_exit_non_zero_with_the_status(self):
        r = self.client("--max_new_tokens", "0", "--temperature", "-1", "generate", "x")
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        self.assertIn("sampling.temperature", r.stderr)
        self.assertEqual(self.client("frobnicate").returncode, 2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

"""txl-client's subcommands against a real txl-server (loopback, tiny model).

Run by CTest: /usr/bin/python3 test_client_cli.py --bin-dir BUILD
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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

    def test_export_and_import(self):
        sid = self.client("create").stdout.strip()
        self.assertEqual(self.client("--session", sid, "--max_new_tokens", "3", "generate", "abc").returncode, 0)
        path = os.path.join(self.tmp.name, "s.txl")
        exported = self.client("sessions", "export", sid, path)
        self.assertEqual(exported.returncode, 0, exported.stderr)
        self.assertGreater(os.path.getsize(path), 0)
        imported = self.client("sessions", "import", path)
        self.assertEqual(imported.returncode, 0, imported.stderr)
        copy = imported.stdout.split()[0]
        self.assertNotEqual(copy, sid)
        self.assertIn("position=6", imported.stdout)
        greedy = lambda s: self.client("--session", s, "--max_new_tokens", "6", "--temperature", "0",
                                       "generate", "xyz").stdout
        self.assertEqual(greedy(sid), greedy(copy))
        with open(path, "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 1]))
        damaged = self.client("sessions", "import", path)
        self.assertEqual(damaged.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", damaged.stderr)

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


class ClientChatTest(unittest.TestCase):
    """`chat` as a REPL, on a character-level model whose vocabulary has no capitals: a refused line,
    commands, and Ctrl-C cancelling a reply."""

    CORPUS = "abcdefghijklmnopqrstuvwxyz .,/\n"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_chat_")
        corpus = os.path.join(cls.tmp.name, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(cls.CORPUS)
        model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name,
                                     init_args=txl_procs.TINY_INIT_ARGS + ("--tokenizer", "char", "--corpus", corpus))
        cls.server = txl_procs.Server(ARGS.bin_dir, model, "--max_new_tokens", "1000000")
        cls.argv = [os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", cls.server.address]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def chat(self, stdin, *flags):
        r = subprocess.run(self.argv + ["--max_new_tokens", "3", *flags, "chat"], input=stdin, capture_output=True,
                           timeout=120)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_a_refused_line_is_reported_and_the_session_goes_on(self):
        code, _, err = self.chat(b"HELLO\n\xff\nhello\n/quit\nnot sent\n")
        self.assertEqual(code, 0, err)
        self.assertIn("error: INVALID_ARGUMENT: input.text: character 'H' (U+0048) at byte 0 is not in the vocabulary",
                      err)
        self.assertIn("error: INVALID_ARGUMENT: the line is not valid UTF-8", err)  # refused before sending
        # Only "hello\n" was fed: the refused lines left the session at 0, /quit ended before "not sent".
        self.assertEqual(re.findall(r"\[length: (\d+) input, 3 generated.*position (\d+)\]", err), [("6", "9")])

    def test_commands(self):
        sid = subprocess.run(self.argv + ["create"], capture_output=True, text=True, timeout=60).stdout.strip()
        code, _, err = self.chat(b"/help\n/frobnicate now\n//ab\n", "--session", sid)  # then end of input
        self.assertEqual(code, 0, err)
        self.assertIn("/quit", err)
        self.assertIn("error: INVALID_ARGUMENT: unknown command '/frobnicate'", err)
        self.assertIn("[length: 4 input, 3 generated", err)  # "/ab\n": one / taken off
        self.assertNotIn("session ", err.splitlines()[0])  # --session: no new one
        code, _, err = self.chat(b"", "--session", "0" * 32)  # only start-up errors end chat
        self.assertEqual(code, 1)
        self.assertIn("NOT_FOUND", err)

    def test_ctrl_c_cancels_the_reply_only(self):
        n = 50000  # about 5 s of tokens: a reply still streaming when the signal comes
        with subprocess.Popen(self.argv + ["--max_new_tokens", str(n), "chat"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0) as proc:
            err = b""

            def read_stderr_until(pattern):
                nonlocal err
                while not re.search(pattern, err):
                    chunk = proc.stderr.read(4096)
                    self.assertTrue(chunk, err)
                    err += chunk

            try:
                read_stderr_until(rb"> ")
                proc.send_signal(signal.SIGINT)  # at the prompt: a hint, not an exit
                read_stderr_until(rb"/quit or Ctrl-D[^\n]*\n> ")
                proc.stdin.write(b"hello\n")
                self.assertTrue(proc.stdout.read(1))  # the reply is streaming
                # Drained, so that the client never blocks writing the rest of it.
                drain = threading.Thread(target=proc.stdout.read)
                drain.start()
                proc.send_signal(signal.SIGINT)
                read_stderr_until(rb"\[cancelled[^\n]*\n")
                self.assertIsNone(proc.poll())  # still running, back at the prompt
                proc.stdin.write(b"hello again\n/quit\n")
                proc.stdin.close()
                err = (err + proc.stderr.read()).decode()
                self.assertEqual(proc.wait(timeout=120), 0, err)
                drain.join()
            finally:
                if proc.poll() is None:
                    proc.kill()
        kept = int(re.search(r"\[cancelled: position (\d+)\]", err).group(1))
        self.assertTrue(6 <= kept < 6 + n, err)  # "hello\n" and part of its reply, fed before the cancel
        self.assertIn(f"[length: 12 input, {n} generated", err)
        self.assertIn(f"position {kept + 12 + n}]", err)
        self.assertNotIn("error:", err)


def make_certificates(directory):
    """ca.pem, server.{pem,key} for localhost and client.{pem,key}, made with the openssl CLI."""
    if shutil.which("openssl") is None:
        raise RuntimeError(
            "the openssl command-line tool is missing: install the 'openssl' package (scripts/install-deps.sh)")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    with open(path("server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    with open(path("client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    steps = [["req", "-x509", *key, "-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2",
              "-subj", "/CN=txl test CA"]]
    for name in ("server", "client"):
        steps += [["req", *key, "-keyout", path(name + ".key"), "-out", path(name + ".csr"),
                   "-subj", "/CN=" + ("localhost" if name == "server" else "txl test client")],
                  ["x509", "-req", "-in", path(name + ".csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                   "-CAcreateserial", "-out", path(name + ".pem"), "-days", "2", "-extfile", path(name + ".ext")]]
    for step in steps:
        subprocess.run(["openssl", *step], check=True, capture_output=True, timeout=60)


class ClientCliSecurityTest(unittest.TestCase):
    """--tls_* and --token / TXL_TOKEN against a server with mutual TLS and bearer tokens."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_cli_sec_")
        d = cls.tmp.name
        make_certificates(d)
        with open(os.path.join(d, "tokens.txt"), "w") as f:
            f.write("# test tokens\ntok-alice alice\ntok-bob bob\n")
        cls.server = txl_procs.Server(
            ARGS.bin_dir, txl_procs.tiny_model(ARGS.bin_dir, d),
            "--tls_cert", os.path.join(d, "server.pem"), "--tls_key", os.path.join(d, "server.key"),
            "--tls_client_ca", os.path.join(d, "ca.pem"), "--auth_tokens", os.path.join(d, "tokens.txt"))
        cls.tls = ["--tls_ca", os.path.join(d, "ca.pem"), "--tls_server_name", "localhost",
                   "--tls_cert", os.path.join(d, "client.pem"), "--tls_key", os.path.join(d, "client.key")]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def client(self, *args, env_token=None):
        env = {k: v for k, v in os.environ.items() if k != "TXL_TOKEN"}
        if env_token is not None:
            env["TXL_TOKEN"] = env_token
        return subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", self.server.address,
                               "--timeout", "30"] + list(args), capture_output=True, text=True, env=env, timeout=120)

    def test_token_from_flag_or_environment_flag_wins(self):
        r = self.client(*self.tls, "--token", "tok-alice", "info")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("n_layer: 2", r.stdout)
        r = self.client(*self.tls, "info", env_token="tok-alice")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.client(*self.tls, "--token", "tok-alice", "info", env_token="tok-wrong")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.client(*self.tls, "--token", "tok-wrong", "info", env_token="tok-alice")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAUTHENTICATED: invalid bearer token", r.stderr)
        self.assertNotIn("tok-wrong", r.stderr)

    def test_without_token_unauthenticated_but_health_serves(self):
        r = self.client(*self.tls, "sessions", "list")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAUTHENTICATED", r.stderr)
        r = self.client(*self.tls, "health")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "SERVING")

    def test_without_client_certificate_or_tls_unavailable(self):
        r = self.client(*self.tls[:4], "--token", "tok-alice", "health")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)
        r = self.client("--token", "tok-alice", "health")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)
        r = self.client(*self.tls[:6], "--token", "tok-alice", "info")
        self.assertEqual(r.returncode, 2)  # --tls_cert without --tls_key
        self.assertIn("--tls_cert and --tls_key go together", r.stderr)

    def test_sessions_are_per_principal(self):
        created = self.client(*self.tls, "--token", "tok-alice", "create")
        self.assertEqual(created.returncode, 0, created.stderr)
        sid = created.stdout.strip()
        self.assertIn(sid, self.client(*self.tls, "--token", "tok-alice", "sessions", "list").stdout)
        listed = self.client(*self.tls, "--token", "tok-bob", "sessions", "list")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertNotIn(sid, listed.stdout)
        for cmd in (["sessions", "get", sid], ["sessions", "delete", sid], ["--session", sid, "generate", "x"]):
            r = self.client(*self.tls, "--token", "tok-bob", *cmd)
            self.assertEqual(r.returncode, 1, cmd)
            self.assertIn(f"NOT_FOUND: session {sid} not found", r.stderr)
        self.assertEqual(self.client(*self.tls, "--token", "tok-alice", "sessions", "delete", sid).returncode, 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

"""The official OpenAI Node SDK (npm "openai", pinned below) against a real txl-server's HTTP
port, with base_url pointing at it: completions.create and chat.completions.create, streaming and
not, the session extension, and an error's status and param (openai_sdk/check.mjs).

npm installs the SDK once into --cache (the build tree); the test needs the npm registry for that.
Run by CTest: /usr/bin/python3 test_openai_sdk.py --bin-dir BUILD --stubs BUILD/client/python/gen
              --model MODEL --cache BUILD/tests/openai_sdk
"""
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests
SDK = "openai@4.95.0"
HERE = os.path.dirname(os.path.abspath(__file__))


class OpenAiSdkTest(unittest.TestCase):
    def test_sdk_against_the_server(self):
        os.makedirs(ARGS.cache, exist_ok=True)
        marker = os.path.join(ARGS.cache, "installed-" + SDK)
        if not os.path.exists(marker):
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", ARGS.cache, SDK],
                           check=True, timeout=600)
            open(marker, "w").close()
        script = os.path.join(ARGS.cache, "check.mjs")  # beside node_modules, so "openai" resolves
        shutil.copy(os.path.join(HERE, "openai_sdk", "check.mjs"), script)
        server = txl_procs.Server(ARGS.bin_dir, ARGS.model, http=True)
        try:
            run = subprocess.run(["node", script], capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, TXL_BASE_URL="http://%s/v1" % server.http_address))
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn('"ok":true', run.stdout)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "the bundled model"}),
        ("--cache", {"required": True, "help": "where npm installs the SDK"})))

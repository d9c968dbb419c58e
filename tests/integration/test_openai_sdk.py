"""The official OpenAI Python SDK (PyPI "openai", pinned in openai_sdk/requirements.txt) against a
real txl-server's HTTP port, with base_url pointing at it: completions and chat, whole and
streamed, usage, n and best_of, response_format, a session continued through session_id, logit_bias and the
penalties, echo (the prompt's log-probs), and 400/404 refusals surfacing as the SDK's exceptions (openai_sdk/check.py).

The SDK lives in a virtual environment inside the build tree (--cache), made with this interpreter
and filled by pip from PyPI once; nothing is installed system-wide. check.py runs in that
environment, so it imports nothing of this project.
Run by CTest: /usr/bin/python3 test_openai_sdk.py --bin-dir BUILD --stubs BUILD/client/python/gen
              --model MODEL --cache BUILD/tests/openai_sdk
"""
import hashlib
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # set by run_stub_tests
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_sdk")


def sdk_python():
    """The venv's interpreter, made (or remade when the pins change) on first use."""
    requirements = os.path.join(HERE, "requirements.txt")
    with open(requirements, "rb") as f:
        pins = hashlib.sha256(f.read()).hexdigest()[:16]
    venv = os.path.join(ARGS.cache, "venv")
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, "installed-" + pins)
    if not os.path.exists(marker):
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True, timeout=300)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", "-r", requirements], check=True, timeout=600)
        open(marker, "w").close()
    return python


class OpenAiSdkTest(unittest.TestCase):
    def test_the_python_sdk_against_the_server(self):
        python = sdk_python()
        server = txl_procs.Server(ARGS.bin_dir, ARGS.model, http=True)
        try:
            run = subprocess.run([python, os.path.join(HERE, "check.py")], capture_output=True, text=True,
                                 timeout=180, env=dict(os.environ, TXL_BASE_URL="http://%s/v1" % server.http_address))
            sys.stderr.write(run.stderr)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("Ran 8 tests", run.stderr)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, extra_args=(
        ("--model", {"required": True, "help": "the bundled model"}),
        ("--cache", {"required": True, "help": "where the SDK's virtual environment lives"})))

"""The processes the integration tests start, in one place: a tiny model, a txl-server, a free port.

- free_port(): a loopback port nobody listens on (for a process that cannot pick its own).
- tiny_model(bin_dir, directory, **config): a small random model written by txl-init.
- Server(bin_dir, model, *flags, metrics=False, http=False): txl-server on 127.0.0.1:0, started and ready, with the
  addresses it reports; stop() (SIGTERM) returns its exit code; a context manager.

- run_stub_tests(namespace, doc, extra_args): the main() of a unittest script that talks gRPC
  through the generated Python stubs (--bin-dir, --stubs).
- hash64(data): base/hash.h's Hash64, for tests that write the server's checksummed formats.

A test script imports it from its own directory:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import txl_procs
"""
import argparse
import json
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import unittest

# The model every server test uses unless it says otherwise: 2 layers, fast on a CPU.
TINY_CONFIG = {"n_layer": 2, "n_head": 2, "d_model": 32, "d_head": 16, "d_inner": 64, "mem_len": 32}
TINY_INIT_ARGS = ("--init_std", "0.3")  # weights large enough that the outputs differ by input


def requested_device():
    """The --device that TXL_TEST_SERVER_FLAGS gives every test server ("cpu" without one)."""
    flags = shlex.split(os.environ.get("TXL_TEST_SERVER_FLAGS", ""))
    device = "cpu"
    for i, flag in enumerate(flags):
        if flag == "--device" and i + 1 < len(flags):
            device = flags[i + 1]
        elif flag.startswith("--device="):
            device = flag.split("=", 1)[1]
    return device


def decode_graphs_on():
    """Whether TXL_TEST_SERVER_FLAGS runs decode graphs: --cuda_graphs=on, or its default (auto) on a
    GPU."""
    flags = " ".join(shlex.split(os.environ.get("TXL_TEST_SERVER_FLAGS", "")))
    if "--cuda_graphs=on" in flags or "--cuda_graphs on" in flags:
        return True
    if "--cuda_graphs=off" in flags or "--cuda_graphs off" in flags:
        return False
    return requested_device() != "cpu"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(bin_dir, directory, name="m.pt", init_args=TINY_INIT_ARGS, **config):
    """Writes TINY_CONFIG updated with `config` as c.json in `directory` and a random model from it
    (BUILD/tools/txl-init with `init_args`) as `name` there; returns the model's path."""
    model = os.path.join(directory, name)
    config_path = os.path.join(directory, "c.json")
    with open(config_path, "w") as f:
        json.dump(dict(TINY_CONFIG, **config), f)
    subprocess.run([os.path.join(bin_dir, "tools", "txl-init"), "--config", config_path, "--out", model,
                    *init_args], check=True, capture_output=True, timeout=120)
    return model


class Server:
    """A running txl-server, started on loopback ports and ready once the constructor returns.

    Server(bin_dir, model, *flags): BUILD/server/txl-server --model MODEL --listen 127.0.0.1:0
    --metrics_listen (127.0.0.1:0 with metrics=True, else "": off) FLAGS; `flagfile` goes first, so
    that every flag after it wins. Server.from_argv(argv) runs a command line as given instead.

    address, metrics_address (None when metrics are off): what the server reported;
    lines: its output (stdout and stderr) read so far: the startup report, and the rest after stop().
    Raises RuntimeError, with the output, when the server exits before it is ready.
    """

    def __init__(self, bin_dir, model, *flags, metrics=False, http=False, flagfile=None):
        self._start(self.test_argv([os.path.join(bin_dir, "server", "txl-server")] +
                                   ([f"--flagfile={flagfile}"] if flagfile else []) +
                                   ["--model", model, "--listen", "127.0.0.1:0",
                                    "--metrics_listen", "127.0.0.1:0" if metrics else "",
                                    "--http_listen", "127.0.0.1:0" if http else "", *flags]))

    @staticmethod
    def test_argv(argv):
        """`argv` (the binary, then the test's own flags) with the environment's flags for every test
        server. TXL_TEST_SERVER_FLAGS: after the test's own (so they win): scripts/gpu_check.sh runs
        the server tests with "--device cuda" this way. TXL_TEST_SERVER_DEFAULTS: before them (so a
        test's own win): on a GPU, where several servers share the device, a --session_memory_budget
        for each."""
        defaults = shlex.split(os.environ.get("TXL_TEST_SERVER_DEFAULTS", ""))
        extra = shlex.split(os.environ.get("TXL_TEST_SERVER_FLAGS", ""))
        return [argv[0], *defaults, *argv[1:], *extra]

    @classmethod
    def from_argv(cls, argv):
        """Runs `argv` as given; a test that builds its own command line passes it through test_argv
        first, so that TXL_TEST_SERVER_FLAGS reach it too."""
        server = cls.__new__(cls)
        server._start(list(argv))
        return server

    def _start(self, argv):
        self.argv = argv
        self.address = self.metrics_address = self.http_address = None
        self.lines = []
        self._stopped = False
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # server/serve.cc reports "listening on ADDR[, metrics on ADDR]", "model PATH (...)", ...
        # and "http on ADDR" (or "http off...") in one write, once it serves.
        while not self.lines or not self.lines[-1].startswith("txl-server: http "):
            line = self.proc.stdout.readline()
            if not line:
                self.stop(timeout=30, check=False)
                raise RuntimeError("txl-server did not start: %s\n%s" % (" ".join(argv), self.output))
            self.lines.append(line)
            m = re.search(r"listening on (\S+?)(?:, metrics on (\S+))?\s*$", line)
            if m:
                self.address, self.metrics_address = m.group(1), m.group(2)
            m = re.match(r"txl-server: http on (\S+)\s*$", line)
            if m:
                self.http_address = m.group(1)
        # The suites CTest runs again on the generic path must really be on it: every server they
        # start, those with a command line of their own too.
        extra = " ".join(shlex.split(os.environ.get("TXL_TEST_SERVER_FLAGS", "")))
        if ("--kernels=generic" in extra or "--kernels generic" in extra) and "generic: libtorch ops" not in self.output:
            self.stop(timeout=30, check=False)
            raise RuntimeError("TXL_TEST_SERVER_FLAGS asks for --kernels generic, but the server reports other "
                               "kernels: %s\n%s" % (" ".join(argv), self.output))

    @property
    def output(self):
        return "".join(self.lines)

    def stop(self, timeout=60, check=True):
        """SIGTERM, then waits up to `timeout` s for the exit; returns the exit code. Past the timeout
        the server is killed, and with `check` subprocess.TimeoutExpired is raised. Stopping again
        returns the same code."""
        if self._stopped:
            return self.proc.returncode
        self._stopped = True
        hung = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired as e:
                hung = e
                self.proc.kill()
                self.proc.wait()
        self.lines.extend(self.proc.stdout.readlines())
        self.proc.stdout.close()
        if hung is not None and check:
            raise hung
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_stub_tests(namespace, doc, extra_args=()):
    """Parses --bin-dir, --stubs and `extra_args` ((flag, kwargs) pairs for add_argument), imports grpc
    and the txl.v1 stubs from --stubs, sets ARGS, grpc, txl_pb2 and txl_pb2_grpc in `namespace` (the
    script's globals()) and runs its unittests with the rest of the command line."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--bin-dir", required=True, help="the build directory")
    parser.add_argument("--stubs", required=True, help="the generated stubs (target txl_python_stubs)")
    for flag, kwargs in extra_args:
        parser.add_argument(flag, **kwargs)
    args, rest = parser.parse_known_args()
    if not os.path.isfile(os.path.join(args.stubs, "txl", "v1", "txl_pb2_grpc.py")):
        sys.exit("no generated stubs in %s: build the txl_python_stubs target" % args.stubs)
    sys.path.insert(0, args.stubs)
    import grpc  # noqa: E402
    from txl.v1 import txl_pb2, txl_pb2_grpc  # noqa: E402
    namespace.update(ARGS=args, grpc=grpc, txl_pb2=txl_pb2, txl_pb2_grpc=txl_pb2_grpc)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


def hash64(data, h=0xcbf29ce484222325):
    """base/hash.h's Hash64 (FNV-1a over 8-byte words, then the length)."""
    prime, mask = 0x100000001b3, (1 << 64) - 1
    i = 0
    while i + 8 <= len(data):
        h = ((h ^ struct.unpack_from("<Q", data, i)[0]) * prime) & mask
        i += 8
    for b in data[i:]:
        h = ((h ^ b) * prime) & mask
    return ((h ^ len(data)) * prime) & mask

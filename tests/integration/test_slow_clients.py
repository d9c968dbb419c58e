"""Clients that do not read, or leave, against a real txl-server (tiny model) (issue 13, 3 and 4).

a) 60 Generate streams on one connection whose client reads nothing: each call holds at most about
   --max_stream_buffer_bytes of output, its session stops being scheduled (the rest of the server
   goes on), and the server's resident memory grows by under 64 MiB in all.
b) --stream_stall_timeout: such streams are cancelled, their sessions released, and counted
   CANCELLED.
c) --max_sessions 1: a second unread throw-away Generate is refused while the first waits.
d) --max_connection_idle: a connection with no call in flight is closed by the server.
e) Score honours deadlines and cancels at step granularity: it keeps only the prefix it fed, is
   counted DEADLINE_EXCEEDED / CANCELLED, and its session is free right after.

Run by CTest: /usr/bin/python3 test_slow_clients.py --bin-dir BUILD --stubs BUILD/client/python/gen
"""
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
grpc = txl_pb2 = txl_pb2_grpc = None  # imported in main, once the stubs are on sys.path

MIB = 1 << 20
LONG = 100000  # tokens an unread stream asks for: far more than any buffer holds


def tokens(ids):
    return txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=ids))


def unread_request(n=4000):
    return txl_pb2.GenerateRequest(input=tokens([1, 2, 3]), max_new_tokens=n, logprobs=20)


class Node:
    def __init__(self, model, *flags):
        self.server = txl_procs.Server(ARGS.bin_dir, model, *flags, metrics=True)
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = txl_pb2_grpc.TransformerXLStub(self.channel)

    def close(self):
        self.channel.close()
        return self.server.stop(check=False)

    def rss(self):
        with open("/proc/%d/status" % self.server.proc.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

    def metrics(self):
        return urllib.request.urlopen("http://%s/metrics" % self.server.metrics_address, timeout=10).read().decode()

    def metric(self, name, labels=""):
        m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), self.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def settled(self, name, quiet=1.0, limit=60):
        """Waits until counter `name` has not moved for `quiet` s; returns its value."""
        last, since, deadline = self.metric(name), time.time(), time.time() + limit
        while time.time() < deadline:
            time.sleep(0.1)
            now = self.metric(name)
            if now != last:
                last, since = now, time.time()
            elif time.time() - since >= quiet:
                return now
        raise AssertionError("%s never settled" % name)

    def established(self):
        """TCP connections established to the server's gRPC port."""
        port = int(self.server.address.rsplit(":", 1)[1])
        count = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    parts = line.split()
                    if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "01":
                        count += 1
        return count


# A client process that opens N Generate streams on one connection, reads one response of each,
# says "started", and stops itself (SIGSTOP): from then on it reads nothing at all, as a client that
# hangs or is too slow does; its socket buffers fill and the server's writes wait.
# BDP probing is off, so each stream's HTTP/2 window stays at its initial 64 KiB. With it on, the
# client's transport keeps reading for the streams the script has not reached yet and grows their
# windows to megabytes: the first 32 streams (--max_batch) then hold their batch slots while the
# client's transport, not the server, takes in hundreds of thousands of tokens, and the last streams'
# first responses came after 40 to 90 s under ASan, and past the test's timeout in CI.
STOPPED_CLIENT = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import grpc
from txl.v1 import txl_pb2, txl_pb2_grpc
channel = grpc.insecure_channel(sys.argv[2], options=[("grpc.http2.bdp_probe", 0)])
stub = txl_pb2_grpc.TransformerXLStub(channel)
req = txl_pb2.GenerateRequest(input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=[1, 2, 3])),
                              max_new_tokens=int(sys.argv[4]), logprobs=20)
calls = [stub.Generate(req, timeout=600) for _ in range(int(sys.argv[3]))]
for c in calls:
    next(c)
print("started", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def stopped_client(test, address, streams, max_new_tokens=4000):
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_CLIENT, ARGS.stubs, address, str(streams),
                             str(max_new_tokens)], stdout=subprocess.PIPE, text=True)

    def end():
        proc.kill()
        proc.wait()
        proc.stdout.close()
    test.addCleanup(end)
    test.assertEqual(proc.stdout.readline().strip(), "started")
    return proc


class SlowClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_slow_")
        cls.model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def node(self, *flags):
        n = Node(self.model, *flags)
        self.addCleanup(n.close)
        return n

    def test_unread_streams_pin_bounded_memory_and_wait(self):
        n = self.node("--stream_stall_timeout", "600", "--max_new_tokens", str(LONG),
                      *os.environ.get("TXL_SLOW_FLAGS", "").split())
        list(n.stub.Generate(unread_request(200), timeout=60))  # warm: the model's scratch is allocated
        base = n.rss()
        stopped_client(self, n.server.address, 60, LONG)
        # Paused: generation stops (unpaused, 60 streams of LONG tokens would run for minutes).
        generated = n.settled("txl_tokens_generated_total") - 200
        grown = n.rss() - base
        print("60 unread streams: %d tokens generated (%.0f a stream), RSS +%.1f MiB" %
              (generated, generated / 60, grown / MIB), file=sys.stderr)
        if not ARGS.sanitized:  # ASan's shadow memory and quarantine grow with any allocation
            self.assertLess(grown, 64 * MIB)
        # The rest of the server goes on meanwhile.
        got = [t.id for r in n.stub.Generate(unread_request(50), timeout=60) for t in r.tokens]
        self.assertEqual(len(got), 50)

    def test_stalled_streams_are_cancelled(self):
        n = self.node("--stream_stall_timeout", "1", "--max_sessions", "1", "--max_new_tokens", str(LONG))
        stopped_client(self, n.server.address, 1, LONG)
        n.settled("txl_tokens_generated_total", quiet=0.3)
        # --max_sessions 1: the waiting stream holds the only session; another is refused, not queued up.
        with self.assertRaises(grpc.RpcError) as cm:
            list(n.stub.Generate(unread_request(10), timeout=30))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, cm.exception.details())
        deadline = time.time() + 30
        while n.metric("txl_requests_total", '{code="CANCELLED",method="Generate"}') < 1:
            self.assertLess(time.time(), deadline, "the stalled stream was never cancelled:\n" + n.metrics())
            time.sleep(0.1)
        # Its session was released: a new one fits.
        got = [t.id for r in n.stub.Generate(unread_request(5), timeout=60) for t in r.tokens]
        self.assertEqual(len(got), 5)

    def test_idle_connections_are_closed(self):
        n = self.node("--max_connection_idle", "1")
        n.stub.ListSessions(txl_pb2.ListSessionsRequest(), timeout=30)
        self.assertEqual(n.established(), 1)
        deadline = time.time() + 30
        while n.established() > 0:
            self.assertLess(time.time(), deadline, "the idle connection stayed open")
            time.sleep(0.1)
        n.stub.ListSessions(txl_pb2.ListSessionsRequest(), timeout=30)  # the client reconnects

    def test_score_honours_deadlines_and_cancel(self):
        n = self.node("--prefill_chunk", "8")  # many steps: a long Score takes seconds
        sid = n.stub.CreateSession(txl_pb2.CreateSessionRequest(), timeout=30).session_id
        long_input = [(i * 7) % 200 + 1 for i in range(60000)]
        for how in ("deadline", "cancel"):
            start = n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).position
            if how == "deadline":
                with self.assertRaises(grpc.RpcError) as cm:
                    n.stub.Score(txl_pb2.ScoreRequest(session_id=sid, input=tokens(long_input), commit=True),
                                 timeout=0.3)
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                self.assertEqual(cm.exception.code(), code)
            else:
                future = n.stub.Score.future(
                    txl_pb2.ScoreRequest(session_id=sid, input=tokens(long_input), commit=True), timeout=60)
                while not n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).busy:
                    pass
                future.cancel()
                code = grpc.StatusCode.CANCELLED
            gave_up = time.time()
            while n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).busy:
                time.sleep(0.005)
            freed = time.time() - gave_up
            position = n.stub.GetSession(txl_pb2.GetSessionRequest(session_id=sid), timeout=30).position
            print("Score %s: session free %.3f s after the client gave up; kept %d of %d tokens" %
                  (how, freed, position - start, len(long_input)), file=sys.stderr)
            self.assertLess(freed, 1.0, how)
            self.assertLess(position - start, len(long_input), "%s: the whole input was committed" % how)
            # What it kept is a prefix of the input: the same prefix scored afresh matches.
            label = '{code="%s",method="Score"}' % code.name
            deadline = time.time() + 10
            while n.metric("txl_requests_total", label) < 1:
                self.assertLess(time.time(), deadline, "Score not counted as %s" % code.name)
                time.sleep(0.05)


def main():
    txl_procs.run_stub_tests(globals(), __doc__, [
        ("--sanitized", dict(action="store_true", help="a sanitizer build: the memory bound is not checked"))])


if __name__ == "__main__":
    main()

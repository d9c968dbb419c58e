#!/usr/bin/python3
"""R1, R2: a model reload under load (--model_repository).

A repository holds model m, version 1 (a copy of --model). txl-server serves it with
--repository_poll_seconds 0.05, and --sessions gRPC streams generate on it without pause (each
stream one session; a finished generation is followed by the next). Then version 2 (the same
checkpoint, copied in whole and renamed into place, as txl-train --publish does) is published:

- R1: the reload's latency, from the rename to ListModels reporting version 2 READY (the poll
  interval, the load, the checks and the warm-up step);
- R2: the running streams' p99 inter-token gap from the rename until 0.5 s after READY, against
  their p99 gap over the same length of time just before the rename (target: at most 1.5x).

Every stream stays on version 1 throughout (the sessions keep their version); a failed request
fails the bench. Two runs by default: their figures are printed side by side.

  /usr/bin/python3 bench/reload.py --build-dir build [--model M.pt] [--sessions 8] [--runs 2]

Needs the generated Python stubs (build/client/python/gen) and Debian's python3-grpcio.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")


def publish(src, repo, version):
    staging = os.path.join(repo, "m", ".staging-%d" % version)
    os.makedirs(staging)
    shutil.copyfile(src, os.path.join(staging, "model.pt"))
    start = time.monotonic()
    os.rename(staging, os.path.join(repo, "m", str(version)))
    return start


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


class Streams:
    """`n` sessions generating without pause; every token's arrival time, per stream."""

    def __init__(self, pb2, stub, n):
        self.pb2, self.stub = pb2, stub
        self.stop = threading.Event()
        self.errors = []
        self.arrivals = [[] for _ in range(n)]  # (time, tokens in the response)
        self.models = set()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, i):
        pb2 = self.pb2
        try:
            s = self.stub.CreateSession(pb2.CreateSessionRequest(model="m"))
            self.models.add(s.model)
            text = "ROMEO:"
            while not self.stop.is_set():
                req = pb2.GenerateRequest(session_id=s.session_id, input=pb2.Input(text=text), max_new_tokens=400,
                                          sampling=pb2.SamplingParams(temperature=1.0, seed=1 + i))
                for r in self.stub.Generate(req):
                    if r.tokens:
                        self.arrivals[i].append((time.monotonic(), len(r.tokens)))
                    if self.stop.is_set():
                        break
                text = "\n"
            self.models.add(self.stub.GetSession(pb2.GetSessionRequest(session_id=s.session_id)).model)
        except Exception as e:  # noqa: BLE001 (reported by the bench)
            self.errors.append("stream %d: %r" % (i, e))

    def gaps(self, start, end):
        out = []
        for arr in self.arrivals:
            for (t0, _), (t1, k) in zip(arr, arr[1:]):
                if start <= t1 < end:
                    out.append((t1 - t0) / k)
        return out

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(120)


def one_run(args, pb2, pb2_grpc, grpc):
    with tempfile.TemporaryDirectory(prefix="txl_reload_") as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "m"))
        publish(args.model, repo, 1)
        server = subprocess.Popen(
            [os.path.join(args.build_dir, "server", "txl-server"), "--model_repository", repo,
             "--repository_poll_seconds", "0.05", "--listen", "127.0.0.1:0", "--http_listen=", "--metrics_listen="],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        address = None
        seen = []
        for line in server.stdout:
            seen.append(line)
            if "listening on " in line:
                address = line.split("listening on ")[1].split(",")[0].strip()
            if line.startswith("txl-server: http "):
                break
        if address is None:
            sys.exit("reload.py: txl-server did not start:\n" + "".join(seen))
        threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
        try:
            with grpc.insecure_channel(address) as ch:
                stub = pb2_grpc.TransformerXLStub(ch)
                streams = Streams(pb2, stub, args.sessions)
                time.sleep(args.warmup)  # the streams reach their steady rate
                published = publish(args.model, repo, 2)
                ready = None
                while ready is None and time.monotonic() - published < 120:
                    for v in stub.ListModels(pb2.ListModelsRequest()).models:
                        if v.version == 2 and v.state == "READY":
                            ready = time.monotonic()
                    time.sleep(0.002)
                time.sleep(0.6)
                streams.join()
                if ready is None:
                    sys.exit("reload.py: version 2 never became ready")
                if streams.errors:
                    sys.exit("reload.py: requests failed: %s" % streams.errors)
                if streams.models != {"m@1"}:
                    sys.exit("reload.py: a stream left version 1: %s" % streams.models)
                window = ready + 0.5 - published
                during = streams.gaps(published, ready + 0.5)
                before = streams.gaps(published - window, published)
                return {"reload_s": ready - published, "window_s": window, "p99_before_ms": 1e3 * p99(before),
                        "p99_during_ms": 1e3 * p99(during), "median_before_ms": 1e3 * statistics.median(before),
                        "gaps": (len(before), len(during))}
        finally:
            server.terminate()
            server.wait(60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.build_dir, "client", "python", "gen"))
    import grpc  # noqa: E402
    from txl.v1 import txl_pb2, txl_pb2_grpc  # noqa: E402
    rows = [one_run(args, txl_pb2, txl_pb2_grpc, grpc) for _ in range(args.runs)]
    print("model %s (%d bytes), %d streams" % (args.model, os.path.getsize(args.model), args.sessions))
    print("%-42s %s" % ("row", "  ".join("run %d" % (i + 1) for i in range(len(rows)))))
    print("%-42s %s" % ("R1 publish -> READY (s)", "  ".join("%.3f" % r["reload_s"] for r in rows)))
    print("%-42s %s" % ("   p99 gap before (ms)", "  ".join("%.2f" % r["p99_before_ms"] for r in rows)))
    print("%-42s %s" % ("   p99 gap during (ms)", "  ".join("%.2f" % r["p99_during_ms"] for r in rows)))
    print("%-42s %s" % ("R2 p99 during / before (target <= 1.5)",
                        "  ".join("%.2f" % (r["p99_during_ms"] / r["p99_before_ms"]) for r in rows)))
    print("%-42s %s" % ("   median gap before (ms)", "  ".join("%.2f" % r["median_before_ms"] for r in rows)))
    print("%-42s %s" % ("   gaps measured (before, during)", "  ".join("%d,%d" % r["gaps"] for r in rows)))


if __name__ == "__main__":
    main()

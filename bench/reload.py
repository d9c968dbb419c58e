#!/usr/bin/python3
"""R1, R2: a model reload under load (--model_repository).

A repository holds model m, version 1 (a copy of --model). txl-server serves it with
--repository_poll_seconds 0.05, and --sessions gRPC streams generate on it without pause (each
stream one session; a finished generation is followed by the next). Then versions 2, 3, ... (the
same checkpoint, copied whole into hidden directories and synced before the streams start, so
that a publish is the rename alone, as in txl-train --publish) are published:

- R1: the reload's latency, from the rename to ListModels reporting the version READY (the poll
  interval, the load, the checks and the warm-up step);
- R2: the running streams' p99 inter-token gap during reloads, against without them. One run
  publishes --reloads versions (2, 3, ...) one after another. A reload's window runs from its
  rename until 0.5 s after READY; its quiet window is as long and ends at the rename, and the
  next rename waits until a window as long as the last has passed since it ended (a quiet window
  never reaches into the reload before: one cut short is counted). The gaps of all the reload
  windows are pooled, and so are those of the quiet windows: R2 is the
  pooled p99 during over the pooled p99 without (target: at most 1.5x). One window of half a
  second holds too few gaps for its p99 to mean anything on a shared host: `--control` publishes
  nothing and shows the statistic's own spread.

A client thread calls ListModels every 2 ms throughout, so the server answers the same requests
in both kinds of window. Every stream stays on version 1 throughout (the sessions keep their
version, while the versions after it load and retire); a failed request fails the bench. Two
runs by default: their figures are printed side by side.

  /usr/bin/python3 bench/reload.py --build-dir build [--model M.pt] [--sessions 8] [--runs 2]
                                   [--reloads 10] [--control] [--server-flag=--FLAG=VALUE ...]

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


def stage(src, repo, version):
    """Copies the checkpoint into a hidden staging directory and syncs it to disk, so that
    publishing is a rename alone: the copy's writeback is not in any window."""
    staging = os.path.join(repo, "m", ".staging-%d" % version)
    os.makedirs(staging)
    dst = os.path.join(staging, "model.pt")
    shutil.copyfile(src, dst)
    with open(dst, "rb") as f:
        os.fsync(f.fileno())
    return staging


def publish(staging, repo, version):
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


class ReadyWatch:
    """ListModels every 2 ms from the streams' start to the end of the run; when each version
    was first seen READY."""

    def __init__(self, pb2, stub):
        self.pb2, self.stub = pb2, stub
        self.stop = threading.Event()
        self.cv = threading.Condition()
        self.ready = {}  # version -> time first seen READY
        self.error = None
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        try:
            while not self.stop.is_set():
                models = self.stub.ListModels(self.pb2.ListModelsRequest()).models
                now = time.monotonic()  # after the answer: READY at or before this
                for v in models:
                    if v.state == "READY" and v.version not in self.ready:
                        with self.cv:
                            self.ready[v.version] = now
                            self.cv.notify_all()
                time.sleep(0.002)
        except Exception as e:  # noqa: BLE001 (reported by wait and join)
            with self.cv:
                self.error = "ListModels: %r" % e
                self.cv.notify_all()

    def wait(self, version, deadline):
        with self.cv:
            self.cv.wait_for(lambda: version in self.ready or self.error,
                             max(0.0, deadline - time.monotonic()))
            if self.error:
                sys.exit("reload.py: %s" % self.error)
            return self.ready.get(version)

    def join(self):
        self.stop.set()
        self.thread.join(60)
        if self.error:
            sys.exit("reload.py: %s" % self.error)


def one_run(args, pb2, pb2_grpc, grpc):
    with tempfile.TemporaryDirectory(prefix="txl_reload_") as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "m"))
        publish(stage(args.model, repo, 1), repo, 1)
        staged = {} if args.control else {k + 2: stage(args.model, repo, k + 2) for k in range(args.reloads)}
        server = subprocess.Popen(
            [os.path.join(args.build_dir, "server", "txl-server"), "--model_repository", repo,
             "--repository_poll_seconds", "0.05", "--listen", "127.0.0.1:0", "--http_listen=", "--metrics_listen="]
            + args.server_flag,
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
                watch = ReadyWatch(pb2, stub)
                time.sleep(args.warmup)  # the streams reach their steady rate
                windows = []  # (published, ready)
                for k in range(args.reloads):
                    if k > 0:
                        # The next quiet window, about as long as this reload's, starts after it ends.
                        published, ready = windows[-1]
                        time.sleep(max(0.0, ready + 0.5 + (ready + 0.5 - published) + 0.3 - time.monotonic()))
                    if args.control:  # nothing published: the same windows around an 80 ms pause
                        published = time.monotonic()
                        time.sleep(0.08)
                        ready = time.monotonic()
                    else:
                        published = publish(staged[k + 2], repo, k + 2)
                        ready = watch.wait(k + 2, published + 120)
                        if ready is None:
                            sys.exit("reload.py: version %d never became ready" % (k + 2))
                    windows.append((published, ready))
                time.sleep(0.6)
                watch.join()
                streams.join()
                if streams.errors:
                    sys.exit("reload.py: requests failed: %s" % streams.errors)
                if streams.models != {"m@1"}:
                    sys.exit("reload.py: a stream left version 1: %s" % streams.models)
                during, before, cut = [], [], 0
                previous_end = 0.0
                for published, ready in windows:
                    window = ready + 0.5 - published
                    during += streams.gaps(published, ready + 0.5)
                    start = max(published - window, previous_end)  # never inside the reload before
                    cut += start > published - window
                    before += streams.gaps(start, published)
                    previous_end = ready + 0.5
                reloads = [ready - published for published, ready in windows]
                return {"reload_s": statistics.median(reloads), "reload_max_s": max(reloads),
                        "p99_before_ms": 1e3 * p99(before), "p99_during_ms": 1e3 * p99(during),
                        "median_before_ms": 1e3 * statistics.median(before),
                        "median_during_ms": 1e3 * statistics.median(during), "gaps": (len(before), len(during)),
                        "cut": cut}
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
    ap.add_argument("--reloads", type=int, default=10, help="versions published in each run")
    ap.add_argument("--server-flag", action="append", default=[],
                    help="a further txl-server flag, e.g. --server-flag=--repository_load_nice=0 (repeatable)")
    ap.add_argument("--control", action="store_true",
                    help="publish nothing: the same windows around an 80 ms pause, the statistic's own noise")
    args = ap.parse_args()
    if args.reloads < 1 or args.runs < 1 or args.sessions < 1:
        sys.exit("reload.py: --reloads, --runs and --sessions must be at least 1")
    sys.path.insert(0, os.path.join(args.build_dir, "client", "python", "gen"))
    import grpc  # noqa: E402
    from txl.v1 import txl_pb2, txl_pb2_grpc  # noqa: E402
    rows = [one_run(args, txl_pb2, txl_pb2_grpc, grpc) for _ in range(args.runs)]
    print("model %s (%d bytes), %d streams, %d %s a run%s" % (
        args.model, os.path.getsize(args.model), args.sessions, args.reloads,
        "reload" if args.reloads == 1 else "reloads", ", control (nothing published)" if args.control else ""))
    if args.server_flag:
        print("txl-server flags: %s" % " ".join(args.server_flag))
    print("%-42s %s" % ("row", "  ".join("run %d" % (i + 1) for i in range(len(rows)))))
    print("%-42s %s" % ("R1 publish -> READY, median (s)", "  ".join("%.3f" % r["reload_s"] for r in rows)))
    print("%-42s %s" % ("   slowest reload (s)", "  ".join("%.3f" % r["reload_max_s"] for r in rows)))
    print("%-42s %s" % ("   p99 gap without (ms)", "  ".join("%.2f" % r["p99_before_ms"] for r in rows)))
    print("%-42s %s" % ("   p99 gap during (ms)", "  ".join("%.2f" % r["p99_during_ms"] for r in rows)))
    print("%-42s %s" % ("R2 p99 during / without (target <= 1.5)",
                        "  ".join("%.2f" % (r["p99_during_ms"] / r["p99_before_ms"]) for r in rows)))
    print("%-42s %s" % ("   median gap without / during (ms)",
                        "  ".join("%.2f/%.2f" % (r["median_before_ms"], r["median_during_ms"]) for r in rows)))
    print("%-42s %s" % ("   gaps measured (without, during)", "  ".join("%d,%d" % r["gaps"] for r in rows)))
    print("%-42s %s" % ("   quiet windows cut short", "  ".join("%d" % r["cut"] for r in rows)))

if __name__ == "__main__":
    main()

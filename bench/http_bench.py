#!/usr/bin/python3
"""H1: streaming over HTTP (server-sent events) against a txl-server started here.

For each concurrency level N (--streams, default 1,8,32), N clients run at once, each on
its own session (POST /v1/sessions) and its own keep-alive connection, each doing T turns
(--turns) of POST /v1/completions with "stream": true, "max_tokens": K (--tokens),
"temperature": 0 and stream_options.include_usage, reading every `data:` event until
`data: [DONE]`. Each turn's prompt is appended to the session, so turns continue a history.

Per level it reports the aggregate generated tokens/s (usage's completion_tokens of every
stream / wall time from the start of all clients to the end of the last one), the client's
time to the first event of a stream (median), and the gaps between consecutive token events
of a stream (median and p90, pooled over all streams). The server sends one event per
GenerateResponse, which may carry more than one token; the table's tokens/event column says
whether it did (1.00: one event per token, so a gap is a per-token time). The gaps are what
this one Python process sees: when the server outruns the reader, several events wait in the
socket buffer and their gaps are near 0, so the tokens/s column is the figure to compare.
By default each client keeps one keep-alive connection, as the OpenAI SDKs do;
--fresh-connections opens a new one for every completion (compare the two to see what the
connection reuse costs, e.g. Nagle's algorithm with delayed ACKs on later turns).

Every stream must answer 200, end with [DONE], carry a usage event and, with
finish_reason "length", exactly K tokens; a stream ended earlier by "stop" is counted and
reported ("early stops"), not a failure. Any HTTP error, error event or malformed stream is
a failure: a message on stderr and exit code 1.

Standard library only; runs with /usr/bin/python3. Reuses bench/harness_base.py's Server
(free port, the "listening" line, SIGTERM at the end); the server gets OMP_WAIT_POLICY=PASSIVE.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness_base import REPO, HarnessError, Server, Tools  # noqa: E402

PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "KING HENRY:", "MACBETH:", "OTHELLO:", "PORTIA:", "LEAR:"]
HTTP_TIMEOUT = 300


def log(msg):
    print("http_bench.py: " + msg, file=sys.stderr, flush=True)


def p90(values):
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=10, method="inclusive")[8]


def median(values):
    return statistics.median(values) if values else None


class Client:
    """One HTTP/1.1 keep-alive connection to host:port; raises HarnessError on any HTTP error."""

    def __init__(self, host, port):
        self.conn = http.client.HTTPConnection(host, port, timeout=HTTP_TIMEOUT)

    def close(self):
        self.conn.close()

    def json_call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            r = self.conn.getresponse()
            text = r.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            raise HarnessError("%s %s: %s: %s" % (method, path, type(e).__name__, e))
        if r.status != 200:
            raise HarnessError("%s %s: HTTP %d: %s" % (method, path, r.status, text[:500]))
        return json.loads(text) if text else {}

    def stream(self, body):
        """One streamed completion. Returns a dict of what the client saw, with times."""
        data = json.dumps(body).encode()
        what = "POST /v1/completions (session %s)" % body.get("session_id", "-")
        events = []  # perf_counter of each event that carries a choice with text
        finish = None
        usage = None
        text = []
        done = False
        try:
            t0 = time.perf_counter()
            self.conn.request("POST", "/v1/completions", body=data, headers={"Content-Type": "application/json"})
            r = self.conn.getresponse()
            if r.status != 200:
                raise HarnessError("%s: HTTP %d: %s" % (what, r.status, r.read().decode("utf-8", "replace")[:500]))
            ctype = r.getheader("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise HarnessError("%s: Content-Type %r, not text/event-stream" % (what, ctype))
            first = None
            while True:
                line = r.readline()
                now = time.perf_counter()
                if not line:
                    break  # end of the body
                line = line.decode("utf-8", "replace").rstrip("\r\n")
                if not line.startswith("data:"):
                    continue  # the blank line between events, or a comment
                payload = line[5:].strip()
                if first is None:
                    first = now
                if done:
                    raise HarnessError("%s: an event after [DONE]: %s" % (what, payload[:200]))
                if payload == "[DONE]":
                    done = True
                    continue
                ev = json.loads(payload)
                if "error" in ev:
                    raise HarnessError("%s: error event: %s" % (what, json.dumps(ev["error"])))
                if ev.get("usage"):
                    usage = ev["usage"]
                for c in ev.get("choices") or []:
                    if c.get("text"):
                        events.append(now)
                        text.append(c["text"])
                    if c.get("finish_reason"):
                        finish = c["finish_reason"]
            r.read()
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise HarnessError("%s: %s: %s" % (what, type(e).__name__, e))
        if not done:
            raise HarnessError("%s: the stream ended without data: [DONE]" % what)
        if usage is None:
            raise HarnessError("%s: no usage event (stream_options.include_usage)" % what)
        if finish is None:
            raise HarnessError("%s: no event with a finish_reason" % what)
        return {"t0": t0, "first": first, "events": events, "finish": finish,
                "tokens": usage.get("completion_tokens"), "text": "".join(text)}


def run_level(host, port, streams, turns, tokens, seed, fresh=False, stop=None):
    """N clients at once, each T turns on its own session. Returns the level's figures.
    fresh: a new connection for each completion instead of one keep-alive connection per client."""
    sessions, clients = [], []
    try:
        for i in range(streams):
            c = Client(host, port)
            clients.append(c)
            sessions.append(c.json_call("POST", "/v1/sessions", {"labels": {"bench": "http_bench"}})["id"])
        barrier = threading.Barrier(streams + 1)
        results = [[] for _ in range(streams)]
        errors = []

        def work(i):
            try:
                barrier.wait()
                for t in range(turns):
                    prompt = PROMPTS[i % len(PROMPTS)] if t == 0 else "\n" + PROMPTS[(i + t) % len(PROMPTS)]
                    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}, "session_id": sessions[i]}
                    if seed:
                        body["seed"] = seed
                    if stop:
                        body["stop"] = stop
                    if fresh:
                        clients[i].close()  # http.client connects again on the next request
                    results[i].append(clients[i].stream(body))
            except threading.BrokenBarrierError:
                pass
            except HarnessError as e:
                errors.append("stream %d: %s" % (i, e))
            except Exception as e:  # noqa: BLE001 -- anything else is a failure too, with its name
                errors.append("stream %d: %s: %s" % (i, type(e).__name__, e))

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(streams)]
        for th in threads:
            th.start()
        barrier.wait()
        start = time.perf_counter()
        for th in threads:
            th.join()
        wall = time.perf_counter() - start
        if errors:
            raise HarnessError("%d of %d streams failed; first: %s" % (len(errors), streams, errors[0]))
    finally:
        for c, sid in zip(clients, sessions):
            try:
                c.json_call("DELETE", "/v1/sessions/" + sid)
            except HarnessError as e:
                log("cleanup: %s" % e)
        for c in clients:
            c.close()

    all_streams = [s for per in results for s in per]
    gaps, ttfe, bad, early = [], [], [], []
    n_tokens = n_events = 0
    for i, per in enumerate(results):
        for t, s in enumerate(per):
            n_tokens += s["tokens"]
            n_events += len(s["events"])
            ttfe.append(s["first"] - s["t0"])
            gaps += [b - a for a, b in zip(s["events"], s["events"][1:])]
            if s["finish"] == "length":
                if s["tokens"] != tokens:
                    bad.append("stream %d turn %d: finish_reason length with %d tokens, expected %d" %
                               (i, t, s["tokens"], tokens))
            elif s["finish"] == "stop":
                early.append({"stream": i, "turn": t, "tokens": s["tokens"]})
            else:
                bad.append("stream %d turn %d: finish_reason %r" % (i, t, s["finish"]))
    if len(all_streams) != streams * turns:
        bad.append("%d streams completed, expected %d" % (len(all_streams), streams * turns))
    if bad:
        raise HarnessError("; ".join(bad[:5]) + (" (and %d more)" % (len(bad) - 5) if len(bad) > 5 else ""))
    return {"streams": streams, "turns": turns, "max_tokens": tokens, "wall_seconds": wall,
            "generated_tokens": n_tokens, "events": n_events, "tokens_per_second": n_tokens / wall,
            "tokens_per_event": n_tokens / n_events if n_events else None,
            "gap_median_ms": 1e3 * median(gaps) if gaps else None,
            "gap_p90_ms": 1e3 * p90(gaps) if gaps else None,
            "ttfe_median_ms": 1e3 * median(ttfe), "early_stops": early}


def wait_http(server, timeout=30):
    """The HTTP address from the server's "http on H:P" line, once /readyz answers 200."""
    deadline = time.time() + timeout
    addr = None
    while addr is None:
        for _, line in list(server.lines):
            m = re.search(r"txl-server: http (on (\S+)|off)", line)
            if m:
                if not m.group(2):
                    raise HarnessError("txl-server says http off")
                addr = m.group(2)
        if addr is None:
            if server.proc.poll() is not None or time.time() > deadline:
                raise HarnessError("txl-server printed no \"http on\" line:\n" +
                                   "\n".join(l for _, l in server.lines[-20:]))
            time.sleep(0.02)
    host, port = addr.rsplit(":", 1)
    while True:
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return host, int(port)
            conn.close()
        except (OSError, http.client.HTTPException):
            pass
        if server.proc.poll() is not None or time.time() > deadline:
            raise HarnessError("txl-server's /readyz never answered 200")
        time.sleep(0.05)


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def main():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # inherited by the server (as bench/run.py does)
    ap = argparse.ArgumentParser(description="H1: HTTP server-sent-event streaming throughput and latency "
                                             "against a txl-server started here.")
    ap.add_argument("--server", default=os.path.join(REPO, "build", "server", "txl-server"))
    ap.add_argument("--model", default=os.path.join(REPO, "model", "bundled", "shakespeare_char.pt"))
    ap.add_argument("--streams", default="1,8,32", help="concurrency levels, comma-separated (one row each)")
    ap.add_argument("--turns", type=int, default=4, help="streamed completions per client")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of each completion")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole measurement R times; rows give the median")
    ap.add_argument("--seed", type=int, default=1, help="request seed (temperature is 0 anyway; 0: none)")
    ap.add_argument("--threads", type=int, default=0, help="txl-server --threads (0: its default)")
    ap.add_argument("--device", default="cpu", help="txl-server --device")
    ap.add_argument("--fresh-connections", action="store_true",
                    help="a new TCP connection for every completion (default: one keep-alive connection per "
                         "client, as the OpenAI SDKs do)")
    ap.add_argument("--stop", default="", help="a stop sequence for every completion (streams it ends early "
                                                  "are counted as early stops)")
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument("--quick", action="store_true", help="1 stream x 1 turn x 8 tokens: only checks that it works")
    args = ap.parse_args()
    if args.quick:
        args.streams, args.turns, args.tokens, args.repeat = "1", 1, 8, 1
    try:
        levels = [int(s) for s in args.streams.split(",") if s.strip()]
    except ValueError:
        ap.error("--streams: comma-separated integers, e.g. 1,8,32")
    if not levels or min(levels) < 1 or args.turns < 1 or args.tokens < 1 or args.repeat < 1:
        ap.error("--streams, --turns, --tokens and --repeat must be >= 1")
    if not os.access(args.server, os.X_OK):
        ap.error("--server %s is not an executable (build it: cmake --build build --target txl-server)" % args.server)
    if not os.path.isfile(args.model):
        ap.error("--model %s: no such file" % args.model)

    tools = Tools(os.path.join(REPO, "build"))
    tools.server = args.server
    started = time.time()
    load_start = list(os.getloadavg())
    runs = []  # runs[r][level index]
    server = Server(tools, args.model, args.threads, args.device, flags=["--http_listen=127.0.0.1:0"])
    try:
        server.wait_listening()
        host, port = wait_http(server)
        log("txl-server http on %s:%d; levels %s, %d turns x %d tokens, %d run(s)" %
            (host, port, levels, args.turns, args.tokens, args.repeat))
        run_level(host, port, 1, 1, min(args.tokens, 8), args.seed)  # warm-up: first-request allocations
        for r in range(args.repeat):
            row = []
            for n in levels:
                t = time.perf_counter()
                res = run_level(host, port, n, args.turns, args.tokens, args.seed, args.fresh_connections,
                                args.stop or None)
                log("run %d, %d stream(s): %.0f tokens/s (%.1f s)" %
                    (r + 1, n, res["tokens_per_second"], time.perf_counter() - t))
                row.append(res)
            runs.append(row)
    except HarnessError as e:
        log("FAILED: %s" % e)
        return 1
    finally:
        server.stop()
        if server.proc.returncode not in (0, None):
            log("txl-server exited with %d" % server.proc.returncode)

    rows = []
    for li, n in enumerate(levels):
        per = [run[li] for run in runs]

        def med(key):
            vals = [p[key] for p in per if p[key] is not None]
            return median(vals)

        rows.append({"id": "H1-%d" % n, "streams": n, "turns": args.turns, "max_tokens": args.tokens,
                     "tokens_per_second": med("tokens_per_second"), "gap_median_ms": med("gap_median_ms"),
                     "gap_p90_ms": med("gap_p90_ms"), "ttfe_median_ms": med("ttfe_median_ms"),
                     "tokens_per_event": med("tokens_per_event"),
                     "early_stops": sum(len(p["early_stops"]) for p in per), "runs": per})
    seconds = time.time() - started
    print("\nH1: HTTP SSE streaming, %s, %s; %d turns x %d tokens per stream, temperature 0; "
          "%s; %d run(s), medians; %s cpus, load %.1f -> %.1f, %.0f s.\n" %
          (os.path.basename(args.model), args.device, args.turns, args.tokens,
           "a new connection per completion" if args.fresh_connections else "keep-alive connections",
           args.repeat, os.cpu_count(),
           load_start[0], os.getloadavg()[0], seconds))
    print("| id | streams | tokens/s | tokens/s per run | gap median ms | gap p90 ms | first event median ms "
          "| tokens/event | early stops |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| %s | %d | %s | %s | %s | %s | %s | %s | %d |" % (
            row["id"], row["streams"], fmt(row["tokens_per_second"], "%.0f"),
            ", ".join("%.0f" % p["tokens_per_second"] for p in row["runs"]), fmt(row["gap_median_ms"], "%.2f"),
            fmt(row["gap_p90_ms"], "%.2f"), fmt(row["ttfe_median_ms"], "%.1f"), fmt(row["tokens_per_event"], "%.2f"),
            row["early_stops"]))
    early = [(row["id"], e) for row in rows for p in row["runs"] for e in p["early_stops"]]
    if early:
        print("\nEarly stops (finish_reason stop before max_tokens): " +
              "; ".join("%s stream %d turn %d after %d tokens" % (rid, e["stream"], e["turn"], e["tokens"])
                        for rid, e in early[:10]))
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "bench/http_bench.py", "server": args.server, "model": args.model,
                       "device": args.device, "threads": args.threads, "levels": levels, "turns": args.turns,
                       "max_tokens": args.tokens, "repeat": args.repeat, "quick": args.quick, "seed": args.seed,
                       "fresh_connections": args.fresh_connections, "stop": args.stop,
                       "cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": list(os.getloadavg()),
                       "seconds": seconds, "rows": rows}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

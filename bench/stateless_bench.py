#!/usr/bin/python3
"""S1, S2, S3: what clients without a session pay, over HTTP, against a txl-server started here.

S1 (long prompts): streamed completions without a session ("max_tokens": 1, "temperature": 0),
prompts of --short and --long characters of Shakespeare (default 1,000 and 64,000 characters:
the bundled model's tokens are characters). Each is sent --reps times, alternating; the row is
the median time to the first event (the client's clock, from the request to the first `data:`
line). With bounded replay (docs/SESSIONS.md, "Bounded replay") a prompt costs at most the
model's receptive field, so the ratio long/short should stay near 1 (the issue's target: at most
1.5), however long the prompt.

S2 (a chat that re-sends its history): --turns turns of /v1/chat/completions, streamed, each
adding a user message of about 200 characters and --tokens generated ones, two ways side by side:
  stateless  the whole conversation is sent every turn, no session (as the OpenAI SDKs do);
  session    the same conversation on a session ("session_id"): the server feeds only the new message.
The row is each turn's time to the first event, median over --reps conversations; the ratio
stateless/session of turns 5-8 is what a state cache would bring to 1.

S3 (several choices of one prompt): a completion with "n": --choices (the prompt fed once, its
state copied per choice) against --choices completions of the same length sent at once on their
own connections (each feeds its prompt), --choice-prompt characters and --tokens tokens each,
temperature 1. Each repetition takes fresh prompts, so the state cache helps neither way. The row
is the median wall time of each way; separate/together is what feeding the prompt once saves.

Standard library only; runs with /usr/bin/python3. Reuses http_bench.py's Client and server start.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness_base import REPO, HarnessError, Server, Tools  # noqa: E402
from http_bench import Client, wait_http  # noqa: E402

CORPUS = os.path.join(REPO, "data", "tinyshakespeare.txt")


def log(msg):
    print("stateless_bench.py: " + msg, file=sys.stderr, flush=True)


def first_event_seconds(client, path, body):
    """Sends one streamed request and reads it to the end; returns the seconds to its first event."""
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    client.conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = client.conn.getresponse()
    if r.status != 200:
        raise HarnessError("POST %s: HTTP %d: %s" % (path, r.status, r.read().decode("utf-8", "replace")[:300]))
    first, text, done = None, [], False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode("utf-8", "replace").rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        if first is None:
            first = time.perf_counter() - t0
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        ev = json.loads(payload)
        if "error" in ev:
            raise HarnessError("POST %s: error event: %s" % (path, json.dumps(ev["error"])))
        for c in ev.get("choices") or []:
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
    r.read()
    if not done:
        raise HarnessError("POST %s: the stream ended without data: [DONE]" % path)
    return first, "".join(text)


def long_prompts(client, corpus, short, long_, reps):
    times = {short: [], long_: []}
    for _ in range(reps):
        for n in (short, long_):
            body = {"prompt": corpus[-n:], "max_tokens": 1, "temperature": 0, "stream": True}
            t, _ = first_event_seconds(client, "/v1/completions", body)
            times[n].append(t)
    s, l = statistics.median(times[short]), statistics.median(times[long_])
    return {"short_chars": short, "long_chars": long_, "short_ttft_ms": 1e3 * s, "long_ttft_ms": 1e3 * l,
            "ratio": l / s}


def chat(client, corpus, turns, tokens, stateless, seed):
    """One conversation; returns each turn's time to the first event."""
    session = None
    if not stateless:
        session = client.json_call("POST", "/v1/sessions", {})["id"]
    messages, out = [], []
    for t in range(turns):
        start = (seed * 7919 + t * 997) % (len(corpus) - 300)
        user = {"role": "user", "content": corpus[start:start + 200]}
        messages.append(user)
        body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True}
        if session:
            body["session_id"] = session
        ttft, reply = first_event_seconds(client, "/v1/chat/completions", body)
        messages.append({"role": "assistant", "content": reply})
        out.append(ttft)
    if session:
        client.json_call("DELETE", "/v1/sessions/%s" % session)
    return out


def choices(host, port, corpus, n, prompt_chars, tokens, reps):
    """S3: one call with n choices against n calls at once; fresh prompts every time."""
    import threading

    def prompt(k):
        start = (k * 7919 * prompt_chars) % (len(corpus) - prompt_chars)
        return corpus[start:start + prompt_chars]

    def body(k, **kw):
        return dict({"prompt": prompt(k), "max_tokens": tokens, "temperature": 1, "seed": 1 + k}, **kw)

    clients = [Client(host, port) for _ in range(n)]
    together, separate, k = [], [], 0
    try:
        for _ in range(reps):
            k += 1
            t0 = time.perf_counter()
            out = clients[0].json_call("POST", "/v1/completions", body(k, n=n))
            together.append(time.perf_counter() - t0)
            if len(out["choices"]) != n or out["usage"]["completion_tokens"] != n * tokens:
                raise HarnessError("S3: n=%d answered %d choices, usage %s" % (n, len(out["choices"]), out["usage"]))
            k += 1
            errors = []

            def one(c, i, k=k):
                try:
                    c.json_call("POST", "/v1/completions", dict(body(k), seed=100 + i))
                except HarnessError as e:
                    errors.append(e)

            threads = [threading.Thread(target=one, args=(c, i)) for i, c in enumerate(clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            separate.append(time.perf_counter() - t0)
            if errors:
                raise errors[0]
    finally:
        for c in clients:
            c.close()
    a, b = statistics.median(together), statistics.median(separate)
    return {"choices": n, "prompt_chars": prompt_chars, "tokens": tokens, "together_ms": 1e3 * a,
            "separate_ms": 1e3 * b, "ratio": b / a}


def main():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(description="S1, S2: what clients without a session pay (HTTP, a server started "
                                             "here).")
    ap.add_argument("--server", default=os.path.join(REPO, "build", "server", "txl-server"))
    ap.add_argument("--model", default=os.path.join(REPO, "model", "bundled", "shakespeare_char.pt"))
    ap.add_argument("--short", type=int, default=1000, help="S1's short prompt, in characters")
    ap.add_argument("--long", type=int, default=64000, help="S1's long prompt, in characters")
    ap.add_argument("--turns", type=int, default=8, help="S2's turns per conversation")
    ap.add_argument("--tokens", type=int, default=32, help="S2's max_tokens per turn")
    ap.add_argument("--reps", type=int, default=5, help="repetitions; rows give the median")
    ap.add_argument("--threads", type=int, default=0, help="txl-server --threads (0: its default)")
    ap.add_argument("--only", default="S1,S2,S3", help="which: S1, S2, S3 (comma-separated)")
    ap.add_argument("--choices", type=int, default=4, help="S3's n")
    ap.add_argument("--choice-prompt", type=int, default=2000, help="S3's prompt, in characters")
    ap.add_argument("--flag", action="append", default=[],
                    help="one more txl-server flag, e.g. --flag=--state_cache_budget=0 (repeatable)")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args()
    if min(args.short, args.long, args.turns, args.tokens, args.reps) < 1:
        ap.error("--short, --long, --turns, --tokens and --reps must be >= 1")
    with open(CORPUS, encoding="utf-8") as f:
        corpus = f.read()
    if args.long > len(corpus):
        ap.error("--long %d: the corpus has %d characters" % (args.long, len(corpus)))
    tools = Tools(os.path.join(REPO, "build"))
    tools.server = args.server
    result = {}
    server = Server(tools, args.model, args.threads, "cpu",
                    flags=["--http_listen=127.0.0.1:0", "--max_input_tokens=%d" % (args.long + 1000)] + args.flag)
    try:
        server.wait_listening()
        host, port = wait_http(server)
        client = Client(host, port)
        first_event_seconds(client, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 1, "stream": True})
        if "S1" in args.only:
            result["S1"] = long_prompts(client, corpus, args.short, args.long, args.reps)
            log("S1: %d chars %.1f ms, %d chars %.1f ms: %.2fx" %
                (args.short, result["S1"]["short_ttft_ms"], args.long, result["S1"]["long_ttft_ms"],
                 result["S1"]["ratio"]))
        if "S2" in args.only:
            per = {"stateless": [], "session": []}
            for r in range(args.reps):
                for how in ("stateless", "session"):
                    per[how].append(chat(client, corpus, args.turns, args.tokens, how == "stateless", r + 1))
            rows = []
            for t in range(args.turns):
                a = statistics.median(run[t] for run in per["stateless"])
                b = statistics.median(run[t] for run in per["session"])
                rows.append({"turn": t + 1, "stateless_ttft_ms": 1e3 * a, "session_ttft_ms": 1e3 * b,
                             "ratio": a / b})
                log("S2 turn %d: stateless %.1f ms, session %.1f ms: %.2fx" % (t + 1, 1e3 * a, 1e3 * b, a / b))
            late = [r["ratio"] for r in rows if r["turn"] >= 5]
            result["S2"] = {"turns": rows, "late_turns_ratio": statistics.median(late) if late else None}
        if "S3" in args.only:
            result["S3"] = choices(host, port, corpus, args.choices, args.choice_prompt, args.tokens, args.reps)
            log("S3: n=%d together %.1f ms, %d calls at once %.1f ms: %.2fx" %
                (args.choices, result["S3"]["together_ms"], args.choices, result["S3"]["separate_ms"],
                 result["S3"]["ratio"]))
        client.close()
    except HarnessError as e:
        log("FAILED: %s" % e)
        return 1
    finally:
        server.stop()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

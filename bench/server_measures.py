"""The benchmark harness's measurements through a running txl-server (bench/run.py runs
them): gRPC end to end against the bare engine step (P4), start-up to the first token (P7),
what durability costs (P8), and a rewind from a turn checkpoint against a replay (R1).
"""
import json
import os
import random
import sys
import time

from harness_base import (BASE_CONFIG, BASE_VOCAB, REPO, HarnessBase, HarnessError, Server, free_port,
                          last_json_line, log, make_row, median, run)


class ServerMeasures(HarnessBase):
    # ------------------------------------------------------------------ P4
    def p4(self):
        """gRPC end to end vs the bare engine step, per generated token.

        A: txl-client bench, 1 session, T turns of 1 input token + G greedy tokens,
           against one txl-server started once; per token = wall time of the run
           (first Generate's start to the last one's end: every RPC, the scheduler,
           sampling, streaming, the client) / generated tokens.
        B: txl-eval --chunk 1 over T*(G+1) random ids with the same mem_len: the
           same model, one token per step, through the same LanguageModel::Step
           the engine thread calls, with the same history lengths (the server's
           session holds T*(G+1) tokens at the end), timing only the step loop
           (its "seconds": no model load). Per token = seconds / tokens.
        Both ask for one next-token distribution per step over a single session;
        the ratio is therefore everything serving adds to the bare step. The
        server is warmed once before the interleaved pairs.
        Also reported (extra "in_server"): A against the server's own engine step
        time over the same run (txl_engine_step_seconds sum / count from its
        /metrics): the same steps in the same process, so a second view of the
        overhead that no difference between the two processes can bias.
        """
        t = self.tools
        t.need(t.server, t.client, t.eval)
        model = self.base_model()
        T, G = self.z["p4_turns"], self.z["p4_new_tokens"]
        n = T * (G + 1)
        rng = random.Random(4)
        ids = self.path("p4_tokens.txt")
        with open(ids, "w") as f:
            f.write(" ".join(str(rng.randrange(BASE_VOCAB)) for _ in range(n)) + "\n")
        server = Server(t, model, self.threads, self.device, metrics=True)
        try:
            addr = server.wait_listening()
            bench_json = self.path("p4_bench.json")

            def bench(turns, new):
                run([t.client, "--server", addr, "--timeout", "600", "bench", "--sessions", "1", "--turns",
                     str(turns), "--input-tokens", "1", "--new-tokens", str(new), "--json", bench_json],
                    self.z["step_timeout"], "txl-client bench")
                with open(bench_json) as f:
                    j = json.load(f)
                if j["errors_total"] or j["generated_tokens"] != turns * new:
                    raise HarnessError("txl-client bench: unexpected result %s" % json.dumps(j))
                return j

            def bare():
                cmd = [t.eval, "--model", model, "--tokens", ids, "--chunk", "1", "--mem_len",
                       str(BASE_CONFIG["mem_len"]), "--device", self.device]
                if self.threads > 0:
                    cmd += ["--threads", str(self.threads)]
                return last_json_line(run(cmd, self.z["step_timeout"], "txl-eval").stdout, "txl-eval")

            bench(1, min(G, 8))  # warm-up: first-request allocations, the relative-position table
            a_reps, b_reps, itl, ttft, pair, in_server = [], [], [], [], [], []
            for r in range(self.z["reps"]):
                s0, c0 = server.step_seconds()
                j = bench(T, G)
                s1, c1 = server.step_seconds()
                in_server.append((s1 - s0) / max(1.0, c1 - c0))
                a = j["wall_seconds"] / j["generated_tokens"]
                e = bare()
                b = e["seconds"] / e["tokens"]
                a_reps.append(a)
                b_reps.append(b)
                pair.append(a / b)
                itl.append(j["inter_token_ms"]["p50"])
                ttft.append(j["time_to_first_token_ms"]["p50"])
                log("P4 rep %d: gRPC %.2f ms/token, bare step %.2f ms/token (in-server step %.2f ms)" %
                    (r + 1, a * 1e3, b * 1e3, in_server[-1] * 1e3))
        finally:
            server.stop()
        extra = {"turns": T, "new_tokens": G, "input_tokens": 1, "bare_tokens": n, "mem_len": BASE_CONFIG["mem_len"],
                 "median_pair_ratio": median(pair), "pair_ratios": pair,
                 "inter_token_ms_p50": itl, "time_to_first_token_ms_p50": ttft,
                 "in_server_step_seconds": in_server, "in_server_step_median_seconds": median(in_server),
                 "ratio_to_in_server_step": median(a_reps) / median(in_server),
                 "a": "txl-client bench wall_seconds / generated_tokens",
                 "b": "txl-eval --chunk 1 seconds / tokens"}
        row = make_row("P4", "gRPC end to end per token (1 session, %d turns x %d tokens, base, mem_len %d) "
                       "vs bare engine step (txl-eval --chunk 1)" % (T, G, BASE_CONFIG["mem_len"]),
                       "gRPC", "bare step", "seconds/token", a_reps, b_reps, 1.10, False, extra)
        row["note"] = "in-server engine step %.3f ms: ratio %.3f" % (median(in_server) * 1e3,
                                                                     extra["ratio_to_in_server_step"])
        return [row]

    # ------------------------------------------------------------------ P8
    def p8(self):
        """Throughput with a state store vs without, the same bench against each.

        Three servers on the bundled model run at once (one without a state
        store, one with --state_dir --fsync=always, one with --fsync=interval,
        each its own directory under the run's temporary directory); each
        repetition runs the same txl-client bench (N sessions, T greedy turns of
        32 input + G generated tokens; every token is journaled and each answer
        waits for its write) against each server in turn, interleaved.
        Ratio: generated tokens/s with the store / without (>= 0.90).
        """
        t = self.tools
        t.need(t.server, t.client)
        model = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")
        N, T, G = self.z["p8_sessions"], self.z["p8_turns"], self.z["p8_new_tokens"]
        servers = {}
        try:
            servers["none"] = Server(t, model, self.threads, self.device)
            for mode in ("always", "interval"):
                servers[mode] = Server(t, model, self.threads, self.device,
                                       flags=["--state_dir", self.path("p8_state_" + mode), "--fsync", mode,
                                              "--replica_name", "bench"])
            addrs = {k: s.wait_listening() for k, s in servers.items()}
            bench_json = self.path("p8_bench.json")

            def bench(addr, turns):
                run([t.client, "--server", addr, "--timeout", "600", "bench", "--sessions", str(N), "--turns",
                     str(turns), "--input-tokens", "32", "--new-tokens", str(G), "--json", bench_json],
                    self.z["step_timeout"], "txl-client bench")
                with open(bench_json) as f:
                    j = json.load(f)
                if j["errors_total"] or j["generated_tokens"] != N * turns * G:
                    raise HarnessError("txl-client bench: unexpected result %s" % json.dumps(j))
                return j["generated_tokens"] / j["wall_seconds"]

            for addr in addrs.values():
                bench(addr, 1)  # warm-up
            reps = {k: [] for k in servers}
            for r in range(self.z["reps"]):
                for k in ("none", "always", "interval"):
                    reps[k].append(bench(addrs[k], T))
                log("P8 rep %d: %s tokens/s" % (r + 1, ", ".join("%s %.0f" % (k, v[-1]) for k, v in reps.items())))
        finally:
            for s in servers.values():
                s.stop()
        extra = {"sessions": N, "turns": T, "new_tokens": G, "input_tokens": 32}
        rows = []
        for rid, mode in (("P8", "always"), ("P8i", "interval")):
            rows.append(make_row(rid, "txl-client bench tokens/s (%d sessions x %d turns x %d tokens, small) with "
                                 "--state_dir --fsync=%s vs no state store" % (N, T, G, mode),
                                 "fsync=" + mode, "no store", "tokens/s", reps[mode], reps["none"], 0.90, True,
                                 dict(extra)))
        return rows

    # ------------------------------------------------------------------ R1
    def r1(self):
        """Going back one turn: RewindSession served from a turn checkpoint vs by replay.

        Two servers on the base model (window 800): one with the default
        --checkpoint_budget, one with --checkpoint_budget=0 (every rewind replays
        the history from an empty session, which is also what a client without
        RewindSession must do: recreate the session and feed the text again).
        A session of T turns of N tokens (Score, commit) on each; each repetition
        rewinds it to the end of its second-to-last turn and feeds that last turn
        again, interleaved between the servers. Ratio: replay seconds /
        checkpoint seconds (>= 10)."""
        t = self.tools
        t.need(t.server, t.init)
        model = self.base_model()
        sys.path.insert(0, t.stubs)
        try:
            import grpc
            from txl.v1 import txl_pb2, txl_pb2_grpc
        except ImportError as e:
            raise HarnessError("R1 needs Debian's python3-grpcio and the built stubs: %s" % e)
        T, N = self.z["r1_turns"], self.z["r1_turn_tokens"]
        rng = random.Random(7)
        turns = [[rng.randrange(BASE_VOCAB) for _ in range(N)] for _ in range(T)]
        servers, stubs, sessions = {}, {}, {}
        try:
            servers["checkpoint"] = Server(t, model, self.threads, self.device)
            servers["replay"] = Server(t, model, self.threads, self.device, flags=["--checkpoint_budget", "0"])
            for k, srv in servers.items():
                stubs[k] = txl_pb2_grpc.TransformerXLStub(grpc.insecure_channel(srv.wait_listening()))
                sessions[k] = stubs[k].CreateSession(txl_pb2.CreateSessionRequest(), timeout=60).session_id
                for ids in turns:
                    stubs[k].Score(txl_pb2.ScoreRequest(session_id=sessions[k], commit=True, input=txl_pb2.Input(
                        tokens=txl_pb2.TokenIds(ids=ids))), timeout=600)
            back = (T - 1) * N

            def once(k):
                t0 = time.perf_counter()
                r = stubs[k].RewindSession(txl_pb2.RewindSessionRequest(session_id=sessions[k], position=back),
                                           timeout=600)
                took = time.perf_counter() - t0
                if r.position != back:
                    raise HarnessError("R1: rewound to %d, not %d" % (r.position, back))
                stubs[k].Score(txl_pb2.ScoreRequest(session_id=sessions[k], commit=True, input=txl_pb2.Input(
                    tokens=txl_pb2.TokenIds(ids=turns[-1]))), timeout=600)
                return took

            reps = {k: [] for k in servers}
            for r in range(self.z["reps"]):
                for k in ("checkpoint", "replay"):
                    reps[k].append(once(k))
                log("R1 rep %d: checkpoint %.4f s, replay %.3f s" % (r + 1, reps["checkpoint"][-1],
                                                                      reps["replay"][-1]))
        except grpc.RpcError as e:
            raise HarnessError("R1: %s %s" % (e.code(), e.details()))
        finally:
            for srv in servers.values():
                srv.stop()
        extra = {"turns": T, "turn_tokens": N, "rewind_to": (T - 1) * N, "mem_len": BASE_CONFIG["mem_len"]}
        return [make_row("R1", "RewindSession one turn back (%d turns of %d tokens, base model, window %d): replay "
                         "vs turn checkpoint" % (T, N, BASE_CONFIG["mem_len"]), "replay", "checkpoint", "s",
                         reps["replay"], reps["checkpoint"], 10.0, True, extra)]

    # ------------------------------------------------------------------ P7
    def p7(self):
        """Process start to the first streamed token: spawn txl-server (base model), a
        client calling Generate with wait-for-ready at once. The client's reconnect
        backoff is set to 20-50 ms so that waiting costs at most that much more than
        the server's readiness. Breakdown from the server's output: spawn -> the
        "listening" line (model load, server start), then -> first token (connect,
        first engine step, streaming)."""
        t = self.tools
        t.need(t.server)
        model = self.base_model()
        if not os.path.isdir(t.stubs):
            raise HarnessError("Python stubs not built: %s (target txl_python_stubs)" % t.stubs)
        sys.path.insert(0, t.stubs)
        try:
            import grpc
            from txl.v1 import txl_pb2, txl_pb2_grpc
        except ImportError as e:
            raise HarnessError("P7 needs Debian's python3-grpcio and the built stubs: %s" % e)
        options = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                   ("grpc.max_reconnect_backoff_ms", 50)]
        request = txl_pb2.GenerateRequest(input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=[1, 2, 3])),
                                          max_new_tokens=4, sampling=txl_pb2.SamplingParams(temperature=0.0))

        def once():
            port = free_port()
            server = Server(t, model, self.threads, self.device, port)
            t0 = server.started
            try:
                channel = grpc.insecure_channel("127.0.0.1:%d" % port, options=options)
                stub = txl_pb2_grpc.TransformerXLStub(channel)
                call = stub.Generate(request, wait_for_ready=True, timeout=120)
                first = None
                for resp in call:
                    if len(resp.tokens) > 0:
                        first = time.perf_counter()
                        break
                call.cancel()
                channel.close()
                if first is None:
                    raise HarnessError("P7: the stream ended without a token")
                server.wait_listening(5)
                return first - t0, server.listening_at - t0
            except grpc.RpcError as e:
                raise HarnessError("P7: Generate failed: %s %s\n%s" % (e.code(), e.details(),
                                                                      "\n".join(l for _, l in server.lines[-10:])))
            finally:
                server.stop()

        once()  # warm-up: the checkpoint into the page cache, as on a node that has pulled it
        firsts, readies = [], []
        for r in range(self.z["p7_reps"]):
            f, ready = once()
            firsts.append(f)
            readies.append(ready)
            log("P7 rep %d: first token %.3f s after spawn (listening at %.3f s)" % (r + 1, f, ready))
        extra = {"load_and_start_seconds": readies, "first_request_seconds": [f - r for f, r in zip(firsts, readies)],
                 "median_load_and_start_seconds": median(readies),
                 "median_first_request_seconds": median([f - r for f, r in zip(firsts, readies)]),
                 "model_bytes": os.path.getsize(model), "reconnect_backoff_ms": [20, 50],
                 "target_applies_to": "a (seconds, absolute)"}
        row = make_row("P7", "txl-server spawn to first streamed token (base model, %.0f MB checkpoint; "
                       "client waits for ready)" % (os.path.getsize(model) / 1e6),
                       "first token", "listening (load + start)", "seconds", firsts, readies, 2.0, False, extra,
                       ratio_of=lambda a, b: a)
        row["ratio"] = None  # an absolute target: met when A < 2 s
        row["met"] = row["a"] < 2.0
        return [row]

#!/usr/bin/python3
"""One command for every performance figure of txl-serve (P1..P9, Q0, R1, W1..W5).

    /usr/bin/python3 bench/run.py [--build-dir build] [--quick] [--json OUT] [--md OUT]
                                  [--only P4,P6,...] [--device cpu|cuda] [--threads 2]
                                  [--original DIR]

Runs build/bench/engine_bench (P1, P1f, P2, P3, P5: the engine's step against the
original code's ways of serving; Q1, Q1f, Q3, Q3f, Q4, Q5: the reduced-precision modes
against float32, on the CPU only; W1, W3, W5: the output side of a large vocabulary, meant
for --engine-shape wt103: one session's greedy step vs its bandwidth floor at memories 800
and 1600, 32 sessions' step share after the last layer per readout (greedy, draw, Score,
top-p, whole rows), start-up; see bench/engine_bench.cc) and, here:

  P4  gRPC end to end, 1 session, one token per step: txl-client bench against
      txl-server vs the bare engine step (txl-eval --chunk 1), same model and
      window. Target: ratio <= 1.10.
  P6  training tokens/s: txl-train vs a Python reference training loop
      (bench/python_train_loop.py: tests/python/txl_reference.py's math, torch
      autograd, the same TXL scheme). Target: ratio >= 1.5.
  P7  txl-server process start to the first streamed token ("base" model),
      client connecting with wait-for-ready. Target: < 2 s.
  P8  what durability costs: txl-client bench throughput (8 sessions, bundled
      model) with --state_dir --fsync=always (P8) and --fsync=interval (P8i)
      vs the same server without a state store. Target: ratio >= 0.90.
  P9  only with --original DIR (the original authors' pytorch/ folder, which
      holds mem_transformer.py; never part of this repository): the engine step
      (build/bench/step_loop, 1 session, memory 800) vs the original
      MemTransformerLM's per-token forward with 800 positions of mems
      (bench/original_step.py), same "base" weights, same threads. Their losses
      on the first steps are checked against txl-eval's log-probabilities of the
      same ids (same weights, same math). Target: ratio >= 15x, P1's (whose
      baseline (b) re-implements this way of serving in C++).
  R1  RewindSession one turn back on the base model: from the turn checkpoint there vs by
      replaying the history (a server with --checkpoint_budget=0); ratio replay / checkpoint
      seconds (>= 10)
  Q0  quality of reduced precision (not a speed): build/tests/precision_test
      --gtest_filter=QualityGateTest.* (the bundled model over the last 10% of
      data/tinyshakespeare.txt) prints the bits per character of float32 and of
      each reduced mode; rows Q0-bf16 (bfloat16 weights + bfloat16 memories) and
      Q0-int8 (int8 weights + bfloat16 memories) report bpc vs float32, the
      relative change, KL(float32 || mode) mean and max. Targets: |change| <
      0.5% (bf16) and < 1.5% (int8), the test's own gates. About 35 s; it runs
      in --quick mode too (the test has no smaller size). engine_bench's Q1..Q5
      rows are the speed of the same modes.

Every ratio is measured in one run: A and B interleaved (A B A B ...), the
median of the repetitions; absolute figures are printed for reference only.
Prints one combined Markdown table and writes JSON (--json) and Markdown (--md).
Exit status: 0 when every measurement ran (whether or not targets are met),
1 when one failed (or --check-ids found an id missing), 2 for bad arguments or
an unavailable --device.

Model shapes: "base" = random weights, 12 layers, d_model 512, 8 heads x 64,
d_inner 2048, 204 tokens (a 204-entry word vocabulary), mem_len 800, written
with txl-init; "small" = the bundled model's config (model/bundled/shakespeare_char.pt).
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

# The harness's parts live beside this file: harness_base.py (ids, sizes, tools, the txl-server
# child, the models), model_measures.py and server_measures.py (the measurements).
from harness_base import ALL_IDS, ENGINE_IDS, REPO, SIZES, HarnessError, Tools, log
from model_measures import ModelMeasures
from server_measures import ServerMeasures


class Harness(ModelMeasures, ServerMeasures):
    """Every measurement, on one run's settings and temporary directory."""


# ---------------------------------------------------------------------- output
def fmt_value(unit, v):
    if v is None:
        return "-"
    if unit in ("seconds/step", "seconds/token"):
        return "%.3f ms" % (v * 1e3)
    if unit == "seconds":
        return "%.3f s" % v
    if unit == "tokens/s":
        return "%.1f tok/s" % v
    if unit.startswith("MB"):
        return "%.3f MB" % v
    if unit == "bpc":
        return "%.4f bpc" % v
    return "%.4g %s" % (v, unit)


def markdown_row(r):
    rid = r["id"]
    if "error" in r:
        return "| %s | %s | - | - | - | - | ERROR: %s |" % (rid, r.get("measurement", ""), r["error"].splitlines()[0])
    unit = r.get("unit", "")
    if r.get("ratio_format") == "relative":  # Q0: a change from float32 within a gate
        ratio = "%+.3f%%" % (100 * (r["ratio"] - 1))
        target = "abs < %g%%" % (100 * r["extra"]["max_relative_change"])
    elif r.get("ratio") is None:
        ratio = "-"
        target = "< %g s" % r["target"]
    elif r.get("target_is_lower_bound"):
        ratio = "%.2fx" % r["ratio"]
        target = ">= %gx" % r["target"]
    else:
        ratio = "%.3f" % r["ratio"]
        target = "<= %g" % r["target"]
    measurement = r["measurement"] + ("; " + r["note"] if r.get("note") else "")
    return "| %s | %s | %s: %s | %s: %s | %s | %s | %s |" % (
        rid, measurement, r["a_name"], fmt_value(unit, r["a"]), r["b_name"], fmt_value(unit, r["b"]),
        ratio, target, "yes" if r["met"] else "NO")


def base_id(rid):
    m = re.match(r"[PQRW]\d+", rid)
    return m.group(0) if m else rid


def id_key(rid):
    """P1 < P1f < P2-800 < ... < P9 < Q0 < Q1-bf16 ... by letter and number only: a stable sort keeps
    engine_bench's order within an id."""
    m = re.match(r"([PQRW])(\d+)", rid)
    return (m.group(1), int(m.group(2))) if m else ("Z", 999)


def markdown(result):
    lines = ["| id | measurement | A | B | ratio | target | met |", "|---|---|---|---|---|---|---|"]
    engine_md = {}
    for l in (result.get("engine") or {}).get("markdown_rows", []):
        engine_md[l.split("|")[1].strip()] = l
    for r in result["rows"]:
        if r.get("source") == "engine_bench" and r["id"] in engine_md:
            lines.append(engine_md[r["id"]])  # engine_bench's own row, verbatim
        else:
            lines.append(markdown_row(r))
    return "\n".join(lines)


# The CPU flags that choose a kernel family (model/kernels/cpu_isa.h), as /proc/cpuinfo names them.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16",
                "amx_tile", "amx_int8")


def machine_info():
    cpu, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "unknown":
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"host": platform.node(), "cpu": cpu, "cpu_flags": [f for f in KERNEL_FLAGS if f in flags],
            "cpu_isa_cap": os.environ.get("TXL_CPU_ISA", ""), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "loadavg_start": list(os.getloadavg())}


def check_device(tools, device):
    """--device cuda: fail early and clearly when the tools cannot use it."""
    if device == "cpu":
        return
    tools.need(tools.eval)
    with tempfile.TemporaryDirectory(prefix="txl_bench_dev_") as d:
        ids = os.path.join(d, "t.txt")
        with open(ids, "w") as f:
            f.write("1 2 3\n")
        proc = subprocess.run([tools.eval, "--model", os.path.join(REPO, "model", "bundled", "shakespeare_char.pt"),
                               "--tokens", ids, "--device", device], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["unknown error"]
        print("run.py: --device %s: CUDA is not usable on this machine (%s); run with --device cpu" %
              (device, msg[0]), file=sys.stderr)
        sys.exit(2)


def main():
    # Every process measured (server, txl-eval, txl-train, engine_bench) gets the wait policy
    # the Dockerfile sets: spinning OpenMP workers distort figures on shared cores.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ap = argparse.ArgumentParser(description="Runs every txl-serve performance measurement (P1..P9, Q0).")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1-2 repetitions: only checks that all works")
    ap.add_argument("--json", default="", help="write the combined results here")
    ap.add_argument("--md", default="", help="write the combined Markdown table here")
    ap.add_argument("--only", default="", help="comma-separated ids, e.g. P4,P6 (default: all)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N], passed to the tools")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every side of every measurement")
    ap.add_argument("--reps", type=int, default=0, help="interleaved repetitions for P4 / P6 / P7 (0: per mode)")
    ap.add_argument("--engine-shape", default="base", choices=["base", "wt103", "small"],
                    help="engine_bench --shape (wt103: the WikiText-103 model's shape, random weights, 1.1 GB)")
    ap.add_argument("--corpus", default=os.environ.get("TXL_CORPUS", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                         "data", "tinyshakespeare.txt")),
                    help="training corpus for P6 (a slice of it is used)")
    ap.add_argument("--check-ids", default="",
                    help="exit 1 unless the JSON written has a row without error for each of these ids")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory (models, logs)")
    ap.add_argument("--original", default="",
                    help="the original authors' pytorch/ folder (mem_transformer.py): adds P9, the engine step vs "
                         "their MemTransformerLM per token at mems 800 (not part of this repository)")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if args.device != "cpu" and not args.device.startswith("cuda"):
        ap.error("--device must be cpu or cuda[:N]")
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()] or list(ALL_IDS)
    bad = [s for s in only if s not in ALL_IDS]
    if bad:
        ap.error("--only: unknown id(s) %s (known: %s)" % (",".join(bad), ",".join(ALL_IDS)))
    if args.original:
        args.original = os.path.abspath(args.original)
        if not os.path.isfile(os.path.join(args.original, "mem_transformer.py")):
            ap.error("--original %s: no mem_transformer.py there (the original code's pytorch/ folder)" %
                     args.original)
    elif "P9" in only:
        if args.only:
            ap.error("--only P9 needs --original DIR (the original code's pytorch/ folder)")
        only.remove("P9")  # P9 runs only against the original code
    if "Q0" in only and args.device != "cpu":
        log("Q0 measures the CPU kernels (precision_test runs on the CPU whatever --device says)")
    sizes = dict(SIZES["quick" if args.quick else "default"])
    if args.reps > 0:
        sizes["reps"] = sizes["p6_reps"] = sizes["p7_reps"] = args.reps
    tools = Tools(args.build_dir)
    check_device(tools, args.device)

    warnings = []
    stale = tools.stale()
    if stale:
        warnings.append("built before build/model/libtxl_model.a (rebuild them, or the ratios compare different "
                        "code): " + ", ".join(stale))
        log("WARNING: " + warnings[-1])
    tmp = tempfile.mkdtemp(prefix="txl_bench_")
    started = time.time()
    result = {"harness": "bench/run.py", "quick": args.quick, "device": args.device, "threads": args.threads,
              "only": only, "sizes": sizes, "machine": machine_info(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
              "engine": None, "rows": [], "errors": [], "warnings": warnings}
    h = Harness(args, sizes, tmp)
    steps = []
    if ENGINE_IDS & set(only):
        engine_ids = ENGINE_IDS & set(only)
        steps.append(("engine", engine_ids, lambda: h.engine(engine_ids)))
    for rid, fn in (("P4", h.p4), ("P6", h.p6), ("P7", h.p7), ("P8", h.p8), ("P9", h.p9), ("Q0", h.q0),
                    ("R1", h.r1)):
        if rid in only:
            steps.append((rid, {rid}, fn))
    try:
        for name, ids, fn in steps:
            t = time.perf_counter()
            log("%s ..." % name)
            try:
                out = fn()
                if name == "engine":
                    rows, data = out
                    result["engine"] = data
                    rows = [r for r in rows if base_id(r["id"]) in only]
                else:
                    rows = out
                for r in rows:
                    r.setdefault("source", "run.py")
                result["rows"] += rows
            except HarnessError as e:
                log("%s FAILED: %s" % (name, e))
                result["errors"].append({"step": name, "error": str(e)})
                for rid in sorted(ids):
                    result["rows"].append({"id": rid, "measurement": name, "error": str(e), "met": None})
                if name == "engine":
                    result["engine"] = {"error": str(e)}
            log("%s done in %.0f s" % (name, time.perf_counter() - t))
    finally:
        if args.keep_tmp:
            log("temporary files kept in " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["rows"].sort(key=lambda r: id_key(r["id"]))
    result["seconds"] = time.time() - started
    result["machine"]["loadavg_end"] = list(os.getloadavg())

    table = markdown(result)
    m = result["machine"]
    header = ("txl-serve benchmarks: device %s, %d threads%s, %s (%s cpus; flags %s%s), load average %.1f -> %.1f, "
              "%.0f s. A and B interleaved; medians of repetitions; absolute figures for reference only." %
              (args.device, args.threads, ", quick" if args.quick else "", m["cpu"], m["cpus"],
               " ".join(m["cpu_flags"]) or "none of the kernels'",
               ", TXL_CPU_ISA=" + m["cpu_isa_cap"] if m["cpu_isa_cap"] else "", m["loadavg_start"][0],
               m["loadavg_end"][0], result["seconds"]))
    if warnings:
        header += "\n\nWARNING: " + "\nWARNING: ".join(warnings)
    print("\n" + header + "\n\n" + table + "\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(header + "\n\n" + table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    status = 1 if result["errors"] else 0
    if args.check_ids:
        if not args.json:
            ap.error("--check-ids needs --json")
        with open(args.json) as f:
            written = json.load(f)  # well-formed JSON, read back
        present = {base_id(r["id"]) for r in written["rows"] if "error" not in r}
        missing = [i for i in args.check_ids.split(",") if i.strip() and i.strip() not in present]
        if missing:
            log("--check-ids: no result for %s" % ",".join(missing))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

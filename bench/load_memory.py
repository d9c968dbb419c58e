#!/usr/bin/python3
"""M1: the memory a loaded model version holds, against the estimate a repository's memory budget
(--model_memory_budget) counts before loading it (LanguageModel::EstimateWeightBytes).

For each weight format, txl-server is started on --model and, as the baseline, on the bundled
model (its weights are 3.5 MB); the row is the resident memory (VmRSS once it listens) less the
baseline's, next to the estimate: the layers' product weights (qkv, o, two feed-forward
matrices) in the format, int8 twice (rows and panels), the rest of the checkpoint as float32, and
5% for the working buffers a load keeps.
The estimate should be at or a few percent above the measure, never below it.

  /usr/bin/python3 bench/load_memory.py --build-dir build --model /tmp/base.pt [--runs 2]

Standard library only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLED = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")


def resident_bytes(server, model, dtype):
    """Starts txl-server on `model`, reads its VmRSS once it is up, stops it."""
    p = subprocess.Popen([server, "--model", model, "--dtype", dtype, "--listen", "127.0.0.1:0", "--http_listen=",
                          "--metrics_listen=", "--session_memory_budget=1000000000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("txl-server: http off"):
            break
    else:
        sys.exit("load_memory.py: txl-server did not start:\n" + "".join(seen))
    with open(f"/proc/{p.pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) * 1024
    p.terminate()
    p.communicate(timeout=60)
    return rss


def estimate(model, dtype):
    with zipfile.ZipFile(model) as z:
        name = next(n for n in z.namelist() if n.endswith("/extra/config.json"))
        c = json.loads(z.read(name))
    inner = c["n_head"] * c["d_head"]
    products = c["n_layer"] * (c["d_model"] * 3 * inner + inner * c["d_model"] + 2 * c["d_model"] * c["d_inner"])
    per = {"float32": 4, "bfloat16": 2, "int8": 2}[dtype]
    weights = max(0, os.path.getsize(model) - 4 * products) + per * products
    return weights + weights // 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    server = os.path.join(a.build_dir, "server", "txl-server")
    print(f"model {a.model}: {os.path.getsize(a.model)} bytes")
    print("| run | format | measured (RSS over the bundled model's) | estimate | estimate / measured |")
    print("|---|---|---|---|---|")
    for run in range(1, a.runs + 1):
        for dtype in ("float32", "bfloat16", "int8"):
            base = resident_bytes(server, BUNDLED, "float32")
            measured = resident_bytes(server, a.model, dtype) - base
            est = estimate(a.model, dtype)
            print(f"| {run} | {dtype} | {measured / 1e6:.1f} MB | {est / 1e6:.1f} MB | {est / measured:.3f} |", flush=True)


if __name__ == "__main__":
    main()

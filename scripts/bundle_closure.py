"""The shared libraries of the GPU bundle's binaries, as the loader resolves them (ldd).

Each library falls in one of these:
  runtime  glibc, libstdc++, libgcc_s: the machine's own C and C++ runtime
  torch    under a torch/lib or nvidia/ folder (the torch wheel and its NVIDIA wheels), or the CUDA
           toolkit or driver: the GPU machine has its own
  carried  anything else: scripts/gpu_bundle.sh copies it into the bundle's lib/
  missing  not found: the binary cannot start

  bundle_closure.py --carry BINARY...          prints the paths to carry, one per line
  bundle_closure.py --check LIBDIR BINARY...   every library is runtime, torch, or in LIBDIR;
                                               exits 1 naming the others (a library the bundle
                                               lacks, found only because this machine has it)
"""
import os
import re
import subprocess
import sys

RUNTIME = re.compile(r"^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|"
                     r"libstdc\+\+|libgcc_s)\.so")


def resolved(binary):
    """(soname, path or None) for each library ldd lists for `binary`."""
    run = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("bundle_closure: ldd %s failed (%d): %s%s" % (binary, run.returncode, run.stdout, run.stderr))
    out = run.stdout
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))$", line)
        if m:
            yield m.group(1), m.group(3)
        elif line and "=>" not in line:  # the loader itself, or the vdso
            yield os.path.basename(line.split()[0]), line.split()[0]


def kind(soname, path):
    if path is None:
        return "missing"
    if RUNTIME.match(soname):
        return "runtime"
    real = os.path.realpath(path)
    if "/torch/lib/" in real or "/nvidia/" in real or real.startswith("/usr/local/cuda") or \
            soname.startswith("libcuda.so"):
        return "torch"
    return "carried"


def main(argv):
    if len(argv) >= 2 and argv[0] == "--carry":
        carry = set()
        for binary in argv[1:]:
            for soname, path in resolved(binary):
                k = kind(soname, path)
                if k == "missing":
                    sys.exit("bundle_closure: %s needs %s, which the loader does not find" % (binary, soname))
                if k == "carried":
                    carry.add(path)
        print("\n".join(sorted(carry)))
        return 0
    if len(argv) >= 3 and argv[0] == "--check":
        libdir = os.path.realpath(argv[1])
        bad = []
        for binary in argv[2:]:
            for soname, path in resolved(binary):
                k = kind(soname, path)
                if k == "missing" or (k == "carried" and os.path.dirname(os.path.realpath(path)) != libdir):
                    bad.append("%s: %s => %s" % (os.path.basename(binary), soname, path or "not found"))
        for b in bad:
            print("bundle_closure: outside the bundle: " + b, file=sys.stderr)
        print("bundle_closure: %d binaries, %s" % (len(argv) - 2, "%d libraries outside the bundle" % len(bad)
                                                   if bad else "every library is the bundle's, torch's or the runtime's"))
        return 1 if bad else 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

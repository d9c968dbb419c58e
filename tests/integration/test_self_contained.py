"""The repository stands alone: no tracked file points outside it.

A fresh clone must build and pass its tests with nothing beside it, so no tracked text file may
name the directory that sits next to a checkout on the developers' machines, or an absolute path of
one machine (a home, a work tree). Paths a deployment uses on purpose (/usr, /etc, /var/lib/txl,
/opt) are not machine-specific and are fine.

Run by CTest: /usr/bin/python3 test_self_contained.py --source-dir SRC
"""
import argparse
import os
import re
import subprocess
import sys
import unittest

ARGS = None
# Built from pieces joined at run time, so that this file names no such path itself.
SEP = "/"
SIBLING = SEP.join(["..", "shared"])                   # the directory beside a developer's checkout
MACHINE_ROOTS = ("work", "home", "root")                # a work tree, a home directory, root's home
FORBIDDEN = [re.compile(re.escape(SIBLING))] + [
    re.compile(r"(?<![\w.-])" + re.escape(SEP + name + SEP) + r"[\w.]") for name in MACHINE_ROOTS]


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
        return [os.path.join(root, p) for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file
        return [os.path.join(d, f) for d, _, fs in os.walk(root) if "/.git" not in d for f in fs]


class SelfContainedTest(unittest.TestCase):
    def test_no_file_points_outside_the_repository(self):
        offenders = []
        files = tracked_files(ARGS.source_dir)
        self.assertGreater(len(files), 50, "found no files to check")
        for path in files:
            try:
                with open(path, "rb") as f:
                    data = f.read(1 << 22)
            except OSError:
                continue
            if b"\0" in data:
                continue  # binary (a model, a fixture)
            text = data.decode("utf-8", "replace")
            for n, line in enumerate(text.splitlines(), 1):
                if any(p.search(line) for p in FORBIDDEN):
                    offenders.append("%s:%d: %s" % (os.path.relpath(path, ARGS.source_dir), n, line.strip()[:120]))
        self.assertEqual(offenders, [], "paths outside the repository:\n" + "\n".join(offenders))

    def test_the_patterns_catch_what_they_should(self):
        bad = [SEP.join([SIBLING, "data", "x.txt"])] + [SEP + SEP.join([name, "x", "y"]) for name in MACHINE_ROOTS]
        for path in bad:
            self.assertTrue(any(p.search(path) for p in FORBIDDEN), path)
        for fine in ("/usr/bin/python3", "/var/lib/txl", "docs/workx", "/opt/txl-serve/model", "a.work/x"):
            self.assertFalse(any(p.search(fine) for p in FORBIDDEN), fine)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

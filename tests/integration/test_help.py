"""`--help` of every binary lists its own flags with their help text (issue 14).

absl's default shows only the flags of a file named after the program, so --help used to print
"No flags matched". Run by CTest: /usr/bin/python3 test_help.py --bin-dir BUILD
"""
import argparse
import os
import subprocess
import sys
import unittest

ARGS = None

# binary (relative to the build directory) -> flags its --help must list
EXPECTED = {
    "server/txl-server": ["--max_stream_buffer_bytes", "--state_dir", "--listen", "--max_connection_idle",
                          "--dtype", "--kv_dtype", "--session_memory_budget", "--gpu_headroom", "--malloc_arenas",
                          "--kernels", "--http_header_timeout_ms"],
    "client/txl-client": ["--server", "--session", "--max_new_tokens"],
    "tools/txl-train": ["--train", "--device", "--resume"],
    "tools/txl-eval": ["--model", "--dtype", "--kv_dtype", "--kernels", "--sdpa_pass_attention"],
    "tools/txl-init": ["--config", "--out"],
}


class HelpTest(unittest.TestCase):
    def test_help_lists_each_binarys_own_flags(self):
        for binary, flags in EXPECTED.items():
            with self.subTest(binary=binary):
                r = subprocess.run([os.path.join(ARGS.bin_dir, binary), "--help"], capture_output=True, text=True,
                                   timeout=60)
                text = r.stdout + r.stderr
                self.assertNotIn("No flags matched", text)
                for flag in flags:
                    self.assertIn(flag, text, "%s --help does not list %s:\n%s" % (binary, flag, text[:2000]))
                self.assertNotIn("--flagfile", text, "absl's own flags belong in --helpfull, not --help")

    def test_sizing_flags_out_of_range_fail_at_start_up_naming_the_flag(self):
        server = os.path.join(ARGS.bin_dir, "server", "txl-server")
        for flag, message in (("--session_memory_budget=-2", "--session_memory_budget >= -1"),
                              ("--gpu_headroom=-5", "--gpu_headroom must be >= 0"),
                              ("--host_headroom=-5", "--host_headroom must be >= 0"),
                              ("--malloc_arenas=-1", "--malloc_arenas must be >= 0"),
                              ("--malloc_keep_bytes=-1", "--malloc_keep_bytes must be >= 0, got -1"),
                              ("--http_header_timeout_ms=0", "--http_header_timeout_ms must be >= 1, got 0")):
            proc = subprocess.run([server, flag, "--listen=127.0.0.1:0"], capture_output=True, text=True,
                                  timeout=60)
            self.assertNotEqual(proc.returncode, 0, flag)
            self.assertIn(message, proc.stderr, flag)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)

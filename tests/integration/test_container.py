"""The Dockerfile's steps, proved without a Docker engine.

No Docker engine runs here, so this test replays what the image does with the
same commands: the build stage's `cmake --install` (into a DESTDIR), the
runtime stage's entrypoint on the installed tree (bundled model by default, a
"mounted" one with --model), the HEALTHCHECK command, and the runtime
package list (`install-deps.sh --runtime`) against the libraries the
installed binaries load.

Run by CTest: /usr/bin/python3 test_container.py --source-dir SRC --build-dir BUILD
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None
# In every debian:12 image (essential, or required by apt itself).
BASE_IMAGE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6"}


def parse_dockerfile(path):
    """Stages as lists of (INSTRUCTION, argument text), continuations joined."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"\\\n", " ", text)
    stages, args = [], {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, rest.strip()))
    return stages, args


def exec_form(arg):
    """A JSON-array instruction argument as a list of strings."""
    return re.findall(r'"([^"]*)"', arg)


class ContainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stages, cls.global_args = parse_dockerfile(os.path.join(ARGS.source_dir, "Dockerfile"))
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_container_")
        # The build stage's install step, into a DESTDIR instead of the image root.
        install = [a for i, a in cls.stages[0] if i == "RUN" and a.startswith("cmake --install")]
        assert len(install) == 1, install
        argv = shlex.split(install[0])
        argv[argv.index("build")] = ARGS.build_dir
        cls.prefix = argv[argv.index("--prefix") + 1]
        cls.root = os.path.join(cls.tmp.name, "root")
        subprocess.run(argv, check=True, capture_output=True, env=dict(os.environ, DESTDIR=cls.root))
        cls.installed = cls.root + cls.prefix

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def final(self, instr):
        return [a for i, a in self.stages[-1] if i == instr]

    def test_stages_use_the_ci_scripts(self):
        self.assertEqual(len(self.stages), 2)
        self.assertEqual(self.global_args.get("DEBIAN"), "debian:12")
        build_runs = " ; ".join(a for i, a in self.stages[0] if i == "RUN")
        self.assertIn("scripts/install-deps.sh", build_runs)
        self.assertIn("scripts/build.sh", build_runs)
        self.assertIn("-slim", self.stages[1][0][1])
        self.assertTrue(any("install-deps.sh --runtime" in a for a in self.final("RUN")))

    def test_runs_as_non_root_and_exposes_the_ports(self):
        users = self.final("USER")
        self.assertTrue(users, "no USER in the runtime stage")
        self.assertNotIn(users[-1].split(":")[0], ("0", "root"))
        ports = " ".join(self.final("EXPOSE")).split()
        self.assertIn("50051", ports)
        self.assertIn("9464", ports)
        self.assertIn("8080", ports)
        entry = exec_form(self.final("ENTRYPOINT")[-1])
        self.assertIn("--listen=0.0.0.0:50051", entry)
        self.assertIn("--metrics_listen=0.0.0.0:9464", entry)
        self.assertIn("--http_listen=0.0.0.0:8080", entry)
        with open(os.path.join(ARGS.source_dir, ".dockerignore")) as f:
            self.assertIn("build*/", f.read().split())

    def start(self, *extra):
        """The image's ENTRYPOINT on the installed tree, on loopback ports; returns a txl_procs.Server."""
        entry = exec_form(self.final("ENTRYPOINT")[-1])
        argv = [self.root + entry[0] if entry[0].startswith(self.prefix) else entry[0]]
        for a in entry[1:]:
            argv.append(re.sub(r"0\.0\.0\.0:\d+", "127.0.0.1:0", a))
        try:
            return txl_procs.Server.from_argv(argv + list(extra))
        except RuntimeError as e:
            self.fail(f"installed {e}")

    def stop(self, server):
        self.assertEqual(server.stop(), 0)

    def healthcheck(self, address):
        cmd = exec_form(self.final("HEALTHCHECK")[-1].split("CMD", 1)[1])
        cmd[0] = self.root + cmd[0]
        cmd[cmd.index("--server") + 1] = address
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)

    def test_installed_server_serves_the_bundled_model_and_passes_the_healthcheck(self):
        server = self.start()
        try:
            self.assertIn(f"model {self.installed}/model/shakespeare_char.pt", server.output)
            health = self.healthcheck(server.address)
            self.assertEqual(health.returncode, 0, health.stderr)
            self.assertEqual(health.stdout.strip(), "SERVING")
        finally:
            self.stop(server)
        # With the server gone the health check must fail (it is a real probe).
        self.assertNotEqual(self.healthcheck(server.address).returncode, 0)

    def test_a_mounted_model_is_served_with_model_flag(self):
        mounted = os.path.join(self.tmp.name, "models", "m.pt")
        os.makedirs(os.path.dirname(mounted))
        shutil.copy(os.path.join(self.installed, "model", "shakespeare_char.pt"), mounted)
        server = self.start("--model", mounted)
        try:
            self.assertIn(f"model {mounted}", server.output)
        finally:
            self.stop(server)

    def test_runtime_packages_cover_what_the_binaries_load(self):
        with open(os.path.join(ARGS.source_dir, "scripts", "install-deps.sh")) as f:
            m = re.search(r"RUNTIME_PACKAGES=\(([^)]*)\)", f.read())
        runtime = set(re.sub(r"#.*", "", m.group(1)).split())
        allowed = runtime | BASE_IMAGE_PACKAGES
        for exe in sorted(os.listdir(os.path.join(self.installed, "bin"))):
            path = os.path.join(self.installed, "bin", exe)
            needed = re.findall(r"\(NEEDED\).*\[(.+)\]", subprocess.run(
                ["readelf", "-d", path], capture_output=True, text=True, check=True).stdout)
            resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(
                ["ldd", path], capture_output=True, text=True, check=True).stdout, re.M))
            for lib in needed:
                self.assertIn(lib, resolved, f"{exe}: {lib} does not resolve")
                real = os.path.realpath(resolved[lib])
                owner = None
                # usrmerge: dpkg may know the file under /lib or /usr/lib.
                for candidate in (resolved[lib], real, real.replace("/usr/lib/", "/lib/", 1)):
                    r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
                    if r.returncode == 0:
                        owner = r.stdout.split(":")[0]
                        break
                self.assertIsNotNone(owner, f"{exe}: no package owns {lib} ({real})")
                self.assertIn(owner, allowed, f"{exe} loads {lib} from {owner}, not in RUNTIME_PACKAGES")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()

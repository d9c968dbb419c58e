"""The real Debian nginx with deploy/nginx/nginx.conf in front of txl-server replicas, for tests.

    proxy = nginx_proxy.NginxProxy(conf_template, [replica.address, ...], work_dir,
                                   http_upstreams=[replica.http_address, ...])  # optional
    proxy.start(ready)   # ready(): True once a call through proxy.address succeeds
    ... proxy.address, proxy.access_log ...
    proxy.stop()

A test script imports it from its own directory, like txl_procs.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time

import txl_procs


def listen_port():
    """A free port below the kernel's ephemeral range, so that no process binding port 0 (the
    replicas and servers of tests running beside this one) can take it before nginx binds it.

    Regression (nginx_affinity in CI): free_port()'s port was taken in that gap by another test's
    txl-server serving the same tiny model; nginx could not listen and exited, the readiness call
    was answered by that server, and the test's "proxied" sessions lived there."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if low <= 11000:
        return txl_procs.free_port()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return txl_procs.free_port()


def render(template, values):
    """envsubst restricted to the given names (what the config's header documents)."""
    out = template
    for name, value in values.items():
        out = out.replace("${" + name + "}", value)
    left = re.findall(r"\$\{TXL_[A-Z_]+\}", out)
    if left:
        raise AssertionError(f"unrendered placeholders: {left}")
    return out


class NginxProxy:
    """nginx rendered from `conf_template` with `upstreams` (host:port), run from `work_dir`/nginx."""

    def __init__(self, conf_template, upstreams, work_dir, http_upstreams=None):
        self.bin = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(self.bin):
            raise RuntimeError("nginx is not installed (scripts/install-deps.sh installs nginx-light)")
        self.run_dir = os.path.join(work_dir, "nginx")
        os.makedirs(self.run_dir)
        os.chmod(work_dir, 0o755)  # nginx workers may run as another user when we are root
        os.chmod(self.run_dir, 0o777)
        self.address = f"127.0.0.1:{listen_port()}"
        self.http_address = f"127.0.0.1:{listen_port()}"
        self.access_log = os.path.join(self.run_dir, "access.log")
        with open(conf_template) as f:
            conf = render(f.read(), {
                "TXL_PROXY_LISTEN": self.address,
                "TXL_NGINX_RUN_DIR": self.run_dir,
                "TXL_UPSTREAM_SERVERS": " ".join(f"server {u};" for u in upstreams),
                "TXL_PROXY_HTTP_LISTEN": self.http_address,
                # Without HTTP replicas the HTTP side is rendered but unused.
                "TXL_UPSTREAM_HTTP_SERVERS": " ".join(f"server {u};" for u in (http_upstreams or upstreams)),
            })
        self.conf_path = os.path.join(self.run_dir, "nginx.conf")
        with open(self.conf_path, "w") as f:
            f.write(conf)
        self.proc = None

    def start(self, ready, timeout=30):
        """Checks the config (nginx -t), starts nginx in the foreground and returns once ready()."""
        check = subprocess.run([self.bin, "-t", "-p", self.run_dir, "-e", "stderr", "-c", self.conf_path],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t rejected the rendered config:\n{check.stderr}")
        self.proc = subprocess.Popen([self.bin, "-p", self.run_dir, "-e", "stderr", "-c", self.conf_path,
                                      "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stdout.read()}")
            # Ready only once this nginx served the call: its log has it, and it still runs.
            if ready() and os.path.exists(self.access_log) and os.path.getsize(self.access_log) > 0:
                if self.proc.poll() is None:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nginx did not start proxying within {timeout} s")
            time.sleep(0.1)  # polling a process that is starting, not hiding a race

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()

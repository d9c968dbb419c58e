"""A redis-server for the integration tests that use the Redis state store (--state_store redis://...).

- Redis(directory): redis-server on a free loopback port, no persistence, ready once it answers
  PING; port, proc; pause() (SIGSTOP) and resume() (SIGCONT): a store that stops answering, and
  then applies what it was sent meanwhile; stop().

A test script imports it from its own directory:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import redis_procs
"""
import shutil
import signal
import socket
import subprocess
import time

import txl_procs


class Redis:
    """redis-server on a free loopback port, no persistence; ready once it answers PING."""

    def __init__(self, directory):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/install-deps.sh installs it)")
        self.port = txl_procs.free_port()
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", directory],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while not self.ping():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.proc.stdout.read()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING within 30 s")
            time.sleep(0.05)  # polling a process that is starting

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def pause(self):
        """SIGSTOP: connections are still accepted (by the kernel) and commands still sent, but nothing
        is answered or applied until resume()."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        """SIGCONT: the commands sent while paused are applied now, in order."""
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused redis-server would not see SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

"""Session affinity through the real Debian nginx with deploy/nginx/nginx.conf.

Two txl-server replicas sit behind the proxy; 20 sessions are created and
driven through it with multi-turn greedy Generate, concurrently. Each turn
must equal the same turn of a control server driven directly, both replicas
must hold sessions, and after one replica stops exactly its own sessions fail
(with NOT_FOUND from the survivor) while the others go on unharmed.

Run by CTest: /usr/bin/python3 test_nginx_affinity.py --bin-dir BUILD --nginx-conf deploy/nginx/nginx.conf
"""
import argparse
import concurrent.futures
import http.client as http_client
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nginx_proxy  # noqa: E402
import txl_procs  # noqa: E402

ARGS = None
SESSIONS = 20
TURNS = ["To be, or not", " to be: that is", " the question."]
NEW_TOKENS = 6


def client(address, *args):
    return subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", address,
                           "--timeout", "60", *args], capture_output=True, text=True, timeout=120)


def turn(address, sid, text):
    """One greedy turn; returns (ok, generated text or the error line)."""
    r = client(address, "--session", sid, "--temperature", "0", "--max_new_tokens", str(NEW_TOKENS),
               "generate", text)
    return r.returncode == 0, (r.stdout if r.returncode == 0 else r.stderr.strip())


def create(address):
    r = client(address, "create")
    if r.returncode != 0:
        raise AssertionError(f"create via {address}: {r.stderr}")
    return r.stdout.strip()


def listed(address):
    r = client(address, "sessions", "list")
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    return set(re.findall(r"\b[0-9a-f]{32}\b", r.stdout))


class NginxAffinityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_nginx_")
        model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)
        cls.replicas = [txl_procs.Server(ARGS.bin_dir, model, http=True), txl_procs.Server(ARGS.bin_dir, model, http=True)]
        cls.control = txl_procs.Server(ARGS.bin_dir, model)
        cls.nginx = nginx_proxy.NginxProxy(ARGS.nginx_conf, [r.address for r in cls.replicas], cls.tmp.name,
                                           http_upstreams=[r.http_address for r in cls.replicas])
        cls.proxy, cls.access_log = cls.nginx.address, cls.nginx.access_log
        # Ready when a call through it succeeds (bounded).
        cls.nginx.start(lambda: client(cls.proxy, "health").returncode == 0)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "nginx", None) is not None:
            cls.nginx.stop()
        for s in getattr(cls, "replicas", []) + [getattr(cls, "control", None)]:
            if s is not None:
                s.stop()
        cls.tmp.cleanup()

    def test_sessions_stick_to_one_replica(self):
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)

        # Control: every session's turns straight against one server.
        def direct(i):
            sid = create(self.control.address)
            return sid, [turn(self.control.address, sid, t) for t in TURNS]

        # Through the proxy: creation and every turn hash on the id.
        def proxied(i):
            sid = create(self.proxy)
            return sid, [turn(self.proxy, sid, t) for t in TURNS]

        expected = list(pool.map(direct, range(SESSIONS)))
        got = list(pool.map(proxied, range(SESSIONS)))
        for i, (sid, turns) in enumerate(got):
            for k, (ok, text) in enumerate(turns):
                self.assertTrue(ok, f"session {i} turn {k} via the proxy failed: {text}")
                self.assertEqual(text, expected[i][1][k][1], f"session {i} turn {k}: history differs from direct run")

        owners = [listed(r.address) for r in self.replicas]
        ids = {sid for sid, _ in got}
        self.assertEqual(owners[0] | owners[1], ids)
        self.assertFalse(owners[0] & owners[1], "a session exists on both replicas")
        self.assertTrue(owners[0] and owners[1], f"one replica holds every session: {[len(o) for o in owners]}")
        print(f"replica sessions: {len(owners[0])} + {len(owners[1])}", file=sys.stderr)

        # The proxy's log shows each session's route on one upstream only.
        upstream_of = {}
        with open(self.access_log) as f:
            for line in f:
                m = re.search(r"upstream=(\S+) .*route=([0-9a-f]{8})\b", line)
                if m:
                    upstream_of.setdefault(m.group(2), set()).add(m.group(1))
        for sid in ids:
            self.assertEqual(len(upstream_of.get(sid[:8], ())), 1, f"{sid} reached {upstream_of.get(sid[:8])}")

        # Forks made through the proxy stay with their source and continue it exactly.
        def fork_turn(address, sid):
            r = client(address, "sessions", "fork", sid)
            self.assertEqual(r.returncode, 0, r.stderr)
            child = r.stdout.split()[0]
            return child, turn(address, child, " Ay")

        for i in range(5):
            child, (ok, text) = fork_turn(self.proxy, got[i][0])
            self.assertTrue(ok, f"fork of session {i} via the proxy failed: {text}")
            self.assertEqual(text, fork_turn(self.control.address, expected[i][0])[1][1])
            self.assertEqual(child[:8], got[i][0][:8])
            self.assertEqual(client(self.proxy, "sessions", "delete", child).returncode, 0)

        # Stop replica 0: only its sessions fail, with a clear status; the rest continue exactly.
        self.replicas[0].stop()
        more = " Whether 'tis nobler"

        def direct_next(i):
            sid = create(self.control.address)
            for t in TURNS:
                turn(self.control.address, sid, t)
            return turn(self.control.address, sid, more)[1]

        expected_next = list(pool.map(direct_next, range(SESSIONS)))
        after = list(pool.map(lambda g: turn(self.proxy, g[0], more), got))
        for i, (sid, _) in enumerate(got):
            ok, text = after[i]
            if sid in owners[0]:
                self.assertFalse(ok, f"session {i} of the stopped replica still answered")
                self.assertIn("NOT_FOUND", text)
                self.assertIn(sid, text)
            else:
                self.assertTrue(ok, f"session {i} of the live replica failed: {text}")
                self.assertEqual(text, expected_next[i])
        # Calls without a session fail over to the live replica.
        for _ in range(4):
            r = client(self.proxy, "--temperature", "0", "--max_new_tokens", "2", "generate", "x")
            self.assertEqual(r.returncode, 0, r.stderr)
        pool.shutdown()

    def test_http_routes_by_the_session_header(self):
        """HTTP through the proxy: a session created with a client-chosen id (sent in the header too)
        lives on one replica, and every later call naming it, by header or by path, reaches it."""
        def http(address, method, path, body=None, sid=None):
            host, port = address.rsplit(":", 1)
            conn = http_client.HTTPConnection(host, int(port), timeout=60)
            headers = {"Content-Type": "application/json"}
            if sid:
                headers["txl-session-id"] = sid
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            r = conn.getresponse()
            out = (r.status, json.loads(r.read() or b"null"))
            conn.close()
            return out

        ids = [secrets.token_hex(16) for _ in range(8)]
        for sid in ids:
            status, s = http(self.nginx.http_address, "POST", "/v1/sessions", {"session_id": sid}, sid=sid)
            self.assertEqual((status, s["id"]), (200, sid))
            for _ in range(3):
                status, c = http(self.nginx.http_address, "POST", "/v1/completions",
                                 {"prompt": "ab", "max_tokens": 2, "temperature": 0}, sid=sid)
                self.assertEqual(status, 200, c)
            status, got = http(self.nginx.http_address, "GET", "/v1/sessions/" + sid)  # by path
            self.assertEqual((status, got["position"]), (200, 12))
        # Each session exists on exactly one replica, and both replicas hold some.
        holders = [[r for r in self.replicas if http(r.http_address, "GET", "/v1/sessions/" + sid)[0] == 200]
                   for sid in ids]
        self.assertTrue(all(len(h) == 1 for h in holders), holders)
        self.assertEqual(len({id(h[0]) for h in holders}), 2)
        for sid in ids:  # routed by path; leaves the replicas as the other test expects them
            self.assertEqual(http(self.nginx.http_address, "DELETE", "/v1/sessions/" + sid)[0], 200)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--nginx-conf", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()

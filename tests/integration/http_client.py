"""One HTTP/1.1 keep-alive connection with JSON and server-sent-event helpers, for the HTTP tests.
A test script imports it from its own directory, as it does txl_procs.
"""
import http.client
import json


class Http:
    """One HTTP/1.1 connection to host:port."""

    def __init__(self, address, token=None):
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.token = token

    def request(self, method, path, body=None, headers=None):
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=data, headers=h)
        return self.conn.getresponse()

    def json(self, method, path, body=None, headers=None):
        r = self.request(method, path, body, headers)
        return r.status, json.loads(r.read() or b"null"), r

    def stream(self, path, body):
        """POSTs a streaming request; returns (status, [parsed events], raw text)."""
        r = self.request("POST", path, body)
        raw = r.read().decode()
        events = []
        for block in raw.split("\n\n"):
            if block.startswith("data: "):
                payload = block[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return r.status, events, raw

    def close(self):
        self.conn.close()

"""A streamed completion on a raw socket, for the HTTP tests that need what http.client hides: a
small receive buffer, so that a long stream cannot be written out until it is read and its
request stays in flight on the server.

- open_stream(address, request): POSTs `request` to /v1/completions, reads up to its first event.
- read_to_end(sock, got): reads the chunked answer to its last chunk; its text.

A test script imports it from its own directory, as it does txl_procs.
"""
import json
import socket


def open_stream(address, request, rcvbuf=4096):
    """POSTs `request` (a dict, with "stream": true) to HOST:PORT's /v1/completions on a new socket
    whose receive buffer is `rcvbuf` bytes, and reads up to the first event: (socket, bytes read)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    body = json.dumps(request).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError("the stream closed before its first event: %r" % got)
        got += chunk
    return sock, got


def read_to_end(sock, got, timeout=60):
    """Reads the chunked answer begun with `got` to its last chunk and returns its text; an
    AssertionError if the server closes it before."""
    sock.settimeout(timeout)
    while not got.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("the stream was cut: %r" % got[-300:])
        got += chunk
    return got.decode("utf-8", "replace")

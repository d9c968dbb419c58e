"""A loopback TCP proxy between txl-server and redis-server that loses one chosen store write, for tests.

    proxy = redis_reply_proxy.RedisReplyProxy(redis_port)   # listens on 127.0.0.1:proxy.port
    ... start txl-server with --state_store redis://127.0.0.1:{proxy.port}/PREFIX ...
    proxy.arm("append", REPLY_LOST, match=session_id)       # the next such write loses its reply
    ... the request ...
    proxy.fired.is_set(), proxy.seen (Counter of the kinds of write forwarded), proxy.stop()

It forwards every connection to Redis unchanged, parsing RESP both ways (client -> server: arrays of
bulk strings, or inline commands; server -> client: + - : $ * replies, nested arrays, $-1 and *-1
nil), so that it knows which reply answers which command (Redis answers each command once, in
order). A write's kind: for EVAL, its ARGV[1] (the element after the numkeys keys), e.g. "append",
"snapshot", "rewind", "create", "fork", "delete", "release"; for any other command its name ("SET",
"GET", ...). Once armed, the first write of that kind whose keys or arguments (the script aside)
contain `match` (any, when None) is lost, once, and the connection it came on goes dark there:

  REPLY_LOST:   the write is forwarded (it lands in Redis) but its reply is not sent back;
  REQUEST_LOST: the write is swallowed (it never lands).

Either way the replies to the commands before it on that connection are delivered, and nothing
after it is forwarded either way: the client sees a connection that stopped answering, times out
(txl-server's Redis command timeout, 2 s), closes it and reconnects; new connections are forwarded
normally. The internal kinds "refence" and "trim" can never be armed.

A test script imports it from its own directory, like txl_procs.
"""
import collections
import socket
import threading

REPLY_LOST = "reply lost"
REQUEST_LOST = "request lost"
NEVER_DROPPED = ("refence", "trim")


class Incomplete(Exception):
    """The buffer ends inside a value: wait for more bytes."""


def _line(buf, pos):
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete()
    return buf[pos:end], end + 2


def parse_value(buf, pos=0):
    """One RESP value from buf[pos:]: (value, end). Raises Incomplete when it is cut short, ValueError
    when it is not RESP. Simple strings and errors come back as bytes, integers as int, nil as None,
    arrays as lists."""
    if pos >= len(buf):
        raise Incomplete()
    kind = buf[pos:pos + 1]
    line, pos = _line(buf, pos + 1)
    if kind in (b"+", b"-"):
        return line, pos
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise Incomplete()
        if buf[pos + n:pos + n + 2] != b"\r\n":
            raise ValueError(f"bulk string of {n} bytes not followed by CRLF")
        return buf[pos:pos + n], pos + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse_value(buf, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"not a RESP2 value: type byte {kind!r}")


def parse_command(buf, pos=0):
    """One client command from buf[pos:]: ([bytes args], end). An array of bulk strings, or an inline
    command (a line of words)."""
    if pos >= len(buf):
        raise Incomplete()
    if buf[pos:pos + 1] == b"*":
        args, end = parse_value(buf, pos)
        if args is None or not all(isinstance(a, bytes) for a in args):
            raise ValueError("a command that is not an array of bulk strings")
        return args, end
    line, end = _line(buf, pos)
    return line.split(), end


def command_kind(args):
    """The kind of write a command is: EVAL's ARGV[1], else the command's name (upper case)."""
    if not args:
        return ""
    name = args[0].decode(errors="replace").upper()
    if name in ("EVAL", "EVALSHA") and len(args) >= 3:
        try:
            numkeys = int(args[2])
        except ValueError:
            return name
        if len(args) > 3 + numkeys:
            return args[3 + numkeys].decode(errors="replace")
    return name


def command_mentions(args, text):
    """Whether `text` occurs in the command's keys or arguments (EVAL's script aside)."""
    if text is None:
        return True
    needle = text.encode()
    skip = 2 if args and args[0].upper() in (b"EVAL", b"EVALSHA") else 1
    return any(needle in a for a in args[skip:])


class _Link:
    """One client connection and its connection to Redis."""

    def __init__(self, proxy, client, upstream):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.lock = threading.Lock()
        self.forwarded = 0      # commands forwarded to Redis
        self.reply_limit = None  # once dark: replies past this many are not sent back
        self.threads = [threading.Thread(target=self._requests, daemon=True),
                        threading.Thread(target=self._replies, daemon=True)]
        for t in self.threads:
            t.start()

    def close(self):
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @staticmethod
    def _frames(sock, parse):
        """(parsed, raw bytes) of each whole RESP value read from sock, until it closes."""
        buf, pos = b"", 0
        while True:
            data = sock.recv(65536)
            if not data:
                return
            buf = buf[pos:] + data
            pos = 0
            while True:
                try:
                    value, end = parse(buf, pos)
                except Incomplete:
                    break
                yield value, buf[pos:end]
                pos = end

    def _requests(self):
        try:
            for args, raw in self._frames(self.client, parse_command):
                with self.lock:
                    if self.reply_limit is not None:
                        continue  # dark: nothing more reaches Redis
                    kind = command_kind(args)
                    lose = self.proxy._take(kind, args)
                    if lose is None:
                        self.forwarded += 1
                        self.proxy._saw(kind)
                    else:
                        self.reply_limit = self.forwarded
                        if lose == REPLY_LOST:
                            self.forwarded += 1
                            self.proxy._saw(kind)
                    if lose in (None, REPLY_LOST):
                        self.upstream.sendall(raw)
                if lose is not None:
                    self.proxy.fired.set()
        except (OSError, ValueError) as e:
            if not isinstance(e, OSError):
                self.proxy.errors.append(f"client -> redis: {e}")
        finally:
            self.close()

    def _replies(self):
        replies = 0
        try:
            for _, raw in self._frames(self.upstream, parse_value):
                with self.lock:
                    deliver = self.reply_limit is None or replies < self.reply_limit
                replies += 1
                if deliver:
                    self.client.sendall(raw)
        except (OSError, ValueError) as e:
            if not isinstance(e, OSError):
                self.proxy.errors.append(f"redis -> client: {e}")
        finally:
            self.close()

class RedisReplyProxy:
    """Listens on 127.0.0.1:port and forwards each connection to 127.0.0.1:redis_port (see above)."""

    def __init__(self, redis_port):
        self.redis_port = redis_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.fired = threading.Event()  # the armed write was lost
        self.seen = collections.Counter()  # kinds of the commands forwarded to Redis
        self.errors = []  # RESP the proxy could not parse (a test should assert there is none)
        self._lock = threading.Lock()
        self._rule = None
        self._links = []
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def arm(self, kind, variant, match=None):
        """The next write of `kind` mentioning `match` is lost as `variant` (REPLY_LOST or REQUEST_LOST).
        Clears `fired` and `seen`."""
        if kind in NEVER_DROPPED:
            raise ValueError(f"the proxy never loses a {kind!r} write")
        if variant not in (REPLY_LOST, REQUEST_LOST):
            raise ValueError(f"unknown variant {variant!r}")
        with self._lock:
            self._rule = (kind, variant, match)
            self.fired.clear()
            self.seen.clear()

    def disarm(self):
        """Forgets a rule that has not fired."""
        with self._lock:
            self._rule = None

    def _take(self, kind, args):
        """The variant to lose this command with, or None; a rule fires once."""
        with self._lock:
            if self._rule is None or self._rule[0] != kind or not command_mentions(args, self._rule[2]):
                return None
            variant = self._rule[1]
            self._rule = None
            return variant

    def _saw(self, kind):
        with self._lock:
            self.seen[kind] += 1

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._stopped:
                client.close()
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.redis_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()  # Redis is gone: so is this connection
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._links = [link for link in self._links if any(t.is_alive() for t in link.threads)]
                self._links.append(_Link(self, client, upstream))

    def stop(self):
        self._stopped = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=10)
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
            for t in link.threads:
                t.join(timeout=10)

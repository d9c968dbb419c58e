"""The examples of docs/API.md and docs/API_GENERATION.md (Generate, Converse and Score, split out of
API.md), run against real txl-servers (the bundled model), so that the pages cannot drift.

Run by CTest (api_examples):
    /usr/bin/python3 test_api_examples.py --bin-dir BUILD --stubs BUILD/client/python/gen [--doc PAGE ...]

The pages are one story, read in the order given (API.md, then API_GENERATION.md): their blocks run as
one page's would, and `after=` may name a block of either. The convention in them: an example to check
is a fenced block right after an HTML comment (invisible when the page is rendered)

    <!-- check -->                                  run it on the shared server ADDR (bundled model, default flags)
    <!-- check: name=N; after=M,K; server=FLAGS; fresh -->

- `server=FLAGS`: the txl-server flags the example assumes (besides the bundled model and loopback ports).
  Blocks with the same flags share one server per server name (`ADDR`, or the word after `--server`),
  and so share its sessions; `fresh` gives the block servers of its own, stopped after it.
- Blocks run in page order, except that a block with `after=M` runs once the block named M has run
  (the page tells a story in which, e.g., GetSession shows a session the later Generate section fed).
- A block of `grpcurl` commands sends each request through the generated stubs (grpcurl's arguments
  `-H`, `-d '...'`, `-d @ <<EOF ... EOF`, the address word and the method); every call must succeed, and
  the ```json block right after it is the last call's answer (one object per response of a stream).
- A console block runs each `$ ` line with bash (txl-client on PATH, `--server NAME` replaced by that
  server's address) and compares the output lines below it. `$ kill -TERM ...` SIGTERMs the block's
  server while 16 long generations keep it draining; the lines after it run during the drain.
- `<!-- check: formula -->`: the block holds `memory_tokens = ...` and `memory_bytes = ...`; every
  session the servers report in the checked examples must satisfy them (`capacity` being a whole
  number of slots between memory_tokens and mem_len). A sentence "`memory_bytes` = a x b x ... = N"
  must multiply out to N, and N must be the memoryBytes / memory_bytes of the example just before it.
- A fenced block with grpcurl or `$ ` commands that is not checked must say why in a comment
  `<!-- not checked: REASON -->`.

What is compared: every field the page shows, by value (ids: a 32-hex id first seen in an answer stands
for the server's id there, and ids sharing their first 8 characters on the page must share them in the
answers too; floats within 1e-4; timestamps, model paths and `*Seconds` timings are not compared, nor
free text such as a streamed generation on the console). `...` on a line of its own stands for answers
(or output lines) left out; inside an object, for fields left out; an object without `...` must have
exactly the fields shown. Console lines compared: `txl-client: CODE: message`, the generate/chat
summary `[reason: N input, M generated, ..., position P]`, `ID key=value ...` session lines, `session ID`,
`exported N bytes to F`, JSON lines, `SERVING`/`NOT_SERVING`, and protobuf text `key: value` lines. A
`# exit N` comment checks the exit status (otherwise 1 where an error line is shown, else 0), and
`no output` that nothing was printed.
"""
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = grpc = txl_pb2 = txl_pb2_grpc = None  # set by txl_procs.run_stub_tests
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED = os.path.join(REPO, "model", "bundled", "shakespeare_char.pt")
HEX32 = re.compile(r"\b[0-9a-f]{32}\b")
ELLIPSIS = "..."
# Times, paths and the CPU kernel family of the machine that wrote the page.
SKIP_KEYS = {"created", "lastUsed", "modelPath", "cpuFamily"}
HEALTH = {b"": "UNKNOWN", b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING", b"\x08\x03": "SERVICE_UNKNOWN"}


class Mismatch(AssertionError):
    pass


# ----------------------------------------------------------------------------------------------------
# Reading the pages

class Block:
    def __init__(self, index, doc, line, options, text, answer):
        self.index, self.doc, self.line, self.text, self.answer = index, doc, line, text, answer
        self.name = options.get("name") or "block@%s:%d" % (doc, line)
        self.after = [a.strip() for a in options.get("after", "").split(",") if a.strip()]
        self.flags = tuple(shlex.split(options.get("server", "")))
        self.fresh = "fresh" in options
        self.formula = "formula" in options
        self.console = any(l.startswith("$ ") for l in text.splitlines())

    def __repr__(self):
        return "%s line %d (%s)" % (self.doc, self.line, self.name)


def parse_options(comment):
    options = {}
    for item in comment.split(";"):
        item = item.strip()
        if not item:
            continue
        key, _, value = item.partition("=")
        options[key.strip()] = value.strip() if _ else True
    return options


FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
CHECK = re.compile(r"<!--\s*check(?::(.*?))?\s*-->\s*$")
NOT_CHECKED = re.compile(r"<!--\s*not checked:.*?-->\s*$")


def read_doc(path, first_index=0):
    """(checked blocks, product sentences [(page, line, text, expression, N)], problems); the blocks are
    numbered from first_index."""
    page = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    fences = [(m.start(), m.end(), m.group(1), m.group(2)) for m in FENCE.finditer(doc)]
    line_of = lambda pos: doc.count("\n", 0, pos) + 1  # noqa: E731
    blocks, problems, used_answers = [], [], set()
    for i, (start, end, lang, body) in enumerate(fences):
        before = doc[:start].rstrip("\n")
        last_line = before[before.rfind("\n") + 1:]
        commands = re.search(r"^(grpcurl |\$ )", body, re.M)
        m = CHECK.search(last_line)
        if m:
            answer = None
            if i + 1 < len(fences) and fences[i + 1][2] == "json" and not doc[end:fences[i + 1][0]].strip():
                answer = fences[i + 1][3]
                used_answers.add(i + 1)
            blocks.append(Block(first_index + len(blocks), page, line_of(start), parse_options(m.group(1) or ""),
                                body, answer))
        elif commands and not NOT_CHECKED.search(last_line):
            problems.append("%s line %d: an example with commands but no <!-- check --> "
                            "(or <!-- not checked: reason -->) comment" % (page, line_of(start)))
    for i, (start, end, lang, body) in enumerate(fences):
        if lang == "json" and i not in used_answers:
            problems.append("%s line %d: a json answer that follows no checked command block" %
                            (page, line_of(start)))
    products = []
    for m in re.finditer(r"`memory_bytes`\s*=\s*([0-9][0-9a-z x]*?)\s*=\s*([0-9][0-9,]*)", doc):
        products.append((page, line_of(m.start()), m.group(0), m.group(1), int(m.group(2).replace(",", ""))))
    return blocks, products, problems


def read_docs(paths):
    """read_doc of every page, in order: their blocks as one page's."""
    blocks, products, problems = [], [], []
    for path in paths:
        b, p, q = read_doc(path, len(blocks))
        blocks, products, problems = blocks + b, products + p, problems + q
    return blocks, products, problems


def parse_json_answer(text):
    """A ```json block: a list of objects and ELLIPSIS markers. `...` inside an object becomes the key
    "..." (fields left out)."""
    text = re.sub(r"([,{]\s*)\.\.\.(\s*[,}])", r'\1"...": null\2', text)
    items, pos, decoder = [], 0, json.JSONDecoder()
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return items
        if text.startswith(ELLIPSIS, pos):
            items.append(ELLIPSIS)
            pos += len(ELLIPSIS)
            continue
        obj, pos = decoder.raw_decode(text, pos)
        items.append(obj)


# ----------------------------------------------------------------------------------------------------
# Comparing: ids bind on first sight; the result of a match is the new bindings (or a Mismatch)

def bind_id(ids, doc_id, actual, where):
    if doc_id in ids:
        if ids[doc_id] != actual:
            raise Mismatch("%s: the page's id %s stands for %s here, the server said %s" %
                           (where, doc_id, ids[doc_id], actual))
        return
    if not HEX32.fullmatch(actual or ""):
        raise Mismatch("%s: the page shows an id %s, the server said %r" % (where, doc_id, actual))
    if actual in ids.values():
        raise Mismatch("%s: the server's id %s already stands for another id of the page" % (where, actual))
    for other, other_actual in ids.items():  # a fork keeps its source's routing prefix, and only a fork
        if (other[:8] == doc_id[:8]) != (other_actual[:8] == actual[:8]):
            raise Mismatch("%s: on the page %s and %s %s their first 8 characters; the server's %s and %s %s" % (
                where, doc_id, other, "share" if other[:8] == doc_id[:8] else "do not share", actual, other_actual,
                "do not" if other[:8] == doc_id[:8] else "do"))
    ids[doc_id] = actual


def substitute_ids(ids, text):
    """The page's ids in a command or message replaced by the server's; unknown ones stand for themselves."""
    def repl(m):
        ids.setdefault(m.group(0), m.group(0))
        return ids[m.group(0)]
    return HEX32.sub(repl, text)


def compare_value(ids, doc, actual, where):
    if isinstance(doc, dict):
        if not isinstance(actual, dict):
            raise Mismatch("%s: the page shows an object, the server %r" % (where, actual))
        elided = "..." in doc
        keys = [k for k in doc if k != "..." and k not in SKIP_KEYS and not k.endswith("Seconds")]
        for k in keys:
            if k not in actual:
                raise Mismatch("%s: the page shows %s, the server's answer has no such field: %s" %
                               (where, k, json.dumps(actual)))
            compare_value(ids, doc[k], actual[k], "%s.%s" % (where, k))
        if not elided:
            extra = [k for k in actual if k not in doc and k not in SKIP_KEYS and not k.endswith("Seconds")]
            if extra:
                raise Mismatch("%s: the server's answer has fields the page does not show (and no '...'): %s "
                               "in %s" % (where, extra, json.dumps(actual)))
    elif isinstance(doc, list):
        if not isinstance(actual, list) or len(doc) != len(actual):
            raise Mismatch("%s: the page shows %d items, the server %s" % (where, len(doc), json.dumps(actual)))
        for i, (d, a) in enumerate(zip(doc, actual)):
            compare_value(ids, d, a, "%s[%d]" % (where, i))
    elif isinstance(doc, bool) or doc is None:
        if doc != actual:
            raise Mismatch("%s: the page shows %r, the server %r" % (where, doc, actual))
    elif isinstance(doc, int) and not isinstance(doc, bool):
        if doc != actual or isinstance(actual, bool):
            raise Mismatch("%s: the page shows %r, the server %r" % (where, doc, actual))
    elif isinstance(doc, float):  # log-probs and the like: float rounding differs between machines
        if not isinstance(actual, (int, float)) or not math.isclose(doc, actual, rel_tol=1e-4, abs_tol=1e-4):
            raise Mismatch("%s: the page shows %r, the server %r" % (where, doc, actual))
    elif isinstance(doc, str) and HEX32.fullmatch(doc):
        bind_id(ids, doc, actual, where)
    else:
        if isinstance(actual, str) and isinstance(doc, str) and substitute_ids(dict(ids), doc) == actual:
            return
        if doc != actual:
            raise Mismatch("%s: the page shows %r, the server %r" % (where, doc, actual))


def try_match(ids, doc, actual, where):
    trial = dict(ids)
    try:
        compare_value(trial, doc, actual, where)
    except Mismatch as e:
        return None, e
    return trial, None


def align(ids, doc_items, actual_items, where):
    """doc_items (with ELLIPSIS markers) against actual_items: the parts between markers in order, the first
    at the start and the last at the end unless a marker stands there. Returns the new bindings."""
    if ELLIPSIS not in doc_items:
        if len(doc_items) != len(actual_items):
            raise Mismatch("%s: the page shows %d items, the server gave %d:\n%s" % (
                where, len(doc_items), len(actual_items), "\n".join(map(str, actual_items))))
        for i, (d, a) in enumerate(zip(doc_items, actual_items)):
            compare_value(ids, d, a, "%s, item %d" % (where, i + 1))
        return ids
    parts, part = [], []
    for item in doc_items:
        if item == ELLIPSIS:
            parts.append(part)
            part = []
        else:
            part.append(item)
    parts.append(part)
    lo, hi = 0, len(actual_items)
    head, tail, middle = parts[0], parts[-1], parts[1:-1]
    if len(head) + len(tail) > hi:
        raise Mismatch("%s: the page shows more items than the server gave (%d)" % (where, hi))
    for i, d in enumerate(head):
        compare_value(ids, d, actual_items[i], "%s, item %d" % (where, i + 1))
    lo = len(head)
    for j, d in enumerate(tail):
        k = hi - len(tail) + j
        compare_value(ids, d, actual_items[k], "%s, item %d of %d" % (where, k + 1, hi))
    hi -= len(tail)
    for seg in middle:
        found = None
        last_error = None
        for start in range(lo, hi - len(seg) + 1):
            trial = dict(ids)
            try:
                for j, d in enumerate(seg):
                    compare_value(trial, d, actual_items[start + j], "%s, item %d" % (where, start + j + 1))
            except Mismatch as e:
                last_error = e
                continue
            found = start
            ids.clear()
            ids.update(trial)
            break
        if found is None:
            raise Mismatch("%s: no run of the server's answers matches the page's %s (last difference: %s)\n"
                           "the server's:\n%s" % (where, json.dumps(seg), last_error,
                                                  "\n".join(map(str, actual_items[lo:hi]))))
        lo = found + len(seg)
    return ids


# Console lines: the fields of a line, or None for free text
def console_fields(line):
    line = line.rstrip()
    m = re.match(r"^txl-client: ([A-Z_]+): (.*)$", line)
    if m:
        return {"code": m.group(1), "message": m.group(2)}
    m = re.match(r"^\[(\w+): (\d+) input, (\d+) generated, .*position (\d+)\]$", line)
    if m:
        return {"finish": m.group(1), "input": int(m.group(2)), "generated": int(m.group(3)),
                "position": int(m.group(4))}
    m = re.match(r"^exported (\d+) bytes to (\S+)$", line)
    if m:
        return {"exported_bytes": int(m.group(1)), "file": m.group(2)}
    m = re.match(r"^([0-9a-f]{32})((?: [a-z_]+=\S+)*)$", line)
    if m:
        fields = {"id": m.group(1)}
        for kv in m.group(2).split():
            k, v = kv.split("=", 1)
            fields[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
        return fields
    m = re.match(r"^session ([0-9a-f]{32})$", line)
    if m:
        return {"session": m.group(1)}
    if line.startswith("{") and line.endswith("}"):
        return json.loads(line)
    if line in ("SERVING", "NOT_SERVING"):
        return {"health": line}
    m = re.match(r"^([a-z_]+): (\S+)$", line)
    if m:
        return {m.group(1): m.group(2)}
    return None


def session_record(fields):
    """(position, mem_len, memory_tokens, memory_bytes) of an answer that describes a session."""
    if not isinstance(fields, dict):
        return None
    if "memory_bytes" in fields and "position" in fields:  # txl-client's session line
        return int(fields["position"]), int(fields["mem_len"]), int(fields["memory_tokens"]), \
            int(fields["memory_bytes"])
    if "sessionId" in fields and "memLen" in fields:  # a txl.v1.Session as JSON
        return (int(fields.get("position", 0)), int(fields["memLen"]), int(fields.get("memoryTokens", 0)),
                int(fields.get("memoryBytes", 0)))
    return None


# ----------------------------------------------------------------------------------------------------
# Running

def get_server(name, flags, pool):
    """The server called `name` (ADDR, A, B ...) with `flags` in `pool`, started on first use."""
    key = (name, flags)
    if key not in pool:
        pool[key] = txl_procs.Server(ARGS.bin_dir, BUNDLED, *flags)
    return pool[key]


def stop_all(pool):
    for server in pool.values():
        server.stop(timeout=60, check=False)
    pool.clear()


def grpcurl_commands(text):
    """[(metadata, [request dicts], server name, method)] of a block of grpcurl commands."""
    heredocs = []

    def cut(m):
        heredocs.append(m.group(2))
        return " "
    text = re.sub(r"<<\s*'?(\w+)'?[^\n]*\n(.*?)\n\1[ \t]*(?:\n|$)", cut, text, flags=re.S)
    text = text.replace("\\\n", " ")
    words = shlex.split(text, comments=True)
    commands, current = [], None
    for w in words:
        if w == "grpcurl":
            current = []
            commands.append(current)
        elif current is None:
            raise ValueError("text before the first grpcurl: %r" % w)
        else:
            current.append(w)
    out = []
    for argv in commands:
        metadata, requests, positional, i = [], None, [], 0
        while i < len(argv):
            a = argv[i]
            if a == "-plaintext":
                i += 1
            elif a == "-H":
                k, _, v = argv[i + 1].partition(":")
                metadata.append((k.strip().lower(), v.strip()))
                i += 2
            elif a == "-d":
                if argv[i + 1] == "@":
                    body = heredocs.pop(0)
                    requests = [json.loads(l) for l in body.splitlines() if l.strip()]
                else:
                    requests = [json.loads(argv[i + 1])]
                i += 2
            elif a.startswith("-"):
                raise ValueError("grpcurl option %s is not understood by the test" % a)
            else:
                positional.append(a)
                i += 1
        if len(positional) != 2:
            raise ValueError("grpcurl needs ADDR and a method, got %r" % positional)
        out.append((metadata, requests if requests is not None else [{}], positional[0], positional[1]))
    return out


class KeepDraining:
    """16 long generations on a server, so that after SIGTERM its drain lasts while the example runs."""

    def __init__(self, server, n=16):
        self.channel = grpc.insecure_channel(server.address)
        stub = txl_pb2_grpc.TransformerXLStub(self.channel)
        self.calls, self.started, self.threads = [], threading.Semaphore(0), []
        for i in range(n):
            call = stub.Generate(txl_pb2.GenerateRequest(input=txl_pb2.Input(text="ROMEO:\n"), max_new_tokens=4096))
            self.calls.append(call)
            t = threading.Thread(target=self._read, args=(call,), daemon=True)
            t.start()
            self.threads.append(t)
        for _ in range(n):
            if not self.started.acquire(timeout=60):
                raise RuntimeError("the keep-alive generations did not start")

    def _read(self, call):
        first = True
        try:
            for _ in call:
                if first:
                    self.started.release()
                    first = False
        except grpc.RpcError:
            pass
        if first:
            self.started.release()

    def running(self):
        return sum(t.is_alive() for t in self.threads)

    def cancel(self):
        for call in self.calls:
            call.cancel()
        for t in self.threads:
            t.join(timeout=30)
        self.channel.close()


def health(address):
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        return HEALTH.get(check(b"", timeout=30), "?")


class ApiExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ["PATH"] = os.path.join(os.path.abspath(ARGS.bin_dir), "client") + os.pathsep + os.environ["PATH"]
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_api_examples_")
        cls.blocks, cls.products, cls.problems = read_docs(ARGS.doc)
        cls.shared = {}

    @classmethod
    def tearDownClass(cls):
        stop_all(cls.shared)
        cls.tmp.cleanup()

    def server(self, name, block, pool):
        return get_server(name, block.flags, pool)

    # -- grpcurl blocks ---------------------------------------------------------------------------------
    def call(self, server, metadata, requests, method):
        service, _, name = method.rpartition("/")
        if service == "grpc.health.v1.Health" and name == "Check":
            status = health(server.address)
            return [{"status": status} if status != "UNKNOWN" else {}]
        if service != "txl.v1.TransformerXL":
            raise ValueError("unknown service %s" % service)
        from google.protobuf import json_format
        desc = txl_pb2.DESCRIPTOR.services_by_name["TransformerXL"].methods_by_name[name]
        req_cls, resp_cls = getattr(txl_pb2, desc.input_type.name), getattr(txl_pb2, desc.output_type.name)
        msgs = [json_format.ParseDict(r, req_cls()) for r in requests]
        path = "/txl.v1.TransformerXL/" + name
        kinds = {(False, False): "unary_unary", (False, True): "unary_stream", (True, False): "stream_unary",
                 (True, True): "stream_stream"}
        kind = kinds[(desc.client_streaming, desc.server_streaming)]
        with grpc.insecure_channel(server.address) as channel:
            rpc = getattr(channel, kind)(path, request_serializer=req_cls.SerializeToString,
                                         response_deserializer=resp_cls.FromString)
            arg = iter(msgs) if desc.client_streaming else msgs[0]
            answer = rpc(arg, metadata=metadata, timeout=120)
            responses = list(answer) if desc.server_streaming else [answer]
        return [json_format.MessageToDict(r) for r in responses]

    def run_grpcurl_block(self, block, ids, pool, records):
        answers = None
        for metadata, requests, server_name, method in grpcurl_commands(block.text):
            server = self.server(server_name, block, pool)
            metadata = [(k, substitute_ids(ids, v)) for k, v in metadata]
            requests = [json.loads(substitute_ids(ids, json.dumps(r))) for r in requests]
            try:
                answers = self.call(server, metadata, requests, method)
            except grpc.RpcError as e:
                raise Mismatch("%s: %s failed: %s: %s" % (block, method, e.code().name, e.details()))
        records.extend(r for r in map(session_record, answers or []) if r)
        if block.answer is not None:
            align(ids, parse_json_answer(block.answer), answers, "%s, the answer" % block)

    # -- console blocks ---------------------------------------------------------------------------------
    def run_console_block(self, block, ids, pool, records):
        steps, current = [], None
        for line in block.text.splitlines():
            if line.startswith("$ "):
                current = (line[2:], [])
                steps.append(current)
            elif current is not None:
                current[1].append(line)
            elif line.strip():
                raise ValueError("%s: output before the first command" % block)
        drain = None
        try:
            for command, doc_lines in steps:
                if re.match(r"kill -TERM\b", command):
                    drain = self.start_drain(block, pool)
                    continue
                self.run_command(block, command, doc_lines, ids, pool, records)
            if drain is not None:
                server, keep = drain
                self.assertIsNone(server.proc.poll(), "%s: the server's drain ended before the example did "
                                  "(the 16 keep-alive generations finished too soon)" % block)
        finally:
            if drain is not None:
                server, keep = drain
                keep.cancel()
                code = server.stop(timeout=60, check=False)
                for k in [k for k, v in pool.items() if v is server]:
                    del pool[k]
                self.assertEqual(code, 0, "%s: the drained server exited %s:\n%s" % (block, code, server.output))

    def start_drain(self, block, pool):
        server = self.server("ADDR", block, pool)
        keep = KeepDraining(server)
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        while health(server.address) == "SERVING":
            if time.time() > deadline:
                raise Mismatch("%s: health stayed SERVING after SIGTERM" % block)
            time.sleep(0.02)
        return server, keep

    def run_command(self, block, command, doc_lines, ids, pool, records):
        where = "%s, $ %s" % (block, command)
        names = re.findall(r"--server\s+(\S+)", command)
        for name in names:
            server = self.server(name, block, pool)
            command = re.sub(r"(--server\s+)%s\b" % re.escape(name), r"\g<1>" + server.address, command)
        command = substitute_ids(ids, command)
        r = subprocess.run(["bash", "-c", command], cwd=self.tmp.name, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300)
        out_lines = r.stdout.splitlines()
        comment = command.partition("  #")[2]
        expected_rc, doc_fields = None, []
        for line in doc_lines:
            m = re.search(r"\s{2,}#(.*)$", line)
            if m:
                line = line[:m.start()]
                e = re.search(r"\bexit (\d+)", m.group(1))
                if e and expected_rc is None:
                    expected_rc = int(e.group(1))
            if line.strip() == ELLIPSIS:
                doc_fields.append(ELLIPSIS)
                continue
            fields = console_fields(line)
            if fields is not None:
                doc_fields.append(fields)
        e = re.search(r"\bexit (\d+)", comment)
        if e:
            expected_rc = int(e.group(1))
        if expected_rc is None:
            expected_rc = 1 if any(isinstance(f, dict) and "code" in f for f in doc_fields) else 0
        self.assertEqual(r.returncode, expected_rc, "%s: exit status %d, the page implies %d; output:\n%s" %
                         (where, r.returncode, expected_rc, r.stdout))
        if "no output" in comment:
            self.assertEqual(r.stdout, "", "%s: the page says no output" % where)
        actual_fields = [f for f in map(console_fields, out_lines) if f is not None]
        records.extend(rec for rec in map(session_record, actual_fields) if rec)
        if re.search(r"\bsessions list\b", command):  # in no particular order: match each line by its id
            plain = [d for d in doc_fields if d != ELLIPSIS]
            for d in plain:
                candidates = [a for a in actual_fields if a.get("id") == ids.get(d["id"])] if d["id"] in ids \
                    else actual_fields
                for a in candidates:
                    trial, _ = try_match(ids, d, a, where)
                    if trial is not None:
                        ids.update(trial)
                        break
                else:
                    raise Mismatch("%s: no listed session matches the page's %s; the server listed:\n%s" %
                                   (where, d, r.stdout))
            if ELLIPSIS not in doc_fields:
                self.assertEqual(len(plain), len(actual_fields), "%s: the page lists %d sessions, the server %d:\n%s"
                                 % (where, len(plain), len(actual_fields), r.stdout))
            return
        align(ids, doc_fields, actual_fields, where)

    # -- the page ----------------------------------------------------------------------------------------
    def test_api_md(self):
        self.assertFalse(self.problems, "\n".join(self.problems))
        self.assertGreater(len(self.blocks), 10, "no checked examples found in %s" % ", ".join(ARGS.doc))
        names = [b.name for b in self.blocks]
        self.assertEqual(len(names), len(set(names)), "block names repeat: %s" % names)
        unknown = {a for b in self.blocks for a in b.after} - set(names)
        self.assertFalse(unknown, "after= names no block: %s" % unknown)

        ids, records, done, results = {}, [], set(), {}
        formula = [b for b in self.blocks if b.formula]
        pending = [b for b in self.blocks if not b.formula]
        while pending:
            ready = next((b for b in pending if all(a in done for a in b.after)), None)
            self.assertIsNotNone(ready, "after= loops: %s" % [b.name for b in pending])
            pending.remove(ready)
            block_records = []
            with self.subTest(block=repr(ready)):
                pool = {} if ready.fresh else self.shared
                try:
                    if ready.console:
                        self.run_console_block(ready, ids, pool, block_records)
                    else:
                        self.run_grpcurl_block(ready, ids, pool, block_records)
                finally:
                    if ready.fresh:
                        stop_all(pool)
            done.add(ready.name)
            results[ready.index] = block_records
            records.extend(block_records)

        self.check_formula(formula, records)
        self.check_products(results)

    def model_shape(self):
        server = get_server("ADDR", (), self.shared)
        with grpc.insecure_channel(server.address) as channel:
            info = txl_pb2_grpc.TransformerXLStub(channel).GetModelInfo(txl_pb2.GetModelInfoRequest(), timeout=60)
        return {"n_layer": info.n_layer, "n_head": info.n_head, "d_head": info.d_head}

    def check_formula(self, formula_blocks, records):
        self.assertEqual(len(formula_blocks), 1, "the pages should mark one block <!-- check: formula -->")
        exprs = {}
        for line in formula_blocks[0].text.splitlines():
            m = re.match(r"^(\w+)\s*=\s*(.*?)(?:\s{2,}\(.*\))?\s*$", line)
            if m:
                exprs[m.group(1)] = m.group(2)
        self.assertEqual(set(exprs), {"memory_tokens", "memory_bytes"}, "the formula block: %s" % exprs)
        shape = self.model_shape()
        self.assertTrue(records, "no checked example reported a session")
        ev = lambda e, **v: eval(e, {"__builtins__": {}, "min": min, "max": max}, dict(shape, **v))  # noqa
        for position, mem_len, tokens, nbytes in records:
            with self.subTest(formula=(position, mem_len, tokens, nbytes)):
                if position == 0:
                    self.assertEqual((tokens, nbytes), (0, 0), "an empty session has 0 and 0")
                    continue
                self.assertEqual(tokens, ev(exprs["memory_tokens"], mem_len=mem_len, position=position),
                                 "memory_tokens = %s" % exprs["memory_tokens"])
                base = ev(exprs["memory_bytes"], capacity=0)
                per_slot = ev(exprs["memory_bytes"], capacity=1) - base
                capacity, rest = divmod(nbytes - base, per_slot)
                self.assertEqual(rest, 0, "memory_bytes %d is not %s for a whole capacity" %
                                 (nbytes, exprs["memory_bytes"]))
                self.assertTrue(tokens <= capacity <= mem_len, "capacity %d outside [memory_tokens %d, mem_len %d]"
                                % (capacity, tokens, mem_len))

    def check_products(self, results):
        self.assertTrue(self.products, "no `memory_bytes` = ... = N sentence found")
        for page, line, text, expression, value in self.products:
            with self.subTest(sentence="%s:%d" % (page, line)):
                factors = [int(x) for x in re.findall(r"\d+", expression)]
                self.assertEqual(math.prod(factors), value, "%s line %d: %s does not multiply out" % (page, line, text))
                before = [b for b in self.blocks
                          if b.doc == page and b.line < line and not b.formula and results.get(b.index)]
                self.assertTrue(before, "%s line %d: no checked example before it" % (page, line))
                reported = [r[3] for r in results[before[-1].index]]
                self.assertIn(value, reported, "%s line %d: %s, but the example before it (%r) reported "
                              "memory_bytes %s" % (page, line, text, before[-1], reported))


if __name__ == "__main__":
    txl_procs.run_stub_tests(globals(), __doc__, [
        ("--doc", dict(nargs="+", default=[os.path.join(REPO, "docs", p) for p in ("API.md", "API_GENERATION.md")],
                       help="the pages to check, in story order"))])

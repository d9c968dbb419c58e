"""A small Python client for txl-serve (gRPC service txl.v1.TransformerXL).

Needs Debian's python3-grpcio and python3-protobuf, and the stubs generated at
build time (target txl_python_stubs) in build/client/python/gen: put that
directory on sys.path / PYTHONPATH before importing this module.

    client = TxlClient("127.0.0.1:50051")
    session = client.create_session()
    for r in client.generate("ROMEO:", session_id=session.session_id, max_new_tokens=20):
        print(r.text, end="", flush=True)
    client.delete_session(session.session_id)

Every call that names a session also sends the id as "txl-session-id"
metadata, so that a proxy hashing on it sends all calls of a session to the
replica holding it; create_session picks the id here for the same reason.

Security (docs/OPERATIONS.md, "Security"): by default the channel is
plaintext and sends no credentials. For a server with --tls_cert/--tls_key
and --auth_tokens:

    client = TxlClient("10.0.0.5:50051", token=os.environ["TXL_TOKEN"],
                       tls_ca="ca.pem", tls_server_name="txl.internal",
                       tls_cert="client.pem", tls_key="client.key")  # the last two: mutual TLS only

- tls_ca, tls_cert, tls_key: PEM file paths. Any of them, tls_server_name or
  tls=True makes the channel TLS; tls_ca verifies the server (None: gRPC's
  default roots); tls_cert and tls_key (both or neither, else ValueError) are
  the client certificate a server with --tls_client_ca requires.
- tls_server_name: the name the server's certificate must carry, instead of
  the address's host (for an IP address or a test certificate).
- token: every call, on every channel kind, carries the metadata
  "authorization: Bearer TOKEN" (a txl.v1 call without it: UNAUTHENTICATED;
  health checks need none). Over plaintext anyone reading the traffic can
  replay it: send tokens over TLS only.
A handshake that fails (untrusted server, wrong name, no client certificate
under mutual TLS, plaintext against TLS) shows as UNAVAILABLE on the call.

Errors are grpc.RpcError: e.code() is a grpc.StatusCode (NOT_FOUND for an
unknown session, ABORTED for a busy one, UNAUTHENTICATED for a missing or
unknown token, INVALID_ARGUMENT, ...) and e.details() the server's message.
"""
import collections
import queue
import secrets

import grpc
from google.protobuf import wrappers_pb2

try:
    from txl.v1 import txl_pb2, txl_pb2_grpc
except ImportError as e:  # pragma: no cover - a setup error, explained
    raise ImportError("txl.v1 stubs not found: build the txl_python_stubs target and put "
                      "build/client/python/gen on PYTHONPATH (" + str(e) + ")") from e

SESSION_METADATA_KEY = "txl-session-id"
AUTHORIZATION_METADATA_KEY = "authorization"

_NOT_LAST = txl_pb2.FINISH_REASON_UNSPECIFIED  # finish_reason of every response but a turn's last

_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def new_session_id():
    """32 lowercase hex characters: 128 bits from the OS's cryptographic source."""
    return secrets.token_hex(16)


def make_input(text=None, tokens=None):
    """A txl.v1.Input from text or token ids (exactly one of them)."""
    if (text is None) == (tokens is None):
        raise ValueError("give exactly one of text and tokens")
    if text is not None:
        return txl_pb2.Input(text=text)
    return txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=list(tokens)))


def make_generate_request(text=None, tokens=None, *, session_id="", max_new_tokens=32, temperature=0.0,
                          top_k=0, top_p=0.0, seed=0, stop_token_ids=(), stop_sequences=(), logprobs=0,
                          logit_bias=None, presence_penalty=0.0, frequency_penalty=0.0, echo=False, n=0, best_of=0):
    """A txl.v1.GenerateRequest. temperature 0 is greedy; seed 0 is random. logit_bias: {token id: bias in
    [-100, 100]} (-100 bans the token); the penalties are OpenAI's, in [-2, 2]. echo: the input's log-probs
    too. n > 1: that many choices of one prompt, without a session (each response's `index` names its
    choice); best_of: the n best of that many candidates."""
    return txl_pb2.GenerateRequest(
        session_id=session_id,
        input=make_input(text, tokens),
        max_new_tokens=max_new_tokens,
        sampling=txl_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                        logit_bias=dict(logit_bias or {}), presence_penalty=presence_penalty,
                                        frequency_penalty=frequency_penalty),
        stop_token_ids=list(stop_token_ids),
        stop_sequences=list(stop_sequences),
        logprobs=logprobs,
        echo=echo,
        n=n,
        best_of=best_of,
    )


def _metadata(session_id):
    return ((SESSION_METADATA_KEY, session_id),) if session_id else None


class Conversation:
    """An open Converse stream on one session: one turn at a time.

    turn() sends a turn at once and returns an iterator over its responses,
    ending with the one that carries finish_reason. Read a turn to its end
    before starting the next. close() ends the stream. The stream's
    txl-session-id metadata is its session, so every turn names that one.
    """

    _END = object()

    def __init__(self, stub, session_id, timeout):
        self._session_id = session_id
        self._requests = queue.Queue()
        self._call = stub.Converse(iter(self._requests.get, self._END), metadata=_metadata(session_id),
                                   timeout=timeout)
        self._closed = False

    def turn(self, text=None, tokens=None, **params):
        if self._closed:
            raise ValueError("conversation closed")
        params.setdefault("session_id", self._session_id)
        self._requests.put(make_generate_request(text, tokens, **params))
        return self._read_turn()

    def _read_turn(self):
        for r in self._call:
            yield r
            if r.finish_reason != _NOT_LAST:
                return
        # (A failed stream raises its grpc.RpcError from the loop above.)
        raise RuntimeError("Converse stream ended before the turn finished")

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._requests.put(self._END)
        for _ in self._call:  # drain: the server ends the stream after the last turn
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self._closed = True
            self._call.cancel()


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                             "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class BearerTokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Appends ("authorization", "Bearer " + token) to the metadata of every call.

    Plain metadata rather than grpc.access_token_call_credentials, which refuse to
    travel without TLS: a server behind a TLS-terminating proxy still needs the token
    (as in the C++ client)."""

    def __init__(self, token):
        if not token:
            raise ValueError("token: empty")
        self._entry = (AUTHORIZATION_METADATA_KEY, "Bearer " + token)

    def __repr__(self):
        return "BearerTokenInterceptor(<token>)"  # never the token itself

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout, list(details.metadata or ()) + [self._entry],
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def _intercept(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    intercept_unary_unary = intercept_unary_stream = _intercept
    intercept_stream_unary = intercept_stream_stream = _intercept


def _read_pem(option, path):
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("%s: cannot read %s: %s" % (option, path, e.strerror)) from e


def channel_credentials(tls_ca=None, tls_cert=None, tls_key=None):
    """grpc.ChannelCredentials for TLS from PEM file paths: tls_ca verifies the server (None:
    gRPC's default roots); tls_cert and tls_key, both or neither, are the client certificate
    for mutual TLS. ValueError when only one of those is given or a file cannot be read."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key: give both or neither")
    return grpc.ssl_channel_credentials(root_certificates=_read_pem("tls_ca", tls_ca),
                                        private_key=_read_pem("tls_key", tls_key),
                                        certificate_chain=_read_pem("tls_cert", tls_cert))


class TxlClient:
    """A client for one txl-serve address. timeout: seconds per call, streams included.

    interceptors: optional grpc client interceptors for the channel. They run before the
    one adding the token, so they never see it.
    token, tls_ca, tls_cert, tls_key, tls_server_name, tls: see the module docstring; none
    of them given: a plaintext channel without credentials.
    The raw generated stub is `stub`, for calls this class does not wrap (it carries the
    token too).
    """

    def __init__(self, address="127.0.0.1:50051", timeout=60.0, interceptors=(), *, token=None, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name=None, tls=False):
        self.address = address
        self.timeout = timeout
        interceptors = list(interceptors)
        if token:
            interceptors.append(BearerTokenInterceptor(token))  # innermost: the last before the wire
        if tls or tls_ca or tls_cert or tls_key or tls_server_name:  # "" counts as not given
            credentials = channel_credentials(tls_ca, tls_cert, tls_key)
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address)
        channel = grpc.intercept_channel(self._channel, *interceptors) if interceptors else self._channel
        self.stub = txl_pb2_grpc.TransformerXLStub(channel)
        # grpc.health.v1: HealthCheckRequest {string service = 1} and HealthCheckResponse
        # {ServingStatus status = 1} have the wire format of the StringValue and Int32Value
        # wrappers, so no generated health module (whose package would be named `grpc`) is needed.
        self._health_check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=wrappers_pb2.StringValue.SerializeToString,
            response_deserializer=wrappers_pb2.Int32Value.FromString)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def health(self, service=""):
        """"SERVING", "NOT_SERVING", ... for `service` ("" = the whole server)."""
        status = self._health_check(wrappers_pb2.StringValue(value=service), timeout=self.timeout).value
        return _HEALTH_NAMES.get(status, str(status))

    def info(self):
        return self.stub.GetModelInfo(txl_pb2.GetModelInfoRequest(), timeout=self.timeout)

    def create_session(self, mem_len=0, idle_ttl_seconds=0, labels=None, session_id=None):
        """A new session; its id is chosen here (new_session_id()) unless given."""
        session_id = session_id or new_session_id()
        request = txl_pb2.CreateSessionRequest(mem_len=mem_len, idle_ttl_seconds=idle_ttl_seconds,
                                               labels=labels or {}, session_id=session_id)
        return self.stub.CreateSession(request, metadata=_metadata(session_id), timeout=self.timeout)

    def get_session(self, session_id):
        return self.stub.GetSession(txl_pb2.GetSessionRequest(session_id=session_id),
                                    metadata=_metadata(session_id), timeout=self.timeout)

    def list_sessions(self):
        return list(self.stub.ListSessions(txl_pb2.ListSessionsRequest(), timeout=self.timeout).sessions)

    def delete_session(self, session_id):
        self.stub.DeleteSession(txl_pb2.DeleteSessionRequest(session_id=session_id),
                                metadata=_metadata(session_id), timeout=self.timeout)

    def fork_session(self, session_id, labels=None, position=0):
        """A new session that copies session_id; position > 0 branches from that earlier
        point of its history instead (as rewind_session), leaving the source as it is."""
        request = txl_pb2.ForkSessionRequest(session_id=session_id, labels=labels or {}, position=position)
        return self.stub.ForkSession(request, metadata=_metadata(session_id), timeout=self.timeout)

    def rewind_session(self, session_id, position):
        """Takes the session back to `position` of its history: it then equals a fresh
        session fed its first `position` tokens. OUT_OF_RANGE names the earliest position
        still reachable; ABORTED while a request runs on it."""
        return self.stub.RewindSession(txl_pb2.RewindSessionRequest(session_id=session_id, position=position),
                                       metadata=_metadata(session_id), timeout=self.timeout)

    def generate(self, text=None, tokens=None, **params):
        """Feeds text or token ids (new ones only) and yields each GenerateResponse as it
        streams; the last carries finish_reason and usage. Keyword parameters are those of
        make_generate_request (session_id "" = a throw-away session). Stopping the
        iteration early cancels the call."""
        request = make_generate_request(text, tokens, **params)
        call = self.stub.Generate(request, metadata=_metadata(request.session_id), timeout=self.timeout)
        try:
            yield from call
        finally:
            call.cancel()  # no-op once the call has finished

    def converse(self, session_id=""):
        """A Conversation on session_id ("" = a session that lives as long as the stream)."""
        return Conversation(self.stub, session_id, self.timeout)

    def score(self, text=None, tokens=None, *, session_id="", commit=False):
        """Per-token log-probs of the input given the session's history. commit=False
        leaves the session untouched."""
        request = txl_pb2.ScoreRequest(session_id=session_id, input=make_input(text, tokens), commit=commit)
        return self.stub.Score(request, metadata=_metadata(session_id), timeout=self.timeout)

#!/usr/bin/python3
"""A multi-turn session with txl-serve from Python, streaming each turn's tokens.

    /usr/bin/python3 client/python/example.py --server 127.0.0.1:50051 [--stubs DIR]
        [--token T] [--tls-ca PEM [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]]

Each turn sends only its new text: the session keeps the model's memory of
everything before it, and its position grows by the tokens fed plus those
generated. The stubs (target txl_python_stubs) are looked for in --stubs,
then on PYTHONPATH, then in build/client/python/gen of this checkout.

For a server with --auth_tokens, --token (or the environment variable
TXL_TOKEN; the flag wins, the variable keeps the token out of `ps`); for one
with TLS, --tls-ca (and --tls-cert/--tls-key under mutual TLS, and
--tls-server-name when the certificate does not name the --server host).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_STUBS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "client", "python", "gen")

DEFAULT_TURNS = ["ROMEO:\n", "\n\nJULIET:\n", "\n\nROMEO:\n"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="127.0.0.1:50051", help="txl-server address")
    p.add_argument("--stubs", help="directory of the generated txl/v1 stubs (default: PYTHONPATH, then %s)"
                   % DEFAULT_STUBS)
    p.add_argument("--turn", action="append", dest="turns", help="a turn's text (repeat; default: 3 turns)")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--seed", type=int, default=0, help="0: random")
    p.add_argument("--converse", action="store_true", help="all turns on one Converse stream")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per call")
    p.add_argument("--token", default=os.environ.get("TXL_TOKEN") or None,
                   help="bearer token for a server with --auth_tokens (default: $TXL_TOKEN)")
    p.add_argument("--tls-ca", help="PEM roots that verify the server (implies TLS)")
    p.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (with --tls-key; implies TLS)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-server-name", help="name the server's certificate must carry, instead of the --server "
                   "host (implies TLS)")
    args = p.parse_args()
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    return args


def main():
    args = parse_args()
    if args.stubs:
        if not os.path.isdir(os.path.join(args.stubs, "txl", "v1")):
            sys.exit("example: no txl/v1 stubs in %s (build the txl_python_stubs target)" % args.stubs)
        sys.path.insert(0, args.stubs)
    else:
        sys.path.append(DEFAULT_STUBS)  # after PYTHONPATH
    sys.path.insert(0, HERE)
    import grpc
    from txl_client import TxlClient

    finish_names = {1: "LENGTH", 2: "STOP_TOKEN", 3: "STOP_SEQUENCE", 4: "CANCELLED"}
    turns = args.turns or DEFAULT_TURNS
    try:
        with TxlClient(args.server, timeout=args.timeout, token=args.token, tls_ca=args.tls_ca,
                       tls_cert=args.tls_cert, tls_key=args.tls_key,
                       tls_server_name=args.tls_server_name) as client:
            info = client.info()
            print("server %s: %s; model: %d layers, d_model %d, %s tokenizer (%d tokens), device %s, "
                  "dtype %s, kv_dtype %s"
                  % (args.server, client.health(), info.n_layer, info.d_model, info.tokenizer, info.vocab_size,
                     info.device, info.dtype, info.kv_dtype))
            session = client.create_session()
            sid = session.session_id
            print("session %s (mem_len %d), position %d" % (sid, session.mem_len, session.position))

            conversation = client.converse(sid) if args.converse else None
            position = session.position
            for n, text in enumerate(turns, 1):
                print("\n--- turn %d: feed %r" % (n, text))
                params = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
                if conversation:
                    responses = conversation.turn(text, **params)
                else:
                    responses = client.generate(text, session_id=sid, **params)
                last = None
                for r in responses:  # tokens print as they stream
                    sys.stdout.write(r.text)
                    sys.stdout.flush()
                    last = r
                u = last.usage
                print("\n--- position %d = %d + %d fed + %d generated (finish %s, first token after %.3f s)"
                      % (last.position, position, u.input_tokens, u.generated_tokens,
                         finish_names.get(last.finish_reason, "?"), u.time_to_first_token_seconds))
                position = last.position
            if conversation:
                conversation.close()

            probe = " and so farewell."
            scored = client.score(probe, session_id=sid, commit=False)
            print("\nscore %r given the session (commit=false): log-prob %.3f over %d tokens; position still %d"
                  % (probe, scored.total_logprob, len(scored.tokens), client.get_session(sid).position))

            client.delete_session(sid)
            try:
                client.get_session(sid)
                print("deleted session %s, but it is still there" % sid)
                return 1
            except grpc.RpcError as e:
                print("deleted session %s; get_session now: %s" % (sid, e.code().name))
    except grpc.RpcError as e:
        print("\nexample: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

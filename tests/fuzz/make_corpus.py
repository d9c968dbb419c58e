#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), in each
target's input format (see the comment at the top of each *_fuzzer.cc).

    /usr/bin/python3 tests/fuzz/make_corpus.py --build-dir build

Needs the normal build: the Python stubs (build/client/python/gen) for the request
seeds, and build/tools/txl-init for the checkpoint seeds (it writes checkpoints like
the fuzzer's templates, whose records are then read in archive order). Rewrites the
seeds it names and leaves every other file in place: the inputs a fuzzer once failed
on are kept in the same directories as regression seeds (added by hand, never by this
script). The seeds are small and kept in git.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import txl_procs  # noqa: E402  (hash64: the server's checksum)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# The fuzzer's templates (checkpoint_fuzzer.cc, LLVMFuzzerInitialize).
TEMPLATE_CORPUS = "abcdefghijklmnopqrstuvwxyz \n.,"
PLAIN = {"n_layer": 1, "n_head": 2, "d_model": 8, "d_head": 4, "d_inner": 16, "mem_len": 8}
ADAPTIVE = dict(PLAIN, n_layer=2, d_embed=8, cutoffs=[8, 16], div_val=2, tie_projs=[False, True, True],
                untie_r=True, pre_lnorm=True, clamp_len=3)
VERSION_RECORDS = ("version", ".data/version")


def write_seeds(target, seeds):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print("%s: %d seeds" % (target, len(seeds)))


def tokenizer_seeds():
    mixed = "caf\u00e9 \u4e2d \U0001F600\n".encode() + b"\xff-\xe4\xb8"
    return [
        ("byte_text", b"\x00hello, world\n" + bytes(range(0, 256, 7))),
        ("char_corpus", b"\x01the quick brown fox\n\0the fox\n"),
        ("char_mixed", b"\x01" + mixed + b"\0" + mixed[::-1]),
        ("char_unk", b"\x02abc\0abcxyz \xc3\xa9"),
        ("word_vocab", b"\x03the\ncat\nsat\n<eos>\n<unk>\0\x00\x01\x00\x02\x00\x03\x00\x00"),
        ("word_text", b"\x03a\nb\n<eos>\0a b\nb  a\n"),
        ("json_char", b'\x04{"type":"char","symbols":["a","b",[255],"<unk>"]}\0ab\xff?'),
        ("json_word", b'\x04{"type":"word","symbols":["x","y","<eos>"]}\0x y\ny x\n'),
        ("json_byte", b'\x04{"type":"byte"}\0bytes'),
    ]


def request_seeds(stubs):
    sys.path.insert(0, stubs)
    from txl.v1 import txl_pb2  # noqa: E402

    sid = "0123456789abcdef0123456789abcdef"

    def seed(rpc, tokenizer, message, metadata=None):
        md = b"\x00" if metadata is None else bytes([len(metadata) + 1]) + metadata.encode()
        return bytes([rpc, tokenizer]) + md + message.SerializeToString()

    create = txl_pb2.CreateSessionRequest(mem_len=8, idle_ttl_seconds=60, session_id=sid, labels={"a": "b"})
    gen_text = txl_pb2.GenerateRequest(
        session_id=sid, input=txl_pb2.Input(text="cat"), max_new_tokens=4,
        sampling=txl_pb2.SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=3),
        stop_token_ids=[1], stop_sequences=["\n"], logprobs=2)
    gen_ids = txl_pb2.GenerateRequest(input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=[1, 2, 3])), max_new_tokens=32)
    gen_words = txl_pb2.GenerateRequest(input=txl_pb2.Input(text="the cat sat\non the mat\n"), logprobs=5)
    # max_new_tokens -1 with echo: the input's log-probs alone (spec.max_new_tokens 0).
    gen_echo = txl_pb2.GenerateRequest(input=txl_pb2.Input(text="the cat"), max_new_tokens=-1, echo=True, logprobs=1)
    score = txl_pb2.ScoreRequest(session_id=sid, input=txl_pb2.Input(text="caf\u00e9"), commit=True)
    score_ids = txl_pb2.ScoreRequest(input=txl_pb2.Input(tokens=txl_pb2.TokenIds(ids=[0, 255])))
    return [
        ("create", seed(0, 0, create)),
        ("create_metadata", seed(0, 0, txl_pb2.CreateSessionRequest(), sid)),
        ("generate_text", seed(1, 1, gen_text, sid)),
        ("generate_ids", seed(1, 0, gen_ids)),
        ("generate_words", seed(1, 2, gen_words)),
        ("generate_echo_only", seed(1, 2, gen_echo)),
        ("score_text", seed(2, 1, score, sid)),
        ("score_ids", seed(2, 0, score_ids)),
    ]


def template_records(bin_dir, tmp, name, config):
    cfg = os.path.join(tmp, name + ".json")
    corpus = os.path.join(tmp, "corpus.txt")
    out = os.path.join(tmp, name + ".pt")
    with open(cfg, "w") as f:
        json.dump(config, f)
    with open(corpus, "w") as f:
        f.write(TEMPLATE_CORPUS)
    subprocess.run([os.path.join(bin_dir, "tools", "txl-init"), "--config", cfg, "--tokenizer", "char",
                    "--corpus", corpus, "--out", out], check=True, capture_output=True)
    with zipfile.ZipFile(out) as z:
        records = []
        for n in z.namelist():
            short = n.split("/", 1)[1]
            if short not in VERSION_RECORDS:
                records.append((short, z.read(n)))
    return records


def checkpoint_seeds(bin_dir):
    # Modes 0 and 1 run in the "torch" scope only (TXL_FUZZ_CHECKPOINT_SCOPE=torch).
    seeds = [
        ("raw_not_zip", b"\x00not a checkpoint"),
        ("raw_zip_magic", b"\x00PK\x03\x04" + bytes(60)),
        ("template_plain", b"\x01"),
        ("template_adaptive", b"\x05"),
        ("patch_header", b"\x01" + struct.pack("<IB", 8, 2) + b"\xff\xff"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for template, (label, config) in enumerate([("plain", PLAIN), ("adaptive", ADAPTIVE)]):
            records = template_records(bin_dir, tmp, label, config)
            # Mode 2 picks among the records the default scope may replace (checkpoint_fuzzer.cc,
            # OursToReplace), in archive order: seeds for config.json, tokenizer.json and the first
            # tensor storage, each with its original contents.
            ours = [(n, d) for n, d in records if n in ("extra/config.json", "extra/tokenizer.json")
                    or n.startswith("data/")]
            kinds = set()
            for i, (name, data) in enumerate(ours):
                kind = "storage" if name.startswith("data/") else name.split("/")[-1].replace(".", "_")
                if kind in kinds:
                    continue
                kinds.add(kind)
                seeds.append(("%s_record_%s" % (label, kind), bytes([2 | template << 2, i]) + data))
            storages = [i for i, (n, _) in enumerate(ours) if n.startswith("data/")]
            seeds.append(("%s_short_storage" % label, bytes([2 | template << 2, storages[-1]]) +
                          ours[storages[-1]][1][:5]))
            named = dict(records)
            seeds.append(("%s_json" % label, bytes([3 | template << 2]) + named["extra/config.json"] + b"\0" +
                          named["extra/tokenizer.json"]))
    return seeds


def journal_seeds():
    """server/durability/session_journal_format.cc's stored formats, valid, as mode-0 inputs."""
    def string(b):
        return struct.pack("<I", len(b)) + b
    meta = (b"TXLMETA1" + string(b"0123456789abcdef0123456789abcdef") + string(b"alice") +
            struct.pack("<qqq", 256, 600, 1700000000 * 10**9) + struct.pack("<I", 1) + string(b"k") + string(b"v"))
    meta += struct.pack("<Q", txl_procs.hash64(meta))

    def record(start, tokens):
        header = struct.pack("<Iq", len(tokens), start)
        body = header + struct.pack("<Q", txl_procs.hash64(header)) + struct.pack("<%di" % len(tokens), *tokens)
        return body + struct.pack("<Q", txl_procs.hash64(body))
    log = record(2, [1, 2, 3]) + record(5, [4]) + record(6, [5, 6])
    return [("journal_meta", b"\x00" + meta), ("journal_log", b"\x00" + log),
            ("journal_log_torn", b"\x00" + log + record(8, [9])[:23]),
            # Checksums that pass over positions no journal writes: DATA_LOSS.
            ("journal_log_negative_start", b"\x00" + record(-2, [5, 6, 7, 8, 9, 10])),
            ("journal_log_overflow", b"\x00" + record(2**63 - 2, [1, 2, 3])),
            # A log that ends one past the fuzzer's snapshot (3): its one-token cut lands on it.
            ("journal_log_cut_at_snapshot", b"\x00" + record(3, [4]))]


def session_import_seeds():
    # The memory image's header fields (model/net/session_memory.cc) at 8 + 8 * i:
    # n_layer, n_head, d_head, mem_len, position, length, capacity, element size.
    def patch(field, value):
        return struct.pack("<HB", 8 + 8 * field, 8) + struct.pack("<q", value)

    return [
        ("export_not", b"\x00TXLSESS\x00\x01\x00\x00\x00"),
        ("image_empty", b"\x01\x00TXLMEM1\x00" + struct.pack("<8q", 2, 0, 0, 8, 0, 0, 0, 4)),
        ("real", b"\x02\x00"),
        ("real_pending", b"\x02\x02"),
        ("real_mem_len", b"\x02\x00" + patch(3, 4096)),
        ("real_position", b"\x02\x01" + patch(4, 1 << 40)),
        ("real_capacity", b"\x02\x00" + patch(6, 4) + patch(5, 3)),
    ] + journal_seeds()


def openai_json_seeds():
    """The HTTP bodies of docs/HTTP.md's examples and their edge cases. Byte 0 picks the parser
    (openai_json_fuzzer.cc): 0 completion, 1 chat, 2 ParseBody, 3 score, 4 create session,
    5 position, 6 required position; + 7 sends a txl-session-id header."""
    completion, chat, body, score, create, position, rewind = range(7)
    header = 7
    sid = "2e0a1cbd2e0a1cbd2e0a1cbd2e0a1cbd"
    deep = b"[" * 300 + b"]" * 300
    seeds = [
        # /v1/completions (docs/HTTP.md)
        ("completion", completion, b'{"prompt": "ROMEO:", "max_tokens": 20, "temperature": 0, "logprobs": 2}'),
        ("completion_quick", completion, b'{"prompt": "ROMEO:", "max_tokens": 40, "temperature": 0.8}'),
        ("completion_stream", completion, b'{"prompt": "ROMEO:", "max_tokens": 5, "stream": true, '
                                          b'"stream_options": {"include_usage": true}}'),
        ("completion_session", completion, b'{"prompt": "ROMEO:", "max_tokens": 5, "session_id": "%s"}' % sid.encode()),
        ("completion_header", completion + header, b'{"prompt": " and", "max_tokens": 5}'),
        ("completion_all", completion, b'{"model": "shakespeare_char", "prompt": ["x"], "max_tokens": 1, '
                                       b'"temperature": 1.5, "top_p": 0.9, "seed": 7, "stop": ["\\n", "END"], '
                                       b'"n": 1, "user": "u", "echo": false, "best_of": 1, "presence_penalty": 0, '
                                       b'"frequency_penalty": 0.0, "logit_bias": {}, "suffix": null, "logprobs": 0}'),
        ("completion_bias", completion, b'{"prompt": "x", "logit_bias": {"1": -100, "007": 100, "64": 2.5}, '
                                        b'"presence_penalty": -2, "frequency_penalty": 1.5}'),
        ("completion_bias_bad", completion, b'{"prompt": "x", "logit_bias": {"-1": 1, "1e3": 1, "2": 101}}'),
        ("completion_ids", completion, b'{"prompt": [0, 1, 2147483647], "max_completion_tokens": 3}'),
        ("completion_empty_ids", completion, b'{"prompt": []}'),
        ("completion_batch", completion, b'{"prompt": ["a", "b"]}'),
        ("completion_other_model", completion, b'{"model": "gpt-4", "prompt": "x"}'),
        ("completion_float_tokens", completion, b'{"prompt": "x", "max_tokens": 3.0, "seed": 1e3}'),
        ("completion_huge", completion, b'{"prompt": "x", "max_tokens": 2147483648, "seed": 18446744073709551615}'),
        ("completion_negative_id", completion, b'{"prompt": [-1], "logprobs": -1}'),
        ("completion_wrong_types", completion, b'{"prompt": 5, "stream": "yes", "stop": 3, "temperature": "hot"}'),
        ("completion_unsupported", completion, b'{"prompt": "x", "tools": [], "best_of": 2, "echo": true}'),
        ("completion_stream_options", completion, b'{"prompt": "x", "stream_options": {"include_usage": 1}}'),
        ("completion_overflow", completion, b'{"prompt": "x", "temperature": 1e400}'),
        ("completion_overflow_nested", completion, b'{"prompt": [1, 2e999], "x": {"y": [1e999]}}'),
        ("completion_beyond_float", completion, b'{"prompt": "x", "top_p": 1e300, "temperature": -4e38}'),
        ("completion_unicode", completion, b'{"prompt": "caf\\u00e9 \\ud83d\\ude00 \\u0000", "stop": "\\u4e2d"}'),
        ("completion_bad_surrogate", completion, b'{"prompt": "\\ud83d"}'),
        ("completion_invalid_utf8", completion, b'{"prompt": "\xff\xfe\xc3"}'),
        # /v1/chat/completions
        ("chat", chat, b'{"messages": [{"role": "user", "content": "Who art thou?"}], "max_tokens": 30}'),
        ("chat_roles", chat, b'{"messages": [{"role": "developer", "content": "Be brief."}, {"role": "system", '
                             b'"content": ""}, {"role": "user", "content": [{"type": "text", "text": "a"}, '
                             b'{"type": "text", "text": "b"}]}, {"role": "assistant", "content": "c"}], '
                             b'"logprobs": true, "top_logprobs": 3, "max_completion_tokens": 4}'),
        ("chat_session", chat + header, b'{"messages": [{"role": "user", "content": "x"}], "stream": true}'),
        ("chat_bad_role", chat, b'{"messages": [{"role": "tool", "content": "x"}]}'),
        ("chat_image_part", chat, b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}'),
        ("chat_part_type_number", chat, b'{"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]}'),
        ("chat_empty", chat, b'{"messages": []}'),
        ("chat_top_without_logprobs", chat, b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}'),
        ("chat_null_content", chat, b'{"messages": [{"role": "user", "content": null}], "logprobs": 1}'),
        # ParseBody
        ("body_object", body, b'{"a": [1, 2.5, "x", null, true, {"b": {}}]}'),
        ("body_empty", body, b''),
        ("body_null", body, b'null'),
        ("body_array", body, b'[1, 2]'),
        ("body_deep", body, b'{"a": ' + deep + b'}'),
        ("body_truncated", body, b'{"prompt": "x'),
        ("body_trailing", body, b'{} {}'),
        ("body_duplicate_keys", body, b'{"a": 1, "a": 2}'),
        ("body_big_number", body, b'{"a": 123456789012345678901234567890, "b": -9223372036854775809}'),
        # score
        ("score", score, b'{"input": "the king", "commit": false}'),
        ("score_ids", score, b'{"input": [1, 2, 3], "commit": true}'),
        ("score_empty_ids", score, b'{"input": []}'),
        ("score_wrong_types", score, b'{"input": {"text": "x"}, "commit": "yes"}'),
        ("score_float_ids", score, b'{"input": [1.0, 2]}'),
        ("score_missing", score, b'{}'),
        # create session / fork
        ("create", create, b'{"mem_len": 128, "idle_ttl_seconds": 300, "labels": {"user": "alice"}, '
                           b'"session_id": "%s"}' % sid.encode()),
        ("create_labels", create, b'{"labels": {"user": "ann"}}'),
        ("create_empty", create, b''),
        ("create_blank", create, b' \t\r\n'),
        ("create_null", create, b'null'),
        ("create_bad_labels", create, b'{"labels": {"a": 1}, "mem_len": -5}'),
        ("create_huge", create, b'{"mem_len": 9223372036854775807, "idle_ttl_seconds": 1e300}'),
        ("create_float", create, b'{"mem_len": 64.0, "idle_ttl_seconds": 0.5}'),
        # fork and rewind positions
        ("fork_position", position, b'{"position": 6, "labels": {"branch": "b"}}'),
        ("fork_empty", position, b''),
        ("rewind", rewind, b'{"position": 6}'),
        ("rewind_missing", rewind, b'{}'),
        ("rewind_null", rewind, b'{"position": null}'),
        ("rewind_negative", rewind, b'{"position": -1}'),
        ("rewind_max", rewind, b'{"position": 9223372036854775807}'),
        ("rewind_string", rewind, b'{"position": "6"}'),
        ("rewind_fraction", rewind, b'{"position": 1.5e0}'),
        ("rewind_overflow", rewind, b'{"position": -1e999}'),
    ]
    return [(name, bytes([parser]) + data) for name, parser, data in seeds]


def grammar_seeds():
    """grammar_fuzzer.cc's input: a grammar, a NUL, then a text to read."""
    json_like = (b'root ::= value\nvalue ::= "{" ws (pair ("," ws pair)*)? "}" ws | "[" ws (value ("," ws value)*)? "]" ws'
                 b' | "\\"" [^"\\\\]* "\\"" ws | "-"? [0-9]+ ws | "true" | "null"\n'
                 b'pair ::= "\\"" [a-z]* "\\"" ":" ws value\nws ::= [ \\t\\n]*\n')
    return [
        ("literal", b'root ::= "ab" [0-9]+ ("x" | "yz")?\0ab12yz'),
        ("json", json_like + b'\0{"a": [1, -2, {"b": null}], "c": "d"}'),
        ("escapes", b'root ::= "\\"" [^"\\\\\\n]* "\\"" [\\x41-\\x43] . "\\t"\0"caf\xc3\xa9"Bz\t'),
        ("comment", b'# a comment\nroot ::= item* "."  # dots\nitem ::= [a-z] | "-"\0ab-c.'),
        ("left_recursive", b'root ::= root "a" | "b"\0ba'),
        ("unclosed", b'root ::= ("a" | [b-\0a'),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(HERE, "..", "..", "build"))
    args = p.parse_args()
    build = os.path.abspath(args.build_dir)
    write_seeds("tokenizer", tokenizer_seeds())
    write_seeds("request_validation", request_seeds(os.path.join(build, "client", "python", "gen")))
    write_seeds("checkpoint", checkpoint_seeds(build))
    write_seeds("session_import", session_import_seeds())
    write_seeds("openai_json", openai_json_seeds())
    write_seeds("grammar", grammar_seeds())


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the corpus of model/bundled/shakespeare_json.pt: tinyshakespeare's
speeches, each written either as the play writes it or as one line of JSON
about it, so that a model trained on it writes both (a prompt picks which).

The JSON lines take a few shapes, so that objects, arrays, strings, integers,
booleans, null and nesting all occur, keys in more than one order:

    {"speaker": "ROMEO", "line": "..."}
    {"speaker": "ROMEO", "lines": ["...", "..."], "words": 12, "question": false}
    {"lines": 2, "by": {"name": "ROMEO", "first": true}, "reply": null}
    ["ROMEO", "JULIET"]

Deterministic (--seed); reads tinyshakespeare (speaker line, its lines, a
blank line), writes the corpus to stdout.
"""
import argparse
import json
import random
import sys


def speeches(text):
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        if len(lines) >= 2 and lines[0].endswith(":"):
            yield lines[0][:-1], lines[1:]


def as_json(rng, speaker, lines, previous):
    words = sum(len(line.split()) for line in lines)
    shape = rng.randrange(4)
    if shape == 0:
        record = {"speaker": speaker, "line": " ".join(lines)}
    elif shape == 1:
        record = {"speaker": speaker, "lines": lines, "words": words, "question": lines[-1].endswith("?")}
    elif shape == 2:
        record = {"lines": len(lines), "by": {"name": speaker, "first": previous is None},
                  "reply": previous}
    else:
        record = [speaker] if previous is None else [previous, speaker]
    return json.dumps(record)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", help="tinyshakespeare.txt")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json_fraction", type=float, default=0.5, help="of the speeches written as JSON")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    out = []
    previous = None
    for speaker, lines in speeches(text):
        if rng.random() < args.json_fraction:
            out.append(as_json(rng, speaker, lines, previous) + "\n")
        else:
            out.append(speaker + ":\n" + "\n".join(lines) + "\n\n")
        previous = speaker
    sys.stdout.write("".join(out))


if __name__ == "__main__":
    main()

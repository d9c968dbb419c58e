#!/usr/bin/env python3
"""Writes the synthetic recall corpus: a task only memory can solve.

Each example states key/value pairs, then filler longer than a training
segment, then asks for one key; the answer is the value stated before:

    #c4 h1 a7|..............................?h1?a7?c4

Keys are a-h and values 0-9; the filler (dots by default) holds neither, so
each answer (the character after "?h") is only predictable from the pairs far
back. Every example asks for each of its keys once, in random order. Low-entropy filler keeps the answers the main thing to learn. With
--cleared, the pairs are replaced by filler of the same length: the same
queries with nothing to recall (accuracy should fall to chance, 1 in 10).
"""
import argparse
import random

KEYS = "abcdefgh"
VALUES = "0123456789"


def example(rng, pairs, filler_min, filler_max, cleared, filler_chars):
    keys = rng.sample(KEYS, pairs)
    values = [rng.choice(VALUES) for _ in keys]
    stated = "#" + " ".join(k + v for k, v in zip(keys, values)) + "|"
    if cleared:
        stated = "".join(rng.choice(filler_chars) for _ in stated)
    filler = "".join(rng.choice(filler_chars) for _ in range(rng.randint(filler_min, filler_max)))
    order = list(range(pairs))
    rng.shuffle(order)
    return stated + filler + "".join("?" + keys[i] + values[i] for i in order) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=8000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--filler-min", type=int, default=34, help="more than tgt_len, so pairs and queries never share a segment")
    p.add_argument("--filler-max", type=int, default=44)
    p.add_argument("--filler-chars", default=".", help="characters the filler is drawn from (no keys or values)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cleared", action="store_true", help="replace the pairs by filler")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if not 1 <= a.pairs <= len(KEYS):
        p.error("--pairs must be in [1, %d]" % len(KEYS))
    if not 0 < a.filler_min <= a.filler_max:
        p.error("need 0 < --filler-min <= --filler-max")
    if not a.filler_chars or set(a.filler_chars) & set(KEYS + VALUES + "#|?\n"):
        p.error("--filler-chars must be non-empty and hold no key, value or separator")
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for _ in range(a.examples):
            f.write(example(rng, a.pairs, a.filler_min, a.filler_max, a.cleared, a.filler_chars))


if __name__ == "__main__":
    main()

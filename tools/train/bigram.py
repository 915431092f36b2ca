#!/usr/bin/python3
"""Bigram baseline for the default model's held-out loss (issue 17).

  tools/train/bigram.py --train RUN/train --heldout RUN/heldout

Counts bigrams over the training set and scores the held-out produced tokens (mask 2)
with an interpolated bigram / add-one unigram model over the full 129,280-id
vocabulary: P(b|a) = l * c(a,b)/c(a) + (1 - l) * (c(b) + 1)/(N + V). The best l on
the held-out set itself is reported (a generous baseline).
"""
import argparse
import collections
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import load_set  # noqa: E402

V = 129280


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    a = ap.parse_args()
    tok, _, idx = load_set(a.train)
    uni = np.bincount(tok, minlength=V).astype(np.float64)
    big = collections.Counter()
    for e in range(idx.size - 1):
        t = tok[idx[e]:idx[e + 1]]
        big.update(zip(t[:-1].tolist(), t[1:].tolist()))
    N = uni.sum()
    htok, hmsk, hidx = load_set(a.heldout)
    pairs = []
    for e in range(hidx.size - 1):
        s, n = hidx[e], hidx[e + 1]
        for i in range(s, n - 1):
            if hmsk[i + 1] == 2:
                pairs.append((int(htok[i]), int(htok[i + 1])))
    best = None
    for lam in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99):
        nll = 0.0
        for x, y in pairs:
            pb = big.get((x, y), 0) / uni[x] if uni[x] > 0 else 0.0
            pu = (uni[y] + 1) / (N + V)
            nll -= math.log(lam * pb + (1 - lam) * pu)
        nll /= len(pairs)
        if best is None or nll < best[0]:
            best = (nll, lam)
    print(f"bigram baseline: {best[0]:.4f} nats/token (lambda {best[1]}) over {len(pairs)} "
          f"held-out produced tokens; train tokens {int(N)}")


if __name__ == "__main__":
    main()

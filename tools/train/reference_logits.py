#!/usr/bin/python3
"""Teacher-forced logits of a model pack computed by the trainer's own forward pass,
for dsinfer's agreement test (tools/eval/default_model_test.cc).

  tools/train/reference_logits.py --pack PACK --set RUN/heldout --out FILE.json

The pack's dequantised values run in float64 (so the reference carries no float32
rounding of its own). For a few held-out examples it records, per position, the
top-8 ids with their logits, the logit every unused id shares, and the MTP head's
top-8 for the token after next.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import dequantized_model  # noqa: E402
from train import load_set  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True)
    ap.add_argument("--set", required=True, help="rendered held-out set prefix")
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=48)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model, _ = dequantized_model(a.pack)
    model = model.double()
    tok, _, idx = load_set(a.set)
    cases = []
    for e in range(a.examples):
        ids = tok[idx[e]:idx[e + 1]][:a.max_len].astype(np.int64)
        S = len(ids)
        rows = model.lut[torch.from_numpy(ids)].unsqueeze(0)
        pos = torch.arange(S).unsqueeze(0)
        mask = torch.zeros(S, S, dtype=torch.float64).masked_fill_(
            ~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf")).view(1, 1, S, S)
        with torch.no_grad():
            h = model(rows, pos, mask)
            z = model.logits(h)
            m = model.logits(model.mtp_forward(h[:, :-1], rows[:, 1:], pos[:, :-1],
                                               mask[:, :, :-1, :-1].contiguous()))
        n_other = model.n_other
        used = model.used_ids

        def top(zrow, k=8):
            raw = zrow.clone()
            raw[-1] -= np.log(n_other)  # the logit of each unused id (not the group)
            v, i = torch.topk(raw[:-1], k)
            return {"ids": used[i].tolist(), "logits": v.tolist(), "other": float(raw[-1])}

        cases.append({"tokens": ids.tolist(),
                      "main": [top(z[0, t]) for t in range(S)],
                      "mtp": [top(m[0, t]) for t in range(S - 1)]})
    with open(a.out, "w") as f:
        json.dump({"pack": os.path.basename(a.pack), "cases": cases}, f)
    print(f"wrote {a.out}: {len(cases)} examples")


if __name__ == "__main__":
    main()

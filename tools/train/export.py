#!/usr/bin/python3
"""Exports a training checkpoint as the committed default-model artifact (issue 17).

  tools/train/export.py --run RUN --out data/default_model/dsinfer-default.safetensors

The artifact is one safetensors file that dsinfer expands into a full HF checkpoint
(src/default_model/): format "dsinfer-default-model/1".
- every matrix: int8 codes `NAME` [rows, cols] with one power-of-two scale per 32
  columns, `NAME.qscale` (F8_E8M0) -- value = code * 2^(e - 127). Such values are
  exact in bf16, so the expanded bf16 checkpoint (and an f32/bf16 GGUF) holds exactly
  the values this file describes;
- vectors (norms) as F32 already rounded to bf16; e_score_correction_bias F32;
- embeddings and head: `vocab.used_ids` (I32) and only those rows of
  `model.embed_tokens.weight` / `lm_head.weight`; every other id gets the row
  `model.embed_tokens.other` / `lm_head.other`. The MTP module's embed_tokens and
  shared_head.head are copies of these (as in DeepSeek V3).
- metadata: `format`, `config` (config.json), `recipe` (JSON: training arguments,
  step, corpus size, seeds, loss).
`dequantized_state(path)` reads an artifact back into trainer tensors (used by the
logit-agreement data and the evaluation in Python).
"""
import argparse
import hashlib
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402

FORMAT = "dsinfer-default-model/1"
BLOCK = 32


def bf16_round(x):
    """Round-to-nearest-even f32 -> bf16 -> f32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return b.view(np.float32)


def quantize(x):
    """[R, C] f32 -> (int8 codes [R, C], e8m0 exponents [R, C/32])."""
    R, C = x.shape
    assert C % BLOCK == 0, x.shape
    blk = x.reshape(R, C // BLOCK, BLOCK).astype(np.float64)
    amax = np.abs(blk).max(-1)
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / 127.0))
    e = np.clip(e, -127, 127)
    codes = np.clip(np.rint(blk / np.exp2(e)[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(R, C), (e + 127).astype(np.uint8)


def dequantize(codes, ebytes):
    R, C = codes.shape
    s = np.exp2(ebytes.astype(np.float64) - 127.0)
    return (codes.reshape(R, C // BLOCK, BLOCK) * s[..., None]).reshape(R, C).astype(np.float32)


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype str, np array)."""
    header, off, blobs = {"__metadata__": metadata}, 0, []
    for name, dt, arr in tensors:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dt = {"F32": np.float32, "I8": np.int8, "F8_E8M0": np.uint8, "I32": np.int32}
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dt[e["dtype"]]).reshape(e["shape"])
    return out, meta


def export(st, out_path, recipe):
    cfg = Config(**st["config"])
    model = Model(cfg, st["used_ids"])
    model.load_state_dict(st["model"])
    tensors = []

    def matrix(name, w):
        codes, e = quantize(w.detach().float().numpy())
        tensors.append((name, "I8", codes))
        tensors.append((name + ".qscale", "F8_E8M0", e))

    def vector(name, v, exact=False):
        a = v.detach().float().numpy()
        tensors.append((name, "F32", a if exact else bf16_round(a)))

    tensors.append(("vocab.used_ids", "I32", model.used_ids.numpy().astype(np.int32)))
    matrix("model.embed_tokens.weight", model.embed[:-1])
    vector("model.embed_tokens.other", model.embed[-1])
    matrix("lm_head.weight", model.head[:-1])
    vector("lm_head.other", model.head[-1])
    for name, t in model.hf_tensors():
        if t.dim() == 2:
            matrix(name, t)
        else:
            vector(name, t, exact=name.endswith("e_score_correction_bias"))
    meta = {"format": FORMAT, "config": json.dumps(cfg.to_hf()), "recipe": json.dumps(recipe)}
    write_safetensors(out_path, tensors, meta)
    with open(out_path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def dequantized_model(path):
    """The artifact's values in a trainer Model (what dsinfer runs, in f32)."""
    t, meta = read_safetensors(path)
    hf = json.loads(meta["config"])
    fields = {k: hf[k] for k in vars(Config()) if k in hf}
    cfg = Config(**fields)
    model = Model(cfg, t["vocab.used_ids"].tolist())

    def val(name):
        if name + ".qscale" in t:
            return torch.from_numpy(dequantize(t[name], t[name + ".qscale"]))
        return torch.from_numpy(t[name].copy())

    with torch.no_grad():
        model.embed.copy_(torch.cat([val("model.embed_tokens.weight"),
                                     val("model.embed_tokens.other").unsqueeze(0)]))
        model.head.copy_(torch.cat([val("lm_head.weight"), val("lm_head.other").unsqueeze(0)]))
        for name, p in model.hf_tensors():
            p.copy_(val(name))
    return model, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = torch.load(os.path.join(a.run, "ckpt.pt"))
    with open(os.path.join(a.run, "run.json")) as f:
        run = json.load(f)
    recipe = {"step": st["step"], "epoch": st["epoch"], "train": run}
    digest = export(st, a.out, recipe)
    print(f"wrote {a.out} ({os.path.getsize(a.out) / 1e6:.1f} MB) sha256 {digest}")


if __name__ == "__main__":
    main()

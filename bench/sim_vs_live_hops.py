#!/usr/bin/env python3
"""The live cluster's hops and admission, fitted from live runs (bench/sim_vs_live.sh).

    sim_vs_live_hops.py WORK_DIR CLUSTER_JSON RUN... > overlay.json

For each RUN, WORK_DIR holds records_RUN.jsonl (`bench serve --records-out`: each
request's steady-clock send time), steps_p_RUN.jsonl / steps_d_RUN.jsonl (the prefill and
decode engines' `serve --step-log`) and r_RUN.out (the router's output, which names the
cost model it prices the prefill quota with). Writes the cluster-description keys of
sim/simulator.h that describe them (a `dsinfer sim --step-fit` overlay):

- prefill_lb_cost: the router's pricing, as it printed it.
- prefill_dispatch_ns: the median, over requests that found the prefill engine idle (its
  last step ended >= 20 ms before they were sent), of their first prefill step's start
  minus their send time (the client -> router -> engine hop).
- prefill_release_ns: the median, over requests that waited for the one before them, of
  the prefill engine's idle gap between that one's step and theirs, minus
  prefill_dispatch_ns: the time after a prefill before the router releases its quota
  (the hand-over's Ack, the end of the engine's stream) and pulls the next.
- p2d_latency_ns: from a request's last prefill step to its arrival at the decode
  engine's scheduler, less the simulator's transfer time (prompt x kv_bytes_per_token /
  p2d_bytes_per_s, from the cluster description CLUSTER_JSON). The decode
  engine plans step N+1 while step N runs (decode_async_join), so the step that took a
  request in (its first item with c + q = prompt + 1) says when it arrived: if the
  engine was idle just before that step (a gap > 1 ms), at the step's start; else during
  the step two before it (between the ends of the steps three and two before). The
  estimate is the median of these times (interval midpoints).
- decode_async_join: true (dsinfer's engines run asynchronously by default, S-ASYNC).

A request is matched to its steps by its prompt length (usage prompt_tokens): its
prefill step is the first ending after its send with an item c + q = L, its join step
the first decode step after that with an item c + q = L + 1 and q > 1; requests whose
prompt is a whole number of blocks (q = 1 at the join) are left out of the p2d estimate.
"""
import json
import re
import statistics
import sys


def steps(path):
    s = [json.loads(line) for line in open(path) if line.strip()]
    s.sort(key=lambda x: x["start_ns"])
    return [x for x in s if x["items"]]


def fit(work, runs, cluster):
    dispatch, gaps, p2d = [], [], []
    lb_cost = None
    for run in runs:
        P = steps(f"{work}/steps_p_{run}.jsonl")
        D = steps(f"{work}/steps_d_{run}.jsonl")
        recs = [json.loads(line) for line in open(f"{work}/records_{run}.jsonl") if line.strip()]
        recs = sorted((r for r in recs if r["ok"]), key=lambda r: r["start_steady_ns"])
        taken = set()
        prev_step = None
        for r in recs:
            sent, L = r["start_steady_ns"], r["prompt_tokens"]
            k = next((i for i, s in enumerate(P) if i not in taken and s["end_ns"] > sent
                      and any(q + c == L for q, c in s["items"])), None)
            if k is None:
                continue
            taken.add(k)
            step = P[k]
            first = step["start_ns"]
            if k > 0 and P[k - 1]["end_ns"] <= sent - 20e6:
                dispatch.append(first - sent)
            elif (k > 0 and prev_step == k - 1 and P[k - 1]["end_ns"] > sent
                  and len(step["items"]) == 1):
                gaps.append(first - P[k - 1]["end_ns"])
            prev_step = k
            if L % 128 == 0:
                continue
            end = step["end_ns"]
            j = next((j for j, x in enumerate(D) if x["start_ns"] >= end
                      and any(q + c == L + 1 and q > 1 for q, c in x["items"])), None)
            if j is None:
                continue
            transfer = L * cluster["kv_bytes_per_token"] / cluster["p2d_bytes_per_s"] * 1e9
            if j == 0 or D[j - 1]["end_ns"] < D[j]["start_ns"] - 1e6:
                at = D[j]["start_ns"]
            elif j >= 3:
                at = (max(D[j - 3]["end_ns"], end) + D[j - 2]["end_ns"]) / 2
            else:
                continue
            p2d.append(max(0.0, at - end - transfer))
        text = open(f"{work}/r_{run}.out").read()
        m = re.search(r"prefill quota priced by base_ns (\S+) per_q_ns (\S+) per_c_ns (\S+) "
                      r"per_qc_ns (\S+) per_qq_ns (\S+)", text)
        if m:
            lb_cost = dict(zip(("base_ns", "per_q_ns", "per_c_ns", "per_qc_ns", "per_qq_ns"),
                               map(float, m.groups())))
    med = lambda v: statistics.median(v) if v else 0.0
    d = med(dispatch)
    out = {"prefill_dispatch_ns": d,
           "prefill_release_ns": max(0.0, med(gaps) - d),
           "p2d_latency_ns": med(p2d),
           "decode_async_join": True}
    if lb_cost:
        out["prefill_lb_cost"] = lb_cost
    info = {"dispatch_samples": len(dispatch), "release_samples": len(gaps),
            "p2d_samples": len(p2d)}
    return out, info


if __name__ == "__main__":
    work, cluster_json, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
    overlay, info = fit(work, runs, json.load(open(cluster_json)))
    print(json.dumps(overlay))
    print(json.dumps(info), file=sys.stderr)

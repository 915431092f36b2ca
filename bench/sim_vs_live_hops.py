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
- p2d_bytes_per_s and prefill_release_ns: over requests that waited for the one before
  them, the prefill engine's idle gap between that one's step and theirs grows with the
  full blocks that one handed over (the router releases the quota and pulls the next
  after the hand-over's Ack): gap = a + s x tokens sent (L - L mod 128), s the median of
  the pairwise slopes (Theil-Sen), a the median of gap - s x tokens; p2d_bytes_per_s =
  kv_bytes_per_token / s (CLUSTER_JSON's), prefill_release_ns = a - prefill_dispatch_ns.
- p2d_latency_ns: from a request's last prefill step to its arrival at the decode
  engine's scheduler, less the transfer time of its full blocks at that rate. The decode
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


def theil_sen(points):
    """Median pairwise slope and the median intercept of (x, y) points."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points)
              for x2, y2 in points[i + 1:] if x2 != x1]
    s = max(0.0, statistics.median(slopes)) if slopes else 0.0
    return s, statistics.median(y - s * x for x, y in points) if points else 0.0


def fit(work, runs, cluster):
    dispatch, gaps, joins = [], [], []
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
                  and len(step["items"]) == 1 and len(P[k - 1]["items"]) == 1):
                q, c = P[k - 1]["items"][0]
                gaps.append(((q + c) - (q + c) % 128, first - P[k - 1]["end_ns"]))
            prev_step = k
            if L % 128 == 0:
                continue
            end = step["end_ns"]
            j = next((j for j, x in enumerate(D) if x["start_ns"] >= end
                      and any(q + c == L + 1 and q > 1 for q, c in x["items"])), None)
            if j is None:
                continue
            if j == 0 or D[j - 1]["end_ns"] < D[j]["start_ns"] - 1e6:
                at = D[j]["start_ns"]
            elif j >= 3:
                at = (max(D[j - 3]["end_ns"], end) + D[j - 2]["end_ns"]) / 2
            else:
                continue
            joins.append((L - L % 128, at - end))
        text = open(f"{work}/r_{run}.out").read()
        m = re.search(r"prefill quota priced by base_ns (\S+) per_q_ns (\S+) per_c_ns (\S+) "
                      r"per_qc_ns (\S+) per_qq_ns (\S+)", text)
        if m:
            lb_cost = dict(zip(("base_ns", "per_q_ns", "per_c_ns", "per_qc_ns", "per_qq_ns"),
                               map(float, m.groups())))
    med = lambda v: statistics.median(v) if v else 0.0
    d = med(dispatch)
    ns_per_token, a = theil_sen(gaps)
    out = {"prefill_dispatch_ns": d,
           "prefill_release_ns": max(0.0, a - d),
           "p2d_latency_ns": med([max(0.0, t - ns_per_token * n) for n, t in joins]),
           "decode_async_join": True}
    if ns_per_token > 0:
        out["p2d_bytes_per_s"] = cluster["kv_bytes_per_token"] / ns_per_token * 1e9
    if lb_cost:
        out["prefill_lb_cost"] = lb_cost
    info = {"dispatch_samples": len(dispatch), "release_samples": len(gaps),
            "p2d_samples": len(joins)}
    return out, info


if __name__ == "__main__":
    work, cluster_json, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
    overlay, info = fit(work, runs, json.load(open(cluster_json)))
    print(json.dumps(overlay))
    print(json.dumps(info), file=sys.stderr)

#!/usr/bin/env python3
"""Where a prefill's time goes, from a flat `perf record` of `dsinfer bench model`.

Usage (issue 20; bench/RESULTS.md "Prefill time split"):
  perf record -F 1999 -o perf.data -- dsinfer bench model --model M.gguf --prompt-tokens 256 \
      --gen-tokens 1 --repetitions 1 --max-threads 2 --skip-llamacpp --roofline=false
  perf script -i perf.data -F time,ip,sym,dso | python3 bench/prefill_split.py

Each prefill is the span from the first to the last sample in the q8_0 GEMM tile of 6
tokens (only a prompt runs it; the warm-up has 4 tokens, decode 1); spans more than 5 s
apart are separate runs (a model reload lies between them: 1 thread, then 2). Samples in
the span are put in categories by symbol; with 2 threads both threads' samples count, so
"thread pool wait" is the time a thread spun while the other worked (serial parts and
imbalance). Expert vs dense GEMMs share the kernel symbol; `bench model --gemm-only` times
them apart.
"""
import collections
import re
import sys

CATEGORIES = [
    ("q8_0 GEMM kernel", ("tile_q8", "run_q8_tokens", "gemm_q8", "gemm_avx512")),
    ("f32 GEMM (absorbed W_kb / W_vb per head)", ("tile_float", "gemm_float", "run_float_tokens")),
    ("activation quantisation", ("q8_block_amax", "q8_quantize", "quantize_act", "quantize_q8_rows",
                                 "f16_to_f32", "f32_to_f16")),
    ("attention kernel (MLA absorbed)", ("mla_", "attend")),
    ("routing", ("route", "sort", "expf", "__exp")),
    ("MoE gather / combine", ("Impl::moe", "axpy")),
    ("copies / memset", ("memmove", "memcpy", "memset")),
    ("thread pool wait", ("ThreadPool", "worker_loop", "parallel_for", "sched_yield")),
    ("norms, rope, silu, residual", ("rms_norm", "rope", "silu", "sincos", "add_rows", "Impl::block")),
]


def category(sym, dso):
    for name, keys in CATEGORIES:
        if any(k in sym for k in keys):
            return name
    if "kernel" in dso:
        return "OS kernel (page faults, scheduling)"
    return "other"


def main():
    samples = []
    for line in sys.stdin:
        m = re.match(r"\s*(\d+\.\d+):\s+[0-9a-f]+\s+(.*) \((.*)\)$", line)
        if m:
            samples.append((float(m.group(1)), m.group(2), m.group(3)))
    gemm = [t for t, s, _ in samples if "tile_q8<2, 6>" in s]
    if not gemm:
        sys.exit("no prefill GEMM samples found")
    spans = [[gemm[0], gemm[0]]]
    for t in gemm[1:]:
        if t - spans[-1][1] > 5.0:
            spans.append([t, t])
        else:
            spans[-1][1] = t
    for i, (a, b) in enumerate(spans):
        inside = [(s, d) for t, s, d in samples if a <= t <= b]
        counts = collections.Counter(category(s, d) for s, d in inside)
        print(f"prefill {i + 1}: {b - a:.2f} s wall, {len(inside)} samples")
        for name, n in counts.most_common():
            print(f"  {100.0 * n / len(inside):5.1f} %  {name}")


if __name__ == "__main__":
    main()

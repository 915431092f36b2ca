// Machine limits that `dsinfer bench kernels` reports its kernels against (issue 3):
// STREAM-style memory bandwidth, and the GEMM speed of OpenBLAS (sgemm) and oneDNN
// (bf16 and s8 matmul). The libraries are dlopen'd when installed (libopenblas0,
// libdnnl2; scripts/setup.sh), so the binary has no link-time dependency on them.
//
// Thread model: call from one thread while no other work runs; each function creates
// and joins its own threads (ThreadPool, OpenBLAS's or OpenMP's) and returns when they
// are idle again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "base/thread_pool.h"

namespace dsi::bench {

// STREAM copy (c = a) and triad (a = b + s*c) over arrays of `array_bytes` each, plus a
// read-only pass (8 interleaved streams per thread, as a GEMV reads 8 row groups), each
// thread on its contiguous share; best of `reps`. GB/s as STREAM counts them (copy 2,
// triad 3 array passes; stores are plain, so write-allocate traffic is not counted).
struct StreamBandwidth {
    double copy_gb_s = 0;
    double triad_gb_s = 0;
    double read_gb_s = 0;
    double best_gb_s() const;
};
StreamBandwidth measure_stream(ThreadPool& pool, int64_t array_bytes, int reps);

// C[m, n] = A[m, k] B[n, k]^T with OpenBLAS cblas_sgemm on `threads` threads: GFLOP/s
// (best of `reps` after one warm-up call) and what was loaded (library path, core,
// threading variant). {"error": ...} when the library is absent.
nlohmann::json openblas_sgemm(int threads, int64_t m, int64_t n, int64_t k, int reps);

// oneDNN matmul of the same shape, weights reordered once to the layout oneDNN picks:
// "bf16" (bf16 x bf16 -> f32) and "s8" (u8 x s8 -> s32), GFLOP/s (GOP/s for s8) and the
// implementation oneDNN chose; "median_s": the median of the `reps` timed calls (after the
// warm-up). `s8_only`: skip the bf16 case. {"error": ...} when the library is absent.
nlohmann::json onednn_matmul(int threads, int64_t m, int64_t n, int64_t k, int reps,
                             bool s8_only = false);

}  // namespace dsi::bench

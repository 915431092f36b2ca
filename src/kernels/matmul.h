// Matrix products of packed weights with f32 activations: Y = X W^T.
//
// matmul() is the GEMV (m = 1, decode) and GEMM (prefill) entry point for every
// packed format. Batch invariance by construction (SPEC S-ENG-6): each output
// element is one accumulator reduced in a fixed order over the columns (see
// internal/gemm_abi.h), so row t of Y is bitwise the same whatever m, whatever
// other rows are in X and whatever the thread count. All ISA variants give the
// same bits as the scalar reference. q8_0 and mxfp4 weights quantise each activation row
// to Q8_0 per 32 values first (as llama.cpp: d = amax/127 as f16, q =
// round-half-even(x*127/amax)); i8c weights quantise each row with one scale over all
// of K (quantize_act_i8c), so its results depend only on that row too.
//
// Thread model: free functions; `pool` (may be null: run inline) is used by one
// caller at a time (ThreadPool's rule).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/packed_matrix.h"

namespace dsi::kernels {

// y[t * w.rows() + r] = sum_k W[r, k] * x[t * w.cols() + k] for t < m.
// REQUIRES: x holds m * cols floats, y m * rows floats; no aliasing.
void matmul(const PackedMatrix& w, const float* x, int64_t m, float* y, ThreadPool* pool);
// The same with an explicit ISA (tests, benchmarks). `amx`: q8_0 and i8c weights with
// m >= 16 use the AMX tile kernels (bitwise equal to the others; internal/gemm_amx.h,
// internal/gemm_i8c.h).
// REQUIRES: isa is supported; amx only with isa == kAvx512 and amx_supported().
void matmul_isa(Isa isa, const PackedMatrix& w, const float* x, int64_t m, float* y,
                ThreadPool* pool, bool amx = false);

// Quantises one activation row of k floats (k % 32 == 0) to Q8_0 blocks: q[k],
// d[k/32] (f16-rounded scales), s128[k/32] = 128 * sum of the block's q.
void quantize_act_q8(const float* x, int64_t k, int8_t* q, float* d, int32_t* s128);
// The same with an ISA's vector code (the scalar bits; matmul uses it).
void quantize_act_q8_isa(Isa isa, const float* x, int64_t k, int8_t* q, float* d,
                         int32_t* s128);

// Quantises one activation row of k floats for i8c weights (internal/gemm_i8c.h): one
// scale over the row, d = amax / 127, q = rne(x * 127 / amax), q[k, padded_cols) = 0,
// s128 = 128 * sum q. Every ISA gives the same bits. REQUIRES: padded_cols >= k rounded
// up to 64.
void quantize_act_i8c(Isa isa, const float* x, int64_t k, int64_t padded_cols, int8_t* q,
                      float* d, int32_t* s128);

// Sum of n floats with the widest loads the ISA has (a read-bandwidth probe).
float read_sum(Isa isa, const float* x, int64_t n);

}  // namespace dsi::kernels

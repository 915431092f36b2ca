// Vectorised small ops of the forward pass: RMSNorm, RoPE (adjacent pairs),
// SiLU·mul, softmax, argmax, top-k. Each has a scalar reference and AVX2 /
// AVX-512 variants that give the same bits (internal/ops_abi.h states the
// reduction orders); each works on one row, so results never depend on the
// batch.
//
// Thread model: free functions, no state; call from any thread.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace dsi::kernels {

// y = x * (1 / sqrt(mean(x^2) + eps)) * w over n floats (y may alias x).
void rms_norm(Isa isa, const float* x, const float* w, int64_t n, float eps, float* y);
// The cos/sin tables rope_apply wants for one position: cc[2i] = cc[2i+1] =
// float(cos(pos * inv_freq[i]) * factor), ss[2i] = -s, ss[2i+1] = s with s the
// same for sin (angle in double, as the reference path).
void rope_table(int64_t pos, const double* inv_freq, int64_t pairs, double factor, float* cc,
                float* ss);
// Rotates adjacent pairs (2i, 2i+1) of num_vecs vectors (stride floats apart).
void rope_apply(Isa isa, float* v, int64_t num_vecs, int64_t stride, const float* cc,
                const float* ss, int64_t pairs);
// out = silu(g) * u (out may alias g or u).
void silu_mul(Isa isa, const float* g, const float* u, int64_t n, float* out);
// In place softmax over n floats.
void softmax(Isa isa, float* x, int64_t n);
// First index of the maximum. REQUIRES: n >= 1, no NaN.
int64_t argmax(Isa isa, const float* x, int64_t n);
// exp of n floats with the kernels' polynomial (tests).
void exp_n(Isa isa, const float* x, int64_t n, float* y);
// The k largest of n (ties: lower index first), in descending order, into ids.
// REQUIRES: 0 <= k <= n.
void top_k(const float* x, int64_t n, int64_t k, int32_t* ids);
// Dot product in the kernels' lane order (tests).
float dot(Isa isa, const float* a, const float* b, int64_t n);

}  // namespace dsi::kernels

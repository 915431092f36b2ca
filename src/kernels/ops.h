// Vectorised small ops of the forward pass: RMSNorm, RoPE (adjacent pairs),
// SiLU·mul, softmax, argmax, top-k, the indexer's scores. Each has a scalar reference and AVX2 /
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

// The lightning indexer's scores (V4 / V4.1): for one token's queries q [heads, dim] and
// head weights w [heads], score(key) = sum_h relu(q_h . key) * w_h, computed as a small
// matmul (a register tile of keys against all heads; the summation order is in
// internal/ops_abi.h, index_scores). Each score depends only on its key, never on the
// other keys of the call.
//
// The queries are packed once per token: index_packed_heads(heads) = heads rounded up to
// 16; index_pack_queries writes qt [dim, P] and wt [P] (zeros past heads).
int64_t index_packed_heads(int64_t heads);
void index_pack_queries(const float* q, const float* w, int64_t heads, int64_t dim, float* qt,
                        float* wt);
// out[k] = score(keys[k]) for k < n (each key dim floats). REQUIRES: P from
// index_packed_heads.
void index_scores(Isa isa, const float* qt, const float* wt, int64_t P, int64_t dim,
                  const float* const* keys, int64_t n, float* out);

}  // namespace dsi::kernels

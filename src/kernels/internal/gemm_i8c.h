// i8c ("int8 per channel", W8A8): int8 weights with one f32 scale per output row,
// int8 activations with one f32 scale per token row, int32 accumulation over all of K.
// Layout and kernels (gemm_i8c_scalar.cc, gemm_i8c_avx2.cc, gemm_i8c_avx512.cc,
// gemm_i8c_amx.cc). Same rules as gemm_abi.h: the variant files are compiled with their
// own -m flags and include no STL.
//
// Packed layout (PackFormat::kI8C): rows in groups of kGroupRows = 16 (tail rows zero),
// columns zero-padded to padded_cols = a multiple of kI8cKTile (64). Group g is
// padded_cols / 4 quads of 64 bytes; quad q byte (4 i + j) = w[16 g + i][4 q + j] + 128
// (biased, as q8_0, for vpdpbusd). So 16 consecutive quads (1 KiB) are exactly one AMX
// B tile (16 rows of K = 64 for TDPBSUD), and one 64-byte load is the vpdpbusd shape
// (16 rows x 4 columns). scales[16 g + i] = d_w of that row (f32, 0 for tail rows).
// Weights: d_w = amax_row / 127, q = rne(w / d_w) clamped to [-127, 127].
//
// Activations (I8cActs): per token row t, d_x[t] = amax / 127, q = rne(x * (127 / amax))
// (0 if amax == 0), over all K, padded with zeros to padded_cols; s128[t] = 128 * sum q.
//
// Reduction order (the batch-invariance contract): isum = sum_k q_w[r,k] q_x[t,k] is an
// exact integer (|isum| <= K * 127^2 < 2^31: pack_matrix caps K at kI8cMaxCols), then
// y[t, r] = float(isum) * (d_x[t] * d_w[r]). Every variant computes exactly that, so all
// are bitwise equal to the scalar reference and row t never depends on m, the other rows
// or the thread count.
#pragma once

#include <cstdint>

#include "kernels/internal/gemm_abi.h"

namespace dsi::kernels::internal {

constexpr int64_t kI8cKTile = 64;         // K of one AMX int8 tile product
constexpr int64_t kI8cMaxCols = 1 << 17;  // 2^17 * 127^2 < 2^31
constexpr int64_t kI8cTileBytes = 1024;   // 16 x 64 int8

inline int64_t i8c_padded_cols(int64_t cols) {
    return (cols + kI8cKTile - 1) / kI8cKTile * kI8cKTile;
}

// m token rows of quantised activations.
struct I8cActs {
    const int8_t* q = nullptr;      // [m][padded_cols], row-major, zero tail
    const float* d = nullptr;       // [m]
    const int32_t* s128 = nullptr;  // [m]
    // AMX only (else null): q re-laid as A tiles, [ceil(m / 16)][padded_cols / 64][16][64],
    // token rows past m zero (and d = s128 = 0 there: d and s128 hold ceil(m/16)*16 rows).
    const int8_t* tiles = nullptr;
};

// y[t * w.rows + r] for t < m and rows of groups [g_begin, g_end).
using I8cGemmFn = void (*)(const PackedView& w, const I8cActs& xa, int64_t m, float* y,
                           int64_t g_begin, int64_t g_end);

void gemm_i8c_scalar(const PackedView& w, const I8cActs& xa, int64_t m, float* y,
                     int64_t g_begin, int64_t g_end);
void gemm_i8c_avx2(const PackedView& w, const I8cActs& xa, int64_t m, float* y, int64_t g_begin,
                   int64_t g_end);
void gemm_i8c_avx512(const PackedView& w, const I8cActs& xa, int64_t m, float* y,
                     int64_t g_begin, int64_t g_end);
// REQUIRES: xa.tiles set, AMX granted (gemm_amx.h). Below kAmxMinTokens it runs
// gemm_i8c_avx512 (same bits).
void gemm_i8c_amx(const PackedView& w, const I8cActs& xa, int64_t m, float* y, int64_t g_begin,
                  int64_t g_end);

// Quantises one activation row of k floats into q[padded_cols] (zero tail), *d, *s128.
// The vector versions give the scalar bits (max is exact, one f32 multiply, round to
// nearest even).
using QuantizeI8cFn = void (*)(const float* x, int64_t k, int64_t padded_cols, int8_t* q,
                               float* d, int32_t* s128);
void quantize_i8c_scalar(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                         int32_t* s128);
void quantize_i8c_avx2(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                       int32_t* s128);
void quantize_i8c_avx512(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                         int32_t* s128);

}  // namespace dsi::kernels::internal

// MXFP4 (OCP MX: e2m1 codes, one e8m0 scale per 32 values) packed layout and
// its matmul variants (gemm_mxfp4_scalar.cc, gemm_mxfp4_avx2.cc,
// gemm_mxfp4_avx512.cc). Same rules as gemm_abi.h: the variant files are
// compiled with their own -m flags and include no STL.
//
// Values (as ggml's block_mxfp4): code c (4 bits) means kMxfp4Values[c], the
// e2m1 value doubled (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6 → 0, ±1, ..., ±12), and
// the block scale byte e means 2^(e - 128) (= e8m0 / 2, ggml's
// GGML_E8M0_TO_FP32_HALF), so w = kMxfp4Values[c] * 2^(e - 128).
//
// Packed layout (rows in groups of kGroupRows = 16, tail rows zero): group g is
// cols/32 blocks of kMxfp4BlockBytes, block b =
//   16 bytes   e8m0 scale of rows 0..15
//   4 chunks   of 64 bytes; chunk c byte (i * 4 + j), i = row, j < 4: low nibble
//              = code of column 8c + j, high nibble = code of column 8c + 4 + j.
// So one 64-byte load gives, per nibble half, 16 rows x 4 consecutive columns
// (the vpdpbusd shape), and its first (last) 32 bytes are rows 0..7 (8..15).
//
// Activations are Q8_0 per 32 (Q8Acts, as llama.cpp's vec_dot_mxfp4_q8_0).
// Reduction order (batch-invariance contract, shared by every variant): per row
// r and 32-block b, isum = sum_j kMxfp4Values[c] * q_x (exact int; the vector
// code computes it as sum (v + 12) * q_x - 12 * sum q_x), then
// acc = fma(float(isum), scale(e_r,b) * d_x[b], acc) in increasing b. So all
// variants are bitwise equal to the scalar one.
#pragma once

#include <cstdint>

#include "kernels/internal/gemm_abi.h"

namespace dsi::kernels::internal {

constexpr int kMxfp4Block = 32;
constexpr int64_t kMxfp4BlockBytes = 16 + 16 * 16;  // per (group, block)
// Added to every value so the weights are unsigned bytes (vpdpbusd, pmaddubsw).
constexpr int kMxfp4Bias = 12;

constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as f32 (e = 0, 1 are the subnormals 2^-128, 2^-127; e = 255 gives
// 2^127 as ggml does, but pack_matrix never stores 255).
inline float mxfp4_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e) - 1u) << 23;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

// Code of (row i, column k) inside one packed block (k < 32).
inline int mxfp4_code(const uint8_t* block, int i, int k) {
    const uint8_t byte = block[16 + (k / 8) * 64 + i * 4 + k % 4];
    return (k % 8) < 4 ? (byte & 0x0f) : (byte >> 4);
}

// GemmFn (gemm_abi.h) for w.format == kMXFP4: reads xq (m rows of Q8_0
// activations), ignores x.
void gemm_mxfp4_scalar(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                       int64_t g_begin, int64_t g_end);
void gemm_mxfp4_avx2(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                     int64_t g_begin, int64_t g_end);
void gemm_mxfp4_avx512(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                       int64_t g_begin, int64_t g_end);

}  // namespace dsi::kernels::internal

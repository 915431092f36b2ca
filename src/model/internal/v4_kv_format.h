// DeepSeek V4's compact KV rows (reference deepseek_v4.md §2.2–§2.4, §4.2), used by
// DeepseekV4Model with kv_dtype e4m3. Private to src/model/. Thread model: pure
// functions.
//
// Main row (window rows, ratio-4 and ratio-128 entries) of `dim` values whose last
// `rope` are RoPE dims — FlashMLA's MODEL1_FP8Sparse entry, one row contiguous:
//   bytes [0, nope)               e4m3 codes of the nope dims (nope = dim - rope)
//   bytes [nope, nope + 2 rope)   the rope dims as bf16 (round to nearest even)
//   bytes [.., + ceil(nope / 64)) one ue8m0 scale per 64 nope values (a shorter
//                                 last group when nope % 64 != 0: test shapes)
//   padding to a multiple of 4 (dim 512, rope 64: 448 + 128 + 7 + 1 = 584 bytes).
// Scale of a group: 2^ceil(log2(max(amax, 1e-4) / 448)) (the reference's
// fast_round_scale); code = e4m3(x / scale), round to nearest even.
//
// Indexer key row of `dim` values (after the Hadamard rotation): MXFP4 as the
// reference's FP4 simulation — e2m1 codes two per byte (low nibble = even element),
// then one ue8m0 scale per 32 values: dim / 2 + dim / 32 bytes (128: 68 bytes).
// Scale: 2^ceil(log2(max(amax, 6 * 2^-126) / 6)); code = nearest e2m1 value of
// x / scale, ties to the even code.
//
// Non-finite inputs: NaN stays NaN (e4m3 0x7f; e2m1 has no NaN, it becomes 0); an
// infinity saturates to the largest code at the largest scale (which may decode to
// infinity again), never to NaN.
#pragma once

#include <cstdint>

namespace dsi::internal {

// REQUIRES: 0 <= rope <= dim.
int64_t v4_main_row_bytes(int64_t dim, int64_t rope);
void v4_main_encode(const float* x, int64_t dim, int64_t rope, uint8_t* dst);
void v4_main_decode(const uint8_t* src, int64_t dim, int64_t rope, float* y);

// REQUIRES: dim > 0, dim % 32 == 0.
int64_t v4_index_row_bytes(int64_t dim);
void v4_index_encode(const float* x, int64_t dim, uint8_t* dst);
void v4_index_decode(const uint8_t* src, int64_t dim, float* y);
// x = decode(encode(x)) per 32 values, in place (the indexer's query).
void v4_fp4_simulate(float* x, int64_t dim);

// ---- DeepSeek V4.1 (reference deepseek_v4.md §7.3; DeepseekV41Model with kv_dtype e4m3) ----
// Main entry of `dim` values (after RoPE, all dims alike): NVFP4 without the global scale —
// e2m1 codes two per byte (low nibble = even element), then one e4m3 scale per 16 values:
// dim / 2 + dim / 16 bytes (512: 288). Scale: e4m3(amax / 6) (round to nearest even;
// a group of zeros gets scale 0 and decodes to zeros); code = nearest e2m1 of x / scale.
// REQUIRES: dim % 16 == 0.
int64_t v41_main_row_bytes(int64_t dim);
void v41_main_encode(const float* x, int64_t dim, uint8_t* dst);
void v41_main_decode(const uint8_t* src, int64_t dim, float* y);
// Window (SWA) row: MXFP8 over all dims — e4m3 codes, then one ue8m0 scale per 32 values:
// dim + dim / 32 bytes (512: 528). Scale as the V4 main row's. REQUIRES: dim % 32 == 0.
int64_t v41_swa_row_bytes(int64_t dim);
void v41_swa_encode(const float* x, int64_t dim, uint8_t* dst);
void v41_swa_decode(const uint8_t* src, int64_t dim, float* y);

// The normalised Walsh-Hadamard transform (Sylvester order, scale n^-1/2), in place.
// REQUIRES: n a power of two.
void hadamard_rotate(float* x, int64_t n);

}  // namespace dsi::internal

// The interface between the matmul driver (matmul.cc) and its per-ISA variants
// (gemm_scalar.cc, gemm_avx2.cc, gemm_avx512.cc).
//
// The variant files are compiled with their own -m flags, so they include no
// STL template (an inline function instantiated there could be picked by the
// linker for the whole program and execute AVX-512 on a machine without it):
// plain structs, pointers and intrinsics only.
//
// Packed layouts (rows are grouped in groups of kGroupRows; tail rows are
// zero):
//   f32/bf16/f16/e4m3: group g is [cols][kGroupRows] elements, so one vector
//   load
//     reads element k of all 16 rows. e4m3 adds one f32 scale per (group, block
//     of scale_block_cols columns): w = e4m3(v) * scale.
//   q8: group g is, per 32-column block b, 16 f16 row scales (32 bytes) then 8
//   quads
//     x 16 rows x 4 int8 (512 bytes), stored biased (u8 = w + 128) for VNNI.
//
// Reduction order (the batch-invariance contract): y[t, r] is one f32
// accumulator updated in increasing k, acc = fma(w[r, k], x[t, k], acc) (f32
// family), or per 32-block acc = fma(float(isum_b), d_w[r, b] * d_x[t, b], acc)
// (q8, isum exact int). Every variant follows it, so all ISAs give bitwise
// identical results.
#pragma once

#include <climits>
#include <cstdint>

namespace dsi::kernels::internal {

// Four int8 activations as one int32 (the VNNI broadcast operand). `static`: each
// variant file gets its own copy, compiled with its own -m flags.
static inline int32_t load_i32(const int8_t* p) {
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

// Activation quantisation with non-finite or huge inputs (a NaN weight upstream):
// the SIMD converts give 0x80000000 for them; these keep the scalar paths and the
// sums defined (two's-complement wrap, no signed overflow). The codes are garbage
// then, as the input was.
static inline int32_t rne_to_i32(float v) {  // nearest even, as nearbyint / cvtps
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
    return static_cast<int32_t>(__builtin_nearbyintf(v));
}
static inline int32_t wrap_add(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
static inline int32_t wrap_times128(int32_t sum) {
    return static_cast<int32_t>(static_cast<uint32_t>(sum) * 128u);
}
// The wrapped sum of n int32 lanes (GCC's _mm512_reduce_add_epi32 adds as int, which
// UBSan reports on overflow).
static inline int32_t wrap_sum(const int32_t* lanes, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; ++i) s = wrap_add(s, lanes[i]);
    return s;
}

constexpr int kGroupRows = 16;
constexpr int kQ8Block = 32;
constexpr int64_t kQ8BlockBytes = 32 + 16 * 32;  // per (group, block)

// kMXFP4: layout and kernels in gemm_mxfp4.h, kI8C in gemm_i8c.h (matmul.cc
// dispatches them there).
enum class PackFormat : uint8_t { kF32, kBF16, kF16, kE4M3, kQ8, kMXFP4, kI8C };

struct PackedView {
    PackFormat format = PackFormat::kF32;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t num_groups = 0;
    int64_t group_bytes = 0;
    const uint8_t* data = nullptr;
    // e4m3: [num_groups][scale_blocks] f32; i8c: [num_groups * 16] row scales.
    const float* scales = nullptr;
    int64_t padded_cols = 0;  // i8c: cols rounded up to 64 (gemm_i8c.h)
    int64_t scale_blocks = 0;
    int64_t scale_block_cols = 0;
};

// Activations quantised per 32-block (q8 weights): per token row of `cols`:
// q[cols] int8, d[cols/32] f32 (f16-rounded, as GGUF Q8_0), s128[cols/32] =
// 128*sum(q).
struct Q8Acts {
    const int8_t* q = nullptr;
    const float* d = nullptr;
    const int32_t* s128 = nullptr;
    // -s128 (wrapping): the AVX-512 q8 kernel starts each block's int32 sum there, so
    // the sum ends at the exact isum_b without a subtraction per (row group, token).
    const int32_t* neg_s128 = nullptr;
};

// y[t * w.rows + r] for t < m and rows of groups [g_begin, g_end). x is [m,
// cols] f32 (f32 family) or xq (q8).
using GemmFn = void (*)(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                        int64_t g_begin, int64_t g_end);

void gemm_scalar(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                 int64_t g_begin, int64_t g_end);
void gemm_avx2(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
               int64_t g_begin, int64_t g_end);
void gemm_avx512(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                 int64_t g_begin, int64_t g_end);

// Q8_0 activation quantiser, vector parts (matmul.cc's quantize_act_q8 computes the f16
// scale and 127/amax of each block in scalar code between them; together they give the
// scalar reference's bits). amax[b] = max |x| over block b (32 values) of nb blocks;
// q[32 b + j] = rne(x * id[b]) and s128[b] = 128 * sum of block b's q.
void q8_block_amax_avx512(const float* x, int64_t nb, float* amax);
void q8_block_amax_avx2(const float* x, int64_t nb, float* amax);
// d[b] = f16-rounded amax[b] / 127 (F16C, nearest even: the bits of the scalar
// f32_to_f16 for every finite input) and, in place, amax[b] -> id[b] = 127 / amax[b]
// (0 where amax is 0).
void q8_scales_avx512(float* amax_id, int64_t nb, float* d);
void q8_scales_avx2(float* amax_id, int64_t nb, float* d);
void q8_quantize_blocks_avx512(const float* x, int64_t nb, const float* id, int8_t* q,
                               int32_t* s128);
void q8_quantize_blocks_avx2(const float* x, int64_t nb, const float* id, int8_t* q,
                             int32_t* s128);

// STREAM-style read bandwidth probe used by benchmarks: sum of n floats.
float sum_avx512(const float* x, int64_t n);
float sum_avx2(const float* x, int64_t n);

}  // namespace dsi::kernels::internal

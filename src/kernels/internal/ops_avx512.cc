// AVX-512 variant of the attention kernel and small ops (body: ops_simd.inc; a
// 16-float vector is one zmm register). Compiled with -mavx512f etc.: no STL here
// (see gemm_abi.h).
#include <immintrin.h>

#include "kernels/internal/ops_abi.h"

namespace dsi::kernels::internal {
namespace {

typedef __m512 V;

// Attention register tiles: 4 rows x 4 queries of score accumulators, 8 output
// accumulators (32 zmm registers).
constexpr int kTileRows = 4;
constexpr int kTileQueries = 4;
constexpr int kTileOut = 8;
// Index-score register tile: 8 keys x 2 groups of 16 heads (16 zmm accumulators).
constexpr int kIndexKeys = 8;

inline __mmask16 mask_n(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }
inline __m512i isplat(int32_t x) { return _mm512_set1_epi32(x); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V splat(float f) { return _mm512_set1_ps(f); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vload_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(mask_n(n), p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void vstore_n(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, mask_n(n), v); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vneg(V a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), isplat(INT32_MIN)));
}
// min_ps(a, b) = a < b ? a : b and max_ps(a, b) = a > b ? a : b, so these are the
// scalar selects, NaN included.
inline V vclamp_hi(V x, float c) { return _mm512_min_ps(splat(c), x); }
inline V vclamp_lo(V x, float c) { return _mm512_max_ps(splat(c), x); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline float hmax(V v) { return _mm512_reduce_max_ps(v); }
inline float lane0(V v) { return _mm512_cvtss_f32(v); }
inline float hsum_tree(V v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline V vexp_finish(V p, V n, V x) {
    const __m512i bits = _mm512_add_epi32(_mm512_castps_si512(p),
                                          _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23));
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, splat(-86.0f), _CMP_LT_OQ);
    return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(static_cast<__mmask16>(~tiny), bits));
}
inline V swap_pairs(V v) { return _mm512_permute_ps(v, 0xB1); }
inline V vload_bf16(const unsigned char* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// e4m3fn: |code| < 8 is subnormal (m * 2^-9); otherwise the f32 with exponent e + 120
// and the mantissa moved up (exact either way), then the sign, then times s.
inline V vload_e4m3(const unsigned char* p, float s) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i em = _mm512_and_si512(c, isplat(0x7f));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, isplat(0x80)), 24);
    const V normal = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_slli_epi32(em, 20), isplat(120 << 23)));
    const V sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), splat(0x1.0p-9f));
    const V f = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(em, isplat(8)), normal, sub);
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign)),
                         splat(s));
}

#include "kernels/internal/ops_simd.inc"

}  // namespace

const OpsTable kOpsAvx512 = kTable;

}  // namespace dsi::kernels::internal

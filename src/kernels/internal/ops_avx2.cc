// AVX2 + FMA variant of the attention kernel and small ops (body: ops_simd.inc). A
// 16-float vector is a pair of native __m256 (lanes 0-7, 8-15), so GCC keeps it in
// ymm registers; each helper does the same op on both halves. No STL here (see
// gemm_abi.h).
#include <immintrin.h>

#include "kernels/internal/ops_abi.h"

namespace dsi::kernels::internal {
namespace {

struct V {
    __m256 lo, hi;
};

// Attention register tiles: 2 rows x 2 queries of score accumulators, 4 output
// accumulators (16 ymm registers).
constexpr int kTileRows = 2;
constexpr int kTileQueries = 2;
constexpr int kTileOut = 4;
// Index-score register tile: 2 keys x 2 groups of 16 heads (8 ymm accumulators, 4 for
// the queries).
constexpr int kIndexKeys = 2;

inline __m256i isplat(int32_t x) { return _mm256_set1_epi32(x); }
// Lane masks for the first n lanes of an 8-lane half.
inline __m256i half_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V splat(float f) { return {_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V vload_n(const float* p, int64_t n) {
    return {_mm256_maskload_ps(p, half_mask(n)), _mm256_maskload_ps(p + 8, half_mask(n - 8))};
}
inline void vstore(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
inline void vstore_n(float* p, V v, int64_t n) {
    _mm256_maskstore_ps(p, half_mask(n), v.lo);
    _mm256_maskstore_ps(p + 8, half_mask(n - 8), v.hi);
}
inline V vadd(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V vsub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V vmul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V vdiv(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V vfma(V a, V b, V c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline __m256 neg8(__m256 a) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(a), isplat(INT32_MIN)));
}
inline V vneg(V a) { return {neg8(a.lo), neg8(a.hi)}; }
// min_ps(a, b) = a < b ? a : b and max_ps(a, b) = a > b ? a : b, so these are the
// scalar selects, NaN included.
inline V vclamp_hi(V x, float c) {
    const __m256 cv = _mm256_set1_ps(c);
    return {_mm256_min_ps(cv, x.lo), _mm256_min_ps(cv, x.hi)};
}
inline V vclamp_lo(V x, float c) {
    const __m256 cv = _mm256_set1_ps(c);
    return {_mm256_max_ps(cv, x.lo), _mm256_max_ps(cv, x.hi)};
}
inline V vmax(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline float hmax(V v) {
    const __m256 m8 = _mm256_max_ps(v.lo, v.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
inline float lane0(V v) { return _mm256_cvtss_f32(v.lo); }
inline float hsum_tree(V v) {
    const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline __m256 exp_finish8(__m256 p, __m256 n, __m256 x) {
    const __m256i bits = _mm256_add_epi32(_mm256_castps_si256(p),
                                          _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-86.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(tiny, _mm256_castsi256_ps(bits));
}
inline V vexp_finish(V p, V n, V x) {
    return {exp_finish8(p.lo, n.lo, x.lo), exp_finish8(p.hi, n.hi, x.hi)};
}
inline V swap_pairs(V v) { return {_mm256_permute_ps(v.lo, 0xB1), _mm256_permute_ps(v.hi, 0xB1)}; }
inline __m256 bf16x8(const unsigned char* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V vload_bf16(const unsigned char* p) { return {bf16x8(p), bf16x8(p + 16)}; }
// e4m3fn: |code| < 8 is subnormal (m * 2^-9); otherwise the f32 with exponent e + 120
// and the mantissa moved up (exact either way), then the sign, then times s.
inline __m256 e4m3x8(const unsigned char* p, __m256 s) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i em = _mm256_and_si256(c, isplat(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, isplat(0x80)), 24);
    const __m256 normal = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(em, 20), isplat(120 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1.0p-9f));
    const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(isplat(8), em));
    const __m256 f = _mm256_blendv_ps(normal, sub, is_sub);
    return _mm256_mul_ps(_mm256_or_ps(f, _mm256_castsi256_ps(sign)), s);
}
inline V vload_e4m3(const unsigned char* p, float s) {
    const __m256 sv = _mm256_set1_ps(s);
    return {e4m3x8(p, sv), e4m3x8(p + 8, sv)};
}

#include "kernels/internal/ops_simd.inc"

}  // namespace

const OpsTable kOpsAvx2 = kTable;

}  // namespace dsi::kernels::internal

// AVX2 + FMA variant of the attention kernel and small ops (body: ops_simd.inc; a
// 16-float vector is two ymm registers). No STL here (see gemm_abi.h).
#include <immintrin.h>

#include "kernels/internal/ops_abi.h"

namespace dsi::kernels::internal {
namespace {

typedef float V __attribute__((vector_size(64)));
typedef int32_t VI __attribute__((vector_size(64)));
typedef uint32_t VU __attribute__((vector_size(64)));

inline __m256 lo(V v) { return reinterpret_cast<__m256>(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)); }
inline __m256 hi(V v) {
    return reinterpret_cast<__m256>(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}
typedef float V8 __attribute__((vector_size(32)));
inline V join(__m256 a, __m256 b) {
    const V8 x = reinterpret_cast<V8>(a);
    const V8 y = reinterpret_cast<V8>(b);
    return __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
// Lane masks for the first n (< 16) lanes of the low and high half.
inline __m256i half_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V vload(const float* p) { return join(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
inline V vload_n(const float* p, int64_t n) {
    return join(_mm256_maskload_ps(p, half_mask(n)), _mm256_maskload_ps(p + 8, half_mask(n - 8)));
}
inline void vstore(float* p, V v) {
    _mm256_storeu_ps(p, lo(v));
    _mm256_storeu_ps(p + 8, hi(v));
}
inline void vstore_n(float* p, V v, int64_t n) {
    _mm256_maskstore_ps(p, half_mask(n), lo(v));
    _mm256_maskstore_ps(p + 8, half_mask(n - 8), hi(v));
}
inline V vfma(V a, V b, V c) {
    return join(_mm256_fmadd_ps(lo(a), lo(b), lo(c)), _mm256_fmadd_ps(hi(a), hi(b), hi(c)));
}

#include "kernels/internal/ops_simd.inc"

}  // namespace

const OpsTable kOpsAvx2 = kTable;

}  // namespace dsi::kernels::internal

// AVX-512 variant of the attention kernel and small ops (body: ops_simd.inc).
// Compiled with -mavx512f etc.: no STL here (see gemm_abi.h).
#include <immintrin.h>

#include "kernels/internal/ops_abi.h"

namespace dsi::kernels::internal {
namespace {

typedef float V __attribute__((vector_size(64)));
typedef int32_t VI __attribute__((vector_size(64)));
typedef uint32_t VU __attribute__((vector_size(64)));

inline __mmask16 mask_n(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }
inline V vload(const float* p) { return reinterpret_cast<V>(_mm512_loadu_ps(p)); }
inline V vload_n(const float* p, int64_t n) {
    return reinterpret_cast<V>(_mm512_maskz_loadu_ps(mask_n(n), p));
}
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, reinterpret_cast<__m512>(v)); }
inline void vstore_n(float* p, V v, int64_t n) {
    _mm512_mask_storeu_ps(p, mask_n(n), reinterpret_cast<__m512>(v));
}
inline V vfma(V a, V b, V c) {
    return reinterpret_cast<V>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                               reinterpret_cast<__m512>(b),
                                               reinterpret_cast<__m512>(c)));
}

#include "kernels/internal/ops_simd.inc"

}  // namespace

const OpsTable kOpsAvx512 = kTable;

}  // namespace dsi::kernels::internal

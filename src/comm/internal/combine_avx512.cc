// combine_kernel.h, AVX-512 (built with -mavx512f -ffp-contract=off).
#include <immintrin.h>

#include "comm/combine_kernel.h"
#include "comm/internal/combine_simd.h"

namespace dsi::comm::internal {
namespace {

struct Avx512 {
    using Vec = __m512;
    static constexpr int kWidth = 16;
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec set1(float x) { return _mm512_set1_ps(x); }
    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
    static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
    static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
};

}  // namespace

void combine_row_avx512(float* out, const float* const* rows, const float* w, int top_k,
                        int hidden) {
    combine_row_simd<Avx512>(out, rows, w, top_k, hidden);
}

}  // namespace dsi::comm::internal

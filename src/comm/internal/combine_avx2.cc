// combine_kernel.h, AVX2 (built with -mavx2 -ffp-contract=off).
#include <immintrin.h>

#include "comm/combine_kernel.h"
#include "comm/internal/combine_simd.h"

namespace dsi::comm::internal {
namespace {

struct Avx2 {
    using Vec = __m256;
    static constexpr int kWidth = 8;
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec set1(float x) { return _mm256_set1_ps(x); }
    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
    static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
    static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
};

}  // namespace

void combine_row_avx2(float* out, const float* const* rows, const float* w, int top_k,
                      int hidden) {
    combine_row_simd<Avx2>(out, rows, w, top_k, hidden);
}

}  // namespace dsi::comm::internal

#include "comm/combine_kernel.h"

#include <algorithm>

namespace dsi::comm {
namespace internal {

// No vector extension assumed: blocks of 8 elements, each element's additions in k order,
// which -O3's vectoriser packs into SSE (a plain loop over h with k inside stays scalar).
void combine_row_generic(float* out, const float* const* rows, const float* w, int top_k,
                         int hidden) {
    constexpr int kBlock = 8;
    int h = 0;
    for (; h + kBlock <= hidden; h += kBlock) {
        float acc[kBlock] = {};
        for (int k = 0; k < top_k; ++k) {
            const float* y = rows[k] + h;
            for (int j = 0; j < kBlock; ++j) {
                acc[j] += w[k] * y[j];
            }
        }
        std::copy(acc, acc + kBlock, out + h);
    }
    for (; h < hidden; ++h) {
        float acc = 0.0f;
        for (int k = 0; k < top_k; ++k) {
            acc += w[k] * rows[k][h];
        }
        out[h] = acc;
    }
}

}  // namespace internal

namespace {

struct Table {
    CombineKernel kernels[3];
    size_t count = 0;
};

Table make_table() {
    Table t;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) {
        t.kernels[t.count++] = {"avx512", internal::combine_row_avx512};
    }
    if (__builtin_cpu_supports("avx2")) {
        t.kernels[t.count++] = {"avx2", internal::combine_row_avx2};
    }
#endif
    t.kernels[t.count++] = {"generic", internal::combine_row_generic};
    return t;
}

}  // namespace

std::span<const CombineKernel> combine_kernels() {
    static const Table t = make_table();
    return {t.kernels, t.count};
}

}  // namespace dsi::comm

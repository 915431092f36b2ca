// The combine's arithmetic for one token (moe_comm.h combine_in_order), with the widest
// vector unit of this CPU, chosen once at run time:
//   out[h] = (((+0.0f + w[0] * rows[0][h]) + w[1] * rows[1][h]) + ...) + w[k-1] * rows[k-1][h]
// Every variant does the same IEEE operations per element (one multiply, one add, in k
// order; never a fused multiply-add: the files are built with -ffp-contract=off), so all
// give the same bits; they differ only in how many elements one instruction does and in
// keeping the accumulators in registers across k (the old loop loaded and stored the
// output block once per k). bench/RESULTS.md ("Decode sizes: the combine in registers")
// has what it saves.
// Thread model: pure functions.
#pragma once

#include <span>

namespace dsi::comm {

// rows: top_k pointers to `hidden` floats; w: top_k weights; out: `hidden` floats (may not
// overlap the rows).
using CombineRowFn = void (*)(float* out, const float* const* rows, const float* w, int top_k,
                              int hidden);

struct CombineKernel {
    const char* isa;  // "avx512", "avx2", "generic"
    CombineRowFn fn;
};

// Every variant this CPU can run, best first (tests compare them; combine_in_order uses
// the first).
std::span<const CombineKernel> combine_kernels();

namespace internal {
void combine_row_generic(float* out, const float* const* rows, const float* w, int top_k,
                         int hidden);
void combine_row_avx2(float* out, const float* const* rows, const float* w, int top_k,
                      int hidden);
void combine_row_avx512(float* out, const float* const* rows, const float* w, int top_k,
                        int hidden);
}  // namespace internal

}  // namespace dsi::comm

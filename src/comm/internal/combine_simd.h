// The vector body of the combine kernels (combine_kernel.h), one per ISA file: each file
// includes this with its own flags and passes the traits of its vector type. Every element
// gets one multiply and one add per k, in k order, from +0.0f (the files are built with
// -ffp-contract=off, so never an FMA): the same bits as the plain loop.
#pragma once

namespace dsi::comm::internal {

// V: struct with type `Vec`, `kWidth` floats, and static zero(), set1(float),
// load(const float*), store(float*, Vec), add(Vec, Vec), mul(Vec, Vec).
template <typename V>
inline void combine_row_simd(float* out, const float* const* rows, const float* w, int top_k,
                             int hidden) {
    constexpr int kStep = 4 * V::kWidth;  // four accumulators stay in registers over k
    int h = 0;
    for (; h + kStep <= hidden; h += kStep) {
        typename V::Vec a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < top_k; ++k) {
            const typename V::Vec wk = V::set1(w[k]);
            const float* y = rows[k] + h;
            a0 = V::add(a0, V::mul(wk, V::load(y)));
            a1 = V::add(a1, V::mul(wk, V::load(y + V::kWidth)));
            a2 = V::add(a2, V::mul(wk, V::load(y + 2 * V::kWidth)));
            a3 = V::add(a3, V::mul(wk, V::load(y + 3 * V::kWidth)));
        }
        V::store(out + h, a0);
        V::store(out + h + V::kWidth, a1);
        V::store(out + h + 2 * V::kWidth, a2);
        V::store(out + h + 3 * V::kWidth, a3);
    }
    for (; h < hidden; ++h) {
        float acc = 0.0f;
        for (int k = 0; k < top_k; ++k) {
            acc += w[k] * rows[k][h];
        }
        out[h] = acc;
    }
}

}  // namespace dsi::comm::internal

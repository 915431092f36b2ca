#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kernels/attention.h"

namespace dsi::kernels {
namespace {

const internal::OpsTable& table(Isa isa) {
    switch (isa) {
        case Isa::kAvx512:
            return internal::kOpsAvx512;
        case Isa::kAvx2:
            return internal::kOpsAvx2;
        case Isa::kScalar:
            break;
    }
    return internal::kOpsScalar;
}

}  // namespace

void mla_attention(Isa isa, const LatentKvView& kv, int64_t num_positions, int64_t lora,
                   int64_t rope, float scale, const MlaHeads& heads) {
    DSI_CHECK(num_positions >= 1);
    const internal::OpsTable& t = table(isa);
    for (int64_t h0 = 0; h0 < heads.num_heads; h0 += internal::kMaxHeadsPerCall) {
        internal::MlaArgs a;
        a.blocks = kv.blocks;
        a.row_stride = kv.row_stride;
        a.num_positions = num_positions;
        a.lora = lora;
        a.rope = rope;
        a.scale = scale;
        a.num_heads = std::min(internal::kMaxHeadsPerCall, heads.num_heads - h0);
        a.q_lat = heads.q_lat + h0 * lora;
        a.q_pe = heads.q_pe + h0 * heads.q_pe_stride;
        a.q_pe_stride = heads.q_pe_stride;
        a.o_lat = heads.o_lat + h0 * lora;
        t.mla(a);
    }
}

void rms_norm(Isa isa, const float* x, const float* w, int64_t n, float eps, float* y) {
    table(isa).rms_norm(x, w, n, eps, y);
}

void rope_table(int64_t pos, const double* inv_freq, int64_t pairs, double factor, float* cc,
                float* ss) {
    for (int64_t i = 0; i < pairs; ++i) {
        const double angle = static_cast<double>(pos) * inv_freq[i];
        const float c = static_cast<float>(std::cos(angle) * factor);
        const float s = static_cast<float>(std::sin(angle) * factor);
        cc[2 * i] = c;
        cc[2 * i + 1] = c;
        ss[2 * i] = -s;
        ss[2 * i + 1] = s;
    }
}

void rope_apply(Isa isa, float* v, int64_t num_vecs, int64_t stride, const float* cc,
                const float* ss, int64_t pairs) {
    table(isa).rope(v, num_vecs, stride, cc, ss, pairs);
}

void silu_mul(Isa isa, const float* g, const float* u, int64_t n, float* out) {
    table(isa).silu_mul(g, u, n, out);
}

void softmax(Isa isa, float* x, int64_t n) { table(isa).softmax(x, n); }

int64_t argmax(Isa isa, const float* x, int64_t n) {
    DSI_CHECK(n >= 1);
    return table(isa).argmax(x, n);
}

void exp_n(Isa isa, const float* x, int64_t n, float* y) { table(isa).exp(x, n, y); }

float dot(Isa isa, const float* a, const float* b, int64_t n) { return table(isa).dot(a, b, n); }

void top_k(const float* x, int64_t n, int64_t k, int32_t* ids) {
    DSI_CHECK(k >= 0 && k <= n);
    // Selection by repeated argmax over the remaining entries would be O(nk); a
    // bounded insertion keeps the k best seen so far (k is small: experts, sampling).
    if (k == 0) return;
    int64_t have = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (have == k && !(x[i] > x[ids[k - 1]])) continue;
        int64_t j = have < k ? have++ : k - 1;
        while (j > 0 && x[i] > x[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            --j;
        }
        ids[j] = static_cast<int32_t>(i);
    }
}

}  // namespace dsi::kernels

#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "base/check.h"
#include "kernels/attention.h"
#include "tensor/dtype.h"

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

static_assert(static_cast<int32_t>(KvDtype::kF32) == internal::kKvF32 &&
              static_cast<int32_t>(KvDtype::kBf16) == internal::kKvBf16 &&
              static_cast<int32_t>(KvDtype::kE4m3) == internal::kKvE4m3);

const char* kv_dtype_name(KvDtype dtype) {
    switch (dtype) {
        case KvDtype::kBf16:
            return "bf16";
        case KvDtype::kE4m3:
            return "e4m3";
        case KvDtype::kF32:
            break;
    }
    return "f32";
}

bool parse_kv_dtype(const char* name, KvDtype* out) {
    const std::string_view n(name);
    if (n == "f32") {
        *out = KvDtype::kF32;
    } else if (n == "bf16") {
        *out = KvDtype::kBf16;
    } else if (n == "e4m3" || n == "fp8") {
        *out = KvDtype::kE4m3;
    } else {
        return false;
    }
    return true;
}

int64_t kv_row_words(KvDtype dtype, int64_t n) {
    switch (dtype) {
        case KvDtype::kBf16:
            return (n + 1) / 2;
        case KvDtype::kE4m3:
            return (n + 3) / 4 + (n + 15) / 16;
        case KvDtype::kF32:
            break;
    }
    return n;
}

void kv_encode_row(KvDtype dtype, const float* x, int64_t n, float* dst) {
    unsigned char* out = reinterpret_cast<unsigned char*>(dst);
    switch (dtype) {
        case KvDtype::kF32:
            std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
            return;
        case KvDtype::kBf16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_bf16(x[i]);
                std::memcpy(out + 2 * i, &h, 2);
            }
            if (n % 2 != 0) std::memset(out + 2 * n, 0, 2);
            return;
        case KvDtype::kE4m3:
            break;
    }
    DSI_CHECK(n % 16 == 0);
    // S-ENG-9: one scale per 16 values, amax maps to e4m3's largest finite 448.
    for (int64_t g = 0; g < n / 16; ++g) {
        float amax = 0.0f;
        for (int64_t i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * g + i]));
        // A group below 2^-100 (or zero) is stored as zeros: 448 / amax would overflow.
        const bool zero = !(amax >= 0x1.0p-100f);
        const float scale = zero ? 0.0f : amax / 448.0f;
        const float inv = zero ? 0.0f : 448.0f / amax;
        for (int64_t i = 0; i < 16; ++i) out[16 * g + i] = f32_to_e4m3(x[16 * g + i] * inv);
        std::memcpy(out + n + 4 * g, &scale, 4);
    }
}

void kv_decode_row(KvDtype dtype, const float* row, int64_t n, float* y) {
    const unsigned char* in = reinterpret_cast<const unsigned char*>(row);
    for (int64_t i = 0; i < n; ++i) {
        if (dtype == KvDtype::kF32) {
            y[i] = row[i];
        } else if (dtype == KvDtype::kBf16) {
            uint16_t h;
            std::memcpy(&h, in + 2 * i, 2);
            y[i] = bf16_to_f32(h);
        } else {
            float s;
            std::memcpy(&s, in + n + 4 * (i / 16), 4);
            y[i] = e4m3_to_f32(in[i]) * s;
        }
    }
}

namespace {

void check_mla(const LatentKvView& kv, int64_t lora, int64_t rope) {
    DSI_CHECK(lora >= 1 && rope >= 0 && lora + rope <= 1024);
    DSI_CHECK(kv.row_stride >= kv_row_words(kv.dtype, lora + rope));
    if (kv.dtype == KvDtype::kE4m3) DSI_CHECK(lora % 16 == 0 && rope % 16 == 0);
}

}  // namespace

void mla_attention(Isa isa, const LatentKvView& kv, int64_t num_positions, int64_t lora,
                   int64_t rope, float scale, const MlaHeads& heads) {
    MlaTokens t;
    t.num_tokens = 1;
    t.num_positions = &num_positions;
    t.num_heads = heads.num_heads;
    t.q_lat = heads.q_lat;
    t.q_pe = heads.q_pe;
    t.q_pe_stride = heads.q_pe_stride;
    t.o_lat = heads.o_lat;
    mla_attention_tokens(isa, kv, lora, rope, scale, t);
}

void mla_attention_tokens(Isa isa, const LatentKvView& kv, int64_t lora, int64_t rope,
                          float scale, const MlaTokens& tokens) {
    check_mla(kv, lora, rope);
    const internal::OpsTable& t = table(isa);
    constexpr int64_t kMaxQ = internal::kMaxQueriesPerCall;
    // Splits into calls of whole tokens (all heads, or head groups when one token has
    // more than kMaxQ heads); each query's result does not depend on the split.
    const int64_t heads_per_call = std::min(tokens.num_heads, kMaxQ);
    const int64_t tokens_per_call = std::max<int64_t>(1, kMaxQ / std::max<int64_t>(1, heads_per_call));
    for (int64_t t0 = 0; t0 < tokens.num_tokens; t0 += tokens_per_call) {
        for (int64_t h0 = 0; h0 < tokens.num_heads; h0 += heads_per_call) {
            internal::MlaArgs a;
            a.blocks = kv.blocks;
            a.row_stride = kv.row_stride;
            a.kv_dtype = static_cast<int32_t>(kv.dtype);
            a.lora = lora;
            a.rope = rope;
            a.scale = scale;
            a.num_tokens = std::min(tokens_per_call, tokens.num_tokens - t0);
            a.num_positions = tokens.num_positions + t0;
            for (int64_t i = 0; i < a.num_tokens; ++i) DSI_CHECK(a.num_positions[i] >= 1);
            a.num_heads = std::min(heads_per_call, tokens.num_heads - h0);
            a.q_lat = tokens.q_lat + t0 * tokens.q_lat_token_stride + h0 * lora;
            a.q_lat_token_stride = tokens.q_lat_token_stride;
            a.q_pe = tokens.q_pe + t0 * tokens.q_pe_token_stride + h0 * tokens.q_pe_stride;
            a.q_pe_token_stride = tokens.q_pe_token_stride;
            a.q_pe_stride = tokens.q_pe_stride;
            a.o_lat = tokens.o_lat + t0 * tokens.o_lat_token_stride + h0 * lora;
            a.o_lat_token_stride = tokens.o_lat_token_stride;
            t.mla(a);
        }
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

int64_t index_packed_heads(int64_t heads) { return (heads + 15) / 16 * 16; }

void index_pack_queries(const float* q, const float* w, int64_t heads, int64_t dim, float* qt,
                        float* wt) {
    const int64_t P = index_packed_heads(heads);
    for (int64_t i = 0; i < dim; ++i) {
        for (int64_t h = 0; h < P; ++h) qt[i * P + h] = h < heads ? q[h * dim + i] : 0.0f;
    }
    for (int64_t h = 0; h < P; ++h) wt[h] = h < heads ? w[h] : 0.0f;
}

void index_scores(Isa isa, const float* qt, const float* wt, int64_t P, int64_t dim,
                  const float* const* keys, int64_t n, float* out) {
    DSI_CHECK(P > 0 && P % 16 == 0 && dim >= 0 && n >= 0);
    table(isa).index_scores(qt, wt, P, dim, keys, n, out);
}

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

// Scalar reference of the attention kernel and the small ops: plain loops that
// spell out the reduction orders of ops_abi.h. The AVX2 / AVX-512 variants
// (ops_simd.inc) reproduce these bits exactly. No STL (see gemm_abi.h).
#include "kernels/internal/ops_abi.h"

namespace dsi::kernels::internal {
namespace {

constexpr int kLanes = 16;

inline float fma_ref(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

float dot_ref(const float* a, const float* b, int64_t n) {
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) acc[j] = fma_ref(a[i + j], b[i + j], acc[j]);
    }
    if (i < n) {
        for (int j = 0; j < kLanes; ++j) {
            acc[j] = i + j < n ? fma_ref(a[i + j], b[i + j], acc[j]) : fma_ref(0.0f, 0.0f, acc[j]);
        }
    }
    for (int w = kLanes / 2; w > 0; w /= 2) {
        for (int j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
    }
    return acc[0];
}

// exp with one fixed op sequence (Cephes-style range reduction, degree-6
// polynomial); inputs below -86 give 0, inputs above 88 are clamped to 88.
float exp_ref(float x) {
    const bool tiny = x < -86.0f;
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -86.0f ? -86.0f : xc;
    float t = xc * 1.44269504088896341f;
    t = t + 12582912.0f;
    const float n = t - 12582912.0f;
    float r = fma_ref(n, -0.693359375f, xc);
    r = fma_ref(n, 2.12194440e-4f, r);
    float p = 1.0f / 720.0f;
    p = fma_ref(p, r, 1.0f / 120.0f);
    p = fma_ref(p, r, 1.0f / 24.0f);
    p = fma_ref(p, r, 1.0f / 6.0f);
    p = fma_ref(p, r, 0.5f);
    p = fma_ref(p, r, 1.0f);
    p = fma_ref(p, r, 1.0f);
    uint32_t bits;
    __builtin_memcpy(&bits, &p, 4);
    bits += static_cast<uint32_t>(static_cast<int32_t>(n)) << 23;
    if (tiny) bits = 0;
    float out;
    __builtin_memcpy(&out, &bits, 4);
    return out;
}

// Value j of a cached row of n values, as a float (ops_abi.h: KV dtypes).
float kv_value(const MlaArgs& a, const unsigned char* row, int64_t n, int64_t j) {
    if (a.kv_dtype == kKvBf16) {
        uint16_t h;
        __builtin_memcpy(&h, row + 2 * j, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        float f;
        __builtin_memcpy(&f, &bits, 4);
        return f;
    }
    if (a.kv_dtype == kKvE4m3) {
        const uint32_t code = row[j];
        const uint32_t em = code & 0x7fu;
        float f;
        if (em < 8) {
            f = static_cast<float>(em) * 0x1.0p-9f;  // subnormal: m * 2^-9
        } else {
            const uint32_t bits = (em << 20) + (120u << 23);
            __builtin_memcpy(&f, &bits, 4);
        }
        if (code & 0x80u) f = -f;
        float s;
        __builtin_memcpy(&s, row + n + 4 * (j / 16), 4);
        return f * s;
    }
    float f;
    __builtin_memcpy(&f, row + 4 * j, 4);
    return f;
}

// One query (token t, head h), spelled out as ops_abi.h states it.
void mla_query_ref(const MlaArgs& a, int64_t t, int64_t h) {
    const int64_t n = a.lora + a.rope;
    const int64_t num_positions = a.num_positions[t];
    const float* q_lat = a.q_lat + t * a.q_lat_token_stride + h * a.lora;
    const float* q_pe = a.q_pe + t * a.q_pe_token_stride + h * a.q_pe_stride;
    float* o = a.o_lat + t * a.o_lat_token_stride + h * a.lora;
    float c[1024];  // one dequantised row (lora + rope <= 1024, checked by the driver)
    float sc[kKvBlockTokens];
    float m = -__builtin_inff();
    float l = 0.0f;
    for (int64_t k = 0; k < a.lora; ++k) o[k] = 0.0f;
    for (int64_t b0 = 0; b0 < num_positions; b0 += kKvBlockTokens) {
        const int64_t left = num_positions - b0;
        const int64_t cnt = left < kKvBlockTokens ? left : kKvBlockTokens;
        const unsigned char* base =
            reinterpret_cast<const unsigned char*>(a.blocks[b0 / kKvBlockTokens]);
        const int64_t stride_bytes = a.row_stride * 4;
        for (int64_t i = 0; i < cnt; ++i) {
            const unsigned char* row = base + i * stride_bytes;
            for (int64_t j = 0; j < n; ++j) c[j] = kv_value(a, row, n, j);
            const float s = dot_ref(q_lat, c, a.lora) + dot_ref(q_pe, c + a.lora, a.rope);
            sc[i] = s * a.scale;
        }
        float mb = sc[0];
        for (int64_t i = 1; i < cnt; ++i) mb = sc[i] > mb ? sc[i] : mb;
        const float mn = mb > m ? mb : m;
        const float alpha = exp_ref(m - mn);
        l = l * alpha;
        for (int64_t k = 0; k < a.lora; ++k) o[k] = o[k] * alpha;
        m = mn;
        for (int64_t i = 0; i < cnt; ++i) {
            sc[i] = exp_ref(sc[i] - mn);
            l = l + sc[i];
        }
        for (int64_t i = 0; i < cnt; ++i) {
            const unsigned char* row = base + i * stride_bytes;
            for (int64_t k = 0; k < a.lora; ++k) o[k] = fma_ref(sc[i], kv_value(a, row, n, k), o[k]);
        }
    }
    const float inv = 1.0f / l;
    for (int64_t k = 0; k < a.lora; ++k) o[k] = o[k] * inv;
}

void mla_ref(const MlaArgs& a) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
        for (int64_t h = 0; h < a.num_heads; ++h) mla_query_ref(a, t, h);
    }
}

void rms_norm_ref(const float* x, const float* w, int64_t n, float eps, float* y) {
    const float ss = dot_ref(x, x, n);
    const float inv = 1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * inv) * w[i];
}

void rope_ref(float* v, int64_t num_vecs, int64_t stride, const float* cc, const float* ss,
              int64_t pairs) {
    for (int64_t r = 0; r < num_vecs; ++r) {
        float* x = v + r * stride;
        for (int64_t i = 0; i < pairs; ++i) {
            const float a = x[2 * i];
            const float b = x[2 * i + 1];
            x[2 * i] = a * cc[2 * i] + b * ss[2 * i];
            x[2 * i + 1] = b * cc[2 * i + 1] + a * ss[2 * i + 1];
        }
    }
}

void silu_mul_ref(const float* g, const float* u, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + exp_ref(-g[i])) * u[i];
}

void softmax_ref(float* x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    float acc[kLanes] = {};
    for (int64_t i = 0; i < n; ++i) {
        x[i] = exp_ref(x[i] - mx);
        acc[i % kLanes] = acc[i % kLanes] + x[i];
    }
    for (int w = kLanes / 2; w > 0; w /= 2) {
        for (int j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
    }
    const float inv = 1.0f / acc[0];
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv;
}

int64_t argmax_ref(const float* x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

void exp_n_ref(const float* x, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = exp_ref(x[i]);
}

void index_scores_ref(const float* qt, const float* wt, int64_t P, int64_t dim,
                      const float* const* keys, int64_t n, float* out) {
    for (int64_t k = 0; k < n; ++k) {
        const float* key = keys[k];
        float s[kLanes] = {};
        for (int64_t g = 0; g < P / kLanes; ++g) {
            for (int j = 0; j < kLanes; ++j) {
                const int64_t h = g * kLanes + j;
                float a = 0.0f;
                for (int64_t i = 0; i < dim; ++i) a = fma_ref(qt[i * P + h], key[i], a);
                const float r = (a > 0.0f ? a : 0.0f) * wt[h];
                s[j] = s[j] + r;
            }
        }
        for (int w = kLanes / 2; w > 0; w /= 2) {
            for (int j = 0; j < w; ++j) s[j] = s[j] + s[j + w];
        }
        out[k] = s[0];
    }
}

}  // namespace

const OpsTable kOpsScalar = {mla_ref,     dot_ref,    rms_norm_ref, rope_ref,        silu_mul_ref,
                             softmax_ref, argmax_ref, exp_n_ref,    index_scores_ref};

}  // namespace dsi::kernels::internal

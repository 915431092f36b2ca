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

void mla_ref(const MlaArgs& a) {
    float sc[kMaxHeadsPerCall][kKvBlockTokens];
    float m[kMaxHeadsPerCall];
    float l[kMaxHeadsPerCall];
    for (int64_t h = 0; h < a.num_heads; ++h) {
        m[h] = -__builtin_inff();
        l[h] = 0.0f;
        for (int64_t k = 0; k < a.lora; ++k) a.o_lat[h * a.lora + k] = 0.0f;
    }
    for (int64_t b0 = 0; b0 < a.num_positions; b0 += kKvBlockTokens) {
        const int64_t left = a.num_positions - b0;
        const int64_t cnt = left < kKvBlockTokens ? left : kKvBlockTokens;
        const float* base = a.blocks[b0 / kKvBlockTokens];
        for (int64_t i = 0; i < cnt; ++i) {
            const float* row = base + i * a.row_stride;
            for (int64_t h = 0; h < a.num_heads; ++h) {
                const float s = dot_ref(a.q_lat + h * a.lora, row, a.lora) +
                                dot_ref(a.q_pe + h * a.q_pe_stride, row + a.lora, a.rope);
                sc[h][i] = s * a.scale;
            }
        }
        for (int64_t h = 0; h < a.num_heads; ++h) {
            float mb = sc[h][0];
            for (int64_t i = 1; i < cnt; ++i) mb = sc[h][i] > mb ? sc[h][i] : mb;
            const float mn = mb > m[h] ? mb : m[h];
            const float alpha = exp_ref(m[h] - mn);
            l[h] = l[h] * alpha;
            float* o = a.o_lat + h * a.lora;
            for (int64_t k = 0; k < a.lora; ++k) o[k] = o[k] * alpha;
            m[h] = mn;
            for (int64_t i = 0; i < cnt; ++i) {
                sc[h][i] = exp_ref(sc[h][i] - mn);
                l[h] = l[h] + sc[h][i];
            }
        }
        for (int64_t i = 0; i < cnt; ++i) {
            const float* row = base + i * a.row_stride;
            for (int64_t h = 0; h < a.num_heads; ++h) {
                const float p = sc[h][i];
                float* o = a.o_lat + h * a.lora;
                for (int64_t k = 0; k < a.lora; ++k) o[k] = fma_ref(p, row[k], o[k]);
            }
        }
    }
    for (int64_t h = 0; h < a.num_heads; ++h) {
        const float inv = 1.0f / l[h];
        float* o = a.o_lat + h * a.lora;
        for (int64_t k = 0; k < a.lora; ++k) o[k] = o[k] * inv;
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

}  // namespace

const OpsTable kOpsScalar = {mla_ref,     dot_ref,    rms_norm_ref, rope_ref,
                             silu_mul_ref, softmax_ref, argmax_ref,  exp_n_ref};

}  // namespace dsi::kernels::internal

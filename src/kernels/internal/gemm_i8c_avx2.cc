// AVX2 variant of the i8c GEMM and activation quantiser (gemm_i8c.h). Compiled with
// -mavx2 -mfma -mf16c: no STL here (gemm_abi.h). A 16-row group is two 8-lane halves;
// without VNNI the weights are unbiased to int8 and multiplied with the sign trick
// (|w| * sign(x, w)), so pmaddubsw cannot saturate (|w|, |x| <= 127). The int32 sums are
// exact over all of K, so the bits are gemm_i8c_scalar.cc's.
#include <immintrin.h>

#include <cstring>

#include "kernels/internal/gemm_i8c.h"

namespace dsi::kernels::internal {
namespace {

// One group x MT tokens over all of K.
template <int MT>
void tile(const PackedView& w, const I8cActs& xa, int64_t g, int64_t t0, float* y) {
    const int64_t kp = w.padded_cols;
    const int64_t nq = kp / 4;
    const uint8_t* grp = w.data + g * w.group_bytes;
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* qx[MT];
    for (int t = 0; t < MT; ++t)
        qx[t] = xa.q + (t0 + t) * kp;
    __m256i acc[2][MT];
    for (int t = 0; t < MT; ++t)
        acc[0][t] = acc[1][t] = _mm256_setzero_si256();
    for (int64_t q = 0; q < nq; ++q) {
        __m256i ws[2], aw[2];
        for (int h = 0; h < 2; ++h) {
            ws[h] = _mm256_xor_si256(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + q * 64 + h * 32)),
                bias);
            aw[h] = _mm256_abs_epi8(ws[h]);
        }
        for (int t = 0; t < MT; ++t) {
            const __m256i xv = _mm256_set1_epi32(load_i32(qx[t] + q * 4));
            for (int h = 0; h < 2; ++h) {
                const __m256i p16 = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xv, ws[h]));
                acc[h][t] = _mm256_add_epi32(acc[h][t], _mm256_madd_epi16(p16, ones));
            }
        }
    }
    for (int h = 0; h < 2; ++h) {
        const int64_t r0 = g * kGroupRows + h * 8;
        const int64_t left = w.rows - r0;
        if (left <= 0)
            break;
        const __m256 dw = _mm256_loadu_ps(w.scales + r0);
        for (int t = 0; t < MT; ++t) {
            const int64_t tt = t0 + t;
            // The sign trick multiplies the unbiased weights: acc is isum itself.
            const __m256 f = _mm256_cvtepi32_ps(acc[h][t]);
            const __m256 v = _mm256_mul_ps(f, _mm256_mul_ps(_mm256_set1_ps(xa.d[tt]), dw));
            float* dst = y + tt * w.rows + r0;
            if (left >= 8) {
                _mm256_storeu_ps(dst, v);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, v);
                for (int64_t i = 0; i < left; ++i)
                    dst[i] = tmp[i];
            }
        }
    }
}

inline int quantize_one(float x, float id) {
    return _mm_cvtss_si32(_mm_set_ss(x * id));  // round to nearest even, as nearbyint
}

}  // namespace

void gemm_i8c_avx2(const PackedView& w, const I8cActs& xa, int64_t m, float* y, int64_t g_begin,
                   int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
        int64_t t = 0;
        for (; t + 4 <= m; t += 4)
            tile<4>(w, xa, g, t, y);
        switch (m - t) {
            case 0:
                break;
            case 1:
                tile<1>(w, xa, g, t, y);
                break;
            case 2:
                tile<2>(w, xa, g, t, y);
                break;
            default:
                tile<3>(w, xa, g, t, y);
                break;
        }
    }
}

void quantize_i8c_avx2(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                       int32_t* s128) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= k; j += 8)
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float amax = 0.0f;
    for (float v : lanes)
        amax = amax > v ? amax : v;
    for (; j < k; ++j) {
        const float a = x[j] < 0.0f ? -x[j] : x[j];
        amax = amax > a ? amax : a;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i vsum = _mm256_setzero_si256();
    for (j = 0; j + 8 <= k; j += 8) {
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vid));
        vsum = _mm256_add_epi32(vsum, v);
        const __m256i p16 = _mm256_packs_epi32(v, v);     // per lane: v0..3 v0..3 (i16)
        const __m256i p8 = _mm256_packs_epi16(p16, p16);  // per lane: v0..3 x 4 (i8)
        const int32_t lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(p8));
        const int32_t hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1));
        std::memcpy(q + j, &lo, 4);
        std::memcpy(q + j + 4, &hi, 4);
    }
    int32_t sums[8];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums), vsum);
    int32_t sum = 0;
    for (int32_t v : sums)
        sum = wrap_add(sum, v);
    for (; j < k; ++j) {
        const int v = quantize_one(x[j], id);
        q[j] = static_cast<int8_t>(v);
        sum = wrap_add(sum, v);
    }
    for (; j < padded_cols; ++j)
        q[j] = 0;
    *d = amax / 127.0f;
    *s128 = wrap_times128(sum);
}

}  // namespace dsi::kernels::internal

// AVX2 + FMA + F16C (x86-64-v3) MXFP4 matmul. Compiled with -mavx2 -mfma
// -mf16c: no STL here (see gemm_abi.h). A 16-row group is two 8-row halves.
// Codes become biased bytes (v + 12, 0..24) through one vpshufb table;
// pmaddubsw (unsigned weights x signed activations, |pair| <= 2*24*127: no
// saturation) and pmaddwd give the exact block sum plus 12 * sum(q), which is
// subtracted: bitwise the result of gemm_mxfp4_scalar.cc.
#include <immintrin.h>

#include "kernels/internal/gemm_mxfp4.h"

namespace dsi::kernels::internal {
namespace {

// Row scales 2^(e - 128) of rows [8h, 8h + 8) of one block.
inline __m256 block_scales(const uint8_t* blk, int h) {
    const __m256i e =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * h)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

inline void store_half(const PackedView& w, int64_t g, int h, int64_t t, __m256 acc, float* y) {
    const int64_t r0 = g * kGroupRows + h * 8;
    const int64_t left = w.rows - r0;
    if (left <= 0)
        return;
    float* dst = y + t * w.rows + r0;
    if (left >= 8) {
        _mm256_storeu_ps(dst, acc);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, acc);
        for (int64_t i = 0; i < left; ++i)
            dst[i] = tmp[i];
    }
}

// NR groups x MT tokens, all of K.
template <int NR, int MT>
void tile(const PackedView& w, const Q8Acts& xq, int64_t g0, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const int64_t nb = K / kMxfp4Block;
    const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4,
                                           0, 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6,
                                           4, 0);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    __m256 acc[NR][2][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][0][t] = acc[g][1][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t boff = b * kMxfp4BlockBytes;
        __m256i ia[NR][2][MT];
        for (int g = 0; g < NR; ++g) {
            for (int t = 0; t < MT; ++t)
                ia[g][0][t] = ia[g][1][t] = _mm256_setzero_si256();
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            __m256i xlo[MT], xhi[MT];
            for (int t = 0; t < MT; ++t) {
                const int8_t* q = xq.q + (t0 + t) * K + b * kMxfp4Block + c * 8;
                xlo[t] = _mm256_set1_epi32(load_i32(q));
                xhi[t] = _mm256_set1_epi32(load_i32(q + 4));
            }
            for (int g = 0; g < NR; ++g) {
                for (int h = 0; h < 2; ++h) {
                    const __m256i v = _mm256_loadu_si256(
                        reinterpret_cast<const __m256i*>(grp[g] + boff + 16 + c * 64 + h * 32));
                    const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
                    const __m256i hi = _mm256_shuffle_epi8(
                        table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
                    for (int t = 0; t < MT; ++t) {
                        // Both halves of the chunk in int16: |sum| <= 4*24*127 < 2^15.
                        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[t]),
                                                           _mm256_maddubs_epi16(hi, xhi[t]));
                        ia[g][h][t] = _mm256_add_epi32(ia[g][h][t], _mm256_madd_epi16(p, ones));
                    }
                }
            }
        }
        for (int g = 0; g < NR; ++g) {
            for (int h = 0; h < 2; ++h) {
                const __m256 dw = block_scales(grp[g] + boff, h);
                for (int t = 0; t < MT; ++t) {
                    const int64_t xb = (t0 + t) * nb + b;
                    const __m256i bias = _mm256_set1_epi32((xq.s128[xb] >> 7) * kMxfp4Bias);
                    const __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(ia[g][h][t], bias));
                    const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xq.d[xb]));
                    acc[g][h][t] = _mm256_fmadd_ps(f, d, acc[g][h][t]);
                }
            }
        }
    }
    for (int g = 0; g < NR; ++g) {
        for (int h = 0; h < 2; ++h) {
            for (int t = 0; t < MT; ++t)
                store_half(w, g0 + g, h, t0 + t, acc[g][h][t], y);
        }
    }
}

}  // namespace

void gemm_mxfp4_avx2(const PackedView& w, const float* /*x*/, const Q8Acts& xq, int64_t m,
                     float* y, int64_t g_begin, int64_t g_end) {
    int64_t g = g_begin;
    if (m == 1) {
        for (; g + 2 <= g_end; g += 2)
            tile<2, 1>(w, xq, g, 0, y);
        for (; g < g_end; ++g)
            tile<1, 1>(w, xq, g, 0, y);
        return;
    }
    for (; g < g_end; ++g) {
        int64_t t = 0;
        for (; t + 2 <= m; t += 2)
            tile<1, 2>(w, xq, g, t, y);
        for (; t < m; ++t)
            tile<1, 1>(w, xq, g, t, y);
    }
}

}  // namespace dsi::kernels::internal

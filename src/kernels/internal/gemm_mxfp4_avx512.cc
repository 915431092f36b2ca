// AVX-512 (F/BW/VL/DQ + VNNI) MXFP4 matmul. Compiled with -mavx512* flags: no
// STL here (see gemm_abi.h). Codes become biased bytes (v + 12, 0..24) through
// one vpshufb table, vpdpbusd multiplies them with the Q8_0 activations, and
// 12 * sum(q) is subtracted: the exact integer block sum of gemm_mxfp4.h, so
// the result is bitwise that of gemm_mxfp4_scalar.cc.
#include <immintrin.h>

#include "kernels/internal/gemm_mxfp4.h"

namespace dsi::kernels::internal {
namespace {

// Code -> kMxfp4Values[code] + kMxfp4Bias, in every 128-bit lane.
inline __m512i biased_table() {
    const __m128i t = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return _mm512_broadcast_i32x4(t);
}

// The 16 row scales 2^(e - 128) of one block (mxfp4_scale, vectorised).
inline __m512 block_scales(const uint8_t* blk) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 is_tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_tiny, normal, tiny));
}

inline void store_rows(const PackedView& w, int64_t g, int64_t t, __m512 acc, float* y) {
    const int64_t r0 = g * kGroupRows;
    float* dst = y + t * w.rows + r0;
    const int64_t left = w.rows - r0;
    if (left >= kGroupRows) {
        _mm512_storeu_ps(dst, acc);
    } else {
        _mm512_mask_storeu_ps(dst, static_cast<__mmask16>((1u << left) - 1), acc);
    }
}

// Software prefetch distance of the GEMV path, in blocks (measured: bench kernels).
constexpr int64_t kPrefetchBlocks = 8;

// NR groups x MT tokens, all of K.
template <int NR, int MT>
void tile(const PackedView& w, const Q8Acts& xq, int64_t g0, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const int64_t nb = K / kMxfp4Block;
    const __m512i table = biased_table();
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    __m512 acc[NR][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        const int64_t boff = b * kMxfp4BlockBytes;
        __m512i ia[NR][MT];
        for (int g = 0; g < NR; ++g) {
            for (int t = 0; t < MT; ++t)
                ia[g][t] = _mm512_setzero_si512();
        }
        if (MT == 1) {
            // GEMV streams NR weight strips at once: fetch each kPrefetchBlocks blocks
            // ahead so the decode below overlaps the memory latency (one block = 272 B).
            for (int g = 0; g < NR; ++g) {
                const uint8_t* ahead = grp[g] + boff + kPrefetchBlocks * kMxfp4BlockBytes;
                for (int64_t l = 0; l < kMxfp4BlockBytes; l += 64)
                    _mm_prefetch(reinterpret_cast<const char*>(ahead + l), _MM_HINT_T0);
            }
        }
        for (int c = 0; c < 4; ++c) {
            __m512i lo[NR], hi[NR];
            for (int g = 0; g < NR; ++g) {
                const __m512i v = _mm512_loadu_si512(grp[g] + boff + 16 + c * 64);
                lo[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(v, low4));
                hi[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
            }
            for (int t = 0; t < MT; ++t) {
                const int8_t* q = xq.q + (t0 + t) * K + b * kMxfp4Block + c * 8;
                const __m512i xlo = _mm512_set1_epi32(load_i32(q));
                const __m512i xhi = _mm512_set1_epi32(load_i32(q + 4));
                for (int g = 0; g < NR; ++g) {
                    ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], lo[g], xlo);
                    ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], hi[g], xhi);
                }
            }
        }
        for (int g = 0; g < NR; ++g) {
            const __m512 dw = block_scales(grp[g] + boff);
            for (int t = 0; t < MT; ++t) {
                const int64_t xb = (t0 + t) * nb + b;
                // s128 = 128 * sum(q): the bias contributes 12 * sum(q).
                const __m512i bias = _mm512_set1_epi32((xq.s128[xb] >> 7) * kMxfp4Bias);
                const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(ia[g][t], bias));
                const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(xq.d[xb]));
                acc[g][t] = _mm512_fmadd_ps(f, d, acc[g][t]);
            }
        }
    }
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            store_rows(w, g0 + g, t0 + t, acc[g][t], y);
    }
}

template <int NR, int MT>
void run_tokens(const PackedView& w, const Q8Acts& xq, int64_t m, float* y, int64_t g) {
    int64_t t = 0;
    for (; t + MT <= m; t += MT)
        tile<NR, MT>(w, xq, g, t, y);
    switch (m - t) {
        case 0:
            break;
        case 1:
            tile<NR, 1>(w, xq, g, t, y);
            break;
        case 2:
            tile<NR, 2>(w, xq, g, t, y);
            break;
        default:
            tile<NR, 3>(w, xq, g, t, y);
            break;
    }
}

}  // namespace

void gemm_mxfp4_avx512(const PackedView& w, const float* /*x*/, const Q8Acts& xq, int64_t m,
                       float* y, int64_t g_begin, int64_t g_end) {
    int64_t g = g_begin;
    if (m == 1) {
        // GEMV: 4 groups give 4 independent dpbusd chains.
        for (; g + 4 <= g_end; g += 4)
            tile<4, 1>(w, xq, g, 0, y);
        for (; g < g_end; ++g)
            tile<1, 1>(w, xq, g, 0, y);
        return;
    }
    for (; g + 2 <= g_end; g += 2)
        run_tokens<2, 4>(w, xq, m, y, g);
    for (; g < g_end; ++g)
        run_tokens<1, 4>(w, xq, m, y, g);
}

}  // namespace dsi::kernels::internal

// AVX-512 (F/BW/VL/DQ + VNNI) variants of the packed matmul. Compiled with
// -mavx512* flags: no STL here (see gemm_abi.h). Reproduces gemm_scalar.cc bit
// for bit: same per-element accumulation order, fma everywhere the reference
// uses fma.
#include <immintrin.h>

#include "kernels/internal/gemm_abi.h"

namespace dsi::kernels::internal {
namespace {

// Loads element k of the 16 rows of a group as f32 (e4m3 comes back divided by
// 256; the caller's scale carries the 256).
template <PackFormat F>
inline __m512 load16(const uint8_t* group, int64_t k) {
    if constexpr (F == PackFormat::kF32) {
        return _mm512_loadu_ps(group + k * 64);
    } else if constexpr (F == PackFormat::kBF16) {
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + k * 32));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else if constexpr (F == PackFormat::kF16) {
        __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + k * 32));
        return _mm512_cvtph_ps(h);
    } else {
        // e4m3 s.eeee.mmm -> f16 s.0eeee.mmm0000000 = value / 2^8 (exact,
        // subnormals too).
        __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + k * 16));
        __m256i v = _mm256_cvtepu8_epi16(b);
        __m256i mag = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7);
        __m256i sign = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8);
        return _mm512_cvtph_ps(_mm256_or_si256(mag, sign));
    }
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

// NR groups x MT tokens, all of K.
template <PackFormat F, int NR, int MT>
void tile_float(const PackedView& w, const float* x, int64_t g0, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    const float* xt[MT];
    for (int t = 0; t < MT; ++t)
        xt[t] = x + (t0 + t) * K;
    __m512 acc[NR][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][t] = _mm512_setzero_ps();
    }
    constexpr bool kScaled = F == PackFormat::kE4M3;
    const int64_t block = kScaled ? w.scale_block_cols : K;
    for (int64_t kb = 0; kb < K; kb += block) {
        const int64_t kend = kb + block < K ? kb + block : K;
        __m512 scale[NR];
        if constexpr (kScaled) {
            for (int g = 0; g < NR; ++g) {
                const float s = w.scales[(g0 + g) * w.scale_blocks + kb / block] * 256.0f;
                scale[g] = _mm512_set1_ps(s);
            }
        }
        for (int64_t k = kb; k < kend; ++k) {
            __m512 wv[NR];
            for (int g = 0; g < NR; ++g) {
                wv[g] = load16<F>(grp[g], k);
                if constexpr (kScaled)
                    wv[g] = _mm512_mul_ps(wv[g], scale[g]);
            }
            for (int t = 0; t < MT; ++t) {
                const __m512 xv = _mm512_set1_ps(xt[t][k]);
                for (int g = 0; g < NR; ++g)
                    acc[g][t] = _mm512_fmadd_ps(wv[g], xv, acc[g][t]);
            }
        }
    }
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            store_rows(w, g0 + g, t0 + t, acc[g][t], y);
    }
}

template <int NR, int MT>
void tile_q8(const PackedView& w, const Q8Acts& xq, int64_t g0, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const int64_t nb = K / kQ8Block;
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    __m512 acc[NR][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; ++b) {
        // Start at -128·Σx: dpbusd adds Σ(w + 128)·x, so ia ends at the exact block sum
        // isum_b (the same integer the reference's `isum − s128` gives).
        __m512i ia[NR][MT];
        for (int g = 0; g < NR; ++g) {
            for (int t = 0; t < MT; ++t)
                ia[g][t] = _mm512_set1_epi32(xq.neg_s128[(t0 + t) * nb + b]);
        }
        const int64_t boff = b * kQ8BlockBytes;
        for (int qd = 0; qd < kQ8Block / 4; ++qd) {
            __m512i wv[NR];
            for (int g = 0; g < NR; ++g) {
                wv[g] = _mm512_loadu_si512(grp[g] + boff + 32 + qd * 64);
            }
            for (int t = 0; t < MT; ++t) {
                const __m512i xv =
                    _mm512_set1_epi32(load_i32(xq.q + (t0 + t) * K + b * kQ8Block + qd * 4));
                for (int g = 0; g < NR; ++g)
                    ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
            }
        }
        for (int g = 0; g < NR; ++g) {
            const __m512 dw = _mm512_cvtph_ps(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[g] + boff)));
            for (int t = 0; t < MT; ++t) {
                const int64_t xb = (t0 + t) * nb + b;
                const __m512 f = _mm512_cvtepi32_ps(ia[g][t]);
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

template <PackFormat F, int NR, int MT>
void run_float_tokens(const PackedView& w, const float* x, int64_t m, float* y, int64_t g) {
    int64_t t = 0;
    for (; t + MT <= m; t += MT)
        tile_float<F, NR, MT>(w, x, g, t, y);
    switch (m - t) {
        case 0:
            break;
        case 1:
            tile_float<F, NR, 1>(w, x, g, t, y);
            break;
        case 2:
            tile_float<F, NR, 2>(w, x, g, t, y);
            break;
        case 3:
            tile_float<F, NR, 3>(w, x, g, t, y);
            break;
        case 4:
            tile_float<F, NR, 4>(w, x, g, t, y);
            break;
        default:
            tile_float<F, NR, 5>(w, x, g, t, y);
            break;
    }
}

template <int NR, int MT>
void run_q8_tokens(const PackedView& w, const Q8Acts& xq, int64_t m, float* y, int64_t g) {
    int64_t t = 0;
    for (; t + MT <= m; t += MT)
        tile_q8<NR, MT>(w, xq, g, t, y);
    switch (m - t) {
        case 0:
            break;
        case 1:
            tile_q8<NR, 1>(w, xq, g, t, y);
            break;
        case 2:
            tile_q8<NR, 2>(w, xq, g, t, y);
            break;
        case 3:
            tile_q8<NR, 3>(w, xq, g, t, y);
            break;
        case 4:
            tile_q8<NR, 4>(w, xq, g, t, y);
            break;
        default:
            tile_q8<NR, 5>(w, xq, g, t, y);
            break;
    }
}

template <PackFormat F>
void gemm_float(const PackedView& w, const float* x, int64_t m, float* y, int64_t g_begin,
                int64_t g_end) {
    if (m == 1) {
        // GEMV: 8 independent accumulator chains hide the fma latency.
        int64_t g = g_begin;
        for (; g + 8 <= g_end; g += 8)
            tile_float<F, 8, 1>(w, x, g, 0, y);
        for (; g < g_end; ++g)
            tile_float<F, 1, 1>(w, x, g, 0, y);
        return;
    }
    int64_t g = g_begin;
    for (; g + 4 <= g_end; g += 4)
        run_float_tokens<F, 4, 6>(w, x, m, y, g);
    for (; g < g_end; ++g)
        run_float_tokens<F, 1, 6>(w, x, m, y, g);
}

void gemm_q8(const PackedView& w, const Q8Acts& xq, int64_t m, float* y, int64_t g_begin,
             int64_t g_end) {
    if (m == 1) {
        int64_t g = g_begin;
        for (; g + 4 <= g_end; g += 4)
            tile_q8<4, 1>(w, xq, g, 0, y);
        for (; g < g_end; ++g)
            tile_q8<1, 1>(w, xq, g, 0, y);
        return;
    }
    int64_t g = g_begin;
    for (; g + 2 <= g_end; g += 2)
        run_q8_tokens<2, 6>(w, xq, m, y, g);
    for (; g < g_end; ++g)
        run_q8_tokens<1, 6>(w, xq, m, y, g);
}

}  // namespace

void gemm_avx512(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
                 int64_t g_begin, int64_t g_end) {
    switch (w.format) {
        case PackFormat::kF32:
            gemm_float<PackFormat::kF32>(w, x, m, y, g_begin, g_end);
            break;
        case PackFormat::kBF16:
            gemm_float<PackFormat::kBF16>(w, x, m, y, g_begin, g_end);
            break;
        case PackFormat::kF16:
            gemm_float<PackFormat::kF16>(w, x, m, y, g_begin, g_end);
            break;
        case PackFormat::kE4M3:
            gemm_float<PackFormat::kE4M3>(w, x, m, y, g_begin, g_end);
            break;
        case PackFormat::kQ8:
            gemm_q8(w, xq, m, y, g_begin, g_end);
            break;
        case PackFormat::kMXFP4:  // gemm_mxfp4_*.cc; matmul.cc never sends it here
        case PackFormat::kI8C:    // gemm_i8c_*.cc, likewise
            break;
    }
}

void q8_block_amax_avx512(const float* x, int64_t nb, float* amax) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 v0 = _mm512_and_ps(_mm512_loadu_ps(x + b * kQ8Block), abs_mask);
        const __m512 v1 = _mm512_and_ps(_mm512_loadu_ps(x + b * kQ8Block + 16), abs_mask);
        amax[b] = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
    }
}

void q8_quantize_blocks_avx512(const float* x, int64_t nb, const float* id, int8_t* q,
                               int32_t* s128) {
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 vid = _mm512_set1_ps(id[b]);
        // Round to nearest even (MXCSR default), as the reference's nearbyint.
        const __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * kQ8Block), vid));
        const __m512i c1 =
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + b * kQ8Block + 16), vid));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8Block), _mm512_cvtepi32_epi8(c0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8Block + 16),
                         _mm512_cvtepi32_epi8(c1));
        // Vector adds wrap like wrap_add, and a sum mod 2^32 does not depend on order.
        const __m512i s16 = _mm512_add_epi32(c0, c1);
        const __m256i s8 =
            _mm256_add_epi32(_mm512_castsi512_si256(s16), _mm512_extracti64x4_epi64(s16, 1));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        s128[b] = wrap_times128(_mm_cvtsi128_si32(h));
    }
}

void q8_scales_avx512(float* amax_id, int64_t nb, float* d) {
    const __m512 k127 = _mm512_set1_ps(127.0f);
    for (int64_t b = 0; b < nb; b += 16) {
        const __mmask16 live = nb - b >= 16 ? static_cast<__mmask16>(0xffff)
                                            : static_cast<__mmask16>((1u << (nb - b)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(live, amax_id + b);
        const __m256i h = _mm512_cvtps_ph(_mm512_div_ps(a, k127), _MM_FROUND_TO_NEAREST_INT);
        _mm512_mask_storeu_ps(d + b, live, _mm512_cvtph_ps(h));
        // `amax != 0` in the reference is true for NaN too (unordered compare).
        const __mmask16 nonzero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_mask_storeu_ps(amax_id + b, live, _mm512_maskz_div_ps(nonzero, k127, a));
    }
}

float sum_avx512(const float* x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    float tmp[16];
    _mm512_storeu_ps(tmp, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    float s = 0;
    for (float v : tmp)
        s += v;
    for (; i < n; ++i)
        s += x[i];
    return s;
}

}  // namespace dsi::kernels::internal

// AVX2 + FMA + F16C (x86-64-v3) variants of the packed matmul. Compiled with
// -mavx2 -mfma -mf16c: no STL here (see gemm_abi.h). A 16-row group is two
// 8-lane halves; results are bitwise equal to gemm_scalar.cc.
#include <immintrin.h>

#include "kernels/internal/gemm_abi.h"

namespace dsi::kernels::internal {
namespace {

// Element k of rows [8h, 8h + 8) of a group as f32 (e4m3 divided by 256).
template <PackFormat F>
inline __m256 load8(const uint8_t* group, int64_t k, int h) {
    const int64_t idx = k * kGroupRows + h * 8;
    if constexpr (F == PackFormat::kF32) {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(group) + idx);
    } else if constexpr (F == PackFormat::kBF16) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + idx * 2));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    } else if constexpr (F == PackFormat::kF16) {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + idx * 2));
        return _mm256_cvtph_ps(v);
    } else {
        __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(group + idx));
        __m128i v = _mm_cvtepu8_epi16(b);
        __m128i mag = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7);
        __m128i sign = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8);
        return _mm256_cvtph_ps(_mm_or_si128(mag, sign));
    }
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

template <PackFormat F, int NR, int MT>
void tile_float(const PackedView& w, const float* x, int64_t g0, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    const float* xt[MT];
    for (int t = 0; t < MT; ++t)
        xt[t] = x + (t0 + t) * K;
    __m256 acc[NR][2][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][0][t] = acc[g][1][t] = _mm256_setzero_ps();
    }
    constexpr bool kScaled = F == PackFormat::kE4M3;
    const int64_t block = kScaled ? w.scale_block_cols : K;
    for (int64_t kb = 0; kb < K; kb += block) {
        const int64_t kend = kb + block < K ? kb + block : K;
        __m256 scale[NR];
        if constexpr (kScaled) {
            for (int g = 0; g < NR; ++g) {
                scale[g] =
                    _mm256_set1_ps(w.scales[(g0 + g) * w.scale_blocks + kb / block] * 256.0f);
            }
        }
        for (int64_t k = kb; k < kend; ++k) {
            __m256 wv[NR][2];
#pragma GCC unroll 8
            for (int g = 0; g < NR; ++g) {
                for (int h = 0; h < 2; ++h) {
                    wv[g][h] = load8<F>(grp[g], k, h);
                    if constexpr (kScaled)
                        wv[g][h] = _mm256_mul_ps(wv[g][h], scale[g]);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < MT; ++t) {
                const __m256 xv = _mm256_broadcast_ss(xt[t] + k);
                for (int g = 0; g < NR; ++g) {
                    for (int h = 0; h < 2; ++h) {
                        acc[g][h][t] = _mm256_fmadd_ps(wv[g][h], xv, acc[g][h][t]);
                    }
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

// One group, MT tokens. Without VNNI: unbias the weights to int8 and use the
// sign trick (|x| * sign(w, x)) so pmaddubsw cannot saturate (|w|, |x| <= 127).
template <int MT>
void tile_q8(const PackedView& w, const Q8Acts& xq, int64_t g, int64_t t0, float* y) {
    const int64_t K = w.cols;
    const int64_t nb = K / kQ8Block;
    const uint8_t* grp = w.data + g * w.group_bytes;
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][MT];
    for (int t = 0; t < MT; ++t)
        acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i ia[2][MT];
        for (int t = 0; t < MT; ++t)
            ia[0][t] = ia[1][t] = _mm256_setzero_si256();
        const uint8_t* blk = grp + b * kQ8BlockBytes;
#pragma GCC unroll 8
        for (int qd = 0; qd < kQ8Block / 4; ++qd) {
            __m256i wv[2];
            for (int h = 0; h < 2; ++h) {
                wv[h] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                             blk + 32 + qd * 64 + h * 32)),
                                         bias);
            }
            for (int t = 0; t < MT; ++t) {
                const __m256i xv =
                    _mm256_set1_epi32(load_i32(xq.q + (t0 + t) * K + b * kQ8Block + qd * 4));
                const __m256i ax = _mm256_abs_epi8(xv);
                for (int h = 0; h < 2; ++h) {
                    const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[h], xv));
                    ia[h][t] = _mm256_add_epi32(ia[h][t], _mm256_madd_epi16(p16, ones));
                }
            }
        }
        for (int h = 0; h < 2; ++h) {
            const __m256 dw =
                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + h * 16)));
            for (int t = 0; t < MT; ++t) {
                const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xq.d[(t0 + t) * nb + b]));
                acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[h][t]), d, acc[h][t]);
            }
        }
    }
    for (int h = 0; h < 2; ++h) {
        for (int t = 0; t < MT; ++t)
            store_half(w, g, h, t0 + t, acc[h][t], y);
    }
}

template <PackFormat F, int NR, int MT>
void run_float_tokens(const PackedView& w, const float* x, int64_t m, float* y, int64_t g) {
    int64_t t = 0;
    for (; t + MT <= m; t += MT)
        tile_float<F, NR, MT>(w, x, g, t, y);
    for (; t < m; ++t)
        tile_float<F, NR, 1>(w, x, g, t, y);
}

template <PackFormat F>
void gemm_float(const PackedView& w, const float* x, int64_t m, float* y, int64_t g_begin,
                int64_t g_end) {
    int64_t g = g_begin;
    if (m == 1) {
        for (; g + 4 <= g_end; g += 4)
            tile_float<F, 4, 1>(w, x, g, 0, y);
        for (; g < g_end; ++g)
            tile_float<F, 1, 1>(w, x, g, 0, y);
        return;
    }
    for (; g + 2 <= g_end; g += 2)
        run_float_tokens<F, 2, 3>(w, x, m, y, g);
    for (; g < g_end; ++g)
        run_float_tokens<F, 1, 3>(w, x, m, y, g);
}

void gemm_q8(const PackedView& w, const Q8Acts& xq, int64_t m, float* y, int64_t g_begin,
             int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
        int64_t t = 0;
        for (; t + 2 <= m; t += 2)
            tile_q8<2>(w, xq, g, t, y);
        for (; t < m; ++t)
            tile_q8<1>(w, xq, g, t, y);
    }
}

}  // namespace

void gemm_avx2(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
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

void q8_block_amax_avx2(const float* x, int64_t nb, float* amax) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + b * kQ8Block;
        __m256 m = _mm256_and_ps(_mm256_loadu_ps(xb), abs_mask);
        for (int i = 1; i < 4; ++i)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), abs_mask));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        amax[b] = _mm_cvtss_f32(h);
    }
}

void q8_scales_avx2(float* amax_id, int64_t nb, float* d) {
    const __m256 k127 = _mm256_set1_ps(127.0f);
    const __m256 zero = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const __m256 a = _mm256_loadu_ps(amax_id + b);
        const __m128i h = _mm256_cvtps_ph(_mm256_div_ps(a, k127), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(d + b, _mm256_cvtph_ps(h));
        // `amax != 0` in the reference is true for NaN too (unordered compare).
        const __m256 nonzero = _mm256_cmp_ps(a, zero, _CMP_NEQ_UQ);
        _mm256_storeu_ps(amax_id + b, _mm256_and_ps(nonzero, _mm256_div_ps(k127, a)));
    }
    for (; b < nb; ++b) {
        const float a = amax_id[b];
        const __m128i h = _mm_cvtps_ph(_mm_set_ss(a / 127.0f), _MM_FROUND_TO_NEAREST_INT);
        d[b] = _mm_cvtss_f32(_mm_cvtph_ps(h));
        amax_id[b] = a != 0.0f ? 127.0f / a : 0.0f;
    }
}

void q8_quantize_blocks_avx2(const float* x, int64_t nb, const float* id, int8_t* q,
                             int32_t* s128) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; ++b) {
        const __m256 vid = _mm256_set1_ps(id[b]);
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
            // Round to nearest even (MXCSR default), as the reference's nearbyint.
            c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * kQ8Block + 8 * i), vid));
        }
        // packs work per 128-bit lane: bytes come out as 4-value pieces in lane order;
        // the permute puts them back in column order. |q| <= 127: no saturation.
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]),
                                             _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQ8Block),
                            _mm256_permutevar8x32_epi32(p, order));
        const __m256i sum =
            _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
        s128[b] = wrap_times128(_mm_cvtsi128_si32(h));
    }
}

float sum_avx2(const float* x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    __m256 s8 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float tmp[8];
    _mm256_storeu_ps(tmp, s8);
    float s = 0;
    for (float v : tmp)
        s += v;
    for (; i < n; ++i)
        s += x[i];
    return s;
}

}  // namespace dsi::kernels::internal

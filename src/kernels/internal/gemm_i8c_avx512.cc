// AVX-512 VNNI variant of the i8c GEMM and activation quantiser (gemm_i8c.h). Compiled
// with -mavx512* flags: no STL here (gemm_abi.h). The int32 sums run over all of K with
// vpdpbusd (biased weights x signed activations, minus 128 * sum x: exact), then one
// epilogue per output, so the bits are gemm_i8c_scalar.cc's.
#include <immintrin.h>

#include "kernels/internal/gemm_i8c.h"

namespace dsi::kernels::internal {
namespace {

// NR groups x MT tokens over all of K.
template <int NR, int MT>
void tile(const PackedView& w, const I8cActs& xa, int64_t g0, int64_t t0, float* y) {
    const int64_t kp = w.padded_cols;
    const int64_t nq = kp / 4;
    const uint8_t* grp[NR];
    for (int g = 0; g < NR; ++g)
        grp[g] = w.data + (g0 + g) * w.group_bytes;
    const int8_t* qx[MT];
    for (int t = 0; t < MT; ++t)
        qx[t] = xa.q + (t0 + t) * kp;
    __m512i acc[NR][MT];
    for (int g = 0; g < NR; ++g) {
        for (int t = 0; t < MT; ++t)
            acc[g][t] = _mm512_setzero_si512();
    }
    for (int64_t q = 0; q < nq; ++q) {
        __m512i wv[NR];
        for (int g = 0; g < NR; ++g)
            wv[g] = _mm512_loadu_si512(grp[g] + q * 64);
        for (int t = 0; t < MT; ++t) {
            const __m512i xv = _mm512_set1_epi32(load_i32(qx[t] + q * 4));
            for (int g = 0; g < NR; ++g)
                acc[g][t] = _mm512_dpbusd_epi32(acc[g][t], wv[g], xv);
        }
    }
    for (int g = 0; g < NR; ++g) {
        const int64_t r0 = (g0 + g) * kGroupRows;
        const __m512 dw = _mm512_loadu_ps(w.scales + r0);
        const int64_t left = w.rows - r0;
        const __mmask16 mask = left >= kGroupRows ? static_cast<__mmask16>(0xffff)
                                                  : static_cast<__mmask16>((1u << left) - 1);
        for (int t = 0; t < MT; ++t) {
            const int64_t tt = t0 + t;
            const __m512 f = _mm512_cvtepi32_ps(
                _mm512_sub_epi32(acc[g][t], _mm512_set1_epi32(xa.s128[tt])));
            const __m512 v = _mm512_mul_ps(f, _mm512_mul_ps(_mm512_set1_ps(xa.d[tt]), dw));
            _mm512_mask_storeu_ps(y + tt * w.rows + r0, mask, v);
        }
    }
}

template <int NR, int MT>
void run_tokens(const PackedView& w, const I8cActs& xa, int64_t m, float* y, int64_t g) {
    int64_t t = 0;
    for (; t + MT <= m; t += MT)
        tile<NR, MT>(w, xa, g, t, y);
    switch (m - t) {
        case 0:
            break;
        case 1:
            tile<NR, 1>(w, xa, g, t, y);
            break;
        case 2:
            tile<NR, 2>(w, xa, g, t, y);
            break;
        case 3:
            tile<NR, 3>(w, xa, g, t, y);
            break;
        case 4:
            tile<NR, 4>(w, xa, g, t, y);
            break;
        default:
            tile<NR, 5>(w, xa, g, t, y);
            break;
    }
}

}  // namespace

void gemm_i8c_avx512(const PackedView& w, const I8cActs& xa, int64_t m, float* y,
                     int64_t g_begin, int64_t g_end) {
    int64_t g = g_begin;
    if (m == 1) {
        for (; g + 8 <= g_end; g += 8)
            tile<8, 1>(w, xa, g, 0, y);
        for (; g < g_end; ++g)
            tile<1, 1>(w, xa, g, 0, y);
        return;
    }
    for (; g + 4 <= g_end; g += 4)
        run_tokens<4, 6>(w, xa, m, y, g);
    for (; g < g_end; ++g)
        run_tokens<1, 6>(w, xa, m, y, g);
}

void quantize_i8c_avx512(const float* x, int64_t k, int64_t padded_cols, int8_t* q, float* d,
                         int32_t* s128) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    // Two chains (max is exact, so their order cannot change the result).
    __m512 vmax = _mm512_setzero_ps();
    __m512 vmax2 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
        vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask));
        vmax2 = _mm512_max_ps(vmax2, _mm512_and_ps(_mm512_loadu_ps(x + j + 16), abs_mask));
    }
    vmax = _mm512_max_ps(vmax, vmax2);
    for (; j < k; j += 16) {
        const __mmask16 mk = k - j >= 16 ? static_cast<__mmask16>(0xffff)
                                         : static_cast<__mmask16>((1u << (k - j)) - 1);
        vmax = _mm512_max_ps(vmax, _mm512_and_ps(_mm512_maskz_loadu_ps(mk, x + j), abs_mask));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    __m512i vsum = _mm512_setzero_si512();
    for (j = 0; j < k; j += 16) {
        // The caller's next row (matmul quantises consecutive rows) into L1 while this one
        // is rounded; a prefetch past the end of x is harmless (no fault).
        _mm_prefetch(reinterpret_cast<const char*>(x + k + j), _MM_HINT_T0);
        const __mmask16 mk = k - j >= 16 ? static_cast<__mmask16>(0xffff)
                                         : static_cast<__mmask16>((1u << (k - j)) - 1);
        // Round to nearest even (MXCSR default), as nearbyint; masked-out lanes are 0.
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + j), vid));
        vsum = _mm512_add_epi32(vsum, v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtepi32_epi8(v));
    }
    // j is k rounded up to 16 (those lanes were written as 0); zero the rest.
    for (; j < padded_cols; ++j)
        q[j] = 0;
    *d = amax / 127.0f;
    int32_t lanes[16];
    _mm512_storeu_si512(lanes, vsum);
    *s128 = wrap_times128(wrap_sum(lanes, 16));
}

}  // namespace dsi::kernels::internal

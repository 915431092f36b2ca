// AMX variant of the i8c GEMM (gemm_i8c.h). Compiled with AVX-512 and AMX flags: no STL
// here (gemm_abi.h).
//
// Blocking: 2 x 2 C tiles (32 tokens x 32 output rows) = tmm4-7 accumulate int32 over all
// of K; per 64-column step two A tiles (tmm0-1, 16 tokens x 64 int8 each, pre-packed
// contiguous by matmul.cc) and two B tiles (tmm2-3, one group's 16 rows x 64 columns: 16
// consecutive packed quads = 1 KiB contiguous) feed four TDPBSUD. C = sum x * (w + 128);
// the epilogue subtracts 128 * sum x (exact) and applies float(isum) * (d_x * d_w) once
// per output, so the bits are gemm_i8c_scalar.cc's. Loop order: a pair of groups (their
// B strips, 2 * 16 * K bytes, stay in L2) outer, token tile pairs inner. Threads split
// groups (matmul.cc), so no output's reduction depends on m or the thread count.
#include <immintrin.h>

#include "kernels/internal/gemm_amx.h"
#include "kernels/internal/gemm_i8c.h"

namespace dsi::kernels::internal {
namespace {

// All eight tiles are 16 rows x 64 bytes (A: 16 tokens x 64 int8; B: 16 quads x 16 rows
// x 4 bytes; C: 16 tokens x 16 int32).
void configure_tiles() {
    AmxTileConfig cfg = {};
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

// One C tile (16 tokens from t0, 16 rows of group g) through the epilogue.
inline void epilogue(const PackedView& w, const I8cActs& xa, const int32_t* c, int64_t m,
                     int64_t t0, int64_t g, float* y) {
    const int64_t r0 = g * kGroupRows;
    const int64_t left = w.rows - r0;
    const __mmask16 mask = left >= kGroupRows ? static_cast<__mmask16>(0xffff)
                                              : static_cast<__mmask16>((1u << left) - 1);
    const __m512 dw = _mm512_loadu_ps(w.scales + r0);
    const int64_t n = m - t0 < 16 ? m - t0 : 16;
    for (int64_t r = 0; r < n; ++r) {
        const int64_t t = t0 + r;
        const __m512 f = _mm512_cvtepi32_ps(
            _mm512_sub_epi32(_mm512_load_si512(c + r * 16), _mm512_set1_epi32(xa.s128[t])));
        _mm512_mask_storeu_ps(y + t * w.rows + r0, mask,
                              _mm512_mul_ps(f, _mm512_mul_ps(_mm512_set1_ps(xa.d[t]), dw)));
    }
}

// Token tiles tt (and tt + 1 when kTwoT) x groups g (and g + 1 when kTwoG), all of K.
template <bool kTwoG, bool kTwoT>
void block(const PackedView& w, const I8cActs& xa, int64_t m, int64_t g, int64_t tt,
           float* y) {
    const int64_t nkt = w.padded_cols / kI8cKTile;
    const int8_t* a0 = xa.tiles + tt * nkt * kI8cTileBytes;
    const int8_t* a1 = a0 + nkt * kI8cTileBytes;
    const uint8_t* b0 = w.data + g * w.group_bytes;
    const uint8_t* b1 = b0 + w.group_bytes;
    _tile_zero(4);
    if constexpr (kTwoG) _tile_zero(5);
    if constexpr (kTwoT) _tile_zero(6);
    if constexpr (kTwoG && kTwoT) _tile_zero(7);
    for (int64_t kt = 0; kt < nkt; ++kt) {
        const int64_t off = kt * kI8cTileBytes;
        _tile_loadd(0, a0 + off, 64);
        _tile_loadd(2, b0 + off, 64);
        if constexpr (kTwoG) _tile_loadd(3, b1 + off, 64);
        if constexpr (kTwoT) _tile_loadd(1, a1 + off, 64);
        _tile_dpbsud(4, 0, 2);
        if constexpr (kTwoG) _tile_dpbsud(5, 0, 3);
        if constexpr (kTwoT) _tile_dpbsud(6, 1, 2);
        if constexpr (kTwoG && kTwoT) _tile_dpbsud(7, 1, 3);
    }
    alignas(64) int32_t c[4][256];
    _tile_stored(4, c[0], 64);
    if constexpr (kTwoG) _tile_stored(5, c[1], 64);
    if constexpr (kTwoT) _tile_stored(6, c[2], 64);
    if constexpr (kTwoG && kTwoT) _tile_stored(7, c[3], 64);
    const int64_t t0 = tt * 16;
    epilogue(w, xa, c[0], m, t0, g, y);
    if constexpr (kTwoG) epilogue(w, xa, c[1], m, t0, g + 1, y);
    if constexpr (kTwoT) epilogue(w, xa, c[2], m, t0 + 16, g, y);
    if constexpr (kTwoG && kTwoT) epilogue(w, xa, c[3], m, t0 + 16, g + 1, y);
}

template <bool kTwoG>
void token_tiles(const PackedView& w, const I8cActs& xa, int64_t m, int64_t g, float* y) {
    const int64_t ntt = (m + 15) / 16;
    int64_t tt = 0;
    for (; tt + 2 <= ntt; tt += 2)
        block<kTwoG, true>(w, xa, m, g, tt, y);
    if (tt < ntt)
        block<kTwoG, false>(w, xa, m, g, tt, y);
}

}  // namespace

void gemm_i8c_amx(const PackedView& w, const I8cActs& xa, int64_t m, float* y, int64_t g_begin,
                  int64_t g_end) {
    if (m < kAmxMinTokens || xa.tiles == nullptr) {
        gemm_i8c_avx512(w, xa, m, y, g_begin, g_end);
        return;
    }
    configure_tiles();
    int64_t g = g_begin;
    for (; g + 2 <= g_end; g += 2)
        token_tiles<true>(w, xa, m, g, y);
    if (g < g_end)
        token_tiles<false>(w, xa, m, g, y);
    _tile_release();
}

}  // namespace dsi::kernels::internal

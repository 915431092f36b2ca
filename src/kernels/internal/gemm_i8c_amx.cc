// AMX variant of the i8c GEMM (gemm_i8c.h). Compiled with AVX-512 and AMX flags: no STL
// here (gemm_abi.h).
//
// Blocking: 2 x 2 C tiles (32 tokens x 32 output rows) = tmm4-7 accumulate int32 over
// K; per 64-column step two A tiles (tmm0-1, 16 tokens x 64 int8 each, pre-packed
// contiguous by matmul.cc) and two B tiles (tmm2-3, one group's 16 rows x 64 columns: 16
// consecutive packed quads = 1 KiB contiguous) feed four TDPBSUD. C = sum x * (w + 128);
// the epilogue subtracts 128 * sum x (exact) and applies float(isum) * (d_x * d_w) once
// per output, so the bits are gemm_i8c_scalar.cc's. Loop order: a pair of groups (their
// B strips, 2 * 16 * K bytes, stay in L2) outer, K blocks, token tile pairs inner. Threads split
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

// K is processed in blocks of kKcTiles 64-column tiles; the int32 C tiles of a chunk of
// kChunkPairs token tile pairs are kept in `cbuf` between K blocks (exact, so the order
// of the K blocks cannot change a bit). The next A tiles (kPrefetchA steps ahead) and B
// tiles (kPrefetchB) are prefetched into L1. Measured at 512 x 2048 x 2048 on this VM
// (docs/kernels.md), with 64-byte aligned tiles: the kernel alone reaches ~1.7 TOP/s with
// these values; K blocks of 8 tiles that keep a group pair's B strip in L1 (the C tiles
// then make a round trip per block) ~15 % slower; other prefetch distances equal or slower.
constexpr int64_t kKcTiles = 32;
constexpr int64_t kChunkPairs = 2;
constexpr int64_t kPrefetchA = 2;
constexpr int64_t kPrefetchB = 1;

inline void prefetch_tile(const int8_t* p) {
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(p) + l * 64, _MM_HINT_T0);
}

// Token tiles tt (and tt + 1 when kTwoT) x groups g (and g + 1 when kTwoG), K tiles
// [kt0, kt1). C comes from (first block: zero) and goes to c (4 x 256 int32).
template <bool kTwoG, bool kTwoT>
void block(const PackedView& w, const I8cActs& xa, int64_t g, int64_t tt, int64_t kt0,
           int64_t kt1, int32_t* c) {
    const int64_t nkt = w.padded_cols / kI8cKTile;
    const int8_t* a0 = xa.tiles + tt * nkt * kI8cTileBytes;
    const int8_t* a1 = a0 + nkt * kI8cTileBytes;
    const uint8_t* b0 = w.data + g * w.group_bytes;
    const uint8_t* b1 = b0 + w.group_bytes;
    if (kt0 == 0) {
        _tile_zero(4);
        if constexpr (kTwoG) _tile_zero(5);
        if constexpr (kTwoT) _tile_zero(6);
        if constexpr (kTwoG && kTwoT) _tile_zero(7);
    } else {
        _tile_loadd(4, c, 64);
        if constexpr (kTwoG) _tile_loadd(5, c + 256, 64);
        if constexpr (kTwoT) _tile_loadd(6, c + 512, 64);
        if constexpr (kTwoG && kTwoT) _tile_loadd(7, c + 768, 64);
    }
    for (int64_t kt = kt0; kt < kt1; ++kt) {
        const int64_t off = kt * kI8cTileBytes;
        if (kt + kPrefetchA < kt1) {
            prefetch_tile(a0 + off + kPrefetchA * kI8cTileBytes);
            if constexpr (kTwoT) prefetch_tile(a1 + off + kPrefetchA * kI8cTileBytes);
        }
        if (kt + kPrefetchB < kt1) {
            prefetch_tile(reinterpret_cast<const int8_t*>(b0 + off + kPrefetchB * kI8cTileBytes));
            if constexpr (kTwoG)
                prefetch_tile(reinterpret_cast<const int8_t*>(b1 + off + kPrefetchB * kI8cTileBytes));
        }
        _tile_loadd(0, a0 + off, 64);
        _tile_loadd(2, b0 + off, 64);
        if constexpr (kTwoG) _tile_loadd(3, b1 + off, 64);
        if constexpr (kTwoT) _tile_loadd(1, a1 + off, 64);
        _tile_dpbsud(4, 0, 2);
        if constexpr (kTwoG) _tile_dpbsud(5, 0, 3);
        if constexpr (kTwoT) _tile_dpbsud(6, 1, 2);
        if constexpr (kTwoG && kTwoT) _tile_dpbsud(7, 1, 3);
    }
    _tile_stored(4, c, 64);
    if constexpr (kTwoG) _tile_stored(5, c + 256, 64);
    if constexpr (kTwoT) _tile_stored(6, c + 512, 64);
    if constexpr (kTwoG && kTwoT) _tile_stored(7, c + 768, 64);
}

template <bool kTwoG>
void token_tiles(const PackedView& w, const I8cActs& xa, int64_t m, int64_t g, float* y) {
    const int64_t nkt = w.padded_cols / kI8cKTile;
    const int64_t ntt = (m + 15) / 16;
    alignas(64) int32_t cbuf[kChunkPairs][4 * 256];
    for (int64_t tc = 0; tc < ntt; tc += 2 * kChunkPairs) {
        const int64_t tc_end = tc + 2 * kChunkPairs < ntt ? tc + 2 * kChunkPairs : ntt;
        for (int64_t kt0 = 0; kt0 < nkt; kt0 += kKcTiles) {
            const int64_t kt1 = kt0 + kKcTiles < nkt ? kt0 + kKcTiles : nkt;
            for (int64_t tt = tc; tt < tc_end; tt += 2) {
                int32_t* c = cbuf[(tt - tc) / 2];
                if (tt + 1 < tc_end) {
                    block<kTwoG, true>(w, xa, g, tt, kt0, kt1, c);
                } else {
                    block<kTwoG, false>(w, xa, g, tt, kt0, kt1, c);
                }
            }
        }
        for (int64_t tt = tc; tt < tc_end; tt += 2) {
            const int32_t* c = cbuf[(tt - tc) / 2];
            epilogue(w, xa, c, m, tt * 16, g, y);
            if (kTwoG) epilogue(w, xa, c + 256, m, tt * 16, g + 1, y);
            if (tt + 1 < tc_end) {
                epilogue(w, xa, c + 512, m, tt * 16 + 16, g, y);
                if (kTwoG) epilogue(w, xa, c + 768, m, tt * 16 + 16, g + 1, y);
            }
        }
    }
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

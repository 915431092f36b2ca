// AMX variant of the q8_0 GEMM (see gemm_amx.h). Compiled with AVX-512 and AMX flags:
// no STL here (gemm_abi.h).
//
// Tiles: A = 16 tokens x one 32-column block of int8 activations (row stride = cols),
// B = one (group, block) of the packed weights as stored (8 quads x 16 rows x 4 biased
// bytes: exactly TDPBSUD's B layout), C[t][r] = sum_k x[t,k] * (w[r,k] + 128), exact in
// int32. Per block, C goes through the reference epilogue:
// acc = fma(float(C - 128*sum x), d_w * d_x, acc), in increasing block order, so the
// bits are those of gemm_scalar.cc. One pass computes 32 tokens x 2 groups of 16 rows
// over all blocks; the epilogue of block b overlaps the tile work of block b + 1.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/internal/gemm_amx.h"

namespace dsi::kernels::internal {
namespace {

// tmm0-1: A (16 tokens x one block), tmm2-3: B (one group x one block), tmm4-7:
// C[token tile][group].
void configure_tiles() {
    AmxTileConfig cfg = {};
    cfg.palette_id = 1;
    for (int i = 0; i < 2; ++i) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = kQ8Block;  // 32 int8 of one block
    }
    for (int i = 2; i < 4; ++i) {
        cfg.rows[i] = kQ8Block / 4;  // 8 quads
        cfg.colsb[i] = 64;           // 16 rows x 4 bytes
    }
    for (int i = 4; i < 8; ++i) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;  // 16 int32
    }
    _tile_loadconfig(&cfg);
}

// The lanes of group g that are real rows (the last group may be partial).
inline __mmask16 row_mask(const PackedView& w, int64_t g) {
    const int64_t left = w.rows - g * kGroupRows;
    return left >= kGroupRows ? static_cast<__mmask16>(0xffff)
                              : static_cast<__mmask16>((1u << left) - 1);
}

// acc[r] (token r of a 16-token tile; the 16 rows of one group) += the reference epilogue
// of block b for all 16 tile rows (padded tokens read zero scales: matmul.cc pads them).
inline void epilogue(const int32_t* c, const int32_t* s128, const float* dx, int64_t nb,
                     int64_t b, __m512 dw, __m512* acc) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
        const __m512i isum =
            _mm512_sub_epi32(_mm512_load_si512(c + r * 16), _mm512_set1_epi32(s128[r * nb + b]));
        const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * nb + b]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[r]);
    }
}

inline __m512 block_scales(const uint8_t* grp, int64_t b) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + b * kQ8BlockBytes)));
}

// Tokens [t0, t0 + nt), nt <= 32 (one or two token tiles), groups g0 and, when
// two_groups, g0 + 1: up to four C tiles per block, all blocks. The C tiles of block b
// are stored to one of two buffers and block b's epilogue runs after block b + 1's
// tile products are issued, so tile work and epilogues overlap; epilogues still run in
// increasing block order.
void tile_pass(const PackedView& w, const Q8Acts& xq, int64_t g0, bool two_groups, int64_t t0,
               int64_t nt, float* y) {
    const int64_t K = w.cols;
    const int64_t nb = K / kQ8Block;
    const uint8_t* grp[2] = {w.data + g0 * w.group_bytes,
                             w.data + (g0 + (two_groups ? 1 : 0)) * w.group_bytes};
    const bool two_tiles = nt > 16;
    const int8_t* a0 = xq.q + t0 * K;
    const int8_t* a1 = a0 + 16 * K;
    __m512 acc[2][2][16];  // [token tile][group][token]
    for (auto& tile : acc) {
        for (auto& group : tile) {
            for (__m512& v : group) v = _mm512_setzero_ps();
        }
    }
    alignas(64) int32_t c[2][4][16 * 16];  // [block parity][ti * 2 + gi]
    auto issue_and_store = [&](int64_t b) {
        const int64_t boff = b * kQ8BlockBytes + 32;
        int32_t(*cb)[256] = c[b & 1];
        _tile_loadd(0, a0 + b * kQ8Block, K);
        _tile_loadd(2, grp[0] + boff, 64);
        _tile_zero(4);
        _tile_dpbsud(4, 0, 2);
        if (two_groups) {
            _tile_loadd(3, grp[1] + boff, 64);
            _tile_zero(5);
            _tile_dpbsud(5, 0, 3);
        }
        if (two_tiles) {
            _tile_loadd(1, a1 + b * kQ8Block, K);
            _tile_zero(6);
            _tile_dpbsud(6, 1, 2);
            if (two_groups) {
                _tile_zero(7);
                _tile_dpbsud(7, 1, 3);
            }
        }
        _tile_stored(4, cb[0], 64);
        if (two_groups) _tile_stored(5, cb[1], 64);
        if (two_tiles) {
            _tile_stored(6, cb[2], 64);
            if (two_groups) _tile_stored(7, cb[3], 64);
        }
    };
    auto finish = [&](int64_t b) {
        int32_t(*cb)[256] = c[b & 1];
        for (int gi = 0; gi < (two_groups ? 2 : 1); ++gi) {
            const __m512 dw = block_scales(grp[gi], b);
            for (int ti = 0; ti < (two_tiles ? 2 : 1); ++ti) {
                epilogue(cb[ti * 2 + gi], xq.s128 + (t0 + 16 * ti) * nb,
                         xq.d + (t0 + 16 * ti) * nb, nb, b, dw, acc[ti][gi]);
            }
        }
    };
    for (int64_t b = 0; b < nb; ++b) {
        issue_and_store(b);
        if (b > 0) finish(b - 1);
    }
    finish(nb - 1);
    const __mmask16 mask0 = row_mask(w, g0);
    const __mmask16 mask1 = two_groups ? row_mask(w, g0 + 1) : static_cast<__mmask16>(0);
    for (int64_t t = 0; t < nt; ++t) {
        float* dst = y + (t0 + t) * w.rows + g0 * kGroupRows;
        _mm512_mask_storeu_ps(dst, mask0, acc[t / 16][0][t % 16]);
        if (two_groups) _mm512_mask_storeu_ps(dst + kGroupRows, mask1, acc[t / 16][1][t % 16]);
    }
}

}  // namespace

void gemm_amx(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
              int64_t g_begin, int64_t g_end) {
    if (w.format != PackFormat::kQ8 || m < kAmxMinTokens) {
        gemm_avx512(w, x, xq, m, y, g_begin, g_end);
        return;
    }
    configure_tiles();
    for (int64_t g = g_begin; g < g_end; g += 2) {
        const bool two_groups = g + 1 < g_end;
        for (int64_t t = 0; t < m; t += 32) {
            tile_pass(w, xq, g, two_groups, t, m - t < 32 ? m - t : 32, y);
        }
    }
    _tile_release();
}

bool amx_request_permission() {
    constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) == 0 &&
        (bitmask & (1ul << kXfeatureXtiledata)) != 0) {
        return true;
    }
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace dsi::kernels::internal

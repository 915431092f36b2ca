// AMX (Intel Advanced Matrix Extensions) GEMM for q8_0 weights: the integer block
// products come from TDPBSUD tiles, the f32 accumulation is the scalar reference's
// (gemm_abi.h), so the results are bitwise equal to every other variant.
//
// REQUIRES for gemm_amx: the CPU has AMX-TILE + AMX-INT8 + AVX-512 (the level
// gemm_avx512 needs), this process was granted the tile data state (amx_request_permission
// returned true), and for q8 weights xq (q, d, s128) holds m rounded up to 16 token rows
// (matmul.cc pads them with zeros). Formats other than q8 and m below
// kAmxMinTokens go to gemm_avx512.
#pragma once

#include <cstdint>

#include "kernels/internal/gemm_abi.h"

namespace dsi::kernels::internal {

// Below this many tokens the AVX-512 VNNI kernel is as fast (a tile holds 16 tokens).
constexpr int64_t kAmxMinTokens = 16;
constexpr int64_t kAmxTokenPad = 16;

// The LDTILECFG memory operand (palette 1): per tile register its rows and bytes per row.
struct alignas(64) AmxTileConfig {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

void gemm_amx(const PackedView& w, const float* x, const Q8Acts& xq, int64_t m, float* y,
              int64_t g_begin, int64_t g_end);

// Linux: asks the kernel for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM) for
// the whole process; true when granted (or already granted). Call once, before any thread
// runs gemm_amx.
bool amx_request_permission();

}  // namespace dsi::kernels::internal

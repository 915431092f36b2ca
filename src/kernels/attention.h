// MLA attention in the absorbed form over a latent KV cache read through a block
// table of 128-token blocks (issue 3; DeepSeek-V2/V3 MLA).
//
// Queries come already absorbed into the latent space (q_lat = W_kb^T q_nope per
// head); the kernel computes, per head h, o_lat[h] = sum_s softmax_s(scale *
// (q_lat[h] . c_s + q_pe[h] . k_s)) c_s over positions s < num_positions, with
// one online softmax in a fixed order (internal/ops_abi.h). The value
// up-projection (W_vb) is the caller's. Prefill is one call per token with its own
// num_positions (causal), decode the same with the whole context.
//
// Batch invariance (SPEC S-ENG-6): a head's result depends only on its inputs and
// num_positions; tiles are aligned to absolute position 0, so it is the same
// whatever the batch, thread count, head grouping or prefill chunking, and every
// ISA variant gives the scalar reference's bits.
//
// Thread model: free functions, no state; call from any thread.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/internal/ops_abi.h"

namespace dsi::kernels {

constexpr int64_t kKvBlockTokens = internal::kKvBlockTokens;

// One layer's latent rows (lora floats c_kv, then rope floats k_pe) as a block
// table: position p is at blocks[p / kKvBlockTokens] + (p % kKvBlockTokens) *
// row_stride. Both the paged and the contiguous KvCache provide this.
struct LatentKvView {
    const float* const* blocks = nullptr;
    int64_t row_stride = 0;
};

struct MlaHeads {
    int64_t num_heads = 0;
    const float* q_lat = nullptr;  // [num_heads][lora]
    const float* q_pe = nullptr;   // head h at q_pe + h * q_pe_stride, rope floats
    int64_t q_pe_stride = 0;
    float* o_lat = nullptr;  // [num_heads][lora]
};

// REQUIRES: num_positions >= 1 and the view covers them; o_lat does not alias.
void mla_attention(Isa isa, const LatentKvView& kv, int64_t num_positions, int64_t lora,
                   int64_t rope, float scale, const MlaHeads& heads);
inline void mla_attention(const LatentKvView& kv, int64_t num_positions, int64_t lora,
                          int64_t rope, float scale, const MlaHeads& heads) {
    mla_attention(active_isa(), kv, num_positions, lora, rope, scale, heads);
}

}  // namespace dsi::kernels

// MLA attention in the absorbed form over a latent KV cache read through a block
// table of 128-token blocks (issue 3; DeepSeek-V2/V3 MLA).
//
// Queries come already absorbed into the latent space (q_lat = W_kb^T q_nope per
// head); the kernel computes, per head h, o_lat[h] = sum_s softmax_s(scale *
// (q_lat[h] . c_s + q_pe[h] . k_s)) c_s over positions s < num_positions, with
// one online softmax in a fixed order (internal/ops_abi.h). The value
// up-projection (W_vb) is the caller's. Decode is one call per token with the whole
// context; prefill is mla_attention_tokens over a chunk's tokens, each with its own
// causal length.
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

// How the latent KV cache stores its values (SPEC S-ENG-9; docs/kernels.md "KV
// dtypes"). A row of n = lora + rope values takes kv_row_words(dtype, n) 4-byte words:
//   kF32:  n floats (exact);
//   kBf16: n bf16, round to nearest even (relative error <= 2^-8);
//   kE4m3: n FP8 e4m3fn codes, then one f32 scale per 16 values (scale = amax / 448,
//          no global scale); REQUIRES lora % 16 == 0 and rope % 16 == 0.
// The attention kernel reads each dtype directly (dequantised in registers).
enum class KvDtype : uint8_t { kF32 = 0, kBf16 = 1, kE4m3 = 2 };

const char* kv_dtype_name(KvDtype dtype);
// "f32", "bf16", "e4m3" (alias "fp8"); false if unknown.
bool parse_kv_dtype(const char* name, KvDtype* out);
// 4-byte words per cached row of n values.
int64_t kv_row_words(KvDtype dtype, int64_t n);
// Encodes n floats into a row (kv_row_words words at dst). For kE4m3, REQUIRES n %
// 16 == 0.
void kv_encode_row(KvDtype dtype, const float* x, int64_t n, float* dst);
// Decodes a row into n floats, exactly as the attention kernel reads it.
void kv_decode_row(KvDtype dtype, const float* row, int64_t n, float* y);

// One layer's latent rows (lora values of c_kv, then rope values of k_pe, encoded as
// `dtype`) as a block table: position p's row starts at blocks[p / kKvBlockTokens] +
// (p % kKvBlockTokens) * row_stride (in 4-byte words). Both the paged and the
// contiguous KvCache provide this.
struct LatentKvView {
    const float* const* blocks = nullptr;
    int64_t row_stride = 0;
    KvDtype dtype = KvDtype::kF32;
};

struct MlaHeads {
    int64_t num_heads = 0;
    const float* q_lat = nullptr;  // [num_heads][lora]
    const float* q_pe = nullptr;   // head h at q_pe + h * q_pe_stride, rope floats
    int64_t q_pe_stride = 0;
    float* o_lat = nullptr;  // [num_heads][lora]
};

// REQUIRES: num_positions >= 1 and the view covers them; o_lat does not alias;
// lora + rope <= 1024.
void mla_attention(Isa isa, const LatentKvView& kv, int64_t num_positions, int64_t lora,
                   int64_t rope, float scale, const MlaHeads& heads);
inline void mla_attention(const LatentKvView& kv, int64_t num_positions, int64_t lora,
                          int64_t rope, float scale, const MlaHeads& heads) {
    mla_attention(active_isa(), kv, num_positions, lora, rope, scale, heads);
}

// Prefill: num_tokens tokens of one sequence, num_heads heads each, token t over
// positions [0, num_positions[t]). Each 128-row tile of the cache is read once for
// all the call's queries (tokens x heads) instead of once per token. Every query's
// result is bitwise the one mla_attention gives it alone (same tiles, same order).
// Query (t, h): q_lat + t * q_lat_token_stride + h * lora, q_pe + t *
// q_pe_token_stride + h * q_pe_stride, o_lat + t * o_lat_token_stride + h * lora.
struct MlaTokens {
    int64_t num_tokens = 0;
    const int64_t* num_positions = nullptr;
    int64_t num_heads = 0;
    const float* q_lat = nullptr;
    int64_t q_lat_token_stride = 0;
    const float* q_pe = nullptr;
    int64_t q_pe_token_stride = 0;
    int64_t q_pe_stride = 0;
    float* o_lat = nullptr;
    int64_t o_lat_token_stride = 0;
};
// Queries one call shares a pass over the rows with (larger calls are split).
constexpr int64_t kMlaMaxQueriesPerPass = internal::kMaxQueriesPerCall;

// REQUIRES: as mla_attention, for every token.
void mla_attention_tokens(Isa isa, const LatentKvView& kv, int64_t lora, int64_t rope,
                          float scale, const MlaTokens& tokens);

}  // namespace dsi::kernels

// The interface between the attention / small-op drivers (attention.cc, ops.cc)
// and their per-ISA variants (ops_scalar.cc, ops_avx2.cc, ops_avx512.cc).
//
// As for gemm_abi.h, the variant files are compiled with their own -m flags and
// include no STL: plain structs, pointers and intrinsics only.
//
// The fixed reduction orders every variant follows (so all ISAs agree bit for bit,
// and a result never depends on batch, thread count or chunking; SPEC S-ENG-6):
//   dot(a, b, n): 16 lane accumulators, acc[i % 16] = fma(a[i], b[i], acc[i % 16])
//     in increasing i (lanes past n see fma(0, 0, acc)); then acc[j] += acc[j + w]
//     for w = 8, 4, 2, 1; the result is acc[0].
//   exp(x): one fixed polynomial (exp_ref in ops_scalar.cc), elementwise.
//   MLA attention for one query (token, head): positions in increasing order, in
//     tiles of kKvBlockTokens aligned to absolute position 0. Per tile: scores s =
//     (dot(q_lat, c) + dot(q_pe, k)) * scale; m' = max(m, tile max); alpha = exp(m -
//     m'); l = l * alpha, o = o * alpha; then per position p = exp(s - m'), l = l + p
//     in increasing position, o = fma(p, c, o) in increasing position. Finally o = o *
//     (1 / l). A call may hold several tokens of one sequence (prefill): each query
//     still sees exactly these operations, so one call over a chunk gives the bits of
//     one call per token.
//   KV dtypes: a cached value c is read as a float first (f32 as is; bf16 exactly;
//     e4m3 as float(code) * scale of its 16-value group, one f32 rounding), then
//     used as above.
//   index_scores (the lightning indexer's score of one key for one token; a matmul of
//     the token's heads x dim queries against the key, so the heads are the lanes): with
//     P = heads rounded up to 16 (queries and weights packed as index_pack_queries
//     writes them, zero past the heads), per head h: a = 0, a = fma(qt[i * P + h],
//     key[i], a) for i = 0 .. dim - 1 in increasing i; r[h] = (a > 0 ? a : 0) * wt[h].
//     Then s[j] = 0, s[j] = s[j] + r[16 g + j] for g = 0 .. P / 16 - 1 in increasing g;
//     then s[j] += s[j + w] for w = 8, 4, 2, 1; the score is s[0]. Every key alone: a
//     score never depends on the other keys of the call, their number or order.
#pragma once

#include <cstdint>

namespace dsi::kernels::internal {

constexpr int64_t kKvBlockTokens = 128;

// Queries one attention call handles (tokens x heads; fixed-size score scratch on
// the stack).
constexpr int64_t kMaxQueriesPerCall = 64;

// KV row encodings (kernels::KvDtype mirrors these values). A row of n values is
//   kKvF32:  n floats;
//   kKvBf16: n bf16 (upper halves of f32), padded to 4 bytes;
//   kKvE4m3: n e4m3fn codes, then n / 16 f32 scales (group g = values 16g..16g+15);
//            REQUIRES lora % 16 == 0 and rope % 16 == 0 (groups never straddle).
constexpr int32_t kKvF32 = 0;
constexpr int32_t kKvBf16 = 1;
constexpr int32_t kKvE4m3 = 2;

// One call: num_heads heads of each of num_tokens tokens of one sequence; token t
// attends over positions [0, num_positions[t]). Position p's latent row (lora values
// of c_kv then rope values of k_pe, encoded as kv_dtype) starts at
// blocks[p / kKvBlockTokens] + (p % kKvBlockTokens) * row_stride (in 4-byte words).
// Query (t, h): q_lat + t * q_lat_token_stride + h * lora, q_pe + t *
// q_pe_token_stride + h * q_pe_stride, o_lat + t * o_lat_token_stride + h * lora.
struct MlaArgs {
    const float* const* blocks = nullptr;
    int64_t row_stride = 0;
    int32_t kv_dtype = kKvF32;
    int64_t lora = 0;
    int64_t rope = 0;
    float scale = 1.0f;
    int64_t num_tokens = 1;
    const int64_t* num_positions = nullptr;  // per token, each >= 1
    int64_t num_heads = 0;  // num_tokens * num_heads <= kMaxQueriesPerCall
    const float* q_lat = nullptr;
    int64_t q_lat_token_stride = 0;
    const float* q_pe = nullptr;
    int64_t q_pe_token_stride = 0;
    int64_t q_pe_stride = 0;
    float* o_lat = nullptr;
    int64_t o_lat_token_stride = 0;
};

struct OpsTable {
    void (*mla)(const MlaArgs& a);
    float (*dot)(const float* a, const float* b, int64_t n);
    // y = (x * inv) * w with inv = 1 / sqrt(dot(x, x) / n + eps).
    void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* y);
    // Adjacent pairs: v[i] = v[i] * cc[i] + v[i ^ 1] * ss[i] for i < 2 * pairs
    // (cc = cos duplicated, ss = (-sin, +sin) per pair), for num_vecs vectors.
    void (*rope)(float* v, int64_t num_vecs, int64_t stride, const float* cc, const float* ss,
                 int64_t pairs);
    // out = g / (1 + exp(-g)) * u.
    void (*silu_mul)(const float* g, const float* u, int64_t n, float* out);
    // In place: x = exp(x - max) * (1 / sum), sum in the dot lane order.
    void (*softmax)(float* x, int64_t n);
    // First index of the maximum (NaN-free input).
    int64_t (*argmax)(const float* x, int64_t n);
    // exp of n floats (tests).
    void (*exp)(const float* x, int64_t n, float* y);
    // out[k] = the index score of keys[k] (dim floats each) for packed queries qt
    // [dim, P] and weights wt [P]; REQUIRES P % 16 == 0.
    void (*index_scores)(const float* qt, const float* wt, int64_t P, int64_t dim,
                         const float* const* keys, int64_t n, float* out);
};

extern const OpsTable kOpsScalar;
extern const OpsTable kOpsAvx2;
extern const OpsTable kOpsAvx512;

}  // namespace dsi::kernels::internal

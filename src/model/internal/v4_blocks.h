// The pieces DeepSeek V4 (model/deepseek_v4.cc) and V4.1 (model/deepseek_v41.cc) share
// (reference deepseek_v4.md §2, §7.4 "V4.1 keeps"): the hyper-connection coefficients
// (sigmoid pre/post, Sinkhorn-normalised comb) and the stream update, the MQA
// attention core (low-rank query with per-head RMS, one shared KV head, RoPE on the
// last qk_rope_head_dim dims, softmax with a sink, inverse RoPE, grouped low-rank
// output), the sqrtsoftplus MoE with the SwiGLU clamp, and the batch gathering of
// forward steps over a state slot whose first word pair is the sequence length.
// Private to src/model/. Thread model: parameters are immutable after loading; the
// functions use the given pool and are called by one thread at a time.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/internal/ep_host.h"
#include "model/internal/linear.h"
#include "model/weights.h"

namespace dsi::internal {

// ---- loading ----

// Loads weights of one checkpoint into Linear layers in the --weight-format classes.
struct V4Loader {
    WeightSource* source = nullptr;
    ClassFormats formats;
    Status linear(const std::string& name, int64_t rows, int64_t cols, WeightClass cls,
                  Linear& out) const;
    // Kept in its stored format whatever --weight-format says (f32 mixing weights).
    Status exact(const std::string& name, int64_t rows, int64_t cols, Linear& out) const;
};

// ---- batching over state slots ----

// The slot's header: the main and a second (V4: MTP) length, one int64 each.
inline constexpr int64_t kStateHeaderFloats = 4;
inline int64_t header_get(const float* slot, int i) {
    int64_t v = 0;
    std::memcpy(&v, slot + 2 * i, sizeof v);
    return v;
}
inline void header_set(float* slot, int i, int64_t v) { std::memcpy(slot + 2 * i, &v, sizeof v); }

// The tokens of one forward call: per token its position, its sequence's cache and
// where its sequence's chunk starts in the batch.
struct Tokens {
    std::vector<int32_t> ids;
    std::vector<int64_t> pos;
    std::vector<KvCache*> cache;
    std::vector<int64_t> chunk_first;  // batch index of the chunk's first token
    std::vector<int64_t> chunk_start;  // position of the chunk's first token
    int64_t size() const { return static_cast<int64_t>(pos.size()); }
};
// ---- hyper-connections ----

// Mixing parameters of one sub-layer (or of V4's head: no post/comb).
struct HcParams {
    Linear fn;  // [mix, hc * hidden] f32
    std::vector<float> base, scale;
};
Status load_hc(const V4Loader& ld, const std::string& prefix, int64_t mix, int64_t nscale,
               int64_t hc_hidden, HcParams& p);
// mixes [n, mix] = fn(x) * rsqrt(mean(x^2) + norm_eps) for x [n, hc * hidden] (the RMS of
// the unnormalised flat streams, no weight).
void hc_mixes(const HcParams& p, const ModelConfig& c, ThreadPool* pool, const float* x, int64_t n,
              std::vector<float>& mixes);
// One token's coefficients from its mixes: pre [hc] = sigmoid + eps, post [hc] = 2 sigmoid,
// comb [hc, hc] = row softmax + eps, then Sinkhorn (hc_sinkhorn_iters rounds).
void hc_coefficients(const HcParams& p, const ModelConfig& c, const float* mixes, float* pre,
                     float* post, float* comb);
// out[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * x[t, j].
void hc_post(const float* x, const float* y, const float* post, const float* comb, int64_t n,
             int64_t hc, int64_t hidden, float* out);
// out[t] = sum_j pre[t, j] * x[t, j] (the sub-layer input before its norm).
void hc_mix_in(const float* x, const float* pre, int64_t n, int64_t hc, int64_t hidden, float* out);

// ---- attention ----

struct AttnCore {
    std::vector<double> inv_freq;  // RoPE of the layer (model/config.h v4_rope_inv_freq)
    Linear wq_a, wq_b, wkv, wo_b;
    std::vector<Linear> wo_a;  // one slice of o_lora_rank rows per output group
    std::vector<float> q_norm, kv_norm, sink;
};
// `a` is the "layers.N.attn." prefix.
Status load_attn_core(const V4Loader& ld, const ModelConfig& c, const std::string& a,
                      AttnCore& core);
// Rotates the last qk_rope_head_dim values of num_vecs vectors (stride apart, each dim
// long) by pos (inverse: by -pos).
void rope_rows(const ModelConfig& c, const std::vector<double>& inv_freq, int64_t pos, float* v,
               int64_t num_vecs, int64_t stride, int64_t dim, bool inverse);
void rms_norm_rows(const ModelConfig& c, const float* x, const float* w, int64_t n, int64_t dim,
                   float* y);
// qr [n, q_lora_rank] (normed), q [n, heads, head_dim] (per-head RMS, RoPE) and the
// shared head's kv [n, head_dim] (normed, RoPE) of tokens at positions pos.
void attn_project(const AttnCore& a, const ModelConfig& c, ThreadPool* pool, const float* h,
                  std::span<const int64_t> pos, std::vector<float>& qr, std::vector<float>& q,
                  std::vector<float>& kv);
// One token, every head: softmax over the keys (key rows of head_dim) and the head's
// sink logit (a zero value), o [heads, head_dim]. `p` is scratch.
void sink_attention(const AttnCore& a, const ModelConfig& c, const float* q,
                    std::span<const float* const> keys, float* o, std::vector<float>& p);
// Inverse RoPE of o [n, heads, head_dim] at each token's position, then the grouped
// low-rank output into out [n, hidden].
void attn_output(const AttnCore& a, const ModelConfig& c, ThreadPool* pool,
                 std::span<const int64_t> pos, std::vector<float>& o, float* out);

// Compact KV rows: encodes each of the n rows of kv [n, dim] into `stored` (words 4-byte
// words per row) and replaces the row by its decoded value (what later reads see).
void store_rows(std::vector<float>& kv, int64_t n, int64_t dim, int64_t words,
                const std::function<void(const float*, uint8_t*)>& encode,
                const std::function<void(const uint8_t*, float*)>& decode,
                std::vector<float>& stored);

// Where a token's keys come from: its chosen compressed entries (ascending ids; may be
// empty) and its window rows before the chunk. Rows stored compactly are decoded into
// `buf` (head_dim floats) and returned there.
struct AttendKeys {
    std::function<const std::vector<int32_t>&(int64_t t)> chosen;
    std::function<const float*(int64_t t, int32_t entry, float* buf)> entry;
    std::function<const float*(int64_t t, int64_t pos, float* buf)> window;
    // Bounded replay (S-SWA): token t reads no window row before this position (empty:
    // no floor).
    std::function<int64_t(int64_t t)> window_floor;
};
// Every token's attention over its chosen entries, then its window (ascending
// positions; the chunk's own rows from kv [n, head_dim]), then the sink: o [n, heads,
// head_dim]. One softmax in that fixed order per (token, head).
void attend(const AttnCore& a, const ModelConfig& c, ThreadPool* pool, const Tokens& tk,
            const std::vector<float>& q, const std::vector<float>& kv, const AttendKeys& keys,
            std::vector<float>& o);

// The indexer's queries of n tokens: q [n, heads, dim] = wq_b(qr) with RoPE (and, for
// quantised keys, the Hadamard rotation and FP4 simulation), per-head weights w [n,
// heads] = weights_proj(h) * dim^-1/2 * heads^-1/2.
struct IndexQueries {
    std::vector<float> q, w;
    int64_t heads = 0, dim = 0;
    // The same queries packed for kernels::index_scores: per token qt [dim, packed_heads]
    // and wt [packed_heads].
    std::vector<float> qt, wt;
    int64_t packed_heads = 0;
    // sum_h relu(q_h . key) * w_h for token t, one kernels::dot per head (V4).
    float score(int64_t t, const float* key) const;
    // The same sum for n keys at once in kernels::index_scores' order (V4.1; a register
    // tile of keys against all heads, ~10x the per-head dots on AVX-512 with the keys in
    // cache: bench/RESULTS.md; the bits differ from score()'s). Each key's score is
    // independent of the others in the call.
    void score_keys(int64_t t, const float* const* keys, int64_t n, float* out) const;
};
IndexQueries index_queries(const Linear& wq_b, const Linear& weights_proj, const ModelConfig& c,
                           ThreadPool* pool, const std::vector<float>& qr, const float* h,
                           std::span<const int64_t> pos, const std::vector<double>& inv_freq,
                           bool quantised_keys);
// The k best of scores (ties: the lower index), in ascending id order.
std::vector<int32_t> top_k_ascending(const std::vector<float>& scores, int64_t k);

// ---- MoE ----

struct Expert {
    Linear w1, w2, w3;
};
struct Moe {
    Linear gate;
    std::vector<float> gate_bias;
    std::vector<int32_t> tid2eid;  // [vocab, top_k] on hash layers
    bool hash = false;
    int64_t top_k = 0;
    std::vector<Expert> experts;
    bool has_shared = false;
    Expert shared;
};
// `f` is the "layers.N.ffn." prefix; hash: route by ffn.gate.tid2eid (checked), else
// ffn.gate.bias. `held`: the routed expert of each slot (-1: an empty slot), expert
// parallelism's local slots; empty: every expert, slot = expert id.
Status load_moe(const V4Loader& ld, const ModelConfig& c, const std::string& f, int64_t num_experts,
                int64_t top_k, bool hash, std::span<const int> held, Moe& m);
// Routed expert `expert` of the MoE at prefix `f` (a live EPLB move, a failover).
Status load_routed_expert(const V4Loader& ld, const ModelConfig& c, const std::string& f,
                          int expert, Expert& e);
// The routing of n tokens (token_ids: hash layers route by them): sqrt(softplus) scores,
// top-k by score + bias (or the token's hash row), weights normalised and scaled. ids and
// weights [n, top_k], each token's ids ascending.
void moe_route(const Moe& m, const ModelConfig& c, ThreadPool* pool, const float* h,
               std::span<const int32_t> token_ids, int64_t n, std::vector<int32_t>& ids,
               std::vector<float>& weights);
// One expert on n rows: y [n, hidden] = w2(silu(clamp(w1 x)) * clamp(w3 x)).
void expert_forward(const Expert& e, const ModelConfig& c, ThreadPool* pool, const float* x,
                    int64_t n, float* y);
// moe_route, the routed experts with the SwiGLU clamp (each token's outputs summed in
// ascending expert order from 0), plus the shared expert.
void moe_forward(const Moe& m, const ModelConfig& c, ThreadPool* pool, const float* h,
                 std::span<const int32_t> ids, int64_t n, float* out);
// moe_forward with the routed experts spread over the group (model/internal/ep_host.h),
// bitwise the same; n may be 0 (this rank brings no tokens to the layer).
Status moe_forward_ep(const Moe& m, const ModelConfig& c, ThreadPool* pool, EpHost& ep,
                      int moe_layer, const float* h, std::span<const int32_t> token_ids, int64_t n,
                      float* out);
// The expert-parallel group of a V4 / V4.1 model, joined (before the weights load); MoE
// layer l is layer l (INVALID_ARGUMENT for a config with a dense layer), `moe_of(l)` its
// Moe. `c`, `ld` and `pool` must outlive the result.
Result<std::unique_ptr<EpExperts<Expert>>> join_expert_parallel(
    const ExpertParallelOptions& options, const ModelConfig& c, const V4Loader& ld,
    ThreadPool* pool, std::function<Moe&(int layer)> moe_of);
// The same for a model whose layers (with a `moe` member) are `layers`.
template <typename Layer>
Result<std::unique_ptr<EpExperts<Expert>>> join_expert_parallel(
    const ExpertParallelOptions& options, const ModelConfig& c, const V4Loader& ld,
    ThreadPool* pool, std::vector<Layer>& layers) {
    return join_expert_parallel(options, c, ld, pool, [&layers](int l) -> Moe& {
        return layers[static_cast<size_t>(l)].moe;
    });
}

// ---- batching ----

// Checks the steps (CausalLm::forward_batch's errors; `model` names the family) and
// fills the token list and logit rows. Does not reset anything. Without
// `bounded_replay` a step that sets replay_end or decoder_begin is INVALID_ARGUMENT.
Status gather_steps(std::span<const SequenceStep> steps, const ModelConfig& c,
                    const std::string& model, Tokens& tk, std::vector<int64_t>& logit_tokens,
                    std::vector<int64_t>& logit_row, bool bounded_replay = false);

}  // namespace dsi::internal

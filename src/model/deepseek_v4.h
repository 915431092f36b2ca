// DeepseekV4Model: the forward pass of DeepSeek V4 (DeepseekV4ForCausalLM;
// reference deepseek_v4.md §2, docs/models.md "DeepSeek V4").
//
// Per block: manifold hyper-connections (hc_mult residual streams mixed by
// Sinkhorn-normalised matrices), MQA with one shared head_dim KV head (K = V) over a
// sliding window of the last `sliding_window` tokens plus, on compressed layers,
// compressed entries (ratio 4: gated pooling of 8 overlapping tokens, chosen per
// query by the indexer's top-k; ratio 128: gated pooling of 128 tokens, all attended),
// attention sinks, inverse RoPE on the output and the grouped low-rank output
// projection; then MoE with sqrt(softplus) scores, hash routing by token id on the
// first num_hash_layers layers, noaux_tc top-k elsewhere and the SwiGLU clamp. The
// final streams collapse through hc_head, norm and head; the MTP layer drafts the
// token after next.
//
// Numerics: weights stay in their stored format (FP8 e4m3 with block scales, FP4
// routed experts as MXFP4 blocks, bf16, f32) and are read by kernels/ matmul;
// activations and compressor state are f32. KV (Options::kv_dtype): f32 keeps the
// rows exact (no simulated quantisation; what llama.cpp's deepseek4 computes); e4m3
// stores them as the reference simulates and production stores them — main rows as
// 584-byte FP8 entries (448 e4m3 with a ue8m0 scale per 64, 64 rope dims in bf16),
// indexer keys Hadamard-rotated as 68-byte MXFP4 rows, the indexer's queries rotated
// and FP4-simulated (model/internal/v4_kv_format.h; docs/models.md).
//
// Determinism: every output element is reduced in one fixed order, so a sequence's
// results are bitwise the same whatever the batch, the prefill chunking (one chunk,
// several, or token by token) and the thread count.
//
// Cache (kv_layout(), the engine's view through CausalLm): compressed entries are
// paged, one entry per 4 tokens ("c4", ratio-4 layers, one main row), its indexer
// keys ("c4_index", one key row) and one entry per 128 tokens ("c128", ratio-128
// layers, one main row); the state slot holds a header (the main and MTP lengths),
// then per layer (main layers, then MTP) the sliding-window ring [sliding_window main
// rows] and the compressors' accumulators (f32 kv and score rows [coff * ratio, coff
// * D], main compressor then indexer's). A main row is head_dim floats (f32) or 584
// bytes (e4m3, head_dim 512); a key row index_head_dim floats or 68 bytes. A step at start_pos 0
// resets the slot (the accumulators' scores to -inf); the window ring and entries are only read
// where written. Prefixes are not reusable from the paged groups alone (the slot depends on the
// whole history), but a copy of the slot taken after B tokens resumes the sequence at B with the
// paged groups of [0, B) (KvLayout::state_snapshot_resumes): the engine's SWA state cache
// (docs/swa_cache.md).
//
// Thread model: a loaded model is immutable; forward calls use the model's thread
// pool, so callers serialise them. A V4State belongs to one sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsi {

// One sequence's attention state for every layer (main layers, then MTP): the
// sliding-window ring of raw KV rows, the compressed KV entries and indexer keys,
// and the compressors' partial-window accumulators (kv and score rows), in one
// contiguous cache of the model's kv_layout().
class V4State {
public:
    ~V4State();
    // Positions [0, capacity()) can be run; the next forward must start at length().
    int64_t capacity() const;
    int64_t length() const;
    // The MTP layer's next position (mtp_forward runs in order, like forward).
    int64_t mtp_length() const;
    // Bytes this state holds (window rings, compressed entries, accumulators).
    int64_t bytes() const;

    struct Impl;

private:
    friend class DeepseekV4Model;
    explicit V4State(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

struct V4Step {
    std::span<const int32_t> tokens;
    int64_t start_pos = 0;  // state->length(), or 0 (starts the sequence afresh)
    V4State* state = nullptr;
    bool all_logits = false;  // logits for every token, else only the last
};

struct V4Output {
    // Logits [rows, vocab]; sequence i's rows start at logit_row[i].
    std::vector<float> logits;
    std::vector<int64_t> logit_row;
    // The residual streams after the last layer [total tokens, hc_mult, hidden], in
    // batch order: the MTP layer's input.
    std::vector<float> streams;
    // With capture_layers set before the call: the streams after each layer
    // [layers][total tokens, hc_mult, hidden] (tests compare them per layer).
    bool capture_layers = false;
    std::vector<std::vector<float>> layer_streams;
};

class DeepseekV4Model final : public CausalLm {
public:
    struct Options {
        int num_threads = 1;
        // As DeepseekModel::Options::weight_format ("auto" keeps stored formats:
        // e4m3 + block scales, MXFP4 experts, bf16, f32).
        std::string weight_format = "auto";
        // kF32 or kE4m3 (the class comment); INVALID_ARGUMENT for kBf16, or kE4m3 with
        // an index_head_dim that is not a power of two >= 32.
        kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
        // With enabled(): this model is one rank of an expert-parallel group
        // (model/expert_parallel.h; docs/comm.md "V4 and V4.1 under EP"). It loads only its
        // own routed experts (and no MTP layer: mtp_forward is FAILED_PRECONDITION; the
        // cache keeps its MTP rows, so the layout is one process's), and every
        // forward_batch is a collective of the group (group_idle_step when this rank has
        // no work).
        ExpertParallelOptions expert_parallel;
    };

    // Reads and checks every tensor of the config (presence, dtype, shape);
    // INVALID_ARGUMENT if the source's config is not V4.
    static Result<std::unique_ptr<DeepseekV4Model>> load(std::unique_ptr<WeightSource> source,
                                                         Options options);
    ~DeepseekV4Model();

    const ModelConfig& config() const override;
    std::unique_ptr<V4State> new_state(int64_t capacity) const;

    // CausalLm (the engine's seam): the layout above, Options::kv_dtype, a contiguous cache, and
    // the forward pass over caches of that layout (BatchOutput::hidden stays empty).
    KvLayout kv_layout() const override;
    kernels::KvDtype kv_dtype() const override;
    std::unique_ptr<KvCache> new_kv_cache(int64_t capacity) const override;
    Status forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) override;
    Result<GroupStep> group_idle_step(bool leaving) override;
    std::optional<ExpertParallelStats> expert_parallel_stats(size_t max_windows) const override;

    // Runs the steps' tokens (sequences in one batch, each continuing its state, or
    // starting afresh at 0). Errors: empty steps or tokens, ids outside the vocabulary,
    // start_pos neither 0 nor the state's length, positions past capacity, two steps
    // sharing a state.
    Status forward_batch(std::span<const V4Step> steps, V4Output& out);
    Status forward(std::span<const int32_t> tokens, int64_t start_pos, V4State& state,
                   bool all_logits, V4Output& out);

    // MTP: for token i, combines the main model's final streams of position
    // start_pos + i (`streams` [T, hc_mult, hidden]) with the embedding of the token
    // after it (`next_tokens[i]`) and returns draft logits [T, vocab] for the token
    // after that. Runs the MTP layer at positions [start_pos, start_pos + T), which
    // must continue state.mtp_length(). FAILED_PRECONDITION without an MTP layer.
    Status mtp_forward(std::span<const int32_t> next_tokens, std::span<const float> streams,
                       int64_t start_pos, V4State& state, std::vector<float>& logits);

    struct Impl;

private:
    explicit DeepseekV4Model(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi

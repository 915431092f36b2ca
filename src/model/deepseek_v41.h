// DeepseekV41Model: the forward pass of DeepSeek-V4.1-Flash (DeepseekV41ForCausalLM;
// reference deepseek_v4.md §7; the choices where §7 is secondary or unverified are in
// docs/models_v41.md).
//
// What it keeps from V4 (model/internal/v4_blocks.h): MQA with one shared head_dim KV
// head (K = V), the own sliding window of every layer, attention sinks, inverse RoPE and
// the grouped low-rank output; the sqrtsoftplus MoE with the SwiGLU clamp; the mHC
// coefficients (Sinkhorn). What is new:
// - Single-pass mHC: each sub-layer mixes its input with the `pre` coefficients the
//   previous sub-layer computed (the first: stream 0), and the final collapse uses the
//   last sub-layer's; no hc_head.
// - CSA2 and the causal encoder / decoder split (CED): the encoder's Full layers
//   compress 2 tokens per entry (softmax-gated, no overlap, no APE), the decoder's only
//   Full layer (max(kv_source_layer_ids)) keeps one entry per token, projected from its
//   own input, i.e. from the encoder's output. Index keys are projected from each
//   normalised entry before its RoPE. Reuse layers attend to their Full layer's entries
//   with the latest Full / Reindex layer's top-k; Reindex layers score the Full layer's
//   keys with their own query, only inside the candidate blocks the decoder's Full
//   layer picked (the hierarchical sparse indexer).
// - Engram before the listed layers: hashed n-gram embeddings (orders 2..max, one table
//   per order and head) gate a value into every residual stream.
// - The DSpark draft blocks are loaded and checked, not run.
//
// Numerics: weights in their stored format (FP8 e4m3 with 32x32 ue8m0 blocks, FP4
// experts, bf16, f32) read by kernels/ matmul; activations, compressor state and (with
// kv dtype f32) the KV rows are f32. kv dtype e4m3 stores the rows as production does
// (docs/models_v41.md): main KV as FP4 e2m1 with an e4m3 scale per 16 values, index keys
// Hadamard-rotated MXFP4 (the indexer queries rotated and FP4-simulated like V4's), the
// window rows MXFP8 (e4m3 with a ue8m0 scale per 32).
//
// Cache (kv_layout()): groups "c2" / "c2_index" (the encoder Full layers' entries and
// keys, one per 2 tokens) and "c1" / "c1_index" (the decoder Full layer's, one per
// token); the state slot holds the length header, the last max_ngram - 1 token ids (the
// Engram n-grams), per main layer its window ring, and per ratio-2 Full layer its
// pending group (f32 kv and score rows). Position-addressed: a copy of the slot taken
// after B tokens resumes the sequence at B.
//
// Bounded replay (S-SWA, docs/swa_cache.md; kv_layout().swa_bounded_replay): a step's
// replay_end replays [start_pos, replay_end) from a fresh state — window attention of
// every layer truncated to the segment, the block KV of those positions read and never
// written (a checked invariant in the compressor) — and its decoder_begin runs the
// decoder only from there (CED compact prefill), its windows truncated there too. The
// floors live in the slot (after the header), so they hold across chunks. The stored
// region of the slot (kv_layout().swa_stored_ranges: lengths, Engram ids, encoder
// rings) is what the SWA state cache keeps in compact mode.
//
// Determinism: every output element is reduced in one fixed order, so a sequence's
// results are bitwise the same whatever the batch, the chunking and the thread count.
// Thread model: a loaded model is immutable; forward calls use the model's thread
// pool, so callers serialise them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsi {

// What one forward call did, per main layer (tests check that every layer kind acts).
struct V41Trace {
    // Summed over the batch's tokens: compressed entries each token could see, the ones
    // it attended to, and (Reindex) the candidates it scored.
    std::vector<int64_t> visible_entries, attended_entries, candidate_entries;
    // The attended entries of the batch's last token.
    std::vector<std::vector<int32_t>> last_token_entries;
    // Engram layers: the mean gate over tokens and streams (0 elsewhere).
    std::vector<double> engram_gate_mean;
    // The residual streams after each layer [tokens, hc_mult, hidden].
    std::vector<std::vector<float>> layer_streams;
};

class DeepseekV41Model final : public CausalLm {
public:
    struct Options {
        int num_threads = 1;
        std::string weight_format = "auto";  // as DeepseekV4Model::Options
        // kF32 or kE4m3 (the production formats above); INVALID_ARGUMENT for kBf16.
        kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
        // With enabled(): one rank of an expert-parallel group (model/expert_parallel.h;
        // docs/comm.md "V4 and V4.1 under EP"): only this rank's routed experts load (and
        // no DSpark tensors), every forward_batch / forward_encoder is a collective of the
        // group (group_idle_step when this rank has no work).
        ExpertParallelOptions expert_parallel;
    };

    // Reads and checks every tensor of deepseek_v41_tensor_specs (presence, dtype,
    // shape); INVALID_ARGUMENT if the source's config is not V4.1.
    static Result<std::unique_ptr<DeepseekV41Model>> load(std::unique_ptr<WeightSource> source,
                                                          Options options);
    ~DeepseekV41Model();

    const ModelConfig& config() const override;
    KvLayout kv_layout() const override;
    kernels::KvDtype kv_dtype() const override;
    std::unique_ptr<KvCache> new_kv_cache(int64_t capacity) const override;
    Status forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) override;
    Result<GroupStep> group_idle_step(bool leaving) override;
    std::optional<ExpertParallelStats> expert_parallel_stats(size_t max_windows) const override;
    // The same, recording what each layer did into `trace` when it is not null.
    Status forward_batch(std::span<const SequenceStep> steps, BatchOutput& out, V41Trace* trace);

    // CED prefill (reference §7.2): runs only the encoder layers and the decoder's kv
    // source projection (its compressor and index keys) over the steps' tokens, filling
    // every block-KV group as a full forward would, bitwise; the decoder layers' windows
    // are not computed. No logits. The same as forward_batch with every step's
    // decoder_begin past its tokens.
    Status forward_encoder(std::span<const SequenceStep> steps);

    // The window (SWA) row of main layer `layer` at position `pos` in `cache`'s slot,
    // decoded to head_dim floats (tests of bounded replay). REQUIRES: pos is one of the
    // last sliding_window positions the sequence wrote for that layer.
    std::vector<float> window_row(KvCache& cache, int64_t layer, int64_t pos) const;

    // DSpark tensors held (loaded and checked, not run yet).
    int64_t num_draft_tensors() const;

    struct Impl;

private:
    explicit DeepseekV41Model(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi

// CausalLm: the seam between the engine and a model family. The engine (engine/) sees a
// model only through this interface: its config, the per-sequence cache it needs
// (KvLayout: paged cache groups plus a fixed state slot, kernels/kv_cache.h) and one
// batched forward pass over sequences whose cache lives wherever the engine put it.
// DeepseekModel (V2/V3, MLA: one group of latent rows, no state) and DeepseekV4Model
// (V4 hybrid attention: compressed-KV groups + a state slot with the sliding-window
// ring and the compressors' partial windows) implement it; load_causal_lm() picks
// the implementation from the checkpoint's config.
//
// Contract of forward_batch for every implementation: each sequence's results are
// bitwise the same whatever else is in the batch (S-ENG-6); a step at start_pos 0
// starts the sequence afresh (a model with a state slot resets it); later steps
// continue the sequence in order.
//
// Thread model: a loaded model is immutable; forward_batch uses the model's thread
// pool, so callers serialise calls on one model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kernels/attention.h"
#include "kernels/kv_cache.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "model/weights.h"

namespace dsi {

// One sequence's part of a batched step: `tokens` at positions [start_pos,
// start_pos + tokens.size()) of the sequence whose KV lives in `cache`.
struct SequenceStep {
    std::span<const int32_t> tokens;
    int64_t start_pos = 0;
    KvCache* cache = nullptr;
    bool all_logits = false;  // logits for every token, else only for the last
    // SWA bounded replay (S-SWA; only models whose kv_layout().swa_bounded_replay is set,
    // others refuse a step that sets these). 0: not used.
    // replay_end > start_pos: an encoder-side replay. The sequence's state is started
    //   afresh at start_pos (nothing restored); positions [start_pos, replay_end) already
    //   have their block KV in the cache, which is read and never written; window
    //   attention reads no row before start_pos (truncated to the segment). `context`
    //   holds the tokens right before start_pos (the model uses the last few: V4.1's
    //   Engram n-grams).
    // decoder_begin: CED compact prefill. Decoder layers run only for positions >=
    //   decoder_begin and their windows read no row before it; positions below run the
    //   encoder (and the decoder's kv-source projection) only, and their logits rows are
    //   NaN. The floor is kept in the state until a later step sets another.
    int64_t replay_end = 0;
    int64_t decoder_begin = 0;
    std::span<const int32_t> context;
};

struct BatchOutput {
    // Logits rows [rows, vocab]; sequence i's rows start at logit_row[i] (one row, or
    // one per token with all_logits).
    std::vector<float> logits;
    std::vector<int64_t> logit_row;
    // Final-normed hidden states [total tokens, hidden], in batch order (V2/V3: the MTP
    // module's input). Empty for V4, whose MTP input is its residual streams
    // (DeepseekV4Model::forward_batch with V4Output).
    std::vector<float> hidden;
};

class CausalLm {
public:
    virtual ~CausalLm() = default;

    virtual const ModelConfig& config() const = 0;
    // The cache a sequence of this model needs; the engine builds its block pool's
    // groups and state slots from it.
    virtual KvLayout kv_layout() const = 0;
    // How group 0 stores its values (the KV store's block header records it).
    virtual kernels::KvDtype kv_dtype() const = 0;
    // A standalone cache for one sequence of up to `capacity` positions (calibration,
    // tests): every group contiguous, plus the state slot.
    virtual std::unique_ptr<KvCache> new_kv_cache(int64_t capacity) const = 0;
    // Runs several sequences in one step (contract above). Errors: empty steps or
    // tokens, ids outside the vocabulary, positions past a cache's capacity, a step
    // that does not continue its sequence (models with a state slot), two steps
    // sharing a cache.
    virtual Status forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) = 0;

    // Expert parallelism (model/expert_parallel.h): with a group, every forward_batch is a
    // collective of all ranks, and a rank without work must call this instead, as often
    // as its peers may step (engine/ep_rank.h loops it). `leaving`: this rank has nothing
    // more to do; the group stops when every rank says so. Without a group: kNotGrouped.
    enum class GroupStep { kNotGrouped, kAllIdle, kJoinedPeers, kStopped };
    virtual Result<GroupStep> group_idle_step(bool leaving) {
        (void)leaving;
        return GroupStep::kNotGrouped;
    }
    // The group's loads, moe_lb and placement changes (live EPLB) with at most the last
    // `max_windows` measured windows; nullopt without a group. Any thread.
    virtual std::optional<ExpertParallelStats> expert_parallel_stats(size_t max_windows) const {
        (void)max_windows;
        return std::nullopt;
    }
};

// Options of load_causal_lm (the union of what the families take).
struct ModelOptions {
    int num_threads = 1;
    // Weight formats per tensor class (DeepseekModel::Options::weight_format).
    std::string weight_format = "auto";
    // The plain reference loops instead of kernels/ (V2/V3 only).
    bool reference_kernels = false;
    // KV cache dtype: "f32", "bf16", "e4m3" for V2/V3; "f32", "e4m3" for V4 and V4.1.
    std::string kv_dtype = "f32";
    // Expert parallelism across processes (every family; model/expert_parallel.h).
    ExpertParallelOptions expert_parallel;
};

// DeepseekModel for V2/V3 checkpoints, DeepseekV4Model for V4, DeepseekV41Model for V4.1.
// INVALID_ARGUMENT names the option a family does not support (V4: reference_kernels, kv_dtype
// bf16); otherwise whatever the family's load() reports.
Result<std::unique_ptr<CausalLm>> load_causal_lm(std::unique_ptr<WeightSource> source,
                                                 const ModelOptions& options);

}  // namespace dsi

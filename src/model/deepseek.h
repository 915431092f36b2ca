// DeepseekModel: the reference forward pass of the DeepSeek V2/V3 family.
//
// Plain C++ with fp32 accumulation: embeddings, RMSNorm, MLA (optional q_lora,
// compressed KV with its norm, decoupled rope key shared by all heads, YaRN rope
// and the mscale softmax correction as the HF config defines it), dense MLP for the
// first `first_k_dense_replace` layers, the MoE gate (V2 softmax greedy /
// group-limited; V3 sigmoid + e_score_correction_bias + noaux_tc group top-k,
// norm_topk_prob, routed_scaling_factor), SwiGLU routed and shared experts, final
// norm, lm_head, and the MTP module. Attention uses the absorbed MLA form: queries
// are mapped into the latent space, attend over the cached latent rows, and the
// value up-projection is applied after.
//
// Weights are repacked once at load into the kernels' formats (Options::weight_format;
// kernels/packed_matrix.h) and multiplied by kernels/matmul.h's GEMV/GEMM, chosen per
// ISA at run time; Options::reference_kernels selects the plain loops that dequantise
// row by row instead. Every output element is reduced in one fixed order, so results
// do not depend on the thread count or on which other tokens are in the call (batch
// invariance by construction).
//
// Thread model: a loaded model is immutable; forward() may run concurrently for
// different sequences if each has its own KvCache, but it uses the model's thread
// pool, so callers serialise forward() calls on one model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/kv_cache.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "model/weights.h"

namespace dsi {

struct ForwardOutput {
    // Logits [num_rows, vocab]: for every input token if all_logits, else only the last.
    std::vector<float> logits;
    // Final-normed hidden states [num_tokens, hidden] (the MTP module's input).
    std::vector<float> hidden;
};

// One sequence's part of a batched MTP pass (DeepseekModel::mtp_forward_batch).
struct MtpStep {
    std::span<const int32_t> next_tokens;  // token i + 1 for each row i
    std::span<const float> hidden;         // [rows, hidden] main (or MTP) hidden states
    int64_t start_pos = 0;
    KvCache* cache = nullptr;
    int64_t logit_rows = 0;  // logits for the last this many rows
    // The layer's output (out.hidden, logits) is computed for the last this many rows
    // (at least logit_rows; -1: all); the rows before them only write their KV rows
    // (bitwise the rows a full pass writes): a catch-up of positions nothing drafts
    // from skips their attention and FFN (issue 24: the prompt catch-up of a switch).
    int64_t output_rows = -1;
};

struct MtpBatchOutput {
    std::vector<float> logits;       // [rows with logits, vocab]
    std::vector<int64_t> logit_row;  // sequence i's first logits row
    // MTP output before the head norm [total rows, hidden]; rows outside a step's
    // output_rows hold unspecified values.
    std::vector<float> hidden;
};

// A restricted MTP head (FR-Spec style draft vocabulary): the MTP head's rows of
// `ids()` only, in the stored format. Drafting over a few thousand frequent tokens
// instead of the whole vocabulary makes a draft cheap where the head dominates the MTP
// layer (small models: the embedded default model's head is 96 % of its MTP pass).
// Drafts only change speed (the target verifies them). Immutable; made by
// DeepseekModel::make_mtp_draft_head.
class MtpDraftHead {
public:
    ~MtpDraftHead();
    std::span<const int32_t> ids() const { return ids_; }

private:
    friend class DeepseekModel;
    struct Weights;
    MtpDraftHead(std::vector<int32_t> ids, std::unique_ptr<Weights> w);
    std::vector<int32_t> ids_;
    std::unique_ptr<Weights> w_;
};

class DeepseekModel final : public CausalLm {
public:
    struct Options {
        int num_threads = 1;
        // Weight formats per tensor class, repacked once at load for the kernels/
        // matmul (docs/kernels.md): "auto" keeps each stored format exactly; one
        // format for all ("bf16", "q8_0"/"int8", "f32", "f16", "e4m3", "mxfp4"); or a
        // list of class=format with classes attn, mlp, shared, experts, router, head,
        // e.g. "experts=q8_0,attn=bf16" or "experts=mxfp4" (S-ENG-9). A format a tensor
        // cannot take (e4m3 from a non-FP8 source, q8_0/mxfp4 with cols % 32 != 0)
        // falls back to its stored one.
        std::string weight_format = "auto";
        // The plain reference loops (row-by-row dequantisation) instead of kernels/.
        bool reference_kernels = false;
        // How the latent KV cache stores its values (SPEC S-ENG-9, kernels/attention.h):
        // "f32" (default: exact, keeps the llama.cpp agreement bounds), "bf16" (half the
        // bytes), "e4m3" (FP8 with one f32 scale per 16 values, 0.31x the bytes;
        // needs kv_lora_rank and qk_rope_head_dim multiples of 16).
        std::string kv_dtype = "f32";
        // With num_ranks > 1: this model is one rank of an expert-parallel group
        // (model/expert_parallel.h). It loads only its own routed experts (and no MTP
        // layer: mtp_forward is FAILED_PRECONDITION), and every forward_batch is a
        // collective of the group (group_idle_step when this rank has no work).
        ExpertParallelOptions expert_parallel;
    };

    // Reads and checks every tensor the config needs (presence, shape); the
    // returned model keeps `source` alive.
    static Result<std::unique_ptr<DeepseekModel>> load(std::unique_ptr<WeightSource> source,
                                                       Options options);
    ~DeepseekModel();

    const ModelConfig& config() const override;
    // One group "mla" of kv_num_layers() layers x one kv_row_floats() row per token; no
    // state slot; prefixes are reusable.
    KvLayout kv_layout() const override;
    // 4-byte words per cached token per layer: kv_lora_rank + qk_rope_head_dim values
    // encoded as kv_dtype() (as many floats for f32, fewer for bf16 / e4m3). A KvCache
    // for this model holds rows of this size; row() points at one.
    int64_t kv_row_floats() const;
    kernels::KvDtype kv_dtype() const override;
    // Layers a KvCache must hold: main layers plus the MTP layer(s).
    int64_t kv_num_layers() const;
    std::unique_ptr<KvCache> new_kv_cache(int64_t capacity) const override;

    // Runs `tokens` at positions [start_pos, start_pos + T): writes their KV rows
    // and fills `out`. Errors: token id outside the vocabulary, positions past the
    // cache capacity.
    Status forward(std::span<const int32_t> tokens, int64_t start_pos, KvCache& cache,
                   bool all_logits, ForwardOutput& out);

    // Runs several sequences in one step: matrix products batch all their tokens;
    // attention reads each token's own sequence only. Each sequence's results are
    // bitwise the same as running it alone (batch invariance). REQUIRES: entries use
    // distinct caches.
    Status forward_batch(std::span<const SequenceStep> steps, BatchOutput& out) override;
    Result<GroupStep> group_idle_step(bool leaving) override;
    std::optional<ExpertParallelStats> expert_parallel_stats(size_t max_windows) const override;

    // MTP (num_nextn_predict_layers = 1): for each i, combines the main model's
    // final hidden state of token i (`hidden` [T, hidden]) with the embedding of
    // the next token `next_tokens[i]` and returns draft logits [T, vocab] for the
    // token after it. Uses the MTP layer's rows of `cache` at the same positions.
    // FAILED_PRECONDITION if the checkpoint has no MTP layer. With `mtp_hidden`, also
    // returns the MTP layer's output before its head norm [T, hidden]: the hidden input
    // of the next recursive draft (spec/mtp.h). `logit_rows` >= 0 computes logits for the
    // last that many rows only ([logit_rows, vocab]; 0: none, KV rows only).
    Status mtp_forward(std::span<const int32_t> next_tokens, std::span<const float> hidden,
                       int64_t start_pos, KvCache& cache, std::vector<float>& logits,
                       std::vector<float>* mtp_hidden = nullptr, int64_t logit_rows = -1);

    // Several sequences' MTP passes in one (the rows of sequence i follow those of i-1 in
    // `out.hidden`); each sequence's results are bitwise those of mtp_forward alone.
    // With `head`, logits rows have head->ids().size() columns (column c scores token
    // head->ids()[c]).
    Status mtp_forward_batch(std::span<const MtpStep> steps, MtpBatchOutput& out,
                             const MtpDraftHead* head = nullptr);
    // The MTP head restricted to `ids` (strictly increasing, within the vocabulary,
    // non-empty): INVALID_ARGUMENT otherwise, FAILED_PRECONDITION without an MTP layer.
    Result<std::unique_ptr<const MtpDraftHead>> make_mtp_draft_head(
        std::span<const int32_t> ids) const;

    struct Impl;

private:
    explicit DeepseekModel(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi

// Worker: the device side of the engine's step loop. It runs a StepPlan (host <-> pool
// block copies, forward_batch, sampling) and returns a StepResult, and keeps what
// sampling needs per sequence (the sequence's own output for penalties, the last token
// it sampled, which is the next decode input: S-ASYNC, it never goes through the host).
//
// Inline (async off): submit() runs the plan at once and wait() returns its result.
// Async (after start()): plans queue to the worker thread; the host schedules step N+1
// while step N runs; results come back in submission order.
//
// Per plan, in order: drop released sequences' state; save swap victims' blocks to host
// slots; restore resumed sequences' rows; (re)create sequences marked init; forward pass
// with fetched store blocks copied in layer by layer on a swap-in thread beside it
// (S-KV-6: attention on a fetched row waits for its layer through kv::LayerGate);
// sample the rows marked sample (with speculation: verify the item's drafts by the
// exact rule, spec/verify.h, and report the rows to keep); then, with a drafter,
// propose the next step's drafts (the MTP drafter also writes its KV rows for every
// item, spec/mtp.h).
//
// Thread model: submit / wait / start / stop from the engine's scheduling thread only;
// everything else on the worker thread (or inline). The model and pool are used by the
// worker alone while a plan runs; the host orders block reuse by steps (engine.h).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "engine/step_plan.h"
#include "kv/block_pool.h"
#include "model/causal_lm.h"
#include "sampling/sampler.h"
#include "spec/drafter.h"
#include "spec/varlen.h"
#include "spec/verify.h"

namespace dsi::engine {

class Worker {
public:
    // REQUIRES: model and pool outlive the worker (swap-in writes fetched blocks into
    // the pool).
    // With a drafter, sampled items come back with next_drafts (at most spec_k). With
    // `varlen_cost` (DSpark variable-length verification, spec/varlen.h), the drafts of
    // each step are cut to the prefix subset that maximises expected tokens per unit of
    // step time under that cost curve, from acceptance estimates learnt here. `rule`:
    // how drafts are accepted at temperature > 0 (spec/verify.h).
    Worker(CausalLm* model, kv::BlockPool* pool, bool record_logits,
           int64_t swap_in_layer_delay_us, std::shared_ptr<spec::Drafter> drafter = nullptr,
           int spec_k = 0, std::shared_ptr<const spec::VerifyCostCurve> varlen_cost = nullptr,
           spec::Acceptance rule = spec::Acceptance::kExact);
    ~Worker();  // stop()
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    // Runs plans on a worker thread from now on (async).
    void start();
    // Runs the plans queued so far, then ends the thread. Idempotent.
    void stop();
    void submit(StepPlan plan);
    // The result of the oldest submitted plan not yet returned (blocks until it ran).
    // REQUIRES: a plan was submitted and not yet waited for.
    StepResult wait();

private:
    struct WorkerSeq {
        std::shared_ptr<const RequestShared> req;
        SamplingParams params;  // with this completion's seed
        std::vector<int32_t> output;
        int32_t last = 0;
        uint32_t epoch = 0;
        // Varlen: the drafter's probability of each draft proposed last (the host sends
        // a prefix of those drafts back to verify).
        std::vector<float> draft_probs;
        // MTP catch-up deferred by steps that did not draft: the target's hidden rows of
        // positions [pending_pos, + pending_rows), run through the MTP layer with the next
        // drafting step (or once they would pass kMaxPendingBytes), never if the sequence ends
        // first — so a gate that does not speculate costs no MTP work.
        std::vector<float> pending_hidden;
        int64_t pending_pos = 0;
        int64_t pending_rows = 0;
    };
    // Per sequence: 4 MiB of hidden rows (4,096 rows of the default model's 256 floats,
    // 146 of DeepSeek V3's 7,168), at least 256 rows. Large enough that a whole prompt
    // waits: the catch-up of prompt rows in the prefill step cost DSpark ~7 % of the
    // time at 64 sequences (issue 24), for sequences most of which never drafted.
    static constexpr int64_t kMaxPendingBytes = int64_t{4} << 20;
    int64_t max_pending_rows_ = 256;

    void loop();
    StepResult execute(StepPlan& plan);
    // Layer-major copy of every fetched block of the plan into its pool block.
    void swap_in_layers(StepPlan& plan, kv::LayerGate& gate);
    // Samples (and verifies the drafts of) item i after the forward pass.
    ItemResult sample_item(StepItem& it, size_t i);
    // The next step's drafts for every item that wants them, in one drafter call.
    Status draft(StepPlan& plan, StepResult& r);
    // Cuts `drafts` at the first one the sequence's grammar mask forbids.
    void cut_forbidden_drafts(const WorkerSeq& ws, std::vector<int32_t>& drafts);
    // Varlen: learns from item `it`'s verification (the drafts it verified, how many
    // were accepted, the token the target emitted after them).
    void observe_acceptance(const StepItem& it, const WorkerSeq& ws, const spec::Verified& v);
    // Varlen: cuts every drafting item's drafts to the chosen lengths; returns the
    // drafts cut.
    int64_t choose_lengths(const StepPlan& plan, StepResult& r);

    CausalLm* model_;
    kv::BlockPool* pool_;
    bool record_logits_;
    int64_t swap_in_layer_delay_us_;
    int64_t vocab_;
    int32_t eos_;
    int64_t state_bytes_;  // the model's per-sequence state slot (0: none)
    std::shared_ptr<spec::Drafter> drafter_;
    int spec_k_;
    std::shared_ptr<const spec::VerifyCostCurve> varlen_cost_;
    spec::Acceptance rule_;
    spec::AcceptanceEstimator estimator_;
    // Varlen: drafts asked of the drafter per sequence, one more than the longest
    // verified in the last choice (at most spec_k): drafts nobody would verify are not
    // drafted, and one more is always proposed so the choice can grow again.
    int varlen_k_;
    // Varlen: what drafting cost a step (EMA of the drafter calls that drafted), and the
    // steps left without drafting after speculation did not pay (then one probe draft).
    double draft_ns_ = 0;
    // Worker thread (or inline) only.
    std::unordered_map<int64_t, WorkerSeq> seqs_;
    Sampler sampler_;
    BatchOutput out_;
    std::vector<SequenceStep> steps_;
    std::vector<std::vector<int32_t>> inputs_;  // per item: decode input (+ drafts)
    spec::Verified verified_;
    std::vector<spec::DraftInput> draft_in_;
    // The deferred catch-up of a drafting step's sequences, run before its drafting.
    std::vector<spec::DraftInput> catchup_in_;
    std::vector<int> catchup_k_;
    std::vector<std::vector<int32_t>> catchup_out_;
    std::vector<int> draft_k_;
    std::vector<size_t> draft_item_;
    std::vector<std::vector<int32_t>> draft_out_;
    std::vector<std::vector<float>> draft_probs_;
    std::vector<std::vector<double>> draft_accept_;
    std::vector<spec::VarlenRequest> varlen_in_;
    std::vector<int32_t> draft_context_;
    TokenMask draft_mask_;

    Mutex mu_;
    CondVar cv_;
    std::deque<StepPlan> todo_ DSI_GUARDED_BY(mu_);
    std::deque<StepResult> done_ DSI_GUARDED_BY(mu_);
    bool stop_ DSI_GUARDED_BY(mu_) = false;
    std::thread thread_;  // owner thread only
};

}  // namespace dsi::engine

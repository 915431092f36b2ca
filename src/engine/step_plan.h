// StepPlan / StepResult: what the host hands the device side (engine/worker.h) for one
// step of the loop, and what comes back. A plan is a value: the host may change its own
// sequences (grow block tables, preempt, finish) while the worker runs it.
//
// Thread model: a plan is built on the engine's scheduling thread, moved to the worker,
// and never shared; a result goes the other way. RequestShared is immutable after
// add_request and shared by both threads (hence shared_ptr).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "kv/paged_kv_cache.h"
#include "kv/tiered_cache.h"
#include "sampling/sampler.h"

namespace dsi::engine {

// What every completion of one request shares; immutable after add_request.
struct RequestShared {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    std::shared_ptr<TokenMaskProvider> mask;
};

// One sequence's part of a planned step.
struct StepItem {
    int64_t seq_id = 0;
    uint32_t epoch = 0;
    std::vector<int32_t> tokens;  // empty: decode; the input is the worker's last sample
    // Decode with speculation (issue 24): drafted tokens verified after the input, at
    // positions start_pos + 1 ... (the worker proposed them after the previous step).
    std::vector<int32_t> drafts;
    int64_t start_pos = 0;
    kv::PagedKvCache cache;  // a copy of the block table: the host may grow its own
    bool sample = false;
    // The first item of an epoch (re)creates the worker's state of the sequence.
    bool init = false;
    std::shared_ptr<const RequestShared> req;
    uint64_t seed = 0;
    std::vector<int32_t> output;  // tokens generated before this epoch
    // Fetched blocks (S-KV-6) at positions [swap_in.begin_pos, + kBlockTokens * size).
    kv::SwapInBatch swap_in;
    // Rows swapped out to host memory, copied back into its new blocks before the step.
    std::vector<kv::HostCopy> restore;
    // SWA state cache (kv/tiered_cache.h plan_swa_step): a stored state copied into the
    // state slot before the step, and a copy of the slot to take right after it.
    std::shared_ptr<const kv::SwaState> swa_restore;
    int64_t swa_capture_position = 0;
    // S-SWA bounded replay (models with KvLayout::swa_bounded_replay): the tokens of
    // [start_pos - replay.size(), start_pos) re-run before `tokens` with truncated
    // attention, their block KV reused (SequenceStep::replay_end = start_pos), and the
    // tokens before them (`replay_context`, the model's n-grams). Not counted in the
    // result's num_tokens. decoder_begin: CED compact prefill (SequenceStep).
    std::vector<int32_t> replay;
    std::vector<int32_t> replay_context;
    int64_t decoder_begin = 0;
};

struct StepPlan {
    std::vector<StepItem> items;
    // Victims swapped out when this step was scheduled: copied to host before the step
    // (their blocks may be reused by it).
    std::vector<kv::HostCopy> save;
    std::vector<int64_t> release;  // worker state to drop (finished sequences)
    // Speculation: the worker proposes drafts after this step (next_drafts). The host
    // plans the next step only once this one's result is back (the drafts decide its
    // positions), and verifies drafts only in a step that runs alone.
    bool draft = false;
};

struct ItemResult {
    int64_t seq_id = 0;
    uint32_t epoch = 0;
    int64_t num_tokens = 0;  // tokens run through the model
    // KV rows that stay: num_tokens less the rejected drafts' rows (rolled back).
    int64_t num_kept = 0;
    bool sampled = false;
    // The sampled tokens in order: one, or with speculation the accepted drafts and the
    // target's own token after them (spec/verify.h). A token of -1 ends the list.
    std::vector<SampledToken> tokens;
    std::vector<float> logits;         // record_logits: one row per token
    int32_t num_drafts = 0;            // drafts verified
    int32_t num_accepted = 0;          // of which accepted
    std::vector<int32_t> next_drafts;  // proposals for the next step (speculation)
    int32_t drafts_cut = 0;            // varlen: proposals not sent to verification
    // MTP: rows of this sequence whose catch-up is deferred after the step (run with its
    // next drafting step: what switching speculation on costs, SpecGate::SwitchPrice).
    int64_t mtp_pending_rows = 0;
    // StepItem::swa_capture_position: the state slot after the step, as bytes.
    std::vector<uint8_t> swa_state;
};

struct StepResult {
    Status status;
    std::vector<ItemResult> items;
    bool speculative = false;  // the plan drafted or verified drafts
    int64_t start_ns = 0;
    // Speculation: time in the drafter this step, and the MTP catch-up rows it ran
    // (target hidden rows through the MTP layer, deferred ones included).
    int64_t draft_ns = 0;
    int64_t draft_catchup_rows = 0;
    // Of them, the rows deferred by earlier steps that did not draft, and the time of
    // their catch-up (a drafter call of its own, KV rows only; part of draft_ns).
    int64_t deferred_catchup_rows = 0;
    int64_t deferred_catchup_ns = 0;
    int64_t end_ns = 0;
    int64_t cpu_ns = -1;  // the worker thread's CPU time from start_ns to end_ns
    // Swap-in (S-KV-6) of this step, if any.
    int64_t swap_in_blocks = 0;
    int64_t swap_in_bytes = 0;
    int64_t swap_in_ns = 0;          // copy thread: start to last layer
    int64_t swap_in_wait_ns = 0;     // attention waiting on layers
    int64_t swap_in_overlapped = 0;  // items whose forward started before the last layer
};

}  // namespace dsi::engine

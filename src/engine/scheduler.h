// Scheduler: the per-step batching policy of one engine (a pure policy class: no I/O,
// clock injected through Env, so sim/ can drive the same code).
//
// Input: the running sequences in admission order, the waiting ones in arrival order,
// and the KV blocks the pool can hand out. Output: which sequences run this step with
// how many new tokens, which are admitted, which are preempted, which ran past their
// deadline. Policy:
//   1. Deadlines: a sequence whose deadline has passed is reported expired, not run.
//   2. Decode first: every running decoding sequence gets one token (1 + its drafts
//      with speculation), oldest first, up to max_batched_tokens. Decode is never
//      refused for time budget.
//   3. Prefill chunks, running sequences first then admissions, strictly FIFO: each
//      chunk is the largest q whose cost fits the step's remaining time budget
//      (S-LB: cost(q, c) solved by PrefillCostModel, capped at 32,768), within
//      max_batched_tokens and the blocks left; the first sequence that gets nothing
//      stops the pass (no overtaking). If a step would otherwise be empty, the head
//      gets at least one token, so a budget smaller than one token cannot stall.
//      The cost model's base_ns is charged once a step (to its first entry), not per
//      sequence: it is the step's fixed part — for a MoE the experts any chunk touches,
//      which a calibration at 16-token chunks puts at ~0.25 s on a 30-layer CPU model;
//      charged per decoding sequence it would stop admission at a handful of them.
//   4. Admission stops at max_running_seqs and never preempts.
//   5. Preemption: a running sequence that needs a block when none is left takes them
//      from the newest running sequences that are not yet scheduled in this step
//      (their blocks go back; they re-enter the waiting queue at their arrival
//      position; the engine either swaps their rows to host memory or recomputes
//      them later — to the scheduler a swapped-out sequence is a waiting one whose
//      admission needs num_swapped_blocks more blocks). Only newer sequences are ever preempted, so
//      the oldest always progresses: no deadlock, no starvation, given that every sequence fits in
//      the pool alone (the engine rejects one that cannot).
// Thread model: not thread-safe; called by the engine's scheduling thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "engine/prefill_cost_model.h"
#include "kv/block_key.h"

namespace dsi::engine {

struct SchedulerConfig {
    int64_t max_running_seqs = 64;
    int64_t max_batched_tokens = 8192;
    // S-LB compute_quota_limit: the time budget of one step.
    double step_budget_ns = 2e9;
    PrefillCostModel cost;

    Status validate() const;
};

// What the scheduler sees of one sequence.
struct SeqView {
    int64_t id = 0;
    int64_t num_tokens = 0;            // tokens whose KV must be computed before decoding
    int64_t num_computed = 0;          // KV rows computed or in flight
    int64_t num_blocks = 0;            // blocks held
    int64_t num_exclusive_blocks = 0;  // blocks that preempting it would free
    bool decoding = false;             // prefill done; the next step computes one token
    // Tokens a decode step computes: 1, or 1 + drafts to verify with speculation. Less
    // than that (at least 1) when max_batched_tokens is short; drafts then shrink.
    int64_t decode_tokens = 1;
    bool can_run = true;               // false: nothing to do this step (e.g. max_tokens in flight)
    int64_t deadline_ns = 0;           // engine clock; 0: none
    // Waiting sequences only: the prefix-cache hit (whole blocks, one token kept back).
    int64_t num_cached_tokens = 0;
    int64_t num_cached_unreferenced_blocks = 0;  // hit blocks that pinning takes from the pool
    // Waiting sequences swapped out to host memory: admission allocates this many
    // blocks to copy the saved rows back into (num_cached_tokens of them).
    int64_t num_swapped_blocks = 0;
};

struct ScheduledSeq {
    int64_t id = 0;
    int64_t num_new_tokens = 0;
    int64_t num_new_blocks = 0;  // to allocate before running
    bool admit = false;          // from the waiting queue
};

struct ScheduleDecision {
    std::vector<ScheduledSeq> scheduled;
    std::vector<int64_t> preempted;  // running -> waiting, blocks released
    std::vector<int64_t> expired;    // deadline passed (running or waiting)
    double cost_ns = 0;              // estimated by the cost model
    int64_t num_tokens = 0;
};

using kv::blocks_for_tokens;

class Scheduler {
public:
    // REQUIRES: config.validate() is OK; env outlives the scheduler.
    Scheduler(SchedulerConfig config, Env* env);

    ScheduleDecision schedule(std::span<const SeqView> running, std::span<const SeqView> waiting,
                              int64_t num_available_blocks) const;
    const SchedulerConfig& config() const { return config_; }

private:
    SchedulerConfig config_;
    Env* env_;
};

}  // namespace dsi::engine

// Engine: the offline serving core of one model replica. Requests come in with a
// streaming callback; each step mixes prefill chunks and decode tokens of many
// sequences in one forward_batch, with KV in 128-token blocks shared through the
// prefix cache.
//
// Request lifecycle (per completion; a request with n > 1 has n sequences):
//   waiting -> prefilling (one or more chunks) -> decoding -> finished
//   any state -> finished(abort | deadline)  (abort frees all blocks at once)
//   prefilling/decoding -> waiting on preemption (blocks released; recomputed later
//   from prompt + tokens generated so far, giving the same tokens: S-ENG-6/7)
// Completions 1..n-1 of a request wait until completion 0 has finished its prefill,
// then reuse its full prompt blocks through the prefix index.
//
// Step loop (S-ASYNC), on the thread that calls step()/run():
//   schedule(N+1) -> submit(N+1) -> wait(N) -> post-process(N)
// With async on (the default), a worker thread runs forward + sampling of step N
// while the host schedules N+1: the host assumes N succeeds (its decode tokens
// exist), and step N+1's decode inputs are the tokens sampled in N, which the worker
// resolves itself, so they never wait for the host. A token found to end a sequence
// in post-processing cancels the already-scheduled next token of that sequence (its
// result is dropped). With async off, the host waits for each step before
// scheduling the next (for comparison). Block data hazards are ordered by steps: a
// block freed while step N is in flight is only handed out to step N+2 or later,
// and a block enters the prefix index only after the step that completed it.
//
// Sampling runs on the worker: penalties see the sequence's own tokens only and
// randomness is keyed by (seed, position), so a request's tokens do not depend on
// its neighbours (with the model's batch-invariant kernels, S-ENG-6).
//
// Where the parts live: this file and engine.cc are the host side (lifecycle, step
// loop, post-processing); engine/worker.h the device side (runs a StepPlan:
// engine/step_plan.h); engine/scheduler.h the batching policy; kv/tiered_cache.h every
// sequence's KV across the tiers (pool blocks, prefix pins, store fetch, write-behind,
// host swap slots).
//
// KV store tiers (S-KV-4..7, docs/kvstore.md), when EngineOptions::kv_store_uri (or
// kv_store) is set:
//   - write-behind: a block published to the prefix index from prefill or decode is
//     offered to a kvstore::WriteBehind in post-processing (one bounded copy; the
//     write happens on the WriteBehind thread; a full queue drops, counted);
//   - admission: after the local prefix match, the rest of the hash chain is matched in
//     the store (metadata only), the hits are fetched on the Fetcher thread while the
//     sequence waits (other requests keep being scheduled), then placed into pool
//     blocks the sequence owns; a block that fails its checks, a late fetch or a dead
//     store is a miss and the sequence computes more;
//   - swap-in (S-KV-6): the worker copies the fetched blocks into the pool on a
//     swap-in thread layer by layer while the forward pass runs; attention on a
//     fetched row waits (with a deadline) on a per-layer readiness counter.
// KV hand-over landings (issue 18, EngineOptions::kv_landing, engine/kv_landing.h):
// between steps the engine serves a receiver's asks for pool blocks (a reservation is
// handed out once the steps in flight when it was taken have completed), lands them
// (prefix index, held for the continuation) or drops them; a continuation whose tokens
// give the landed keys starts past the prompt's tail rows too.
//
// The model (model/causal_lm.h) says what a sequence's cache is (KvLayout): paged
// groups become the pool's cache groups; a state slot (DeepSeek V4) becomes one slot per
// running sequence, so max_running_seqs is capped by the slots that fit in half of
// kv_cache_bytes. A layout whose prefixes are not reusable turns prefix caching, the KV
// store and swapping off (logged once at create): a hit the model cannot honour is
// never offered, and preemption recomputes. A state slot that resumes from a copy taken
// at a block boundary (KvLayout::state_snapshot_resumes, V4) keeps prefix caching in
// this process through the SWA state cache (kv/tiered_cache.h, docs/swa_cache.md: slot
// copies at the S-KV-9 positions in a host pool, the S-KV-10 hit rule, exact replay);
// the store and swapping stay off for it.
//
// Thread model: add_request / abort / step / run / stats are called from one thread
// (the owner); callbacks run on that thread inside step(). TokenMaskProvider::fill
// runs on the worker thread. The model must not be used by anyone else meanwhile.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "engine/kv_landing.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/kv_export.h"
#include "kv/swa_pool.h"
#include "kv/yoco_prefill.h"
#include "model/causal_lm.h"
#include "sampling/sampler.h"
#include "spec/drafter.h"
#include "spec/varlen.h"

namespace dsi {
namespace kvstore {
class BlockStore;
}
class Tokenizer;
}  // namespace dsi

namespace dsi::engine {

using RequestId = int64_t;

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kDeadline, kError };
const char* finish_reason_name(FinishReason r);

// One step as the worker ran it (EngineOptions::on_step): the worker's wall time and its
// thread's CPU time over the step (with --threads 1 the forward runs on that thread, so
// wall - CPU is the time the worker was descheduled), and per item the tokens run and the
// context before them. The simulator's step costs are fitted from these (sim/step_fit.h).
struct StepRecord {
    struct Item {
        int64_t q = 0;  // tokens run through the model (a prefill chunk, or 1 + drafts)
        int64_t c = 0;  // the sequence's rows computed before this step
    };
    int64_t start_ns = 0;  // steady clock (base/clock.h)
    int64_t end_ns = 0;
    int64_t cpu_ns = 0;  // the worker thread's CPU time in the step; -1: unknown
    std::vector<Item> items;
};

struct EngineOptions {
    bool async = true;  // S-ENG-5: overlap host work with the forward pass
    bool prefix_cache = true;
    int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
    int64_t kv_cache_bytes = int64_t{2} << 30;
    int64_t max_model_len = 0;       // 0: the model's max_position_embeddings
    std::string model_id = "model";  // part of the prefix-cache salt
    SchedulerConfig scheduler;
    // Prefill cost model fitted by `dsinfer calibrate` (engine/calibrate.h): "" = use
    // scheduler.cost as given; else a JSON file that replaces scheduler.cost when it
    // exists (a malformed one fails create()); when it does not, scheduler.cost becomes
    // conservative_cpu_cost_model() of the model's sizes (not the H800-class default).
    std::string cost_model_path;
    // S-ENG-6: a request's logits do not depend on the other requests in its step.
    // Every model kernel is batch-invariant today, so false changes nothing yet
    // (docs/engine.md, "Batch invariance"); the switch is where a faster,
    // batch-dependent kernel path will be selected.
    bool batch_invariant = true;
    // Preemption by swapping (engine/swap.h): a preempted sequence's KV blocks are
    // copied to a host buffer of at most this many bytes and copied back when it
    // resumes; when the buffer has no room it is preempted by recompute. 0: recompute.
    int64_t swap_space_bytes = int64_t{1} << 30;
    // Speculative decoding (issue 24, docs/engine.md "Speculative decoding"): drafts
    // verified in the same step as everyone else's work, output token for token the
    // same as without (exact acceptance rule). Validated by create() (k range, MTP
    // present). A step that drafts or verifies runs synchronously (a step's input
    // positions depend on how many drafts the last one accepted); with variable-length
    // verification (speculative.varlen) a spec::SpecGate measures, per batch size,
    // whether speculating beats the asynchronous loop without it, and the engine runs
    // whichever is faster (async when it does not speculate, if `async`).
    spec::SpecConfig speculative;
    // Tests: a drafter of the caller's (wins over speculative.method; k from
    // speculative.k()).
    std::shared_ptr<spec::Drafter> drafter;
    // Variable-length verification's step-cost curve (speculative.varlen): the curve
    // `dsinfer calibrate` profiled (engine/calibrate.h, serving loads it); without one,
    // create() profiles a quick curve of the model in memory.
    std::shared_ptr<const spec::VerifyCostCurve> verify_cost;
    // Variable-length verification's on/off gate (probe and hold lengths; measure =
    // false speculates always, for tests of the verification choice alone).
    spec::SpecGate::Options spec_gate;
    bool record_logits = false;            // pass each sampled row's logits to the callback (tests)
    // Called with each step's record after its result is processed, on the thread that
    // calls step(); must not block (the serving loop waits). Empty: no records are made.
    std::function<void(const StepRecord&)> on_step;
    const Tokenizer* tokenizer = nullptr;  // needed for text and stop strings
    // KV block store below the pool (S-KV-4..7): "" = none; else a kvstore URI
    // ("file:///path", "redis://..."). An unreachable store is not an error: serving
    // goes on without it (every store failure is a miss or a dropped write).
    std::string kv_store_uri;
    // Or a store the caller owns (tests, fault injection); wins over kv_store_uri.
    // REQUIRES: outlives the engine.
    kvstore::BlockStore* kv_store = nullptr;
    int64_t kv_store_match_timeout_ms = 200;   // match_prefix deadline (metadata only)
    int64_t kv_store_fetch_timeout_ms = 5000;  // a fetch later than this is a miss
    int64_t kv_store_write_queue_bytes = int64_t{256} << 20;  // write-behind budget
    // Host buffers the fetcher reads blocks into (reused; a buffer is free again once
    // its block has been swapped in): at most this many bytes, at least one block.
    int64_t kv_store_fetch_buffer_bytes = int64_t{256} << 20;
    // SWA state cache (docs/swa_cache.md; models whose state slot resumes from a copy
    // taken at a block boundary: V4): the host pool of stored states, in bytes, or a pool
    // the caller owns (wins; REQUIRES: outlives the engine). 0 and no pool: such a
    // model gets no prefix hits. Ignored for models without a state slot.
    int64_t swa_pool_bytes = int64_t{1} << 30;
    kv::SwaStatePool* swa_pool = nullptr;
    // V4.1 (CED) YOCO prefill and bounded replay (S-SWA, kv/yoco_prefill.h,
    // docs/swa_cache.md; models with KvLayout::swa_bounded_replay, ignored by others).
    // compact (default): a prompt's decoder layers run only over its last keep_tokens
    // (windows truncated there), an SWA miss on a prefix hit is served by bounded replay
    // of one unit, and the SWA pool keeps only the encoder windows (S-KV-8's stored
    // region). off: every layer over every token and states of the whole slot (exact:
    // a hit equals the cold run bitwise). keep_tokens below the window plus the draft
    // count (speculative.k() when speculating) is INVALID_ARGUMENT at create.
    kv::YocoPrefillSettings yoco_prefill;
    // Issue 18 hand-over into this engine's pool (engine/kv_landing.h): a KvInbox
    // receives into blocks reserved here and the continuation attaches them (the
    // prompt's tail rows too). Attached at create when the layout has landings (V2/V3
    // with prefix caching); else the inbox keeps the store-tier path. May be shared with
    // the engines that follow this one (one attached at a time).
    std::shared_ptr<KvLanding> kv_landing;
    bool kv_store_write = true;          // offer completed blocks to the store
    int64_t swap_in_layer_delay_us = 0;  // tests: slow the swap-in per layer
};

struct GenerateRequest {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    std::string cache_salt;   // tenants with different salts never share prefix blocks
    int64_t deadline_ns = 0;  // on the engine's Env clock; 0: none
    // Structured output; shared by the request's completions (reason: the caller
    // keeps it to inspect, the worker thread uses it until the request ends).
    std::shared_ptr<TokenMaskProvider> mask;
    // S-KV-3 retention class of the blocks it writes to the KV store (agent: shorter TTL).
    bool agent_traffic = false;
    // A continuation (issue 18 failover): output tokens another engine already produced
    // for this request and the client has. They are prefilled with the prompt and count
    // as output (max_tokens, penalties, the sampler's positions, the grammar, stop
    // strings), so the tokens that follow are the ones the first engine would have
    // produced next; their text is not sent again. REQUIRES: sampling.n == 1 and fewer
    // tokens than max_tokens.
    std::vector<int32_t> resume_output;
    // Issue 18 prefill -> decode hand-over: the finishing event (kLength or kStop) of
    // completion 0 carries a copy of its published full blocks (TokenEvent::kv_export),
    // for the server to send to the decode engine. Ignored with n > 1. A length finish
    // then does not flush the text held back (a partial UTF-8 character, a possible
    // stop-string prefix): the continuation on the other engine holds and releases it.
    bool export_kv = false;
};

struct TokenEvent {
    RequestId request_id = 0;
    int32_t index = 0;   // completion index (n > 1)
    int32_t token = -1;  // -1: no token (finish-only event)
    std::string text;    // new text (with a tokenizer; stop strings cut here)
    float logprob = 0.0f;
    std::span<const std::pair<int32_t, float>> top_logprobs;
    std::span<const float> logits;  // record_logits only; valid during the callback
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
    // Prompt tokens this request took from the prefix cache at its first admission
    // (0 before admission); per-request usage.cached_tokens in the server.
    int64_t cached_prompt_tokens = 0;
    // This completion's speculative decoding so far: drafts verified, of which
    // accepted, and the steps that verified any (per-request usage, on request).
    int64_t spec_draft_tokens = 0;
    int64_t spec_accepted_tokens = 0;
    int64_t spec_verify_steps = 0;
    // GenerateRequest::export_kv: the finished sequence's full blocks (null when it has
    // none or the model's layout cannot be exported: kv::TieredCache::export_blocks).
    std::shared_ptr<const kv::KvExport> kv_export;
};
using StreamCallback = std::function<void(const TokenEvent&)>;

struct EngineStats {
    int64_t num_requests = 0;
    int64_t num_finished = 0;
    int64_t num_live_seqs = 0;            // sequences waiting or running now
    int64_t prompt_tokens = 0;            // admitted prompt tokens (per completion)
    int64_t cached_prompt_tokens = 0;     // of which taken from the prefix cache
    int64_t computed_prefill_tokens = 0;  // prefill tokens run through the model
    int64_t output_tokens = 0;
    int64_t steps = 0;
    int64_t preemptions = 0;          // all preemptions (swap + recompute)
    int64_t preemptions_swapped = 0;  // of which swapped to host memory
    int64_t swapped_out_blocks = 0;
    int64_t swapped_in_blocks = 0;
    int64_t swap_slots_held = 0;     // host swap blocks held by swapped-out sequences now
    int64_t state_slots = 0;         // per-sequence state slots of the model (V4), total
    int64_t state_slots_in_use = 0;  // held by running sequences now
    // Speculative decoding: decode items that verified drafts, drafts verified, of
    // which accepted; per draft position j (0-based): verified with a draft at j, and
    // accepted at j (acceptance at j = accepted_at[j] / drafted_at[j]).
    int64_t spec_verify_steps = 0;
    int64_t spec_draft_tokens = 0;
    int64_t spec_accepted_tokens = 0;
    std::array<int64_t, spec::kMaxSpeculativeTokens> spec_drafted_at{};
    std::array<int64_t, spec::kMaxSpeculativeTokens> spec_accepted_at{};
    // Steps that verified at least one draft (verified tokens per step =
    // spec_draft_tokens / spec_steps), and drafts proposed but not verified because
    // variable-length verification judged them not worth their cost.
    int64_t spec_steps = 0;
    int64_t spec_varlen_cut_tokens = 0;
    // Where a gated run's time goes (speculative.varlen): decode-only steps in each mode
    // ([0] plain, [1] speculating) with their wall time between consecutive results and
    // tokens emitted; steps planned as probes of each mode; mode switches; time in the
    // drafter and the MTP catch-up rows it ran (every drafting config).
    std::array<int64_t, 2> spec_gate_steps{}, spec_gate_ns{}, spec_gate_tokens{};
    std::array<int64_t, 2> spec_gate_probe_steps{};
    int64_t spec_gate_switches = 0;
    int64_t spec_draft_ns = 0;
    int64_t spec_catchup_rows = 0;
    // Of the catch-up rows, those deferred by plain steps and caught up when the
    // sequence drafted again (a drafter call of their own: their time, which prices a
    // switch of the gate, spec::SwitchPrice), and the gate's decisions against switching
    // speculation on because that catch-up would cost more than the remaining output
    // (max_tokens) could gain.
    int64_t spec_deferred_catchup_rows = 0;
    int64_t spec_deferred_catchup_ns = 0;
    int64_t spec_gate_priced_out = 0;
    int64_t forward_ns = 0;   // worker busy time
    int64_t host_gap_ns = 0;  // worker idle between consecutive steps while work existed
    kv::BlockPoolStats pool;
    // KV store tiers (hits per tier in blocks: device = pool.hit_blocks).
    int64_t store_lookups = 0;         // admissions that asked the store
    int64_t store_hit_blocks = 0;      // blocks fetched, verified and placed in the pool
    int64_t store_miss_blocks = 0;     // matched in metadata but not usable (damaged, late)
    int64_t store_hit_tokens = 0;      // prompt tokens taken from the store
    int64_t store_bytes_read = 0;      // payload bytes swapped in
    int64_t store_blocks_offered = 0;  // write-behind offers accepted
    int64_t store_blocks_dropped = 0;  // write-behind drops (queue full or stopping)
    int64_t store_blocks_written = 0;  // written by the write-behind thread
    int64_t store_puts_dropped = 0;    // refused by the store (full, down): counted there
    int64_t store_bytes_offered = 0;
    int64_t fetch_count = 0, fetch_sum_ns = 0, fetch_max_ns = 0;  // submit -> ready
    int64_t kv_exports = 0;  // finished sequences whose blocks were exported (export_kv)
    int64_t kv_export_bytes = 0;
    int64_t swap_in_count = 0, swap_in_sum_ns = 0;  // per step with swap-ins: copy time
    int64_t swap_in_wait_ns = 0;     // attention time spent waiting on swap-in layers
    int64_t swap_in_overlapped = 0;  // swap-ins whose forward started before the last layer
    // Fetch host buffers (kvstore::FetchBufferStats): created, held now, handed out.
    int64_t fetch_buffers_allocated = 0, fetch_buffers_in_use = 0, fetch_buffer_leases = 0;
    // SWA state cache (kv::TieredCacheStats): the hit rule's counters per traffic class
    // (block hits, SWA hits, replays and their tokens, pool bytes and evictions), slot
    // copies taken, states stored / restored / refused (a miss), and tokens computed past
    // S-KV-10's plan (the model replays exactly: kReplay starts at an older state).
    kv::SwaCacheCounters swa;
    int64_t swa_captures = 0;
    int64_t swa_states_stored = 0;
    int64_t swa_states_restored = 0;
    int64_t swa_states_rejected = 0;
    int64_t swa_fallback_tokens = 0;
    // CED compact prefill (S-SWA decoder side): prompt tokens the decoder layers ran
    // for, and those they skipped (encoder and kv-source projection only); in total and
    // per traffic class (kvstore::TrafficClass order, as swa.by_class).
    int64_t yoco_decoder_tokens = 0;
    int64_t yoco_decoder_skipped_tokens = 0;
    struct YocoClass {
        int64_t decoder_tokens = 0;
        int64_t decoder_skipped_tokens = 0;
    };
    std::array<YocoClass, kvstore::kNumTrafficClasses> yoco_by_class{};
    // Expert parallelism (model/expert_parallel.h): per-rank expert load, moe_lb of the
    // last measured window, placement changes (live EPLB); nullopt without a group.
    std::optional<ExpertParallelStats> expert_parallel;
    // Attention data parallelism over an --ep group (engine/dp_front.h): per rank (0 =
    // this one) the sequences running now, KV blocks in use, requests sent to it. Empty
    // without a DpFront. The totals above (requests, tokens) then count every rank's.
    struct DpRank {
        int64_t running_seqs = 0;
        int64_t kv_blocks_used = 0;
        int64_t kv_blocks = 0;
        int64_t requests = 0;  // since the start (re-runs after a failover included)
        int64_t prefix_blocks = 0;  // chain keys the front holds for it (prefix routing)
    };
    std::vector<DpRank> dp_ranks;
    int64_t dp_reruns = 0;  // requests re-run on the healthy ranks after a rank died
    // Prefix routing (engine/dp_balance.h): requests sent to the rank with the longest
    // matched prefix instead of the least-loaded one; the matched full-block tokens the
    // front predicted on the chosen ranks (usage cached_tokens is what the ranks took);
    // requests whose longest match was passed over because its rank was too loaded.
    int64_t dp_prefix_routed = 0;
    int64_t dp_prefix_matched_tokens = 0;
    int64_t dp_prefix_overloaded = 0;
};

// One KV block as the prefill -> decode hand-over carries it, and the store tier holds
// it: every cache group's layers in group order (kv::num_store_layers), each layer 128
// tokens of that group. V2/V3: the one group, every layer the same size. V4 / V4.1 (a
// state slot that resumes from a copy, KvLayout::state_snapshot_resumes): the groups'
// layers differ in size, and a stored SWA state travels with the blocks (the slot's
// words and the seal, kv::swa_sealed_ok). nullopt when the model's prefixes cannot be
// reused at all (a state slot that does not resume from a copy).
struct StoreBlockShape {
    std::vector<uint64_t> layer_block_bytes;  // per store layer: one layer of one block
    uint32_t dtype = 0;                       // the store's dtype code
    uint64_t swa_state_bytes = 0;             // a stored SWA state; 0: none (V2/V3)

    uint32_t num_layers() const { return static_cast<uint32_t>(layer_block_bytes.size()); }
    uint64_t block_bytes() const;  // every layer of one block
};
// `yoco`: the engine's YOCO truncation mode; under V4.1's bounded replay (compact) a
// stored state is the slot's stored region only (S-KV-8), and so is a handed-over one.
std::optional<StoreBlockShape> store_block_shape(
    const CausalLm& model, kv::YocoTruncationMode yoco = kv::YocoTruncationMode::kCompact);

// What a serving loop drives (server::EngineService, `generate`): one Engine, or a
// DpFront spreading requests over the ranks of an expert-parallel group
// (engine/dp_front.h). The contract is Engine's below; a front may deliver an abort's
// finish event in a later step() rather than inside abort(). Thread model: Engine's.
class StepEngine {
public:
    virtual ~StepEngine() = default;
    virtual Result<RequestId> add_request(GenerateRequest request, StreamCallback callback) = 0;
    virtual Status abort(RequestId id) = 0;
    virtual Status step() = 0;
    virtual bool has_work() const = 0;
    virtual EngineStats stats() const = 0;
    // Called by a serving loop while the engine has no work (every ~50 ms): an engine
    // whose parts live in other processes checks on them here, so a part that died while
    // nothing ran is replaced now, not when the next request arrives (DpFront).
    virtual Status idle_check() { return Status::ok(); }
};

// What add_request checks a request against (Engine::validate_request). A front with
// no model (engine/dp_front.h) checks the requests it sends to its ranks with the same
// rules: every rank has the same options.
struct RequestLimits {
    int64_t vocab = 0;
    int64_t max_model_len = 0;
    int64_t num_pool_blocks = -1;  // -1: not known (the pool check is left to the engine)
    bool has_tokenizer = false;    // stop strings need one
};
// The errors of Engine::add_request below for `limits`.
Status validate_request(const GenerateRequest& request, const RequestLimits& limits);

class Engine final : public StepEngine {
public:
    // REQUIRES: model and env outlive the engine.
    static Result<std::unique_ptr<Engine>> create(CausalLm* model, EngineOptions options, Env* env);
    ~Engine() override;

    // INVALID_ARGUMENT (bad sampling, empty prompt, ids outside the vocabulary),
    // OUT_OF_RANGE (prompt + max_tokens over max_model_len), RESOURCE_EXHAUSTED (the
    // request could never fit in the KV pool).
    Result<RequestId> add_request(GenerateRequest request, StreamCallback callback) override;
    // add_request's checks alone (the errors above; nothing changes). Every rank of a
    // data-parallel group has the same options, so rank 0 checks a request it sends to
    // another rank here and refuses it at once (engine/dp_front.h).
    Status validate_request(const GenerateRequest& request) const;
    RequestLimits request_limits() const;
    // Finishes the request now (callback gets a finish event with kAbort) and frees
    // its blocks. NOT_FOUND if unknown or already finished.
    Status abort(RequestId id) override;
    // One iteration of the step loop. Errors from the model are fatal for the engine.
    Status step() override;
    // Idle: hand-over landings past their TTL are released (EngineOptions::kv_landing).
    Status idle_check() override;
    // Steps until no request is left.
    Status run();
    bool has_work() const override;
    EngineStats stats() const override;
    // The pool's invariants plus: every block's refcount equals the references the
    // sequences hold. Call between steps.
    Status check_invariants() const;

    struct Impl;

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::engine

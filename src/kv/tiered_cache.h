// TieredCache: the engine's KV below the scheduler. It owns the block pool and every
// sequence's cache state across the tiers (S-KV-4..7, docs/kvstore.md):
//   device   pool blocks: the block table, prefix pins (hash-chain keys, S-KV-4),
//            publication to the prefix index;
//   store    a kvstore::BlockStore below the pool: admission matches the rest of the
//            chain there (metadata only) and fetches the hits on the Fetcher thread
//            while the sequence waits; published blocks are written behind;
//   host     swap slots (HostSwapSpace) holding a preempted sequence's rows.
// Models with fixed per-sequence state (DeepSeek V4: window ring, compressor partial
// windows; kernels/kv_cache.h KvLayout) also get one state slot per running sequence
// (StateSlotPool): taken at admission, released at preemption and removal, handed to
// the model through the block table's PagedKvCache::state(). Such state cannot be
// restored from blocks, so a sequence holding a slot is always preempted by recompute.
// When a copy of the slot taken after exactly B tokens (B a block boundary) resumes the
// sequence from B (kernels/kv_cache.h KvLayout::state_snapshot_resumes: V4), prefixes
// are cached with such copies: the SWA state cache (docs/swa_cache.md, S-KV-8..10).
// The engine sees a sequence id and a few counts; it never touches blocks, pins,
// tickets or slots. Sizes come in plain (cache groups, block count), not from a model.
//
// Per sequence, in the order the engine calls:
//   add ─> [waiting: fetching() / poll_fetch() / peek_admission()] ─> admit
//       ─> [running: restore() for a swapped-in one, grow(), table(), take_swap_in(),
//           publish()] ─> preempt (back to waiting) | remove
// Policies:
//   - S-KV-9: an admission hit keeps at least one token back (its logits start the
//     output); only whole blocks are matched, published, stored or fetched.
//   - The store is asked once per admission epoch; a fetch later than its deadline,
//     a block that fails its checks, a broken chain or a short pool is a miss (the
//     sequence computes those tokens). Blocks that came from a tier are not written back.
//   - Preemption swaps when the host slots allow, all or nothing; else the rows are
//     dropped (recompute). Slots released are reusable from the next plan on
//     (end_plan()), so a save never overwrites a slot a pending restore still reads.
//   - A continuation (add(): a generation moved from another engine) with the SWA
//     cache may also start at an exact state at the largest block boundary <= L - 1
//     its blocks reach, or one unit below it, past S-KV-10's cap of L - 134: the state
//     is the whole slot copied with lateness 0, so a restore rebuilds nothing and the
//     output is the one the first engine would produce. This is how a hand-over's state
//     at the prefill's store position P (export_blocks) is a full hit at L = P + k.
//   - SWA state (state-slot layouts with an SWA pool; S-KV-9/10): a hit needs a stored
//     slot copy at its length. peek_admission applies plan_swa_hit (hit <= L - 134, the
//     state at L1 or L1 - 128); the model replays exactly, so where S-KV-10 would
//     replay approximately (no state in [L1 - 128, L1]) the hit falls back to the
//     newest stored state below, else 0 (a miss). The hit's blocks are [0, hit) only:
//     a re-run unit is computed into new blocks, never over shared ones. admit() takes
//     the state from the pool and checks its seal; a damaged or missing one is a miss.
//     Copies are taken by whoever runs the forward pass right after the step that ends
//     at the store position (plan_swa_step asks for them; a prefill chunk is cut there),
//     so they are exact (lateness 0). The prefill copy is stored when the prefill's last
//     chunk has run; decode copies at each 128-token boundary, the latest stored at
//     remove() or preempt(). States never go to the store.
//   - Bounded replay (swa_bounded_replay: V4.1 with compact YOCO prefill, S-SWA): a
//     kReplay plan is served instead of falling back: the sequence pins the blocks of
//     [0, L1) and its first step (plan_swa_step's replay_begin = L1 - 128) re-runs that
//     unit with truncated attention, rebuilding windows only (the model never writes
//     the pinned blocks). States keep only swa_stored_ranges of the slot (S-KV-8's
//     stored region); a restore writes them into a zeroed slot image (the dropped
//     region is rebuilt by the model's replay).
//   - Hand-over landings (issue 18, below): blocks a receiver writes while no table holds
//     them; landed, the full ones are in the prefix index and all are held until the
//     continuation is admitted (it adopts the tail block when its tokens give the tail
//     key; one landing per continuation) or the landing expires. A reservation leaves
//     each running sequence a block to grow into.
//   - Block data hazards are ordered by the caller's steps (engine.h): a block released
//     while a step may use it is handed out again only by a later plan.
// Device-side copies (copy_block_to_host, copy_block_from_host, copy_fetched_layer) run
// on whoever runs the forward pass, at the times the plans order.
//
// Thread model: not thread-safe; every method on the engine's scheduling thread. The
// store's own threads (write-behind, fetcher) are internal and stopped by the destructor
// before the store goes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/block_key.h"
#include "kv/block_pool.h"
#include "kv/host_swap.h"
#include "kv/kv_export.h"
#include "kv/paged_kv_cache.h"
#include "kv/state_slots.h"
#include "kv/swa_pool.h"
#include "kv/swa_rules.h"
#include "kvstore/async_store.h"
#include "kvstore/block_store.h"

namespace dsi::kv {

using SeqId = int64_t;

// A fetched block to copy into pool block `block` before its rows are read (S-KV-6).
struct SwapIn {
    BlockId block = 0;
    std::shared_ptr<const kvstore::Block> data;
};

// A sequence's fetched blocks, at positions [begin_pos, end_pos()).
struct SwapInBatch {
    int64_t begin_pos = 0;
    std::vector<SwapIn> blocks;
    int64_t end_pos() const {
        return begin_pos + static_cast<int64_t>(blocks.size()) * kBlockTokens;
    }
};

// One block copied between the pool and a host swap slot (preemption by swapping).
struct HostCopy {
    BlockId block = 0;
    float* host = nullptr;
};

// Every cache group's slice of the block, back to back, to/from the host slot.
void copy_block_to_host(BlockPool& pool, const HostCopy& c);
void copy_block_from_host(BlockPool& pool, const HostCopy& c);
// A block in the store: every cache group's layers, in group order (store layer i is
// group 0's layer i, then group 1's layers, ...); one layer is that group's slice of the
// block for that layer ([entry][floats]). V2/V3: the one `mla` group. V4: the `c4`
// entries, the `c4_index` keys, the `c128` entries (docs/swa_cache.md).
int64_t num_store_layers(const BlockPool& pool);
// Store layer `layer` of a fetched block into its pool block. REQUIRES: the block's
// layer sizes were checked on admission (they are).
void copy_fetched_layer(BlockPool& pool, const SwapIn& s, int64_t layer);

// A stored SWA state's bytes (SwaStatePool entries, KvExport::swa_state): the state slot's
// words, then an 8-byte seal (XXH3-64 of them seeded with the position). Whether `st`
// is slot_bytes of slot with an intact seal for its key's position.
inline constexpr size_t kSwaSealBytes = 8;
bool swa_sealed_ok(const SwaState& st, size_t slot_bytes);
// Appends the seal of `bytes` (a slot copy) at `position`.
void swa_seal(std::vector<uint8_t>& bytes, int64_t position);

// The SWA side of one planned step of a sequence (plan_swa_step).
struct SwaStepPlan {
    int64_t end = 0;  // where the step must end (a prefill chunk cut at the store position)
    // > 0: copy the state slot after the step (its length is then capture_position) and
    // hand the bytes to on_swa_step.
    int64_t capture_position = 0;
    // Set on the sequence's first step after admission: copy its bytes (the slot, then
    // the seal) into the state slot before the step.
    std::shared_ptr<const SwaState> restore;
    // > 0 (bounded replay, on the first step of a kReplay hit): the step re-runs
    // [replay_begin, its begin) first, with truncated attention and the block KV of those
    // positions reused (SequenceStep::replay_end).
    int64_t replay_begin = 0;
};

struct TieredCacheOptions {
    // Device tier. The store holds every group's layers of a block (num_store_layers).
    std::vector<CacheGroupSpec> groups;
    int64_t num_blocks = 0;
    bool prefix_cache = true;
    // Per-sequence state slots of state_floats words (0: none). REQUIRES: with state,
    // num_state_slots >= the most sequences ever admitted at once (the scheduler's
    // max_running_seqs), since admission takes one.
    int64_t state_floats = 0;
    int64_t num_state_slots = 0;
    // SWA state cache (with state slots and prefix_cache; docs/swa_cache.md): a pool the
    // caller owns (wins; REQUIRES: outlives the cache), else one of swa_pool_bytes (0 and
    // no pool: off, and a state-slot layout gets no prefix hits).
    SwaStatePool* swa_pool = nullptr;
    int64_t swa_pool_bytes = 0;
    // S-SWA bounded replay (the model's KvLayout::swa_bounded_replay, compact mode): serve
    // kReplay plans by replay (above); states keep only `swa_stored_ranges` ([begin, end)
    // floats of the slot; empty: the whole slot).
    bool swa_bounded_replay = false;
    std::vector<std::pair<int64_t, int64_t>> swa_stored_ranges;
    // Host tier: bytes of swap slots (0: preemption always recomputes).
    int64_t swap_space_bytes = 0;
    // Store tier: a store the caller owns (wins; REQUIRES: outlives the cache), else a
    // kvstore URI ("" = none). An unreachable store is logged and left out.
    kvstore::BlockStore* store = nullptr;
    std::string store_uri;
    std::string model_id;    // the store's model identity
    uint32_t store_dtype = 1;  // dtype code in the store's block header (1 f32, 2 bf16, 3 e4m3)
    int64_t match_timeout_ms = 200;
    int64_t fetch_timeout_ms = 5000;
    int64_t write_queue_bytes = int64_t{256} << 20;
    int64_t fetch_buffer_bytes = int64_t{256} << 20;
    bool store_write = true;
};

struct TieredCacheStats {
    int64_t preemptions_swapped = 0;
    int64_t swapped_out_blocks = 0;
    int64_t swapped_in_blocks = 0;
    int64_t swap_slots_held = 0;
    int64_t state_slots_in_use = 0;
    int64_t store_lookups = 0;
    int64_t store_hit_blocks = 0;
    int64_t store_miss_blocks = 0;
    int64_t store_hit_tokens = 0;
    int64_t store_blocks_offered = 0;
    int64_t store_blocks_dropped = 0;
    int64_t store_blocks_written = 0;
    int64_t store_puts_dropped = 0;
    int64_t store_bytes_offered = 0;
    int64_t fetch_count = 0, fetch_sum_ns = 0, fetch_max_ns = 0;
    int64_t fetch_buffers_allocated = 0, fetch_buffers_in_use = 0, fetch_buffer_leases = 0;
    BlockPoolStats pool;
    // SWA state cache: the hit rule's counters per traffic class (with the pool's bytes
    // and evictions), and this cache's own: slot copies taken, states put in the pool,
    // states restored at admission, states refused at admission (seal, size or gone:
    // a miss), and tokens computed past S-KV-10's plan because the model replays
    // exactly (its kReplay falls back to an older state).
    SwaCacheCounters swa;
    int64_t swa_captures = 0;
    int64_t swa_states_stored = 0;
    int64_t swa_states_restored = 0;
    int64_t swa_states_rejected = 0;
    int64_t swa_fallback_tokens = 0;
    // Hand-over landings (issue 18): reserved, landed (published and held), attached to
    // a continuation, expired unclaimed, dropped (a failed or aborted transfer), refused
    // (no room: the transfer takes the store-tier path), the tail rows attached, and the
    // blocks held by landings now.
    int64_t landings_reserved = 0;
    int64_t landings_landed = 0;
    int64_t landings_attached = 0;
    int64_t landings_expired = 0;
    int64_t landings_dropped = 0;
    int64_t landings_refused = 0;
    int64_t landing_tail_tokens = 0;
    int64_t landing_blocks_held = 0;
};

// What admission would find for a waiting sequence now.
struct AdmissionPeek {
    int64_t num_cached_tokens = 0;                // rows it starts with (whole blocks)
    int64_t num_cached_unreferenced_blocks = 0;  // hit blocks pinning takes from the pool
    int64_t num_swapped_blocks = 0;              // > 0: swapped out; rows come back from host
};

class TieredCache {
public:
    // INVALID_ARGUMENT on bad groups or num_blocks < 1.
    static Result<std::unique_ptr<TieredCache>> create(TieredCacheOptions options);
    ~TieredCache();  // stops the store threads (write-behind drained, bounded)
    TieredCache(const TieredCache&) = delete;
    TieredCache& operator=(const TieredCache&) = delete;

    // --- sequences ---
    // A new sequence whose keys are salted with `salt`; its stored blocks get `traffic`.
    // `continuation`: a generation moved here from another engine (its tokens end with
    // output that engine produced: the prefill -> decode hand-over, a failover); with
    // the SWA state cache it may start at an exact state past S-KV-10's cap (Policies).
    void add(SeqId id, const BlockKey& salt, kvstore::TrafficClass traffic,
             bool continuation = false);
    // Releases everything the sequence holds (blocks, staged blocks, fetch, slots).
    void remove(SeqId id);

    // --- waiting sequences ---
    // A store fetch is in flight: the sequence waits outside the admission queue.
    bool fetching(SeqId id) const;
    // For a fetching sequence: false while the fetch runs and is not late; else resolves
    // it (pins the local prefix, places the verified blocks into pool blocks the
    // sequence holds; anything unusable is a miss) and returns true.
    bool poll_fetch(SeqId id);
    // What admission would take for `tokens` (the sequence's known tokens); nullopt when
    // this call started a store fetch (the sequence waits for it).
    std::optional<AdmissionPeek> peek_admission(SeqId id, std::span<const int32_t> tokens);
    // Takes the peeked prefix (pins local hits, or adopts fetched blocks) and returns the
    // rows the sequence starts with: num_cached_tokens of the peek, or the swapped rows.
    // With state slots, takes one (aborts if none is free: the caller bounds admissions).
    // Call for every admission of a step before any restore() / grow() of that step, so
    // an allocation cannot evict a hit. REQUIRES: num_cached_tokens from peek_admission.
    int64_t admit(SeqId id, int64_t num_cached_tokens);
    bool swapped_out(SeqId id) const;

    // --- running sequences ---
    // A swapped-out sequence just admitted: allocates blocks for its saved rows and
    // returns the copies that bring them back (its slots are released after this plan).
    Result<std::vector<HostCopy>> restore(SeqId id);
    // Appends n new blocks. INTERNAL if the pool cannot (the scheduler over-committed).
    Status grow(SeqId id, int64_t n);
    int64_t num_blocks(SeqId id) const;
    // Speculation rollback (issue 24): keeps the first rows [0, num_rows) and releases
    // the blocks after the one holding the last of them. The released blocks held only
    // rejected drafts' rows (never published). REQUIRES: no step in flight writes them;
    // num_rows covers every published block.
    void truncate(SeqId id, int64_t num_rows);
    // Blocks only this sequence references (what preempting it frees).
    int64_t num_exclusive_blocks(SeqId id) const;
    // The model's view of the block table (a copy: the cache may grow it meanwhile),
    // with the sequence's state slot.
    PagedKvCache table(SeqId id);
    // Fetched blocks the next step must copy in before reading them (once).
    SwapInBatch take_swap_in(SeqId id);
    // Publishes full blocks [.., num_full_blocks) of `tokens` to the prefix index and
    // offers the new ones to the store's write-behind (S-KV-7). REQUIRES: their rows
    // are computed (the step that computed them has completed).
    void publish(SeqId id, std::span<const int32_t> tokens, int64_t num_full_blocks);
    // Issue 18 hand-over: a copy of the sequence's published full blocks (the prefix of
    // `tokens` the prefix index holds for it), as the store would hold them (every cache
    // group's layers). With state slots (V4, V4.1): the blocks [0, P) and the SWA state
    // at P, the prefill's store position of the tokens it was admitted with (S-KV-9),
    // taken from the SWA pool. Null when there is no block, prefix caching is off, or a
    // state-slot layout has no stored state at P (no SWA pool, P = 0, evicted).
    // V2/V3 also export the rows [full blocks, num_rows) of the tail block (KvExport's
    // tail; num_rows: the rows computed, at most tokens.size()).
    std::shared_ptr<const KvExport> export_blocks(SeqId id, std::span<const int32_t> tokens,
                                                  int64_t num_rows = 0) const;
    // Back to waiting: rows [0, rows) go to host slots when they fit and the sequence
    // has no state slot (true), else are dropped (recompute). Its blocks and state slot
    // are released either way.
    bool preempt(SeqId id, int64_t rows);

    // --- SWA state (no-ops without an SWA pool) ---
    bool swa_enabled() const { return swa_ != nullptr; }
    // The step [begin, end) of a running sequence: cut at the prefill store position,
    // whether to copy the slot after it, the state to restore before it (once).
    SwaStepPlan plan_swa_step(SeqId id, int64_t begin, int64_t end);
    // The step [begin, end) has run (results in order); `captured`: the slot copy it
    // asked for (state_floats words as bytes), else empty. `tokens`: the sequence's
    // known tokens (the state's chain key). Stores what S-KV-9 says is complete.
    void on_swa_step(SeqId id, std::span<const int32_t> tokens, int64_t begin, int64_t end,
                     std::vector<uint8_t> captured);

    // --- plans ---
    // Saves queued by preempt() since the last call: the next step runs them first.
    std::vector<HostCopy> take_saves();
    bool has_pending_saves() const { return !pending_saves_.empty(); }
    // Call after submitting a plan: slots released before it become reusable.
    void end_plan();

    // --- hand-over landings (issue 18, docs/cluster.md "KV hand-over") ---
    // Pool blocks a KV hand-over is received into (one copy: wire -> pool): reserved for
    // num_tokens rows (the full blocks, then a tail block for the rows past them), written
    // by the receiver while no table holds them, then landed: the full blocks published
    // to the prefix index under their chain keys, and every block held under the landing
    // until a continuation whose tokens give the same keys (and the tail's tail_key) is
    // admitted -- it pins the full blocks, adopts the tail block and starts at
    // num_tokens -- or until expires_ns. Layouts with one entry per token and no state
    // slot (V2/V3) only. Block data hazards: a reserved block may be one a step in flight
    // still writes (a sequence just finished); the caller hands it to the writer only
    // after every step submitted before the reservation has completed (engine.cc).
    bool landing_supported() const;
    // RESOURCE_EXHAUSTED when the pool cannot spare the blocks and one more for each
    // running sequence to grow into (nothing is taken: the caller falls back to the store
    // tier); FAILED_PRECONDITION when unsupported.
    Result<int64_t> reserve_landing(int64_t num_tokens);
    // Per store layer, per block of the landing: that block's slice of that layer
    // (num_store_layers x blocks pointers to layer_block_bytes bytes).
    std::vector<std::vector<uint8_t*>> landing_memory(int64_t handle);
    // `keys`: the full blocks' chain keys (num_tokens / kBlockTokens of them); tail_key:
    // kv::tail_key of the tail's tokens (ignored without a tail). NOT_FOUND for an
    // unknown handle (dropped already).
    Status land(int64_t handle, std::span<const BlockKey> keys, const BlockKey& tail,
                int64_t expires_ns);
    // Releases every block of a reserved or landed landing (unknown: nothing).
    void drop_landing(int64_t handle);
    // Drops the landed landings past their expiry; returns how many.
    int64_t expire_landings(int64_t now_ns);
    int64_t num_landings() const { return static_cast<int64_t>(landings_.size()); }

    // --- whole cache ---
    int64_t num_available_blocks() const { return pool_->num_available(); }
    int64_t num_pool_blocks() const { return pool_->num_blocks(); }
    int64_t num_state_slots() const { return slots_ ? slots_->num_slots() : 0; }
    BlockPool* pool() { return pool_.get(); }
    int64_t num_fetching() const { return num_fetching_; }
    // Waits until the oldest in-flight fetch is done, at most max_wait_ms.
    void wait_for_fetch(int64_t max_wait_ms);
    TieredCacheStats stats() const;
    // The pool's invariants; every refcount equals the references the sequences hold;
    // waiting sequences hold no table blocks; every swap slot is free, pending, or held
    // by exactly one swapped-out sequence with a consistent row count; with state slots,
    // exactly the admitted sequences hold one each, and the rest are free.
    Status check_invariants() const;

private:
    struct Seq {
        BlockKey salt;
        kvstore::TrafficClass traffic = kvstore::TrafficClass::kChatbot;
        std::vector<BlockKey> keys;  // chain keys of the full blocks seen so far
        std::vector<BlockId> blocks;  // the block table (admitted only)
        bool admitted = false;
        bool continuation = false;     // add(): moved here from another engine
        int64_t num_published = 0;     // blocks put in the prefix index
        int64_t num_store_blocks = 0;  // blocks [0, n) need no write-behind (from a tier)
        // Store (S-KV-4/5): asked once per epoch.
        bool store_checked = false;
        std::shared_ptr<kvstore::FetchTicket> fetch;
        int64_t fetch_first_block = 0;  // chain index of the first fetched key
        int64_t fetch_num_blocks = 0;
        int64_t fetch_submit_ns = 0;    // kvstore clock
        int64_t fetch_deadline_ns = 0;  // kvstore clock
        // A resolved fetch: the prefix blocks the waiting sequence holds (local hits
        // pinned, then fetched blocks to swap in from staged_first on).
        std::vector<BlockId> staged;
        std::vector<std::shared_ptr<const kvstore::Block>> staged_data;
        int64_t staged_first = 0;
        // Swapped out: host slots holding rows [0, swapped_rows).
        std::vector<int32_t> swap_slots;
        int64_t swapped_rows = 0;
        SlotId state_slot = -1;  // admitted, with a state-slot layout
        // SWA state (swa_ set): the last peek's plan and where it starts; per epoch the
        // tracker, the prefill store position, the state to restore at the first step,
        // and the latest complete copy not yet in the pool.
        SwaHitPlan swa_plan;
        int64_t swa_start = 0;
        SwaStoreTracker swa_tracker;
        int64_t swa_prompt = 0;
        int64_t swa_prefill_pos = 0;
        std::shared_ptr<const SwaState> swa_restore;
        int64_t swa_replay_begin = 0;  // bounded replay pending for the first step
        int64_t swa_held_pos = 0;
        std::vector<uint8_t> swa_held;  // sealed
        SwaStateKey swa_held_key;
        int64_t landing = 0;  // the landing the last peek matched (0: none)
    };
    struct Landing {
        int64_t num_tokens = 0;
        std::vector<BlockId> blocks;  // full blocks, then the tail block (held: ref 1)
        bool landed = false;
        BlockKey last_key;  // the last full block's chain key (none: BlockKey{})
        BlockKey tail_key;
        int64_t expires_ns = 0;
        SeqId claimant = 0;  // the waiting sequence whose last peek matched it
        int64_t tail_tokens() const { return num_tokens % kBlockTokens; }
        int64_t num_full() const { return num_tokens / kBlockTokens; }
    };

    TieredCache(TieredCacheOptions options, std::unique_ptr<BlockPool> pool);
    void open_store();
    Seq& at(SeqId id);
    const Seq& at(SeqId id) const;
    // Bytes of store layer i (num_store_layers), and of all of them.
    int64_t layer_bytes(int64_t i) const;
    int64_t block_payload_bytes() const;
    int64_t store_layers() const { return num_store_layers(*pool_); }
    kvstore::BlockInfo store_info(const Seq& s, std::span<const int32_t> tokens, int64_t b) const;
    void offer_block(const Seq& s, std::span<const int32_t> tokens, int64_t b);
    void ensure_keys(Seq& s, std::span<const int32_t> tokens, int64_t n);
    int64_t max_hit_blocks(size_t num_tokens) const;
    bool start_fetch(Seq& s, std::span<const int32_t> tokens, int64_t max_hit);
    void resolve_fetch(Seq& s);
    void drop_fetch(Seq& s);
    void release_staged(Seq& s);
    void release_state(Seq& s);
    // SWA: the newest usable start <= the plan (exact replay), the restore at admission,
    // and storing the held copy.
    int64_t swa_fallback_start(const Seq& s, const SwaHitPlan& plan) const;
    // The hit rule for L = input_tokens over `block_hit_tokens` of blocks: sets the
    // sequence's plan and start and returns the start.
    int64_t swa_plan_start(Seq& s, int64_t input_tokens, int64_t block_hit_tokens);
    // A continuation's exact start past the cap (Policies), when better than the plan.
    void swa_continuation_start(Seq& s, int64_t input_tokens, int64_t block_hit_tokens);
    // Keeps the first keep_blocks staged blocks, releases the rest.
    void trim_staged(Seq& s, int64_t keep_blocks);
    bool swa_take_restore(Seq& s, int64_t hit_tokens);
    void swa_store_held(Seq& s);
    bool swa_has_state(const Seq& s, int64_t position) const;
    // A landed landing this continuation's tokens continue (its keys and tail key), whose
    // full blocks the index holds for it (`hit_blocks` of them): its handle, else 0.
    // One landing serves one continuation: a landing another waiting sequence's peek
    // matched is skipped.
    int64_t match_landing(SeqId id, Seq& s, std::span<const int32_t> tokens, int64_t hit_blocks);
    void release_landing(std::map<int64_t, Landing>::iterator it);

    TieredCacheOptions options_;
    std::unique_ptr<BlockPool> pool_;
    HostSwapSpace swap_;
    std::unique_ptr<StateSlotPool> slots_;  // null: the model keeps no per-sequence state
    std::unique_ptr<SwaStatePool> owned_swa_;
    SwaStatePool* swa_ = nullptr;  // null: no SWA state cache
    std::vector<HostCopy> pending_saves_;
    std::map<SeqId, Seq> seqs_;  // by id (= arrival order)
    std::map<int64_t, Landing> landings_;  // by handle
    int64_t next_landing_ = 1;
    int64_t num_fetching_ = 0;
    TieredCacheStats stats_;
    // Store tier (null: none). Declared last: destroyed first (threads before store).
    std::unique_ptr<kvstore::BlockStore> owned_store_;
    kvstore::BlockStore* store_ = nullptr;
    kvstore::StoreKey model_identity_;
    std::unique_ptr<kvstore::WriteBehind> write_behind_;
    std::unique_ptr<kvstore::Fetcher> fetcher_;
};

}  // namespace dsi::kv

// The SWA state rules of V4-class hybrid attention as pure code: where a sequence's
// sliding-window (SWA) state is stored (SPEC S-KV-9), how long a prefix hit may be and
// when the last unit is replayed (S-KV-10, S-SWA), and how big one sequence's state
// slot is (S-KV-8). docs/swa_cache.md has the rules with worked numbers.
//
// Terms. A *unit* is one 128-token block (kBlockTokens, the storage granularity). The
// SWA *state at position B* (B a positive multiple of the unit) is the window of SWA
// rows of positions [B - 128, B) of every stored layer: what the next token (position
// B) attends to. It is copied out of the per-layer ring of 134 rows (window 128 + 6),
// where position q lives in slot q % 134; the stored region is the whole ring (134
// rows per layer), which holds that window. The state at position 0 is the empty
// window: it always exists and is never stored.
//
// Ring and lateness (S-KV-9). During decode the ring copy for boundary B is read
// while the sequence has B + d complete tokens and one more step (one token, the
// async loop's step in flight) may be writing its row, overwriting the slot of
// position B + d - 134. The stable rows are [B + d - 133, B + d - 1], which contain
// the window [B - 128, B) iff 0 <= d <= 5: the ring of 134 = window 128 + 5 + 1
// (the in-flight row). d is the copy's *lateness*; d > 5 is a contract violation
// (OUT_OF_RANGE, the copy is not used).
//
// Thread model: pure functions and value types; SwaStoreTracker belongs to one
// sequence and is driven by the engine's scheduling thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kv/block_key.h"

namespace dsi::kv {

// S-KV-9: the sliding window, the most tokens a decode copy may land late, and the
// ring that holds the window for any such lateness (window + lateness + the row of
// the step in flight).
inline constexpr int64_t kSwaWindowTokens = 128;
inline constexpr int64_t kSwaMaxCopyLatenessTokens = 5;
inline constexpr int64_t kSwaRingTokens = kSwaWindowTokens + kSwaMaxCopyLatenessTokens + 1;
static_assert(kSwaRingTokens == 134, "S-KV-8: ring of window 128 + 6");

// The sizes the rules are written in; the defaults are the SPEC's (unit 128, window
// 128, lateness 5, ring 134). Other values exist for tests of the rules' shape.
struct SwaGeometry {
    int64_t unit_tokens = kBlockTokens;
    int64_t window_tokens = kSwaWindowTokens;
    int64_t max_lateness_tokens = kSwaMaxCopyLatenessTokens;

    int64_t ring_tokens() const { return window_tokens + max_lateness_tokens + 1; }
    // INVALID_ARGUMENT unless unit >= 1, 1 <= window <= unit (one replayed unit must
    // rebuild a whole window, S-SWA) and lateness >= 0.
    Status validate() const;
};

// ---- Store positions (S-KV-9) -------------------------------------------------

// The store position after a prefill of `prompt_tokens` tokens:
// floor((prompt_tokens - 1) / unit) * unit (keep one token back, round down); 0 when
// below one full unit past that (store nothing). INVALID_ARGUMENT for prompt_tokens < 1.
Result<int64_t> prefill_store_position(int64_t prompt_tokens, const SwaGeometry& g = {});

// Where the window of the state at position B sits in the ring: one or two runs of
// slots (two when it wraps), in position order. The engine copies the whole ring
// (the stored region); the runs say which rows a restore reads as the window.
struct SwaRingRuns {
    struct Run {
        int64_t first_slot = 0;
        int64_t num_slots = 0;
    };
    std::array<Run, 2> runs{};
    int num_runs = 0;
};

// A copy the engine takes: the state at `store_position` (= B) is the rows of positions
// [window_begin, store_position). During prefill the rows before `chunk_begin` are
// read from the ring (`ring` slots) and the rest from the chunk's computed rows (the
// ring alone may not hold them: a chunk longer than 6 tokens overwrites its slots).
// During decode chunk_begin = store_position: every row comes from the ring.
struct SwaCopyRegion {
    int64_t store_position = 0;
    int64_t window_begin = 0;
    int64_t chunk_begin = 0;
    SwaRingRuns ring;  // slots of the window's rows before chunk_begin
};

// The ring slots of positions [begin, end). REQUIRES: 0 <= begin <= end, end - begin
// <= ring_tokens.
SwaRingRuns swa_ring_runs(int64_t begin, int64_t end, const SwaGeometry& g = {});

// The chain-key index whose key names the state at position B: B / unit - 1 (the
// block that ends at B). REQUIRES: B a positive multiple of the unit.
int64_t swa_chain_index(int64_t position, const SwaGeometry& g = {});

// SwaStoreTracker: one sequence's store decisions, driven step by step by the engine.
//
//   prefill:  begin_prefill(start, prompt) then on_prefill_chunk(b, e) per chunk in
//             order. The state at P = prefill_store_position(prompt) is captured in
//             the first chunk that reaches P (b <= P <= e; a copy region with the
//             ring part and the chunk part) and becomes complete only when the last
//             chunk ends ("chunked prefill stores only at the last chunk"); a prefill
//             cut short stores nothing.
//   decode:   on_tokens(n) after each step (n = complete tokens); when the sequence
//             crosses a boundary B it returns B and the engine starts the ring copy;
//             on_copy_landed(B, n') when the copy has been read with n' complete
//             tokens: lateness n' - B in [0, 5] makes B the latest complete copy.
//             on_rollback(n) cuts the sequence back (rejected drafts): a pending copy
//             past n is dropped, and so are complete copies past n.
//   end:      latest_complete() is the state to store (0: none).
//
// Errors: INVALID_ARGUMENT for malformed calls (negative or decreasing lengths, chunks
// out of order, a copy for a boundary not pending); OUT_OF_RANGE for a copy more than
// 5 tokens late (that copy is dropped). Any other call that fails changes nothing.
// A prompt that ends on a boundary (k * 128 tokens) stores at (k - 1) * 128 and takes
// no decode copy at k * 128 (that boundary was reached in prefill, not crossed in
// decode); the next copy is at (k + 1) * 128. A decode-only sequence (handed over
// after prefill elsewhere) starts with begin_prefill(n, n).
class SwaStoreTracker {
public:
    // REQUIRES: g.validate() is ok.
    explicit SwaStoreTracker(SwaGeometry g = {});

    // The prefill runs tokens [start_tokens, prompt_tokens); start_tokens is the hit
    // length (0 on a miss). REQUIRES: called once, first.
    Status begin_prefill(int64_t start_tokens, int64_t prompt_tokens);
    // The chunk [begin, end) ran; begin is where the previous one ended. Returns the
    // copy to take from this chunk's forward pass, if any.
    Result<std::optional<SwaCopyRegion>> on_prefill_chunk(int64_t begin, int64_t end);

    // The sequence now has `seq_tokens` complete tokens (>= the current length).
    // Returns the highest boundary crossed (0: none); a copy pending for an earlier
    // boundary is dropped (it can no longer land in time).
    Result<int64_t> on_tokens(int64_t seq_tokens);
    // The ring copy for `boundary` was read with `seq_tokens` complete tokens.
    Status on_copy_landed(int64_t boundary, int64_t seq_tokens);
    // Speculative rollback to `seq_tokens` (<= the current length).
    Status on_rollback(int64_t seq_tokens);

    int64_t length() const { return length_; }
    // The boundary whose copy is in flight (0: none).
    int64_t pending_copy() const { return pending_; }
    // The latest complete copy's position: what is stored at request end (0: none).
    int64_t latest_complete() const { return complete_.empty() ? 0 : complete_.back(); }
    // The ring slots of a decode copy's window (chunk_begin = boundary).
    SwaCopyRegion decode_copy_region(int64_t boundary) const;

private:
    SwaGeometry g_;
    bool prefill_begun_ = false;
    bool prefill_done_ = false;
    int64_t prompt_tokens_ = 0;
    int64_t prefill_position_ = 0;  // P (0: nothing to store)
    bool prefill_captured_ = false;
    int64_t length_ = 0;
    int64_t pending_ = 0;
    std::vector<int64_t> complete_;  // ascending positions of complete copies
};

// ---- Hit rule (S-KV-10) and bounded replay (S-SWA) -------------------------------

// How a hit's SWA window is rebuilt.
//   kNone     no hit (L1 = 0): compute from 0.
//   kExact    a state at L1: restore it, compute from L1.
//   kCatchUp  a state at L1 - unit only (or L1 = unit: the empty state at 0): restore
//             it and run [L1 - unit, L1) again with exact attention; block KV of that
//             unit is reused, not recomputed. S-KV-10 counts the hit as L1.
//   kReplay   no state in [L1 - unit, L1]: bounded replay of [L1 - unit, L1) with
//             attention truncated to the segment (approximate SWA); block KV reused.
//             S-KV-10 counts the hit as L1 - unit.
enum class SwaHitKind : uint8_t { kNone, kExact, kCatchUp, kReplay };

std::string_view swa_hit_kind_name(SwaHitKind kind);

struct SwaHitPlan {
    int64_t input_tokens = 0;      // L
    int64_t block_hit_tokens = 0;  // L1: block KV reused for [0, L1), after the cap
    int64_t hit_tokens = 0;        // S-KV-10's hit length (L1, or L1 - unit on replay)
    SwaHitKind kind = SwaHitKind::kNone;
    int64_t swa_state_position = 0;  // the restored state (kExact, kCatchUp); 0 otherwise
    int64_t compute_begin = 0;       // first position run through the model
    // kCatchUp and kReplay: the segment [rerun_begin, rerun_end) = [L1 - unit, L1) run
    // again for its SWA rows only; empty otherwise.
    int64_t rerun_begin = 0;
    int64_t rerun_end = 0;

    int64_t rerun_tokens() const { return rerun_end - rerun_begin; }
    bool swa_hit() const { return kind == SwaHitKind::kExact || kind == SwaHitKind::kCatchUp; }
};

// Whether a stored SWA state exists at a position (a positive multiple of the unit),
// for this request's chain (the caller looks up the chain key swa_chain_index(p)).
using SwaStateLookup = std::function<bool(int64_t position)>;

// The hit rule. `input_tokens` = L; `block_hit_tokens` = the prefix index's block hit
// (a multiple of the unit, <= L). L1 = min(block hit, the largest multiple of the unit
// <= L - ring) (so no hit below L = ring + unit = 262 tokens); then a state at L1 ->
// kExact, else at L1 - unit -> kCatchUp (position 0 always has the empty state), else
// kReplay. `has_state` is asked only for positive positions.
// INVALID_ARGUMENT for L < 1, a block hit < 0, > L or not a multiple of the unit.
Result<SwaHitPlan> plan_swa_hit(int64_t input_tokens, int64_t block_hit_tokens,
                                const SwaStateLookup& has_state, const SwaGeometry& g = {});

// S-SWA truncated attention: replaying from position s, the query at i attends to
// keys [swa_replay_key_begin(s, i), i] = [max(s, i - window + 1), i].
inline int64_t swa_replay_key_begin(int64_t segment_begin, int64_t query,
                                    const SwaGeometry& g = {}) {
    const int64_t window_begin = query - g.window_tokens + 1;
    return window_begin > segment_begin ? window_begin : segment_begin;
}

// ---- Slot size (S-KV-8) -----------------------------------------------------------

// One sequence's SWA state slot: [stored region | dropped region]. The stored region
// is the ring of every stored layer (the only part the pool keeps); the dropped region
// is the SWA of layers whose state is rebuilt instead (V4.1: the decoder's consumer
// layers and the draft layers) and the compressors' partial-window accumulators.
struct SwaSlotShape {
    int64_t stored_layers = 0;
    int64_t dropped_swa_layers = 0;
    int64_t ring_tokens = kSwaRingTokens;
    int64_t swa_row_bytes = 0;  // one SWA row (V4.1 MXFP8: 512 e4m3 + 16 ue8m0 = 528)
    int64_t accumulator_bytes = 0;

    // stored layers x ring x row bytes (V4.1: 20 x 134 x 528 = 1,415,040).
    int64_t stored_bytes() const { return stored_layers * ring_tokens * swa_row_bytes; }
    int64_t dropped_bytes() const {
        return dropped_swa_layers * ring_tokens * swa_row_bytes + accumulator_bytes;
    }
    int64_t slot_bytes() const { return stored_bytes() + dropped_bytes(); }
    // INVALID_ARGUMENT for negative sizes or a ring shorter than the window.
    Status validate() const;
};

}  // namespace dsi::kv

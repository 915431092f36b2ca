#include "kv/swa_rules.h"

#include <string>

#include "base/check.h"

namespace dsi::kv {
namespace {

std::string n(int64_t v) { return std::to_string(v); }

bool is_boundary(int64_t position, const SwaGeometry& g) {
    return position > 0 && position % g.unit_tokens == 0;
}

}  // namespace

Status SwaGeometry::validate() const {
    if (unit_tokens < 1)
        return invalid_argument("SWA unit must be >= 1 token, got " + n(unit_tokens));
    if (window_tokens < 1 || window_tokens > unit_tokens) {
        // S-SWA: one replayed unit must rebuild the whole window.
        return invalid_argument("SWA window must be in [1, unit " + n(unit_tokens) + "], got " +
                                n(window_tokens));
    }
    if (max_lateness_tokens < 0) {
        return invalid_argument("SWA copy lateness must be >= 0, got " + n(max_lateness_tokens));
    }
    return Status::ok();
}

Result<int64_t> prefill_store_position(int64_t prompt_tokens, const SwaGeometry& g) {
    if (prompt_tokens < 1) {
        return invalid_argument("SWA store position: prompt length must be >= 1, got " +
                                n(prompt_tokens));
    }
    // S-KV-9: keep one token back, round down to the unit; below one unit: nothing.
    return (prompt_tokens - 1) / g.unit_tokens * g.unit_tokens;
}

SwaRingRuns swa_ring_runs(int64_t begin, int64_t end, const SwaGeometry& g) {
    const int64_t ring = g.ring_tokens();
    DSI_CHECK(0 <= begin && begin <= end && end - begin <= ring, "ring runs of [", begin, ", ", end,
              ") in a ring of ", ring);
    SwaRingRuns r;
    if (begin == end) return r;
    const int64_t first = begin % ring;
    const int64_t count = end - begin;
    if (first + count <= ring) {
        r.runs[0] = {first, count};
        r.num_runs = 1;
    } else {
        r.runs[0] = {first, ring - first};
        r.runs[1] = {0, count - (ring - first)};
        r.num_runs = 2;
    }
    return r;
}

int64_t swa_chain_index(int64_t position, const SwaGeometry& g) {
    DSI_CHECK(is_boundary(position, g), "SWA state position ", position, " is not a unit boundary");
    return position / g.unit_tokens - 1;
}

// ---- SwaStoreTracker ----------------------------------------------------------------

SwaStoreTracker::SwaStoreTracker(SwaGeometry g) : g_(g) {
    const Status s = g_.validate();
    DSI_CHECK(s.is_ok(), s.to_string());
}

Status SwaStoreTracker::begin_prefill(int64_t start_tokens, int64_t prompt_tokens) {
    if (prefill_begun_) return invalid_argument("SWA tracker: begin_prefill called twice");
    if (start_tokens < 0 || prompt_tokens < 1 || start_tokens > prompt_tokens) {
        return invalid_argument("SWA tracker: prefill of [" + n(start_tokens) + ", " +
                                n(prompt_tokens) + ") is malformed");
    }
    DSI_ASSIGN_OR_RETURN(const int64_t p, prefill_store_position(prompt_tokens, g_));
    prefill_begun_ = true;
    prompt_tokens_ = prompt_tokens;
    // A store position before the first computed token is not reachable from this
    // prefill's rows (the hit's own state covers it).
    prefill_position_ = p >= start_tokens ? p : 0;
    length_ = start_tokens;
    prefill_done_ = start_tokens == prompt_tokens;
    return Status::ok();
}

Result<std::optional<SwaCopyRegion>> SwaStoreTracker::on_prefill_chunk(int64_t begin, int64_t end) {
    if (!prefill_begun_ || prefill_done_) {
        return invalid_argument("SWA tracker: a prefill chunk outside a prefill");
    }
    if (begin != length_ || end <= begin || end > prompt_tokens_) {
        return invalid_argument("SWA tracker: chunk [" + n(begin) + ", " + n(end) +
                                ") does not continue [0, " + n(length_) +
                                ") within the prompt of " + n(prompt_tokens_));
    }
    std::optional<SwaCopyRegion> copy;
    const int64_t p = prefill_position_;
    if (p > 0 && !prefill_captured_ && begin <= p && p <= end) {
        // The first chunk that reaches P sees all of P's window: rows before `begin`
        // in the ring (P - window >= begin - ring), the rest in its own rows.
        SwaCopyRegion r;
        r.store_position = p;
        r.window_begin = p - g_.window_tokens;
        r.chunk_begin = begin;
        if (r.window_begin < begin) r.ring = swa_ring_runs(r.window_begin, begin, g_);
        prefill_captured_ = true;
        copy = r;
    }
    length_ = end;
    if (end == prompt_tokens_) {
        prefill_done_ = true;
        // S-KV-9: chunked prefill stores only at the last chunk.
        if (prefill_captured_) complete_.push_back(p);
    }
    return copy;
}

Result<int64_t> SwaStoreTracker::on_tokens(int64_t seq_tokens) {
    if (prefill_begun_ && !prefill_done_) {
        return invalid_argument("SWA tracker: decode tokens before the prefill's last chunk");
    }
    if (seq_tokens < length_) {
        return invalid_argument("SWA tracker: length " + n(seq_tokens) + " is below " + n(length_) +
                                " (use on_rollback)");
    }
    const int64_t old_units = length_ / g_.unit_tokens;
    const int64_t new_units = seq_tokens / g_.unit_tokens;
    length_ = seq_tokens;
    if (new_units == old_units) return int64_t{0};
    // S-KV-9: a copy each time a boundary is crossed; an older pending copy would land
    // more than a unit late, so it is dropped.
    pending_ = new_units * g_.unit_tokens;
    return pending_;
}

Status SwaStoreTracker::on_copy_landed(int64_t boundary, int64_t seq_tokens) {
    if (pending_ == 0 || boundary != pending_) {
        return invalid_argument("SWA tracker: copy for boundary " + n(boundary) +
                                " landed, pending is " + n(pending_));
    }
    if (seq_tokens < boundary || seq_tokens > length_) {
        return invalid_argument("SWA tracker: copy for boundary " + n(boundary) +
                                " read at length " + n(seq_tokens) + ", outside [" + n(boundary) +
                                ", " + n(length_) + "]");
    }
    const int64_t lateness = seq_tokens - boundary;
    if (lateness > g_.max_lateness_tokens) {
        pending_ = 0;
        return out_of_range("SWA copy for boundary " + n(boundary) + " landed " + n(lateness) +
                            " tokens late; the ring of " + n(g_.ring_tokens()) +
                            " holds the window only up to " + n(g_.max_lateness_tokens));
    }
    pending_ = 0;
    complete_.push_back(boundary);
    return Status::ok();
}

Status SwaStoreTracker::on_rollback(int64_t seq_tokens) {
    if (prefill_begun_ && !prefill_done_) {
        return invalid_argument("SWA tracker: rollback during prefill");
    }
    if (seq_tokens < 0 || seq_tokens > length_) {
        return invalid_argument("SWA tracker: rollback to " + n(seq_tokens) + " from length " +
                                n(length_));
    }
    length_ = seq_tokens;
    if (pending_ > seq_tokens) pending_ = 0;
    // A copy past the new length holds rows of rejected tokens.
    while (!complete_.empty() && complete_.back() > seq_tokens) complete_.pop_back();
    return Status::ok();
}

SwaCopyRegion SwaStoreTracker::decode_copy_region(int64_t boundary) const {
    DSI_CHECK(is_boundary(boundary, g_), "decode copy at ", boundary, " is not a boundary");
    SwaCopyRegion r;
    r.store_position = boundary;
    r.window_begin = boundary - g_.window_tokens;
    r.chunk_begin = boundary;
    r.ring = swa_ring_runs(r.window_begin, boundary, g_);
    return r;
}

// ---- Hit rule -----------------------------------------------------------------------

std::string_view swa_hit_kind_name(SwaHitKind kind) {
    switch (kind) {
        case SwaHitKind::kNone:
            return "none";
        case SwaHitKind::kExact:
            return "exact";
        case SwaHitKind::kCatchUp:
            return "catch-up";
        case SwaHitKind::kReplay:
            return "replay";
    }
    return "?";
}

Result<SwaHitPlan> plan_swa_hit(int64_t input_tokens, int64_t block_hit_tokens,
                                const SwaStateLookup& has_state, const SwaGeometry& g) {
    DSI_RETURN_IF_ERROR(g.validate());
    if (input_tokens < 1) {
        return invalid_argument("SWA hit: input length must be >= 1, got " + n(input_tokens));
    }
    if (block_hit_tokens < 0 || block_hit_tokens > input_tokens ||
        block_hit_tokens % g.unit_tokens != 0) {
        return invalid_argument("SWA hit: block hit " + n(block_hit_tokens) +
                                " must be a multiple of " + n(g.unit_tokens) + " in [0, " +
                                n(input_tokens) + "]");
    }
    SwaHitPlan p;
    p.input_tokens = input_tokens;
    // S-KV-10: the hit is at most L - 134 (the ring), on a unit boundary.
    const int64_t cap = input_tokens > g.ring_tokens()
                            ? (input_tokens - g.ring_tokens()) / g.unit_tokens * g.unit_tokens
                            : 0;
    const int64_t l1 = block_hit_tokens < cap ? block_hit_tokens : cap;
    p.block_hit_tokens = l1;
    if (l1 == 0) return p;  // kNone: compute from 0
    const int64_t prev = l1 - g.unit_tokens;
    if (has_state && has_state(l1)) {
        p.kind = SwaHitKind::kExact;
        p.hit_tokens = l1;
        p.swa_state_position = l1;
        p.compute_begin = l1;
        return p;
    }
    // S-KV-10: a state anywhere in [L1 - 128, L1] makes the hit L1; the empty state
    // at 0 always exists.
    p.rerun_begin = prev;
    p.rerun_end = l1;
    p.compute_begin = prev;
    if (prev == 0 || (has_state && has_state(prev))) {
        p.kind = SwaHitKind::kCatchUp;
        p.hit_tokens = l1;
        p.swa_state_position = prev;
        return p;
    }
    // S-SWA: bounded replay of the last unit of the hit; the hit counts as L1 - 128.
    p.kind = SwaHitKind::kReplay;
    p.hit_tokens = prev;
    return p;
}

// ---- Slot size ----------------------------------------------------------------------

Status SwaSlotShape::validate() const {
    if (stored_layers < 0 || dropped_swa_layers < 0 || swa_row_bytes < 0 || accumulator_bytes < 0) {
        return invalid_argument("SWA slot: negative size");
    }
    if (ring_tokens < kSwaWindowTokens) {
        return invalid_argument("SWA slot: ring of " + n(ring_tokens) +
                                " is shorter than the window " + n(kSwaWindowTokens));
    }
    return Status::ok();
}

}  // namespace dsi::kv

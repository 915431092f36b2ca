// GcPolicy: which blocks a store node drops, and why (S-KV-3). A plain class with no
// I/O: it takes the node's block list and an injected clock and returns a plan, so the
// GC worker, the tests and sim/ run the same decisions.
//
// Policy, in order:
//   1. TTL per traffic class: a block whose last access is older than its class's TTL
//      is expired (defaults: agent 3 days, chatbot 7 days; settings, not constants).
//      The TTL runs from the last access, so a prefix that keeps being hit stays.
//   2. Watermarks: if the bytes left after step 1 exceed high_watermark x capacity,
//      evict least-recently-used blocks (oldest last access first; ties by key) until
//      they are at or below low_watermark x capacity.
// The client never expires anything; only the GC worker acts on a plan.
// Thread model: const after construction; plan() is safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "kvstore/block_store.h"

namespace dsi::kvstore {

inline constexpr int64_t kNsPerSecond = 1'000'000'000;
inline constexpr int64_t kNsPerDay = 86'400 * kNsPerSecond;

struct RetentionSettings {
    double high_watermark = 0.90;  // fraction of capacity that triggers eviction
    double low_watermark = 0.80;   // fraction eviction brings usage down to
    // TTL per TrafficClass, indexed by its value; <= 0 means no TTL.
    std::array<int64_t, kNumTrafficClasses> ttl_ns = {7 * kNsPerDay,   // chatbot
                                                      3 * kNsPerDay};  // agent
    // kInvalidArgument unless 0 < low <= high <= 1.
    Status validate() const;
};

struct GcPlan {
    std::vector<StoreKey> expired;  // TTL, step 1
    std::vector<StoreKey> evicted;  // LRU under the watermark, step 2
    int64_t used_bytes_before = 0;
    int64_t used_bytes_after = 0;
    int64_t expired_bytes = 0;
    int64_t evicted_bytes = 0;
};

class GcPolicy {
public:
    // REQUIRES: settings.validate().is_ok(); env outlives the policy (its wall clock is
    // the time base of GcEntry::last_access_ns).
    GcPolicy(RetentionSettings settings, Env* env);

    GcPlan plan(std::span<const GcEntry> blocks, int64_t capacity_bytes) const;
    const RetentionSettings& settings() const { return settings_; }

private:
    RetentionSettings settings_;
    Env* env_;
};

}  // namespace dsi::kvstore

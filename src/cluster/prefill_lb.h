// PrefillLb: the DeepSeek prefill load balancer across DP engines (SPEC S-LB).
//
// Policy:
//  - A request goes to one of four buckets by total context length: < 16K, 16-64K,
//    64-256K, >= 256K tokens (bucket bounds are settings).
//  - Engines are assigned to buckets. Every round (default 1 s) the engines are
//    re-apportioned in proportion to each bucket's compute-quota demand in the last
//    round (cost of the requests that arrived plus the backlog still waiting); a bucket
//    with demand keeps at least one engine. Reassignment is stable: engines stay where
//    they are unless their bucket has a surplus.
//  - Each bucket has its own per-batch compute quota cap (ns of the cost model). An
//    engine *pulls* requests from its bucket, FIFO, while the cost of what it holds stays
//    within the cap (an empty engine always takes the head request, which it then chunks).
//  - No prefix affinity: the shared KV store lets any engine hit any prefix (S-KV-1).
//  - Reassignment (a setting): kProportional splits engines in proportion to demand, so
//    every bucket drains its backlog in the same time; kMinMaxCompletion (ours, default)
//    chooses the split that minimises the latest expected completion over buckets,
//    backlog / engines + the cost of the bucket's largest waiting request, with no bucket
//    given more engines than it has requests (one request never spans engines). Long
//    requests then wait less than short ones, so one 200K prompt does not start behind a
//    queue it cannot overtake.
//  - Work conservation (our addition, a setting): an empty engine whose bucket has no
//    waiting work pulls from the bucket with the most waiting cost.
//
// No I/O; time comes in as now_ns. Thread model: not thread-safe; one owner (the
// entrypoint's routing thread or the simulator).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "base/status.h"

namespace dsi::cluster {

inline constexpr int kNumPrefillBuckets = 4;

enum class PrefillReassign { kProportional, kMinMaxCompletion };

struct PrefillLbSettings {
    // Upper bounds (exclusive) of buckets 0..2; bucket 3 is everything longer (S-LB).
    std::array<int64_t, kNumPrefillBuckets - 1> bucket_upper_tokens = {16384, 65536, 262144};
    // Per-batch compute quota cap per bucket, ns of PrefillCostModel time.
    std::array<double, kNumPrefillBuckets> bucket_quota_ns = {1e9, 2e9, 4e9, 5e9};
    int64_t round_ns = 1'000'000'000;
    bool steal_when_idle = true;
    PrefillReassign reassign = PrefillReassign::kMinMaxCompletion;

    Status validate() const;
};

// One request as the prefill LB sees it.
struct PrefillWork {
    uint64_t id = 0;
    int64_t total_tokens = 0;  // full context length (decides the bucket)
    double cost_ns = 0;        // compute cost of the missed part (cost model)
    int64_t arrival_ns = 0;
};

class PrefillLb {
public:
    // REQUIRES: settings.validate() is OK, num_engines >= 1.
    PrefillLb(const PrefillLbSettings& settings, int num_engines, int64_t now_ns);

    int bucket_of(int64_t total_tokens) const;
    void submit(const PrefillWork& work);

    // Engine `engine` holds work of total cost `held_cost_ns`; returns what it pulls,
    // in FIFO order. An unavailable engine pulls nothing.
    std::vector<PrefillWork> pull(int engine, double held_cost_ns);

    // Reassigns engines to buckets when a round has ended. Returns true if it did.
    bool tick(int64_t now_ns);

    // Engines that fail or scale in stop pulling; they rejoin at the next round.
    void set_engine_available(int engine, bool available);

    int engine_bucket(int engine) const { return engine_bucket_[engine]; }  // -1: none
    double quota_cap_ns(int engine) const;
    std::array<int, kNumPrefillBuckets> engines_per_bucket() const;
    double pending_cost_ns(int bucket) const { return pending_cost_ns_[bucket]; }
    size_t num_pending() const;
    int num_engines() const { return static_cast<int>(engine_bucket_.size()); }
    int64_t num_reassignments() const { return num_reassignments_; }

    // Apportions `num_engines` over buckets by demand: largest remainder, and at least
    // one engine for each bucket with demand > 0 while engines last. Exposed for tests.
    static std::array<int, kNumPrefillBuckets> apportion(
        int num_engines, const std::array<double, kNumPrefillBuckets>& demand);

    // kMinMaxCompletion: engine counts (fractional) per bucket minimising
    // max_b demand_b / n_b + longest_b, with n_b <= max_engines_b and sum n_b = num_engines.
    // Exposed for tests.
    static std::array<double, kNumPrefillBuckets> min_max_completion_split(
        int num_engines, const std::array<double, kNumPrefillBuckets>& demand_ns,
        const std::array<double, kNumPrefillBuckets>& longest_ns,
        const std::array<int, kNumPrefillBuckets>& max_engines);

private:
    void take_from(int bucket, double held_cost_ns, double cap_ns, std::vector<PrefillWork>& out);
    void reassign(const std::array<int, kNumPrefillBuckets>& target);

    PrefillLbSettings settings_;
    std::array<std::deque<PrefillWork>, kNumPrefillBuckets> queues_;
    std::array<double, kNumPrefillBuckets> pending_cost_ns_{};
    std::array<double, kNumPrefillBuckets> round_demand_ns_{};
    std::array<int, kNumPrefillBuckets> round_arrivals_{};
    std::vector<int> engine_bucket_;
    std::vector<bool> available_;
    int64_t next_round_ns_ = 0;
    int64_t num_reassignments_ = 0;
};

}  // namespace dsi::cluster

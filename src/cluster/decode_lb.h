// DecodeLb: picks the decode DP rank for a request that leaves prefill (SPEC S-LB).
//
// Policy: balance both the batch size of each rank's step (request count) and its
// attention cost (total KV length).
//  - A *long* request (context > long_factor x the cluster's mean context per running
//    request) goes to the rank with the least total KV (ties: fewer requests).
//  - Any other (short) request goes to a rank with low concurrency (request count within
//    count_slack of the minimum) and, among those, the one with the MOST total KV: a short
//    request adds little KV, so it evens out request counts without raising the
//    KV-heaviest ranks' attention cost by much, and keeps low-KV ranks free for long ones.
//  - Ranks that are draining, at max_requests, or without room for the request's KV are
//    skipped; when none is left the answer is RESOURCE_EXHAUSTED (the caller queues).
// Ties break to the lower rank index, so the choice is deterministic.
//
// Also here: the two baselines the simulator compares against (round robin, least
// loaded by request count). No I/O. Thread model: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"

namespace dsi::cluster {

struct DecodeRankState {
    int num_requests = 0;
    int64_t kv_tokens = 0;
    int max_requests = 128;
    int64_t kv_capacity_tokens = 1 << 22;
    bool accepting = true;  // false while draining or failed
};

struct DecodeLbSettings {
    double long_factor = 2.0;
    int count_slack = 1;
    Status validate() const;
};

// True if `rank` can take a request needing `kv_tokens` of KV now.
bool decode_rank_fits(const DecodeRankState& rank, int64_t kv_tokens);

class DecodeLb {
public:
    explicit DecodeLb(const DecodeLbSettings& settings = {});
    // `context_tokens`: the request's KV at arrival (prompt); `reserve_tokens`: the KV it
    // must fit (prompt + expected output, or just the prompt).
    Result<int> choose(std::span<const DecodeRankState> ranks, int64_t context_tokens,
                       int64_t reserve_tokens) const;

private:
    DecodeLbSettings settings_;
};

// Baselines for the simulator.
Result<int> decode_choose_least_loaded(std::span<const DecodeRankState> ranks,
                                       int64_t reserve_tokens);
class DecodeRoundRobin {
public:
    Result<int> choose(std::span<const DecodeRankState> ranks, int64_t reserve_tokens);

private:
    size_t next_ = 0;
};

}  // namespace dsi::cluster

// DecodeDrain: scale-in of decode engines with a grace period (SPEC S-DEPLOY).
//
// Policy: an engine told to stop takes no new requests and keeps decoding its running
// ones for a grace period (default 60 s). When the period ends, its unfinished requests
// move, with their KV, to other decode engines in one go: one plan places all of them
// (largest KV first, each through DecodeLb, counting the earlier moves of the same plan).
// Requests no engine can take are listed as unplaced; the caller re-routes them through
// prefill (request-level re-routing, S-DEPLOY). No I/O; time comes in as now_ns.
// Thread model: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "base/status.h"
#include "cluster/decode_lb.h"

namespace dsi::cluster {

struct DrainSettings {
    int64_t grace_ns = 60'000'000'000;  // S-DEPLOY: 1 minute
};

struct DecodeRequestView {
    uint64_t id = 0;
    int64_t kv_tokens = 0;
};

struct Migration {
    uint64_t request_id = 0;
    int from = -1;
    int to = -1;
    int64_t kv_tokens = 0;
};

struct DrainPlan {
    int engine = -1;
    std::vector<Migration> moves;
    std::vector<uint64_t> unplaced;
};

class DecodeDrain {
public:
    explicit DecodeDrain(const DrainSettings& settings = {}) : settings_(settings) {}

    // FAILED_PRECONDITION if `engine` is already draining.
    Status start(int engine, int64_t now_ns);
    bool is_draining(int engine) const { return deadline_ns_.count(engine) > 0; }
    // Draining engines whose grace period has ended, in engine order.
    std::vector<int> due(int64_t now_ns) const;
    // The one-shot move of all of `engine`'s unfinished requests. `ranks` is the current
    // state of every decode engine (the draining ones are skipped). Ends the drain.
    DrainPlan plan(int engine, std::span<const DecodeRequestView> unfinished,
                   std::vector<DecodeRankState> ranks, const DecodeLb& lb);

private:
    DrainSettings settings_;
    std::map<int, int64_t> deadline_ns_;
};

}  // namespace dsi::cluster

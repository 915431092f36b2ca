#include "cluster/drain.h"

#include <algorithm>
#include <string>

namespace dsi::cluster {

Status DecodeDrain::start(int engine, int64_t now_ns) {
    if (is_draining(engine)) {
        return failed_precondition("decode engine " + std::to_string(engine) +
                                   " is already draining");
    }
    deadline_ns_[engine] = now_ns + settings_.grace_ns;  // S-DEPLOY: grace period
    return Status::ok();
}

std::vector<int> DecodeDrain::due(int64_t now_ns) const {
    std::vector<int> out;
    for (const auto& [engine, deadline] : deadline_ns_) {
        if (now_ns >= deadline) {
            out.push_back(engine);
        }
    }
    return out;
}

DrainPlan DecodeDrain::plan(int engine, std::span<const DecodeRequestView> unfinished,
                            std::vector<DecodeRankState> ranks, const DecodeLb& lb) {
    DrainPlan p;
    p.engine = engine;
    for (const auto& [e, deadline] : deadline_ns_) {
        if (e >= 0 && e < static_cast<int>(ranks.size())) {
            ranks[e].accepting = false;
        }
    }
    std::vector<DecodeRequestView> order(unfinished.begin(), unfinished.end());
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
        return a.kv_tokens > b.kv_tokens;
    });
    // S-DEPLOY: all unfinished requests move in one go, with their KV.
    for (const DecodeRequestView& r : order) {
        Result<int> to = lb.choose(ranks, r.kv_tokens, r.kv_tokens);
        if (!to.is_ok()) {
            p.unplaced.push_back(r.id);
            continue;
        }
        p.moves.push_back({r.id, engine, *to, r.kv_tokens});
        ranks[*to].num_requests += 1;
        ranks[*to].kv_tokens += r.kv_tokens;
    }
    deadline_ns_.erase(engine);
    return p;
}

}  // namespace dsi::cluster

#include "cluster/decode_lb.h"

#include <cmath>
#include <optional>

namespace dsi::cluster {

Status DecodeLbSettings::validate() const {
    if (!(long_factor > 0) || !std::isfinite(long_factor)) {
        return invalid_argument("decode lb: long_factor must be > 0");
    }
    if (count_slack < 0) {
        return invalid_argument("decode lb: count_slack must be >= 0");
    }
    return Status::ok();
}

bool decode_rank_fits(const DecodeRankState& rank, int64_t kv_tokens) {
    return rank.accepting && rank.num_requests < rank.max_requests &&
           rank.kv_tokens + kv_tokens <= rank.kv_capacity_tokens;
}

DecodeLb::DecodeLb(const DecodeLbSettings& settings) : settings_(settings) {
    DSI_CHECK(settings.validate().is_ok(), settings.validate().to_string());
}

Result<int> DecodeLb::choose(std::span<const DecodeRankState> ranks, int64_t context_tokens,
                             int64_t reserve_tokens) const {
    int64_t total_kv = 0;
    int64_t total_requests = 0;
    std::optional<int> min_count;  // not a -1 sentinel: counts are the caller's
    for (const auto& r : ranks) {
        total_kv += r.kv_tokens;
        total_requests += r.num_requests;
        if (decode_rank_fits(r, reserve_tokens) && (!min_count || r.num_requests < *min_count)) {
            min_count = r.num_requests;
        }
    }
    if (!min_count) {
        return resource_exhausted("decode lb: no rank has room for the request");
    }
    const double mean_context =
        total_requests > 0 ? static_cast<double>(total_kv) / total_requests : 0.0;
    const bool is_long =
        total_requests > 0 && context_tokens > settings_.long_factor * mean_context;
    int best = -1;
    for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
        const DecodeRankState& r = ranks[i];
        if (!decode_rank_fits(r, reserve_tokens)) {
            continue;
        }
        if (best < 0) {
            if (is_long || r.num_requests <= *min_count + settings_.count_slack) {
                best = i;
            }
            continue;
        }
        const DecodeRankState& b = ranks[best];
        if (is_long) {
            // S-LB: long requests to ranks with small total KV.
            if (r.kv_tokens < b.kv_tokens ||
                (r.kv_tokens == b.kv_tokens && r.num_requests < b.num_requests)) {
                best = i;
            }
        } else if (r.num_requests <= *min_count + settings_.count_slack) {
            // S-LB: short requests to ranks with low concurrency but large total KV.
            if (r.kv_tokens > b.kv_tokens ||
                (r.kv_tokens == b.kv_tokens && r.num_requests < b.num_requests)) {
                best = i;
            }
        }
    }
    return best;
}

Result<int> decode_choose_least_loaded(std::span<const DecodeRankState> ranks,
                                       int64_t reserve_tokens) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
        if (decode_rank_fits(ranks[i], reserve_tokens) &&
            (best < 0 || ranks[i].num_requests < ranks[best].num_requests)) {
            best = i;
        }
    }
    if (best < 0) {
        return resource_exhausted("decode least-loaded: no rank has room");
    }
    return best;
}

Result<int> DecodeRoundRobin::choose(std::span<const DecodeRankState> ranks,
                                     int64_t reserve_tokens) {
    for (size_t k = 0; k < ranks.size(); ++k) {
        const size_t i = (next_ + k) % ranks.size();
        if (decode_rank_fits(ranks[i], reserve_tokens)) {
            next_ = i + 1;
            return static_cast<int>(i);
        }
    }
    return resource_exhausted("decode round robin: no rank has room");
}

}  // namespace dsi::cluster

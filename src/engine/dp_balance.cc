#include "engine/dp_balance.h"

#include "base/check.h"

namespace dsi::engine {

DpBalancer::DpBalancer(int num_ranks) : loads_(static_cast<size_t>(num_ranks)) {
    DSI_CHECK(num_ranks >= 1, "a group has at least rank 0");
}

int DpBalancer::pick(bool any_rank) const {
    if (!any_rank) return 0;
    size_t best = 0;
    for (size_t r = 1; r < loads_.size(); ++r) {
        const RankLoad& a = loads_[r];
        const RankLoad& b = loads_[best];
        if (a.running_seqs != b.running_seqs ? a.running_seqs < b.running_seqs
            : a.kv_tokens != b.kv_tokens     ? a.kv_tokens < b.kv_tokens
                                             : a.requests < b.requests) {
            best = r;
        }
    }
    return static_cast<int>(best);
}

void DpBalancer::on_start(int rank, int64_t prompt_tokens) {
    RankLoad& l = loads_.at(static_cast<size_t>(rank));
    ++l.running_seqs;
    ++l.requests;
    l.kv_tokens += prompt_tokens;
}

void DpBalancer::on_token(int rank) { ++loads_.at(static_cast<size_t>(rank)).kv_tokens; }

void DpBalancer::on_finish(int rank, int64_t tokens) {
    RankLoad& l = loads_.at(static_cast<size_t>(rank));
    --l.running_seqs;
    l.kv_tokens -= tokens;
    DSI_CHECK(l.running_seqs >= 0 && l.kv_tokens >= 0, "a rank finished more than it ran");
}

void DpBalancer::resize(int num_ranks, bool keep_rank0) {
    DSI_CHECK(num_ranks >= 1, "a group has at least rank 0");
    const RankLoad zero = loads_[0];
    std::vector<RankLoad> next(static_cast<size_t>(num_ranks));
    if (!keep_rank0) {
        for (size_t r = 0; r < next.size() && r < loads_.size(); ++r) {
            next[r].requests = loads_[r].requests;
        }
    }
    loads_ = std::move(next);
    if (keep_rank0) loads_[0] = zero;
}

}  // namespace dsi::engine

#include "engine/dp_balance.h"

#include <algorithm>

#include "base/check.h"

namespace dsi::engine {

DpBalancer::DpBalancer(int num_ranks, Options options)
    : options_(options),
      loads_(static_cast<size_t>(num_ranks)),
      ranks_(static_cast<size_t>(num_ranks)) {
    DSI_CHECK(num_ranks >= 1, "a group has at least rank 0");
    DSI_CHECK(options_.max_blocks_per_rank >= 0 && options_.balance_abs_seqs >= 0 &&
                  options_.balance_rel >= 1.0,
              "DpBalancer options out of range");
}

int DpBalancer::least_loaded(std::span<const int64_t> match, int64_t best) const {
    int pick = -1;
    for (size_t r = 0; r < loads_.size(); ++r) {
        if (!match.empty() && match[r] != best) continue;
        if (pick < 0) {
            pick = static_cast<int>(r);
            continue;
        }
        const RankLoad& a = loads_[r];
        const RankLoad& b = loads_[static_cast<size_t>(pick)];
        if (a.running_seqs != b.running_seqs ? a.running_seqs < b.running_seqs
            : a.kv_tokens != b.kv_tokens     ? a.kv_tokens < b.kv_tokens
                                             : a.requests < b.requests) {
            pick = static_cast<int>(r);
        }
    }
    return pick;
}

int64_t DpBalancer::matched_blocks(int rank, std::span<const kv::BlockKey> chain) const {
    const Keys& k = ranks_.at(static_cast<size_t>(rank));
    int64_t n = 0;
    for (const kv::BlockKey& key : chain) {
        if (!k.where.contains(key)) break;
        ++n;
    }
    return n;
}

DpBalancer::Choice DpBalancer::pick(bool any_rank, std::span<const kv::BlockKey> chain) const {
    if (!any_rank) return {0, matched_blocks(0, chain), Reason::kRankZero};
    const int least = least_loaded({}, 0);
    if (!options_.prefix || chain.empty() || loads_.size() == 1) {
        return {least, matched_blocks(least, chain), Reason::kLoad};
    }
    std::vector<int64_t> match(loads_.size());
    for (size_t r = 0; r < loads_.size(); ++r) {
        match[r] = matched_blocks(static_cast<int>(r), chain);
    }
    const auto [lo, hi] = std::minmax_element(match.begin(), match.end());
    const int64_t best = *hi;
    if (best == *lo) {
        // No rank holds more of it than another (none, or a prefix every rank holds).
        return {least, best, Reason::kLoad};
    }
    if (match[static_cast<size_t>(least)] == best) return {least, best, Reason::kPrefix};
    const int cand = least_loaded(match, best);
    const int64_t seqs = loads_[static_cast<size_t>(cand)].running_seqs;
    const int64_t min_seqs = loads_[static_cast<size_t>(least)].running_seqs;
    const bool too_loaded =
        seqs - min_seqs > options_.balance_abs_seqs &&
        static_cast<double>(seqs) > static_cast<double>(min_seqs) * options_.balance_rel;
    if (too_loaded) return {least, match[static_cast<size_t>(least)], Reason::kOverloaded};
    return {cand, best, Reason::kPrefix};
}

int64_t DpBalancer::cap(const Keys& k) const {
    return k.pool_blocks > 0 ? std::min(options_.max_blocks_per_rank, k.pool_blocks)
                             : options_.max_blocks_per_rank;
}

void DpBalancer::trim(Keys& k) {
    const int64_t limit = cap(k);
    while (static_cast<int64_t>(k.lru.size()) > limit) {
        k.where.erase(k.lru.back());
        k.lru.pop_back();
    }
}

void DpBalancer::learn(int rank, std::span<const kv::BlockKey> chain) {
    if (!options_.prefix) return;
    Keys& k = ranks_.at(static_cast<size_t>(rank));
    // Past the cap only the chain's first blocks could stay: touch just those.
    const size_t n = std::min(chain.size(), static_cast<size_t>(cap(k)));
    // Leaf first, root last: the root ends most recent, so a parent never ages before the
    // blocks that extend it and the walk in matched_blocks never meets a hole.
    for (size_t i = n; i-- > 0;) {
        auto it = k.where.find(chain[i]);
        if (it != k.where.end()) {
            k.lru.splice(k.lru.begin(), k.lru, it->second);
        } else {
            k.lru.push_front(chain[i]);
            k.where.emplace(chain[i], k.lru.begin());
        }
    }
    trim(k);
}

void DpBalancer::set_pool_blocks(int rank, int64_t blocks) {
    Keys& k = ranks_.at(static_cast<size_t>(rank));
    k.pool_blocks = std::max<int64_t>(blocks, 0);
    trim(k);
}

void DpBalancer::forget(int rank) {
    Keys& k = ranks_.at(static_cast<size_t>(rank));
    k.lru.clear();
    k.where.clear();
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
    std::vector<Keys> keys(static_cast<size_t>(num_ranks));
    if (keep_rank0) {
        loads_[0] = zero;
        keys[0] = std::move(ranks_[0]);
    }
    ranks_ = std::move(keys);
}

}  // namespace dsi::engine

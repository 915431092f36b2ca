#include "engine/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace dsi::engine {

Status SchedulerConfig::validate() const {
    if (max_running_seqs < 1) return invalid_argument("max_running_seqs must be >= 1");
    if (max_batched_tokens < 1) return invalid_argument("max_batched_tokens must be >= 1");
    if (!(step_budget_ns > 0)) return invalid_argument("step budget must be > 0 ns");
    return cost.validate();
}

Scheduler::Scheduler(SchedulerConfig config, Env* env) : config_(std::move(config)), env_(env) {
    DSI_CHECK(config_.validate().is_ok());
}

ScheduleDecision Scheduler::schedule(std::span<const SeqView> running,
                                     std::span<const SeqView> waiting,
                                     int64_t num_available_blocks) const {
    ScheduleDecision d;
    const int64_t now = env_->now_ns();
    auto expired = [&](const SeqView& s) { return s.deadline_ns > 0 && now >= s.deadline_ns; };
    int64_t avail = num_available_blocks;
    double budget = config_.step_budget_ns;
    int64_t tokens_left = config_.max_batched_tokens;
    // Per running sequence: 0 untouched, 1 scheduled, 2 preempted or expired.
    std::vector<uint8_t> state(running.size(), 0);
    int64_t num_running = 0;
    for (size_t i = 0; i < running.size(); ++i) {
        if (expired(running[i])) {
            d.expired.push_back(running[i].id);
            avail += running[i].num_exclusive_blocks;
            state[i] = 2;
        } else {
            ++num_running;
        }
    }
    // Frees blocks for running[i] by preempting the newest untouched sequences after it.
    auto make_room = [&](size_t i, int64_t need) {
        for (size_t j = running.size(); j-- > i + 1 && need > avail;) {
            if (state[j] != 0) continue;
            state[j] = 2;
            d.preempted.push_back(running[j].id);
            avail += running[j].num_exclusive_blocks;
            --num_running;
        }
        return need <= avail;
    };
    // The cost model's base is a step's fixed part (for a MoE, mostly the experts a
    // first chunk touches): the first entry of a step pays it, later ones do not.
    const double base = config_.cost.base_ns;
    auto add = [&](const SeqView& s, int64_t q, int64_t new_blocks, bool admit) {
        const double c = config_.cost.cost_ns(q, s.num_computed) - (d.scheduled.empty() ? 0 : base);
        d.scheduled.push_back({s.id, q, new_blocks, admit});
        budget -= c;
        d.cost_ns += c;
        d.num_tokens += q;
        tokens_left -= q;
        avail -= new_blocks;
    };
    // 2. Decode first, oldest first.
    for (size_t i = 0; i < running.size() && tokens_left > 0; ++i) {
        const SeqView& s = running[i];
        if (state[i] != 0 || !s.decoding || !s.can_run) continue;
        auto blocks_for = [&](int64_t q) {
            return std::max<int64_t>(0, blocks_for_tokens(s.num_computed + q) - s.num_blocks);
        };
        int64_t q = std::clamp<int64_t>(s.decode_tokens, 1, tokens_left);
        if (blocks_for(q) > avail) q = 1;  // drafts never preempt anyone
        const int64_t need = blocks_for(q);
        if (!make_room(i, need)) continue;
        state[i] = 1;
        add(s, q, need, false);
    }
    // Largest chunk for s starting at c within budget, tokens and `blocks` more blocks.
    auto chunk = [&](const SeqView& s, int64_t c, int64_t held_blocks, int64_t blocks) {
        const int64_t remaining = std::min(s.num_tokens - c, tokens_left);
        if (remaining <= 0) return int64_t{0};
        const double paid = d.scheduled.empty() ? 0 : base;  // the base is paid once a step
        int64_t q = config_.cost.max_chunk_tokens(budget + paid, c, remaining);
        if (q == 0 && d.scheduled.empty()) q = 1;  // progress even on a tiny budget
        q = std::min(q, (held_blocks + blocks) * kv::kBlockTokens - c);
        return std::max<int64_t>(q, 0);
    };
    // 3a. Running prefills, FIFO.
    bool blocked = false;
    for (size_t i = 0; i < running.size() && !blocked; ++i) {
        const SeqView& s = running[i];
        if (state[i] != 0 || s.decoding || !s.can_run) continue;
        int64_t q = chunk(s, s.num_computed, s.num_blocks, avail);
        if (q < s.num_tokens - s.num_computed && q < tokens_left) {
            // Short of blocks (not of budget)? Take them from newer sequences.
            const int64_t want = chunk(s, s.num_computed, s.num_blocks, 1 << 30);
            const int64_t need = blocks_for_tokens(s.num_computed + want) - s.num_blocks;
            if (want > q && make_room(i, need)) q = want;
        }
        if (q <= 0) {
            blocked = true;
            break;
        }
        state[i] = 1;
        const int64_t need =
            std::max<int64_t>(0, blocks_for_tokens(s.num_computed + q) - s.num_blocks);
        add(s, q, need, false);
    }
    // 3b. Admissions, FIFO, never preempting.
    for (const SeqView& w : waiting) {
        if (blocked) break;
        if (expired(w)) {
            d.expired.push_back(w.id);
            continue;
        }
        if (num_running >= config_.max_running_seqs) break;
        // Blocks the sequence holds once admitted (pinned hits, or swapped-in rows) and
        // what taking them costs the pool.
        const int64_t held_blocks =
            w.num_swapped_blocks > 0 ? w.num_swapped_blocks : blocks_for_tokens(w.num_cached_tokens);
        const int64_t taken = w.num_cached_unreferenced_blocks + w.num_swapped_blocks;
        const int64_t free_after_pin = avail - taken;
        if (free_after_pin < 0) break;
        const int64_t q = chunk(w, w.num_cached_tokens, held_blocks, free_after_pin);
        if (q <= 0) break;
        const int64_t need = blocks_for_tokens(w.num_cached_tokens + q) - held_blocks;
        SeqView at = w;
        at.num_computed = w.num_cached_tokens;
        add(at, q, need, true);
        avail -= taken;
        ++num_running;
    }
    return d;
}

}  // namespace dsi::engine

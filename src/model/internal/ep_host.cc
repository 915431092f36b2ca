#include "model/internal/ep_host.h"

#include "base/logging.h"
#include "comm/combine_kernel.h"

namespace dsi::internal {

Status EpHost::join(const ExpertParallelOptions& options, const ModelConfig& config,
                    ExpertFn expert) {
    DSI_CHECK(options.enabled());
    DSI_ASSIGN_OR_RETURN(group_, ExpertParallelGroup::create(options, config));
    group_->set_weight_mover(this);
    options_ = options;
    config_ = config;
    expert_ = std::move(expert);
    num_experts_ = static_cast<int>(config.n_routed_experts);
    num_moe_layers_ = group_->num_moe_layers();
    hidden_ = config.hidden_size;
    top_k_ = config.num_experts_per_tok;
    return Status::ok();
}

std::vector<int> EpHost::held(int moe_layer) const {
    if (group_ != nullptr) {
        const std::span<const int> local = group_->local_experts(moe_layer);
        return {local.begin(), local.end()};
    }
    std::vector<int> all(static_cast<size_t>(num_experts_));
    for (int e = 0; e < num_experts_; ++e) all[static_cast<size_t>(e)] = e;
    return all;
}

bool EpHost::recoverable(const Status& s) const {
    return s.code() == StatusCode::kUnavailable && options_.restart != nullptr;
}

void EpHost::abandon() {
    if (group_ != nullptr) group_->abandon();
}

Status EpHost::begin_pass(int64_t num_tokens) {
    pass_tokens_ = num_tokens;
    if (group_ == nullptr) return Status::ok();
    Result<int> rounds = group_->begin_forward(num_tokens);
    if (rounds.is_ok()) {
        rounds_ = *rounds;
        return Status::ok();
    }
    if (!recoverable(rounds.status())) return rounds.status();
    return resume_pass(rounds.status(), 0);
}

Status EpHost::run_layer(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                         std::span<const int32_t> ids, std::span<const float> gate,
                         std::span<float> out) {
    if (options_.on_moe_layer) options_.on_moe_layer(moe_layer);
    return group_->run_moe(
        moe_layer, hidden, num_tokens, ids, gate, rounds_,
        [&](int slot, const float* x, int64_t rows, float* y) {
            expert_(moe_layer, slot, x, rows, y);
        },
        out);
}

Status EpHost::moe(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                   std::span<const int32_t> ids, std::span<const float> gate,
                   std::span<float> out) {
    for (;;) {
        if (group_ == nullptr) {
            moe_alone(moe_layer, hidden, num_tokens, ids, gate, out);
            return Status::ok();
        }
        Status s = run_layer(moe_layer, hidden, num_tokens, ids, gate, out);
        if (s.is_ok() || !recoverable(s) || pass_tokens_ == 0) return s;
        // S-DEPLOY: this layer again in the group of the healthy ranks (the combine
        // rewrites every output row).
        DSI_RETURN_IF_ERROR(resume_pass(s, moe_layer));
    }
}

Status EpHost::join_layers(int from_moe_layer) {
    for (int l = from_moe_layer; l < num_moe_layers_ && group_ != nullptr; ++l) {
        DSI_RETURN_IF_ERROR(moe(l, {}, 0, {}, {}, {}));
    }
    return Status::ok();
}

Status EpHost::resume_pass(Status failure, int done_layers) {
    for (;;) {
        group_->abandon();
        DSI_RETURN_IF_ERROR(fail_over(failure));
        if (group_ == nullptr) return Status::ok();
        Result<int> rounds = group_->begin_forward(pass_tokens_);
        Status s = rounds.status();
        if (rounds.is_ok()) {
            rounds_ = *rounds;
            // The new group's other ranks run every MoE layer of this pass (an empty pass).
            for (int l = 0; l < done_layers && s.is_ok(); ++l) {
                s = run_layer(l, {}, 0, {}, {}, {});
            }
            if (s.is_ok()) return s;
        }
        if (!recoverable(s)) return s;
        failure = s;  // another death in the new group
    }
}

void EpHost::moe_alone(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                       std::span<const int32_t> ids, std::span<const float> gate,
                       std::span<float> out) {
    const int64_t H = hidden_;
    const int64_t k = top_k_;
    // Rows of each expert (token-major order), the expert on them, then each token's sum
    // in k order with the combine's kernel (the same bits as the group's combine).
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(num_experts_));
    for (int64_t i = 0; i < num_tokens * k; ++i) {
        rows_of[static_cast<size_t>(ids[static_cast<size_t>(i)])].push_back(i);
    }
    std::vector<float> y(static_cast<size_t>(num_tokens * k * H));
    std::vector<float> xin, yout;
    for (int e = 0; e < num_experts_; ++e) {
        const std::vector<int64_t>& rows = rows_of[static_cast<size_t>(e)];
        if (rows.empty()) continue;
        const int64_t m = static_cast<int64_t>(rows.size());
        xin.resize(static_cast<size_t>(m * H));
        yout.resize(static_cast<size_t>(m * H));
        for (int64_t r = 0; r < m; ++r) {
            std::copy_n(hidden.data() + rows[static_cast<size_t>(r)] / k * H, H,
                        xin.data() + r * H);
        }
        expert_(moe_layer, e, xin.data(), m, yout.data());
        for (int64_t r = 0; r < m; ++r) {
            std::copy_n(yout.data() + r * H, H, y.data() + rows[static_cast<size_t>(r)] * H);
        }
    }
    const comm::CombineRowFn combine = comm::combine_kernels()[0].fn;
    std::vector<const float*> rows(static_cast<size_t>(k));
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t j = 0; j < k; ++j) rows[static_cast<size_t>(j)] = y.data() + (t * k + j) * H;
        combine(out.data() + t * H, rows.data(), gate.data() + t * k, static_cast<int>(k),
                static_cast<int>(H));
    }
}

Status EpHost::fail_over(const Status& failure) {
    DSI_LOG(kWarning) << "expert parallelism: " << failure.to_string()
                      << "; restarting with the healthy ranks (S-DEPLOY)";
    DSI_ASSIGN_OR_RETURN(EpRestart next, options_.restart(failure));
    ExpertParallelOptions o = options_;
    o.num_ranks = next.num_ranks;
    o.group = next.group;
    std::unique_ptr<ExpertParallelGroup> group;
    std::vector<int> next_local;
    if (o.num_ranks > 1) {
        DSI_ASSIGN_OR_RETURN(group, ExpertParallelGroup::create(o, config_));
        for (int l = 0; l < group->num_moe_layers(); ++l) {
            const auto local = group->local_experts(l);
            next_local.insert(next_local.end(), local.begin(), local.end());
        }
    } else {
        for (int l = 0; l < num_moe_layers_; ++l) {
            for (int e = 0; e < num_experts_; ++e) next_local.push_back(e);
        }
    }
    begin_move(std::move(next_local));
    // The pass waits for the weights: nothing can run before they are here.
    DSI_RETURN_IF_ERROR(wait_move().with_context("expert parallelism failover"));
    commit_move();
    const ExpertParallelStats old = group_->stats(0);
    MutexLock lock(&mu_);
    past_.steps += old.steps;
    past_.placement_changes += old.placement_changes;
    ++past_.failovers;
    options_ = o;
    group_ = std::move(group);
    if (group_ != nullptr) group_->set_weight_mover(this);
    return Status::ok();
}

Result<CausalLm::GroupStep> EpHost::idle_step(bool leaving) {
    using GroupStep = CausalLm::GroupStep;
    if (group_ == nullptr) return GroupStep::kNotGrouped;
    Result<int> rounds = group_->idle(leaving);
    Status s = rounds.status();
    if (rounds.is_ok()) {
        if (*rounds == ExpertParallelGroup::kStopped) return GroupStep::kStopped;
        if (*rounds == 0) return GroupStep::kAllIdle;
        // A peer's step: this rank brings no tokens and joins every MoE exchange.
        rounds_ = *rounds;
        pass_tokens_ = 0;
        s = join_layers(0);
        if (s.is_ok()) return GroupStep::kJoinedPeers;
    }
    group_->abandon();
    if (!recoverable(s)) return s;
    // S-DEPLOY: a peer died while this rank had no tokens; continue with the healthy ranks.
    DSI_RETURN_IF_ERROR(fail_over(s));
    return group_ == nullptr ? GroupStep::kNotGrouped : GroupStep::kAllIdle;
}

std::optional<ExpertParallelStats> EpHost::stats(size_t max_windows) const {
    MutexLock lock(&mu_);
    if (group_ == nullptr && past_.failovers == 0) return std::nullopt;
    ExpertParallelStats s;  // alone after a failover: no group left
    if (group_ != nullptr) s = group_->stats(max_windows);
    s.steps += past_.steps;
    s.placement_changes += past_.placement_changes;
    s.failovers = past_.failovers;
    return s;
}

Result<CausalLm::GroupStep> group_idle_step(EpHost* host, bool leaving) {
    if (host == nullptr) return CausalLm::GroupStep::kNotGrouped;
    return host->idle_step(leaving);
}

std::optional<ExpertParallelStats> group_stats(const EpHost* host, size_t max_windows) {
    if (host == nullptr) return std::nullopt;
    return host->stats(max_windows);
}

}  // namespace dsi::internal

#include "model/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>

#include "comm/shm_group.h"
#include "comm/ucx_group.h"

namespace dsi {
namespace {

int count_moe_layers(const ModelConfig& c) {
    int n = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) n += c.is_moe_layer(i) ? 1 : 0;
    return n;
}

// The agreement's value with this rank's ready bit: values are >= kLeaving (-2).
int64_t encode(int64_t value, bool ready) { return (value + 2) * 2 + (ready ? 1 : 0); }
int64_t decode_value(int64_t word) { return word / 2 - 2; }
bool decode_ready(int64_t word) { return (word & 1) != 0; }

constexpr size_t kMaxStatsWindows = 1000;

}  // namespace

int slots_per_rank(int num_experts, int num_ranks, int redundant_per_rank) {
    // S-EPLB: E + redundant * N physical slots, rounded up to a multiple of N.
    return (num_experts + redundant_per_rank * num_ranks + num_ranks - 1) / num_ranks;
}

Result<comm::PlacementTable> initial_placement(int num_experts, int num_ranks, int slots) {
    if (num_experts % num_ranks == 0) {
        return comm::PlacementTable::identity(num_experts, num_ranks, slots);
    }
    // Rank r holds a contiguous run of experts, the first E mod N ranks one more; the
    // remaining slots hold replicas of experts 0, 1, ... in rank order.
    const int base = num_experts / num_ranks;
    const int extra = num_experts % num_ranks;
    std::vector<int> slot_expert(static_cast<size_t>(num_ranks) * slots, -1);
    int next_replica = 0;
    for (int r = 0; r < num_ranks; ++r) {
        const int first = r * base + std::min(r, extra);
        const int count = base + (r < extra ? 1 : 0);
        for (int s = 0; s < slots; ++s) {
            slot_expert[static_cast<size_t>(r) * slots + s] =
                s < count ? first + s : next_replica++ % num_experts;
        }
    }
    return comm::PlacementTable::create(num_experts, num_ranks, slots, std::move(slot_expert));
}

Status validate_expert_parallel(const ExpertParallelOptions& o, const ModelConfig& c) {
    const std::string ep = "expert parallelism (--ep " + std::to_string(o.num_ranks) + ")";
    if (o.num_ranks < 1) {
        return invalid_argument(ep + ": the rank count must be >= 1");
    }
    if (!o.enabled()) {
        return Status::ok();
    }
    if (o.rank < 0 || o.rank >= o.num_ranks) {
        return invalid_argument(ep + ": rank " + std::to_string(o.rank) + " not in [0, " +
                                std::to_string(o.num_ranks) + ")");
    }
    const int64_t experts = c.n_routed_experts;
    if (experts <= 0 || c.num_experts_per_tok <= 0) {
        return invalid_argument(ep + ": the model has no routed experts");
    }
    if (o.num_ranks > experts) {
        return invalid_argument(ep + ": more ranks than the " + std::to_string(experts) +
                                " routed experts");
    }
    if (o.redundant_experts_per_rank < 0 || o.max_tokens_per_call < 1) {
        return invalid_argument(ep + ": redundant experts must be >= 0, tokens per call >= 1");
    }
    // S-EPLB: E + redundant * N physical slots, N per rank; more replicas per rank than
    // there are experts cannot be filled with distinct work.
    if (o.redundant_experts_per_rank > experts) {
        return invalid_argument(ep + ": " + std::to_string(o.redundant_experts_per_rank) +
                                " redundant experts per rank, more than the " +
                                std::to_string(experts) + " routed experts");
    }
    if (o.stats_window_steps < 1) {
        return invalid_argument(ep + ": the stats window must be >= 1 step");
    }
    if (o.group.empty()) {
        return invalid_argument(ep + ": no group name");
    }
    if (o.transport == EpTransport::kUcx && o.coordinator.empty()) {
        return invalid_argument(ep + ": UCX needs a coordinator address (host:port)");
    }
    return Status::ok();
}

Result<std::unique_ptr<ExpertParallelGroup>> ExpertParallelGroup::create(
    const ExpertParallelOptions& options, const ModelConfig& config) {
    DSI_RETURN_IF_ERROR(validate_expert_parallel(options, config));
    const int experts = static_cast<int>(config.n_routed_experts);
    const int slots =
        slots_per_rank(experts, options.num_ranks, options.redundant_experts_per_rank);
    DSI_ASSIGN_OR_RETURN(comm::PlacementTable placement,
                         initial_placement(experts, options.num_ranks, slots));
    const int moe_layers = count_moe_layers(config);
    if (moe_layers < 1) {
        return invalid_argument("expert parallelism: the model has no MoE layer");
    }
    std::unique_ptr<comm::PlacementPolicy> policy;
    if (options.placement_policy) {
        DSI_ASSIGN_OR_RETURN(policy,
                             options.placement_policy(moe_layers, experts, options.num_ranks));
    }
    comm::MoeShape shape;
    shape.num_ranks = options.num_ranks;
    shape.hidden = static_cast<int>(config.hidden_size);
    shape.top_k = static_cast<int>(config.num_experts_per_tok);
    shape.max_tokens_per_rank = options.max_tokens_per_call;
    shape.slots_per_rank = slots;
    // The fields both transports' options share.
    auto common = [&](auto& o) {
        o.rank = options.rank;
        o.shape = shape;
        o.attach_timeout_ms = options.attach_timeout_ms;
        o.op_timeout_ms = options.op_timeout_ms;
        o.abandoned = options.abandoned;
    };
    std::unique_ptr<comm::MoeCommunicator> comm;
    if (options.transport == EpTransport::kUcx) {
        comm::UcxGroupOptions ucx;
        common(ucx);
        ucx.coordinator = options.coordinator;
        DSI_ASSIGN_OR_RETURN(comm, comm::create_ucx_communicator(ucx));
    } else {
        comm::ShmOptions shm;
        common(shm);
        shm.name = options.group;
        DSI_ASSIGN_OR_RETURN(comm, comm::ShmMoeCommunicator::create(shm));
    }
    std::vector<comm::PlacementTable> placements(static_cast<size_t>(moe_layers), placement);
    return std::unique_ptr<ExpertParallelGroup>(new ExpertParallelGroup(
        options, std::move(placements), std::move(comm), std::move(policy)));
}

ExpertParallelGroup::ExpertParallelGroup(ExpertParallelOptions options,
                                         std::vector<comm::PlacementTable> placements,
                                         std::unique_ptr<comm::MoeCommunicator> comm,
                                         std::unique_ptr<comm::PlacementPolicy> policy)
    : options_(std::move(options)),
      placements_(std::move(placements)),
      comm_(std::move(comm)),
      policy_(std::move(policy)),
      step_load_(static_cast<int>(placements_.size()), placements_[0].num_experts()),
      window_rank_rows_(placements_.size() * static_cast<size_t>(options_.num_ranks), 0) {
    stats_.rank_rows.assign(static_cast<size_t>(options_.num_ranks), 0);
}

ExpertParallelGroup::~ExpertParallelGroup() = default;

std::span<const int> ExpertParallelGroup::local_experts(int moe_layer) const {
    const comm::PlacementTable& p = placements_[static_cast<size_t>(moe_layer)];
    const size_t slots = static_cast<size_t>(p.slots_per_rank());
    return p.slot_expert().subspan(static_cast<size_t>(options_.rank) * slots, slots);
}

ExpertParallelStats ExpertParallelGroup::stats(size_t max_windows) const {
    ExpertParallelStats s;
    MutexLock lock(&stats_mu_);
    s.num_ranks = options_.num_ranks;
    s.steps = stats_.steps;
    s.placement_changes = stats_.placement_changes;
    s.rank_rows = stats_.rank_rows;
    s.placed_moe_lb = stats_.placed_moe_lb;
    const size_t n = std::min(max_windows, stats_.windows.size());
    s.windows.assign(stats_.windows.end() - static_cast<std::ptrdiff_t>(n), stats_.windows.end());
    return s;
}

void ExpertParallelGroup::abandon() { comm_.reset(); }

Status ExpertParallelGroup::end_step() {
    if (!step_open_) return Status::ok();
    step_open_ = false;
    const size_t N = static_cast<size_t>(options_.num_ranks);
    {
        MutexLock lock(&stats_mu_);
        ++stats_.steps;
        if (++window_steps_ == options_.stats_window_steps) {
            // moe_lb per layer = busiest rank / mean rank, averaged over layers with rows.
            double sum = 0;
            int layers = 0;
            for (size_t l = 0; l < placements_.size(); ++l) {
                const int64_t* rows = window_rank_rows_.data() + l * N;
                const int64_t total = std::accumulate(rows, rows + N, int64_t{0});
                if (total == 0) continue;
                const int64_t busiest = *std::max_element(rows, rows + N);
                sum += static_cast<double>(busiest) * static_cast<double>(N) /
                       static_cast<double>(total);
                ++layers;
            }
            if (layers > 0) {
                if (stats_.windows.size() == kMaxStatsWindows) {
                    stats_.windows.erase(stats_.windows.begin());
                }
                stats_.windows.push_back({stats_.steps, stats_.placement_changes, sum / layers});
            }
            std::fill(window_rank_rows_.begin(), window_rank_rows_.end(), 0);
            window_steps_ = 0;
        }
    }
    if (policy_ == nullptr) return Status::ok();
    DSI_RETURN_IF_ERROR(policy_->record_step(step_load_.step_loads()));
    step_load_.reset();
    // S-EPLB: the policy says when; one placement moves at a time.
    DSI_ASSIGN_OR_RETURN(comm::PlacementDecision d, policy_->decide());
    if (d.phy_to_log.empty() || !staged_.empty()) return Status::ok();
    {
        MutexLock lock(&stats_mu_);
        stats_.placed_moe_lb = d.moe_lb_on_window;
        if (!stats_.windows.empty() && stats_.windows.back().end_step == stats_.steps) {
            // Decided as a window closed: computed from that window's loads.
            stats_.windows.back().placed_moe_lb = d.moe_lb_on_window;
        }
    }
    return stage(d.phy_to_log);
}

Status ExpertParallelGroup::stage(std::span<const int> phy_to_log) {
    const int layers = num_moe_layers();
    const int experts = placements_[0].num_experts();
    const int slots = placements_[0].slots_per_rank();
    const int physical = slots * options_.num_ranks;
    if (phy_to_log.size() != static_cast<size_t>(layers) * physical) {
        return internal_error("eplb: the policy placed " + std::to_string(phy_to_log.size()) +
                              " slots, the group has " + std::to_string(layers) + " x " +
                              std::to_string(physical));
    }
    std::vector<comm::PlacementTable> next;
    bool changed = false;
    for (int l = 0; l < layers; ++l) {
        DSI_ASSIGN_OR_RETURN(
            comm::PlacementTable t,
            comm::layer_placement(phy_to_log, physical, l, experts, options_.num_ranks));
        const auto a = t.slot_expert();
        const auto b = placements_[static_cast<size_t>(l)].slot_expert();
        changed = changed || !std::equal(a.begin(), a.end(), b.begin(), b.end());
        next.push_back(std::move(t));
    }
    if (!changed) return Status::ok();
    if (mover_ == nullptr) {
        return failed_precondition("eplb: a placement policy but no weight mover");
    }
    std::vector<int> local;
    for (const comm::PlacementTable& t : next) {
        const auto mine = t.slot_expert().subspan(static_cast<size_t>(options_.rank) * slots,
                                                  static_cast<size_t>(slots));
        local.insert(local.end(), mine.begin(), mine.end());
    }
    staged_ = std::move(next);
    mover_->begin_move(std::move(local));
    return Status::ok();
}

Result<std::vector<int64_t>> ExpertParallelGroup::gather(int64_t value, int64_t timeout_ms) {
    if (comm_ == nullptr) {
        return failed_precondition("expert parallelism: this rank left its group");
    }
    if (stopped_) {
        return failed_precondition("expert parallelism: the group has stopped");
    }
    DSI_RETURN_IF_ERROR(end_step());
    bool ready = false;
    if (!staged_.empty()) {
        DSI_ASSIGN_OR_RETURN(ready, mover_->move_ready());
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.op_timeout_ms);
        while (!ready && options_.wait_for_moved_weights) {
            if (std::chrono::steady_clock::now() > deadline) {
                return deadline_exceeded("eplb: the moved experts' weights did not load in " +
                                         std::to_string(options_.op_timeout_ms) + " ms");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            DSI_ASSIGN_OR_RETURN(ready, mover_->move_ready());
        }
    }
    DSI_ASSIGN_OR_RETURN(std::vector<int64_t> words,
                         comm_->all_gather(encode(value, ready), timeout_ms));
    bool all_ready = !staged_.empty();
    std::vector<int64_t> values;
    values.reserve(words.size());
    for (int64_t w : words) {
        values.push_back(decode_value(w));
        all_ready = all_ready && decode_ready(w);
    }
    if (all_ready) {
        // Every rank saw the same words: all switch here, before this pass's MoE layers.
        mover_->commit_move();
        placements_ = std::move(staged_);
        staged_.clear();
        MutexLock lock(&stats_mu_);
        ++stats_.placement_changes;
    }
    return values;
}

int ExpertParallelGroup::rounds_for(std::span<const int64_t> values) const {
    int64_t rounds = 0;
    const int64_t per_call = options_.max_tokens_per_call;
    for (int64_t v : values) {
        rounds = std::max(rounds, v > 0 ? (v + per_call - 1) / per_call : 0);
    }
    return static_cast<int>(rounds);
}

Result<int> ExpertParallelGroup::begin_forward(int64_t num_tokens) {
    DSI_CHECK(num_tokens > 0, "begin_forward needs tokens (idle() otherwise)");
    DSI_ASSIGN_OR_RETURN(std::vector<int64_t> values, gather(num_tokens, 0));
    step_open_ = true;
    return rounds_for(values);
}

Result<int> ExpertParallelGroup::idle(bool leaving) {
    if (stopped_) return kStopped;
    DSI_ASSIGN_OR_RETURN(std::vector<int64_t> values,
                         gather(leaving ? kLeaving : kIdle, options_.idle_timeout_ms));
    const int rounds = rounds_for(values);
    if (rounds > 0) {
        step_open_ = true;
        return rounds;
    }
    if (std::all_of(values.begin(), values.end(), [](int64_t v) { return v == kLeaving; })) {
        stopped_ = true;
        return kStopped;
    }
    return 0;
}

Status ExpertParallelGroup::run_moe(int moe_layer, std::span<const float> hidden,
                                    int64_t num_tokens, std::span<const int32_t> ids,
                                    std::span<const float> gate, int rounds, const ExpertFn& expert,
                                    std::span<float> out) {
    if (comm_ == nullptr) {
        return failed_precondition("expert parallelism: this rank left its group");
    }
    const size_t H = static_cast<size_t>(comm_->shape().hidden);
    const size_t k = static_cast<size_t>(comm_->shape().top_k);
    const int64_t per_call = options_.max_tokens_per_call;
    DSI_CHECK(num_tokens <= int64_t{rounds} * per_call, "more tokens than the agreed rounds carry");
    for (int r = 0; r < rounds; ++r) {
        const size_t begin = static_cast<size_t>(std::min<int64_t>(r * per_call, num_tokens));
        const size_t n =
            static_cast<size_t>(std::min<int64_t>(begin + per_call, num_tokens)) - begin;
        const comm::PlacementTable& placement = placements_[static_cast<size_t>(moe_layer)];
        DSI_ASSIGN_OR_RETURN(comm::MoeLayout layout,
                             comm_->layout(placement, ids.subspan(begin * k, n * k),
                                           static_cast<int>(n), options_.replica_choice));
        // S-EPLB: the group's load of this layer, the same on every rank.
        DSI_RETURN_IF_ERROR(step_load_.add_slot_rows(moe_layer, placement, layout.slot_rows));
        const size_t slots = static_cast<size_t>(placement.slots_per_rank());
        int64_t* rank_rows = window_rank_rows_.data() + static_cast<size_t>(moe_layer) *
                                                            static_cast<size_t>(options_.num_ranks);
        {
            MutexLock lock(&stats_mu_);
            for (size_t p = 0; p < layout.slot_rows.size(); ++p) {
                rank_rows[p / slots] += layout.slot_rows[p];
                stats_.rank_rows[p / slots] += layout.slot_rows[p];
            }
        }
        DSI_ASSIGN_OR_RETURN(comm::DispatchView view,
                             comm_->dispatch(layout, hidden.subspan(begin * H, n * H)));
        std::span<float> y = comm_->expert_output_buffer(layout);
        for (size_t s = 0; s + 1 < view.slot_offsets.size(); ++s) {
            const int64_t first = view.slot_offsets[s];
            const int64_t rows = view.slot_offsets[s + 1] - first;
            if (rows > 0) {
                expert(static_cast<int>(s), view.rows.data() + first * H, rows,
                       y.data() + first * H);
            }
        }
        DSI_RETURN_IF_ERROR(comm_->combine(layout, y, gate.subspan(begin * k, n * k),
                                           out.subspan(begin * H, n * H)));
    }
    return Status::ok();
}

}  // namespace dsi

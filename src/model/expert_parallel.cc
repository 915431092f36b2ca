#include "model/expert_parallel.h"

#include <algorithm>
#include <string>

#include "comm/shm_group.h"

namespace dsi {

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
    if (c.v4_layout()) {
        return invalid_argument(ep + ": runs DeepSeek V2/V3 only yet, not " + c.architecture);
    }
    const int64_t experts = c.n_routed_experts;
    if (experts <= 0 || c.num_experts_per_tok <= 0) {
        return invalid_argument(ep + ": the model has no routed experts");
    }
    if (o.num_ranks > experts) {
        return invalid_argument(ep + ": more ranks than the " + std::to_string(experts) +
                                " routed experts");
    }
    if (experts % o.num_ranks != 0) {
        return invalid_argument(ep + ": " + std::to_string(o.num_ranks) +
                                " ranks do not divide the " + std::to_string(experts) +
                                " routed experts (each rank holds as many)");
    }
    if (o.redundant_experts_per_rank < 0 || o.max_tokens_per_call < 1) {
        return invalid_argument(ep + ": redundant experts must be >= 0, tokens per call >= 1");
    }
    if (o.group.empty()) {
        return invalid_argument(ep + ": no group name");
    }
    return Status::ok();
}

Result<std::unique_ptr<ExpertParallelGroup>> ExpertParallelGroup::create(
    const ExpertParallelOptions& options, const ModelConfig& config) {
    DSI_RETURN_IF_ERROR(validate_expert_parallel(options, config));
    const int experts = static_cast<int>(config.n_routed_experts);
    const int slots = experts / options.num_ranks + options.redundant_experts_per_rank;
    DSI_ASSIGN_OR_RETURN(comm::PlacementTable placement,
                         comm::PlacementTable::identity(experts, options.num_ranks, slots));
    comm::ShmOptions shm;
    shm.name = options.group;
    shm.rank = options.rank;
    shm.shape.num_ranks = options.num_ranks;
    shm.shape.hidden = static_cast<int>(config.hidden_size);
    shm.shape.top_k = static_cast<int>(config.num_experts_per_tok);
    shm.shape.max_tokens_per_rank = options.max_tokens_per_call;
    shm.shape.slots_per_rank = slots;
    shm.attach_timeout_ms = options.attach_timeout_ms;
    shm.op_timeout_ms = options.op_timeout_ms;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<comm::ShmMoeCommunicator> comm,
                         comm::ShmMoeCommunicator::create(shm));
    return std::unique_ptr<ExpertParallelGroup>(
        new ExpertParallelGroup(options, std::move(placement), std::move(comm)));
}

ExpertParallelGroup::ExpertParallelGroup(ExpertParallelOptions options,
                                         comm::PlacementTable placement,
                                         std::unique_ptr<comm::MoeCommunicator> comm)
    : options_(std::move(options)), placement_(std::move(placement)), comm_(std::move(comm)) {}

ExpertParallelGroup::~ExpertParallelGroup() = default;

std::span<const int> ExpertParallelGroup::local_experts() const {
    const size_t slots = static_cast<size_t>(placement_.slots_per_rank());
    return placement_.slot_expert().subspan(static_cast<size_t>(options_.rank) * slots, slots);
}

void ExpertParallelGroup::abandon() { comm_.reset(); }

Result<std::vector<int64_t>> ExpertParallelGroup::gather(int64_t value, int64_t timeout_ms) {
    if (comm_ == nullptr) {
        return failed_precondition("expert parallelism: this rank left its group");
    }
    if (stopped_) {
        return failed_precondition("expert parallelism: the group has stopped");
    }
    return comm_->all_gather(value, timeout_ms);
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
    return rounds_for(values);
}

Result<int> ExpertParallelGroup::idle(bool leaving) {
    if (stopped_) return kStopped;
    DSI_ASSIGN_OR_RETURN(std::vector<int64_t> values,
                         gather(leaving ? kLeaving : kIdle, options_.idle_timeout_ms));
    const int rounds = rounds_for(values);
    if (rounds > 0) {
        return rounds;
    }
    if (std::all_of(values.begin(), values.end(), [](int64_t v) { return v == kLeaving; })) {
        stopped_ = true;
        return kStopped;
    }
    return 0;
}

Status ExpertParallelGroup::run_moe(std::span<const float> hidden, int64_t num_tokens,
                                    std::span<const int32_t> ids, std::span<const float> gate,
                                    int rounds, const ExpertFn& expert, std::span<float> out) {
    if (comm_ == nullptr) {
        return failed_precondition("expert parallelism: this rank left its group");
    }
    const size_t H = static_cast<size_t>(comm_->shape().hidden);
    const size_t k = static_cast<size_t>(comm_->shape().top_k);
    const int64_t per_call = options_.max_tokens_per_call;
    DSI_CHECK(num_tokens <= int64_t{rounds} * per_call, "more tokens than the agreed rounds carry");
    for (int r = 0; r < rounds; ++r) {
        const size_t begin = static_cast<size_t>(std::min<int64_t>(r * per_call, num_tokens));
        const size_t n = static_cast<size_t>(std::min<int64_t>(begin + per_call, num_tokens)) - begin;
        DSI_ASSIGN_OR_RETURN(comm::MoeLayout layout,
                             comm_->layout(placement_, ids.subspan(begin * k, n * k),
                                           static_cast<int>(n), options_.replica_choice));
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
        DSI_RETURN_IF_ERROR(
            comm_->combine(layout, y, gate.subspan(begin * k, n * k), out.subspan(begin * H, n * H)));
    }
    return Status::ok();
}

}  // namespace dsi

#include "comm/moe_comm.h"

#include <string>

namespace dsi::comm {

Result<PlacementTable> PlacementTable::create(int num_experts, int num_ranks, int slots_per_rank,
                                              std::vector<int> slot_expert) {
    if (num_experts <= 0 || num_ranks <= 0 || slots_per_rank <= 0) {
        return invalid_argument("placement: experts, ranks and slots per rank must be > 0");
    }
    const size_t num_slots = static_cast<size_t>(num_ranks) * slots_per_rank;
    if (slot_expert.size() != num_slots) {
        return invalid_argument("placement: " + std::to_string(slot_expert.size()) +
                                " slot entries for " + std::to_string(num_ranks) + " ranks x " +
                                std::to_string(slots_per_rank) + " slots");
    }
    PlacementTable t;
    t.num_experts_ = num_experts;
    t.num_ranks_ = num_ranks;
    t.slots_per_rank_ = slots_per_rank;
    t.replica_begin_.assign(static_cast<size_t>(num_experts) + 1, 0);
    for (size_t p = 0; p < num_slots; ++p) {
        const int e = slot_expert[p];
        if (e < -1 || e >= num_experts) {
            return invalid_argument("placement: slot " + std::to_string(p) + " holds expert " +
                                    std::to_string(e) + ", not in [-1, " +
                                    std::to_string(num_experts) + ")");
        }
        if (e >= 0) {
            ++t.replica_begin_[static_cast<size_t>(e) + 1];
        }
    }
    for (int e = 0; e < num_experts; ++e) {
        if (t.replica_begin_[static_cast<size_t>(e) + 1] == 0) {
            return invalid_argument("placement: expert " + std::to_string(e) + " has no slot");
        }
        t.replica_begin_[static_cast<size_t>(e) + 1] += t.replica_begin_[e];
    }
    // Counting sort of slots by expert; slots ascend within an expert.
    t.replica_slots_.resize(static_cast<size_t>(t.replica_begin_.back()));
    std::vector<int> fill(t.replica_begin_.begin(), t.replica_begin_.end() - 1);
    for (size_t p = 0; p < num_slots; ++p) {
        if (slot_expert[p] >= 0) {
            t.replica_slots_[static_cast<size_t>(fill[slot_expert[p]]++)] = static_cast<int>(p);
        }
    }
    t.slot_expert_ = std::move(slot_expert);
    return t;
}

Result<PlacementTable> PlacementTable::identity(int num_experts, int num_ranks,
                                                int slots_per_rank) {
    if (num_ranks <= 0 || num_experts % num_ranks != 0 ||
        slots_per_rank < num_experts / num_ranks) {
        return invalid_argument("identity placement: " + std::to_string(num_experts) +
                                " experts do not fit " + std::to_string(num_ranks) + " ranks x " +
                                std::to_string(slots_per_rank) + " slots");
    }
    const int own = num_experts / num_ranks;
    std::vector<int> slots;
    int next_replica = 0;
    for (int r = 0; r < num_ranks; ++r) {
        for (int s = 0; s < slots_per_rank; ++s) {
            slots.push_back(s < own ? r * own + s : next_replica++ % num_experts);
        }
    }
    return create(num_experts, num_ranks, slots_per_rank, std::move(slots));
}

Status MoeShape::validate() const {
    if (num_ranks <= 0 || hidden <= 0 || top_k <= 0 || max_tokens_per_rank <= 0 ||
        slots_per_rank <= 0 || max_recv_rows < 0) {
        return invalid_argument("moe shape: ranks " + std::to_string(num_ranks) + ", hidden " +
                                std::to_string(hidden) + ", top_k " + std::to_string(top_k) +
                                ", max tokens " + std::to_string(max_tokens_per_rank) + ", slots " +
                                std::to_string(slots_per_rank) + " must all be > 0");
    }
    return Status::ok();
}

namespace {

int choose_replica(std::span<const int> replicas, const PlacementTable& placement, int rank,
                   int token, int k, ReplicaChoice choice) {
    const int count = static_cast<int>(replicas.size());
    if (count == 1 || choice == ReplicaChoice::kFirst) {
        return replicas[0];
    }
    if (choice == ReplicaChoice::kLocalFirst) {
        for (int p : replicas) {
            if (p / placement.slots_per_rank() == rank) {
                return p;
            }
        }
    }
    const int64_t spread = int64_t{token} * placement.num_ranks() + rank + k;
    return replicas[static_cast<size_t>(spread % count)];
}

}  // namespace

Status route_tokens(const MoeShape& shape, const PlacementTable& placement, int rank,
                    std::span<const int32_t> topk_ids, int num_tokens, ReplicaChoice choice,
                    MoeLayout& layout) {
    if (placement.num_ranks() != shape.num_ranks ||
        placement.slots_per_rank() != shape.slots_per_rank) {
        return invalid_argument("placement for " + std::to_string(placement.num_ranks()) +
                                " ranks x " + std::to_string(placement.slots_per_rank()) +
                                " slots, group has " + std::to_string(shape.num_ranks) + " x " +
                                std::to_string(shape.slots_per_rank));
    }
    if (num_tokens < 0) {
        return invalid_argument("negative token count");
    }
    if (num_tokens > shape.max_tokens_per_rank) {
        return resource_exhausted(std::to_string(num_tokens) + " tokens, capacity " +
                                  std::to_string(shape.max_tokens_per_rank) + " per rank");
    }
    const size_t n = static_cast<size_t>(num_tokens) * shape.top_k;
    if (topk_ids.size() != n) {
        return invalid_argument(std::to_string(topk_ids.size()) + " top-k ids for " +
                                std::to_string(num_tokens) + " tokens x top_k " +
                                std::to_string(shape.top_k));
    }
    layout.num_tokens = num_tokens;
    layout.top_k = shape.top_k;
    layout.dst_rank.resize(n);
    layout.dst_slot.resize(n);
    layout.dst_row.assign(n, -1);
    layout.send_counts.assign(static_cast<size_t>(shape.num_ranks), 0);
    std::vector<int> sent;  // kRoundRobin: rows of each expert so far
    if (choice == ReplicaChoice::kRoundRobin) {
        sent.assign(static_cast<size_t>(placement.num_experts()), rank);
    }
    for (int t = 0; t < num_tokens; ++t) {
        for (int k = 0; k < shape.top_k; ++k) {
            const size_t i = static_cast<size_t>(t) * shape.top_k + k;
            const int32_t e = topk_ids[i];
            if (e < 0 || e >= placement.num_experts()) {
                return invalid_argument("token " + std::to_string(t) + ", k " + std::to_string(k) +
                                        ": expert " + std::to_string(e) + " not in [0, " +
                                        std::to_string(placement.num_experts()) + ")");
            }
            const std::span<const int> replicas = placement.replicas(e);
            const int p = choice == ReplicaChoice::kRoundRobin
                              ? replicas[static_cast<size_t>(sent[static_cast<size_t>(e)]++) %
                                         replicas.size()]
                              : choose_replica(replicas, placement, rank, t, k, choice);
            layout.dst_rank[i] = p / shape.slots_per_rank;
            layout.dst_slot[i] = p % shape.slots_per_rank;
            ++layout.send_counts[static_cast<size_t>(layout.dst_rank[i])];
        }
    }
    return Status::ok();
}

}  // namespace dsi::comm

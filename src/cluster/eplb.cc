#include "cluster/eplb.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace dsi::cluster {
namespace {

// Greedy min-max packing of n items into num_packs packs of exactly n / num_packs items:
// heaviest first, into the lightest pack that still has room (ties: lower pack).
// Returns pack[i] and slot[i] (position inside the pack).
void balanced_packing(std::span<const double> weight, int num_packs, std::vector<int>& pack,
                      std::vector<int>& slot) {
    const int n = static_cast<int>(weight.size());
    const int per_pack = n / num_packs;
    pack.assign(n, 0);
    slot.assign(n, 0);
    if (per_pack == 1) {
        std::iota(pack.begin(), pack.end(), 0);
        return;
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return weight[a] > weight[b]; });
    std::vector<double> pack_weight(num_packs, 0.0);
    std::vector<int> pack_items(num_packs, 0);
    for (int item : order) {
        int best = -1;
        for (int p = 0; p < num_packs; ++p) {
            if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) {
                best = p;
            }
        }
        pack[item] = best;
        slot[item] = pack_items[best]++;
        pack_weight[best] += weight[item];
    }
}

// Min-max replication: num_phy slots for the logical experts of `weight`; each extra
// slot goes to the expert with the highest load per replica (ties: lower id).
void replicate(std::span<const double> weight, int num_phy, std::vector<int>& phy_to_log,
               std::vector<int>& replica, std::vector<int>& count) {
    const int n = static_cast<int>(weight.size());
    phy_to_log.resize(num_phy);
    replica.assign(num_phy, 0);
    count.assign(n, 1);
    std::iota(phy_to_log.begin(), phy_to_log.begin() + n, 0);
    for (int p = n; p < num_phy; ++p) {
        int best = 0;
        for (int e = 1; e < n; ++e) {
            if (weight[e] / count[e] > weight[best] / count[best]) {
                best = e;
            }
        }
        phy_to_log[p] = best;
        replica[p] = count[best]++;
    }
}

// Swap search: while some swap between the most loaded rank and another rank of the same
// node lowers the pair's maximum below the current maximum, apply the best such swap.
void refine_layer(std::span<const double> load, std::span<int> phy_to_log,
                  std::span<int> replica_index, std::span<const int> count, int num_ranks,
                  int num_nodes) {
    const int num_phy = static_cast<int>(phy_to_log.size());
    const int slots = num_phy / num_ranks;
    const int ranks_per_node = num_ranks / num_nodes;
    auto w = [&](int p) { return load[phy_to_log[p]] / count[phy_to_log[p]]; };
    std::vector<double> rank_load(num_ranks, 0.0);
    for (int p = 0; p < num_phy; ++p) {
        rank_load[p / slots] += w(p);
    }
    for (int iter = 0; iter < 64 * num_ranks; ++iter) {
        int h = 0;
        for (int r = 1; r < num_ranks; ++r) {
            if (rank_load[r] > rank_load[h]) {
                h = r;
            }
        }
        const int node = h / ranks_per_node;
        double best_max = rank_load[h];
        int best_a = -1;
        int best_b = -1;
        for (int a = h * slots; a < (h + 1) * slots; ++a) {
            const double wa = w(a);
            for (int r = node * ranks_per_node; r < (node + 1) * ranks_per_node; ++r) {
                if (r == h) {
                    continue;
                }
                for (int b = r * slots; b < (r + 1) * slots; ++b) {
                    const double wb = w(b);
                    if (wb >= wa || phy_to_log[a] == phy_to_log[b]) {
                        continue;
                    }
                    const double m = std::max(rank_load[h] - wa + wb, rank_load[r] - wb + wa);
                    if (m < best_max - 1e-12 * rank_load[h]) {
                        best_max = m;
                        best_a = a;
                        best_b = b;
                    }
                }
            }
        }
        if (best_a < 0) {
            return;
        }
        const int r = best_b / slots;
        const double delta = w(best_a) - w(best_b);
        rank_load[h] -= delta;
        rank_load[r] += delta;
        std::swap(phy_to_log[best_a], phy_to_log[best_b]);
        std::swap(replica_index[best_a], replica_index[best_b]);
    }
}

Status check_layout(int num_layers, int num_logical, const EplbLayout& l, size_t load_size) {
    if (num_layers <= 0 || num_logical <= 0) {
        return invalid_argument("eplb: need layers > 0 and experts > 0");
    }
    if (load_size != static_cast<size_t>(num_layers) * num_logical) {
        return invalid_argument("eplb: load has " + std::to_string(load_size) +
                                " entries, want layers x experts = " +
                                std::to_string(static_cast<int64_t>(num_layers) * num_logical));
    }
    if (l.num_ranks <= 0 || l.num_nodes <= 0 || l.num_groups <= 0) {
        return invalid_argument("eplb: ranks, nodes and groups must be > 0");
    }
    if (l.num_ranks % l.num_nodes != 0) {
        return invalid_argument("eplb: ranks must be a multiple of nodes");
    }
    if (l.num_physical < num_logical || l.num_physical % l.num_ranks != 0) {
        return invalid_argument("eplb: physical experts must be >= logical and a multiple of ranks");
    }
    return Status::ok();
}

}  // namespace

Status EplbSettings::validate() const {
    if (redundant_experts_per_rank < 0) {
        return invalid_argument("eplb: redundant experts per rank must be >= 0");
    }
    if (window_steps < 1 || rebalance_interval_steps < 1) {
        return invalid_argument("eplb: window and interval must be >= 1 step");
    }
    if (smoothing_windows < 1 || smoothing_windows > 64) {
        return invalid_argument("eplb: smoothing_windows must be in 1..64");
    }
    if (!(ema_alpha > 0 && ema_alpha <= 1)) {
        return invalid_argument("eplb: ema_alpha must be in (0, 1]");
    }
    return Status::ok();
}

int num_physical_experts(int num_logical, int ep_size, int redundant_per_rank) {
    DSI_CHECK(ep_size > 0 && num_logical >= 0 && redundant_per_rank >= 0);
    // S-EPLB: redundant experts per rank, total rounded up to a multiple of the EP size.
    const int total = num_logical + redundant_per_rank * ep_size;
    return (total + ep_size - 1) / ep_size * ep_size;
}

Status ExpertPlacement::validate() const {
    if (num_layers <= 0 || num_logical <= 0 || num_ranks <= 0 || num_physical % num_ranks != 0) {
        return invalid_argument("placement: bad shape");
    }
    if (phy_to_log.size() != static_cast<size_t>(num_layers) * num_physical ||
        replica_index.size() != phy_to_log.size() ||
        replica_count.size() != static_cast<size_t>(num_layers) * num_logical) {
        return invalid_argument("placement: bad array sizes");
    }
    for (int l = 0; l < num_layers; ++l) {
        std::vector<int> seen(num_logical, 0);
        std::vector<std::vector<bool>> index_seen(num_logical);
        for (int p = 0; p < num_physical; ++p) {
            const int e = phy_to_log[l * num_physical + p];
            if (e < 0 || e >= num_logical) {
                return invalid_argument("placement: slot holds no valid expert");
            }
            ++seen[e];
        }
        for (int e = 0; e < num_logical; ++e) {
            const int c = replica_count[l * num_logical + e];
            if (seen[e] == 0) {
                return invalid_argument("placement: layer " + std::to_string(l) + " expert " +
                                        std::to_string(e) + " not placed");
            }
            if (c != seen[e]) {
                return invalid_argument("placement: replica count mismatch");
            }
            index_seen[e].assign(c, false);
        }
        for (int p = 0; p < num_physical; ++p) {
            const int e = phy_to_log[l * num_physical + p];
            const int k = replica_index[l * num_physical + p];
            if (k < 0 || k >= seen[e] || index_seen[e][k]) {
                return invalid_argument("placement: replica indices not 0..count-1");
            }
            index_seen[e][k] = true;
        }
    }
    return Status::ok();
}

Result<ExpertPlacement> place_experts(std::span<const double> load, int num_layers,
                                      int num_logical, const EplbLayout& layout, bool refine) {
    DSI_RETURN_IF_ERROR(check_layout(num_layers, num_logical, layout, load.size()));
    for (double v : load) {
        if (!(v >= 0) || !std::isfinite(v)) {
            return invalid_argument("eplb: loads must be finite and >= 0");
        }
    }
    // Hierarchical when groups divide evenly over nodes, else global (S-EPLB).
    int groups = layout.num_groups;
    int nodes = layout.num_nodes;
    if (num_logical % groups != 0 || groups % nodes != 0) {
        groups = 1;
        nodes = 1;
    }
    const int num_phy = layout.num_physical;
    const int ranks = layout.num_ranks;
    if ((num_phy / nodes) < (num_logical / nodes) || num_phy % nodes != 0) {
        return invalid_argument("eplb: physical experts do not split over nodes");
    }
    const int group_size = num_logical / groups;
    const int groups_per_node = groups / nodes;
    const int log_per_node = num_logical / nodes;
    const int phy_per_node = num_phy / nodes;
    const int ranks_per_node = ranks / nodes;
    const int slots = num_phy / ranks;

    ExpertPlacement out;
    out.num_layers = num_layers;
    out.num_logical = num_logical;
    out.num_physical = num_phy;
    out.num_ranks = ranks;
    out.phy_to_log.resize(static_cast<size_t>(num_layers) * num_phy);
    out.replica_index.resize(out.phy_to_log.size());
    out.replica_count.resize(static_cast<size_t>(num_layers) * num_logical);

    std::vector<double> group_load(groups);
    std::vector<int> group_pack, group_slot, log_to_mlog(num_logical), mlog_to_log(num_logical);
    std::vector<double> node_load(log_per_node), phy_load(phy_per_node);
    std::vector<int> phy_to_mlog, phy_replica, mlog_count, pack, slot;
    for (int l = 0; l < num_layers; ++l) {
        std::span<const double> w = load.subspan(static_cast<size_t>(l) * num_logical, num_logical);
        // 1. Groups to nodes.
        std::fill(group_load.begin(), group_load.end(), 0.0);
        for (int e = 0; e < num_logical; ++e) {
            group_load[e / group_size] += w[e];
        }
        balanced_packing(group_load, nodes, group_pack, group_slot);
        for (int e = 0; e < num_logical; ++e) {
            const int g = e / group_size;
            log_to_mlog[e] =
                (group_pack[g] * groups_per_node + group_slot[g]) * group_size + e % group_size;
            mlog_to_log[log_to_mlog[e]] = e;
        }
        for (int n = 0; n < nodes; ++n) {
            // 2. Replicas inside the node.
            for (int m = 0; m < log_per_node; ++m) {
                node_load[m] = w[mlog_to_log[n * log_per_node + m]];
            }
            replicate(node_load, phy_per_node, phy_to_mlog, phy_replica, mlog_count);
            // 3. Replicas to the node's ranks.
            for (int p = 0; p < phy_per_node; ++p) {
                phy_load[p] = node_load[phy_to_mlog[p]] / mlog_count[phy_to_mlog[p]];
            }
            balanced_packing(phy_load, ranks_per_node, pack, slot);
            for (int p = 0; p < phy_per_node; ++p) {
                const size_t dst = static_cast<size_t>(l) * num_phy + n * phy_per_node +
                                   pack[p] * slots + slot[p];
                out.phy_to_log[dst] = mlog_to_log[n * log_per_node + phy_to_mlog[p]];
                out.replica_index[dst] = phy_replica[p];
            }
            for (int m = 0; m < log_per_node; ++m) {
                out.replica_count[static_cast<size_t>(l) * num_logical +
                                  mlog_to_log[n * log_per_node + m]] = mlog_count[m];
            }
        }
        if (refine) {
            refine_layer(w,
                         std::span<int>(out.phy_to_log).subspan(static_cast<size_t>(l) * num_phy,
                                                                num_phy),
                         std::span<int>(out.replica_index)
                             .subspan(static_cast<size_t>(l) * num_phy, num_phy),
                         std::span<const int>(out.replica_count)
                             .subspan(static_cast<size_t>(l) * num_logical, num_logical),
                         ranks, nodes);
        }
    }
    return out;
}

Result<ExpertPlacement> identity_placement(int num_layers, int num_logical,
                                           const EplbLayout& layout) {
    std::vector<double> zero(static_cast<size_t>(std::max(0, num_layers)) *
                             std::max(0, num_logical));
    DSI_RETURN_IF_ERROR(check_layout(num_layers, num_logical, layout, zero.size()));
    ExpertPlacement out;
    out.num_layers = num_layers;
    out.num_logical = num_logical;
    out.num_physical = layout.num_physical;
    out.num_ranks = layout.num_ranks;
    out.phy_to_log.resize(static_cast<size_t>(num_layers) * layout.num_physical);
    out.replica_index.resize(out.phy_to_log.size());
    out.replica_count.assign(static_cast<size_t>(num_layers) * num_logical, 0);
    // Logical experts fill the first slots of each rank in order; spare slots repeat
    // experts round-robin.
    const int slots = layout.num_physical / layout.num_ranks;
    const int per_rank = (num_logical + layout.num_ranks - 1) / layout.num_ranks;
    for (int l = 0; l < num_layers; ++l) {
        int* count = &out.replica_count[static_cast<size_t>(l) * num_logical];
        int next_spare = 0;
        for (int p = 0; p < layout.num_physical; ++p) {
            const int r = p / slots;
            const int k = p % slots;
            int e = r * per_rank + k;
            if (k >= per_rank || e >= num_logical) {
                e = next_spare++ % num_logical;
            }
            const size_t at = static_cast<size_t>(l) * layout.num_physical + p;
            out.phy_to_log[at] = e;
            out.replica_index[at] = count[e]++;
        }
    }
    return out;
}

std::vector<double> rank_loads(const ExpertPlacement& pl, std::span<const double> load,
                               int layer, ReplicaDispatch dispatch) {
    std::vector<double> r(pl.num_ranks, 0.0);
    const int slots = pl.slots_per_rank();
    const int* phy = &pl.phy_to_log[static_cast<size_t>(layer) * pl.num_physical];
    const int* count = &pl.replica_count[static_cast<size_t>(layer) * pl.num_logical];
    const double* w = &load[static_cast<size_t>(layer) * pl.num_logical];
    if (dispatch == ReplicaDispatch::kEvenSplit) {
        for (int p = 0; p < pl.num_physical; ++p) {
            r[p / slots] += w[phy[p]] / count[phy[p]];
        }
        return r;
    }
    // Least-loaded replica: single-replica experts are fixed; replicated experts' load is
    // handed out in chunks to the least-loaded rank holding one of their replicas.
    std::vector<std::vector<int>> holders(pl.num_logical);
    for (int p = 0; p < pl.num_physical; ++p) {
        if (count[phy[p]] == 1) {
            r[p / slots] += w[phy[p]];
        } else {
            holders[phy[p]].push_back(p / slots);
        }
    }
    std::vector<int> replicated;
    for (int e = 0; e < pl.num_logical; ++e) {
        if (!holders[e].empty()) {
            replicated.push_back(e);
        }
    }
    std::stable_sort(replicated.begin(), replicated.end(),
                     [&](int a, int b) { return w[a] > w[b]; });
    for (int c = 0; c < kDispatchChunks; ++c) {
        for (int e : replicated) {
            int best = holders[e][0];
            for (int h : holders[e]) {
                if (r[h] < r[best] || (r[h] == r[best] && h < best)) {
                    best = h;
                }
            }
            r[best] += w[e] / kDispatchChunks;
        }
    }
    return r;
}

MoeLb moe_lb(const ExpertPlacement& pl, std::span<const double> load, ReplicaDispatch dispatch) {
    MoeLb out;
    for (int l = 0; l < pl.num_layers; ++l) {
        const std::vector<double> r = rank_loads(pl, load, l, dispatch);
        const double sum = std::accumulate(r.begin(), r.end(), 0.0);
        const double mx = *std::max_element(r.begin(), r.end());
        const double v = sum > 0 ? mx / (sum / pl.num_ranks) : 1.0;  // S-EPLB: slowest / mean
        out.mean += v / pl.num_layers;
        out.max = std::max(out.max, v);
    }
    return out;
}

EplbController::EplbController(const EplbSettings& settings, int num_layers, int num_logical,
                               const EplbLayout& layout)
    : settings_(settings),
      num_layers_(num_layers),
      num_logical_(num_logical),
      layout_(layout),
      sub_window_steps_(std::max<int64_t>(1, settings.window_steps / kSubWindows)),
      sub_windows_(kSubWindows + 1,
                   std::vector<double>(static_cast<size_t>(num_layers) * num_logical, 0.0)),
      window_acc_(static_cast<size_t>(num_layers) * num_logical, 0.0) {
    DSI_CHECK(settings.validate().is_ok(), settings.validate().to_string());
}

Status EplbController::record_step(std::span<const double> load) {
    if (load.size() != sub_windows_[0].size()) {
        return invalid_argument("eplb: step load has " + std::to_string(load.size()) +
                                " entries, want " + std::to_string(sub_windows_[0].size()));
    }
    // S-EPLB: loads of the last N steps are counted.
    if (steps_in_current_ == sub_window_steps_) {
        current_ = (current_ + 1) % (kSubWindows + 1);
        std::fill(sub_windows_[current_].begin(), sub_windows_[current_].end(), 0.0);
        steps_in_current_ = 0;
    }
    std::vector<double>& cur = sub_windows_[current_];
    for (size_t i = 0; i < load.size(); ++i) {
        cur[i] += load[i];
        window_acc_[i] += load[i];
    }
    ++steps_in_current_;
    if (++steps_in_window_ == settings_.window_steps) {
        // A completed window feeds the smoothed estimate.
        if (settings_.smoothing == EplbSmoothing::kEma) {
            if (ema_.empty()) {
                ema_ = window_acc_;
            } else {
                for (size_t i = 0; i < ema_.size(); ++i) {
                    ema_[i] += settings_.ema_alpha * (window_acc_[i] - ema_[i]);
                }
            }
        } else if (settings_.smoothing == EplbSmoothing::kMeanOfWindows) {
            if (static_cast<int>(history_.size()) < settings_.smoothing_windows) {
                history_.push_back(window_acc_);
            } else {
                history_[completed_windows_ % settings_.smoothing_windows] = window_acc_;
            }
        }
        ++completed_windows_;
        std::fill(window_acc_.begin(), window_acc_.end(), 0.0);
        steps_in_window_ = 0;
    }
    ++steps_;
    ++steps_since_rebalance_;
    return Status::ok();
}

std::vector<double> EplbController::window_load() const {
    // The current sub-window plus the previous full ones, up to window_steps steps.
    std::vector<double> sum(sub_windows_[0].size(), 0.0);
    int64_t covered = 0;
    for (int k = 0; k <= kSubWindows && covered < settings_.window_steps; ++k) {
        const int idx = (current_ - k + kSubWindows + 1) % (kSubWindows + 1);
        const int64_t n = k == 0 ? steps_in_current_ : sub_window_steps_;
        if (covered + n > settings_.window_steps && k > 0) {
            break;
        }
        for (size_t i = 0; i < sum.size(); ++i) {
            sum[i] += sub_windows_[idx][i];
        }
        covered += n;
    }
    return sum;
}

std::vector<double> EplbController::estimated_load() const {
    if (settings_.smoothing == EplbSmoothing::kEma && !ema_.empty()) {
        return ema_;
    }
    if (settings_.smoothing == EplbSmoothing::kMeanOfWindows && !history_.empty()) {
        std::vector<double> mean(history_[0].size(), 0.0);
        for (const auto& h : history_) {
            for (size_t i = 0; i < mean.size(); ++i) {
                mean[i] += h[i] / static_cast<double>(history_.size());
            }
        }
        return mean;
    }
    return window_load();
}

Result<ExpertPlacement> EplbController::rebalance() {
    steps_since_rebalance_ = 0;
    const std::vector<double> w = estimated_load();
    return place_experts(w, num_layers_, num_logical_, layout_, settings_.refine);
}

}  // namespace dsi::cluster

// The expert-parallel side of a model (model/expert_parallel.h; docs/comm.md "Expert
// parallelism in the engine") that DeepseekModel (V2/V3), DeepseekV4Model and
// DeepseekV41Model share: the group and the pass under way, one MoE layer's routed
// experts through the group, a rank's empty passes (CausalLm::group_idle_step), the
// stats over failovers, S-DEPLOY failover, and live EPLB's weight moves
// (ExpertParallelGroup::WeightMover) for any expert type.
//
// Failover (ExpertParallelOptions::restart; S-DEPLOY) resumes the pass at the MoE layer
// that failed: the new group's other ranks join its pass with empty passes over every
// MoE layer, this rank with empty exchanges for the MoE layers it has already done, then
// runs the failed layer again and goes on. Nothing before that layer runs twice, so a
// model whose per-sequence state a pass changes (V4's window ring and compressor
// accumulators) loses nothing either; a failover that leaves the rank alone computes the
// layer here with every expert (the model's one-process path runs from the next layer).
//
// Thread model: used by the thread that runs the model's forward passes (they are
// serialised already); stats() from any thread. The weight loads of a move run on a
// background thread that touches only what `load` reads (the checkpoint).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/expert_parallel.h"

namespace dsi::internal {

class EpHost : public ExpertParallelGroup::WeightMover {
public:
    // Runs local slot `slot`'s expert of MoE layer `moe_layer` on `rows` rows of x into y
    // (both [rows, hidden]). After a failover that left the rank alone, slot = expert id.
    using ExpertFn =
        std::function<void(int moe_layer, int slot, const float* x, int64_t rows, float* y)>;

    // Joins the group (call before the weights load: a rank whose load fails leaves at once,
    // so its peers fail fast). REQUIRES: options.enabled().
    Status join(const ExpertParallelOptions& options, const ModelConfig& config, ExpertFn expert);

    // true while this rank is in a group; false after a failover left it alone (every
    // expert local, slot = expert id: the model's one-process path runs).
    bool grouped() const { return group_ != nullptr; }
    // The logical expert of each local slot of MoE layer `moe_layer` (-1: empty); every
    // expert in id order without a group.
    std::vector<int> held(int moe_layer) const;
    int num_moe_layers() const { return num_moe_layers_; }

    // Collective: the start of a forward pass bringing `num_tokens` (> 0). Fails over on a
    // peer's death (with restart).
    Status begin_pass(int64_t num_tokens);
    // One MoE layer's routed experts for this rank's `num_tokens` tokens (hidden [n, H], ids
    // and gate [n, top_k], each token's ids ascending): out [n, H] = per token the
    // gate-weighted sum of its experts' outputs in k order from +0.0f (bitwise one
    // process's). Collective; with restart, a peer's death fails over (class comment).
    Status moe(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
               std::span<const int32_t> ids, std::span<const float> gate, std::span<float> out);
    // Empty exchanges for MoE layers [from, end) of the pass under way (a pass whose later
    // layers run none of this rank's tokens: V4.1's encoder-only pass).
    Status join_layers(int from_moe_layer);
    // CausalLm::group_idle_step: with restart, a peer's death fails over (kAllIdle, or
    // kNotGrouped when alone).
    Result<CausalLm::GroupStep> idle_step(bool leaving);
    // A pass failed on this rank: it leaves its group (peers see UNAVAILABLE at once).
    void abandon();
    // CausalLm::expert_parallel_stats: the group's, plus steps, placement changes and
    // failovers of the groups before it.
    std::optional<ExpertParallelStats> stats(size_t max_windows) const DSI_EXCLUDES(mu_);

protected:
    // After begin_move: blocks until the new slots' experts are loaded.
    virtual Status wait_move() = 0;

private:
    bool recoverable(const Status& s) const;
    Status run_layer(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                     std::span<const int32_t> ids, std::span<const float> gate,
                     std::span<float> out);
    // Every expert here (alone after a failover), the combine's arithmetic.
    void moe_alone(int moe_layer, std::span<const float> hidden, int64_t num_tokens,
                   std::span<const int32_t> ids, std::span<const float> gate, std::span<float> out);
    // S-DEPLOY: the group restart() gives (or alone); this rank's experts move to its slots
    // there.
    Status fail_over(const Status& failure) DSI_EXCLUDES(mu_);
    // After a failure at MoE layer `done_layers` of a pass with tokens: fails over, starts
    // the pass in the new group and joins its MoE layers before `done_layers` empty.
    Status resume_pass(Status failure, int done_layers);

    ExpertParallelOptions options_;
    ModelConfig config_;
    ExpertFn expert_;
    int num_experts_ = 0;
    int num_moe_layers_ = 0;
    int64_t hidden_ = 0;
    int64_t top_k_ = 0;
    // Written only by the forward thread (at a failover, under mu_); stats() reads it
    // under mu_.
    std::unique_ptr<ExpertParallelGroup> group_;
    int rounds_ = 0;           // MoE rounds of the pass under way
    int64_t pass_tokens_ = 0;  // its tokens on this rank (0: an empty pass)
    mutable Mutex mu_;
    // Steps, changes and failovers of the groups before group_.
    ExpertParallelStats past_ DSI_GUARDED_BY(mu_);
};

// CausalLm::group_idle_step and expert_parallel_stats of a model whose host is `host`
// (null: no expert parallelism).
Result<CausalLm::GroupStep> group_idle_step(EpHost* host, bool leaving);
std::optional<ExpertParallelStats> group_stats(const EpHost* host, size_t max_windows);

// Live EPLB's weight moves for experts of type Expert: slots whose expert this rank holds
// already take it over at the commit (moved, not copied); the others load from the
// checkpoint on a background thread, as at start-up (the same bytes, so the same results).
template <typename Expert>
class EpExperts final : public EpHost {
public:
    // experts(l): MoE layer l's experts by local slot (the model's); load(l, e, out): loads
    // expert e of MoE layer l (runs on a background thread).
    using ExpertsOf = std::function<std::vector<Expert>&(int moe_layer)>;
    using Load = std::function<Status(int moe_layer, int expert, Expert& out)>;
    EpExperts(ExpertsOf experts, Load load)
        : experts_(std::move(experts)), load_(std::move(load)) {}
    ~EpExperts() override {
        if (move_load_.valid()) move_load_.wait();
    }

    void begin_move(std::vector<int> next_local) override {
        if (move_load_.valid()) move_load_.wait();  // a move of an abandoned group
        const int layers = num_moe_layers();
        const size_t slots = next_local.size() / static_cast<size_t>(layers);
        move_from_.assign(static_cast<size_t>(layers), std::vector<int>(slots, -1));
        moved_.assign(static_cast<size_t>(layers), std::vector<Expert>(slots));
        std::vector<std::pair<int, size_t>> to_load;  // (moe layer, slot)
        for (int l = 0; l < layers; ++l) {
            const std::vector<int> now = held(l);
            std::vector<bool> taken(now.size(), false);
            for (size_t s = 0; s < slots; ++s) {
                const int e = next_local[static_cast<size_t>(l) * slots + s];
                if (e < 0) continue;
                for (size_t old = 0; old < now.size(); ++old) {
                    if (now[old] == e && !taken[old]) {
                        taken[old] = true;
                        move_from_[static_cast<size_t>(l)][s] = static_cast<int>(old);
                        break;
                    }
                }
                if (move_from_[static_cast<size_t>(l)][s] < 0) to_load.emplace_back(l, s);
            }
        }
        // The forward passes never touch `moved_`: this thread has it alone.
        move_load_ = std::async(std::launch::async, [this, to_load, next_local, slots]() -> Status {
            for (const auto& [l, s] : to_load) {
                DSI_RETURN_IF_ERROR(load_(l, next_local[static_cast<size_t>(l) * slots + s],
                                          moved_[static_cast<size_t>(l)][s]));
            }
            return Status::ok();
        });
    }

    Result<bool> move_ready() override {
        if (move_loaded_) return true;
        DSI_CHECK(move_load_.valid(), "move_ready without begin_move");
        if (move_load_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
            return false;
        }
        Status s = move_load_.get();
        if (!s.is_ok()) return s.with_context("eplb: loading the moved experts");
        move_loaded_ = true;  // get() consumed the future; commit_move follows
        return true;
    }

    void commit_move() override {
        for (size_t l = 0; l < moved_.size(); ++l) {
            std::vector<Expert>& current = experts_(static_cast<int>(l));
            std::vector<Expert> next(moved_[l].size());
            for (size_t s = 0; s < next.size(); ++s) {
                const int from = move_from_[l][s];
                next[s] = from >= 0 ? std::move(current[static_cast<size_t>(from)])
                                    : std::move(moved_[l][s]);
            }
            current = std::move(next);
        }
        moved_.clear();
        move_from_.clear();
        move_loaded_ = false;
    }

protected:
    Status wait_move() override {
        DSI_RETURN_IF_ERROR(move_load_.get());
        move_loaded_ = true;
        return Status::ok();
    }

private:
    ExpertsOf experts_;
    Load load_;
    std::vector<std::vector<int>> move_from_;  // [moe layer][slot]: old slot, or -1: loaded
    std::vector<std::vector<Expert>> moved_;   // [moe layer][slot]: the loaded experts
    bool move_loaded_ = false;
    std::future<Status> move_load_;  // last member: joined first on destruction
};

}  // namespace dsi::internal

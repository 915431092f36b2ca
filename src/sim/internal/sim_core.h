// The simulator's event loop state (private to src/sim/): the event types, per-request
// and per-engine state and the Sim class whose methods live in simulator.cc (requests,
// prefill, decode, results) and sim_operations.cc (drains, failures, autoscaling).
// Thread model: one Sim per simulate() call, single-threaded.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <queue>
#include <vector>

#include "cluster/autoscaler.h"
#include "cluster/decode_lb.h"
#include "cluster/drain.h"
#include "cluster/prefill_lb.h"
#include "sim/block_id_cache.h"
#include "sim/simulator.h"
#include "workload/trace.h"

namespace dsi::sim::internal {

enum class Ev : uint8_t {
    kArrival,
    kPrefillDone,
    kDecodeArrive,
    kDecodeDone,
    kPrefillWake,     // id: engine; a pulled request reached it (prefill_dispatch_ns)
    kPrefillRelease,  // id: index into Sim::releases_ (prefill_release_ns)
    // Operations (id: index into drains / failures, or an instance, or a request).
    kDrainStart,
    kDrainDue,
    kFailure,
    kRestart,
    kMigrateArrive,
    kScaleTick,
};

struct Event {
    int64_t t_ns;
    uint64_t seq;
    Ev type;
    uint32_t id;
};
struct Later {
    bool operator()(const Event& a, const Event& b) const {
        return a.t_ns > b.t_ns || (a.t_ns == b.t_ns && a.seq > b.seq);
    }
};

struct Req {
    int64_t arrival_ns = 0;
    int64_t hit_tokens = 0;
    int64_t done_tokens = 0;  // computed so far (excluding the hit)
    double cost_ns = 0;       // whole-request estimate for quotas
    int32_t prefill_engine = -1;
    int32_t decode_engine = -1;
    int64_t ready_ns = 0;  // arrival + store read
    int64_t at_engine_ns = 0;  // at its prefill engine (after the router's dispatch hop)
    int64_t prefill_done_ns = -1;
    int64_t first_token_ns = -1;
    int64_t decode_arrive_ns = -1;
    int64_t second_token_ns = -1;  // the end of its first decode step
    int64_t finish_ns = -1;
    int32_t finishes = 0;
    // Tokens this prefill round covers: the prompt, or prompt + generated after a re-route.
    int64_t context_tokens = 0;
    int64_t decode_left = 0;  // decode tokens still to produce
    int64_t first_hit_tokens = 0;  // the hit of the first prefill round
    uint32_t migrate_epoch = 0;  // the target rank's epoch when a drain moved it
};

struct Chunk {
    uint32_t req;
    int64_t q;
};

struct PrefillEngine {
    std::deque<uint32_t> queue;  // FIFO (S-LB)
    double held_cost_ns = 0;
    int64_t pending_releases = 0;  // finished prefills whose quota is not released yet
    bool wake_pending = false;     // a kPrefillWake is scheduled
    int64_t queued_tokens = 0;  // missed tokens not yet computed
    bool busy = false;
    double busy_ns = 0;
    std::vector<Chunk> step;
    std::unique_ptr<BlockIdCache> store;  // per-engine store mode only
    bool online = true;     // operations: takes new work
    bool stopping = false;  // operations: scaled in, finishing its queue
};

struct DecodeEngine {
    std::vector<uint32_t> joining;
    // decode_async_join: arrived before the step in flight began (in the plan of the
    // next step); `joining` then holds those that arrived during it.
    std::vector<uint32_t> planned;
    std::priority_queue<std::pair<int64_t, uint32_t>, std::vector<std::pair<int64_t, uint32_t>>,
                        std::greater<>>
        finishing;  // (finish step, request)
    int64_t step = 0;
    int64_t running = 0;
    bool busy = false;
    double busy_ns = 0;
    bool stale_step = false;           // the step in flight was lost to a failure
    bool evacuate_after_step = false;  // a drain's grace ended during this step
    uint32_t epoch = 0;                // bumped when the rank loses its requests
    // The step in flight: who joined it, when it began, its partial-block recompute.
    std::vector<uint32_t> step_joined;
    int64_t step_start_ns = 0;
    double step_join_ns = 0;
    int64_t step_kv_tokens = 0;
};

// Operations: an EP instance of decode ranks (S-DEPLOY).
enum class InstState : uint8_t { kUp, kDraining, kDown, kOff };
struct DecodeInstance {
    InstState state = InstState::kUp;
    int ep = 0;  // active ranks: the first `ep` of the instance's slots
};

class Sim {
public:
    Sim(const workload::Trace& trace, const ClusterDescription& c, const SimOptions& o, double time_scale)
        : trace_(trace),
          c_(c),
          o_(o),
          time_scale_(time_scale),
          reqs_(trace.requests.size()),
          prefill_(c.num_prefill),
          decode_(c.num_decode),
          ranks_(c.num_decode),
          decode_lb_(o.decode_lb) {
        const int64_t cap_blocks =
            c.store_capacity_tokens > 0
                ? std::max<int64_t>(1, c.store_capacity_tokens / trace.block_tokens)
                : 0;
        if (o.store == StoreKind::kShared) {
            shared_store_ = std::make_unique<BlockIdCache>(cap_blocks, c.store_ttl_ns);
        } else {
            for (auto& e : prefill_) {
                e.store = std::make_unique<BlockIdCache>(
                    cap_blocks > 0 ? std::max<int64_t>(1, cap_blocks / c.num_prefill) : 0,
                    c.store_ttl_ns);
            }
        }
        if (o.prefill_routing == PrefillRouting::kDeepSeek) {
            prefill_lb_ = std::make_unique<cluster::PrefillLb>(o.prefill_lb, c.num_prefill, 0);
        }
        for (auto& r : ranks_) {
            r.max_requests = c.decode_max_batch;
            r.kv_capacity_tokens = c.decode_kv_capacity_tokens;
        }
        decode_ep_ = c.decode_ep();
        instances_.assign(c.num_decode / decode_ep_, DecodeInstance{InstState::kUp, decode_ep_});
    }

    SimResult run();

private:
    void summarize();
    void push(int64_t t_ns, Ev type, uint32_t id) { events_.push({t_ns, seq_++, type, id}); }
    int64_t hit_tokens_for(const workload::TraceRequest& tr, int64_t matched_blocks) const;
    void on_arrival(uint32_t r);
    void route_prefill(uint32_t r, bool reroute);
    void try_start_prefill(int e);
    void on_prefill_done(int e);
    void on_decode_arrive(uint32_t r);
    bool place_decode(uint32_t r);
    // after_step: called when the rank's step ended (else: it was idle).
    void start_decode(int d, bool after_step = false);
    void on_prefill_release(uint32_t release);
    void on_decode_done(int d);
    void place_pending();
    // KV of a request in decode: prompt + tokens generated so far.
    int64_t kv_of(uint32_t r) const {
        const workload::TraceRequest& tr = trace_.requests[r];
        return tr.input_tokens + std::max<int64_t>(0, tr.output_tokens - 1) - reqs_[r].decode_left;
    }
    // Operations (sim_operations.cc).
    void init_operations();
    void on_operation(const Event& ev);
    bool rank_active(int d) const {
        const DecodeInstance& in = instances_[d / decode_ep_];
        return d % decode_ep_ < in.ep &&
               (in.state == InstState::kUp || in.state == InstState::kDraining);
    }
    std::vector<uint32_t> take_requests(int d);
    void reroute(uint32_t r);
    void start_drain(int instance);
    void on_drain_due(int instance);
    void evacuate_for_drain(int d);
    void on_migrate_arrive(uint32_t r);
    void on_failure(const DeviceFailureAt& f);
    void on_restart(int instance);
    void set_instance_accepting(int instance);
    void on_scale_tick();
    void account_devices();
    int devices_held() const;
    void note_online();
    int bucket_of(int64_t tokens) const {
        for (int b = 0; b < cluster::kNumPrefillBuckets - 1; ++b) {
            if (tokens < o_.prefill_lb.bucket_upper_tokens[b]) {
                return b;
            }
        }
        return cluster::kNumPrefillBuckets - 1;
    }
    // Spreads a busy interval [start, start + dur) of one engine over the timeline bins.
    void add_busy(std::vector<double>& bins, int64_t start_ns, double dur_ns) {
        const double bin = static_cast<double>(o_.timeline_bin_ns);
        double t = static_cast<double>(start_ns);
        const double end = t + dur_ns;
        while (t < end) {
            const size_t i = static_cast<size_t>(t / bin);
            if (i >= bins.size()) {
                bins.resize(i + 1, 0.0);
            }
            const double bin_end = (static_cast<double>(i) + 1) * bin;
            bins[i] += std::min(end, bin_end) - t;
            t = bin_end;
        }
    }
    void sample_waiting() {
        const size_t i = static_cast<size_t>(now_ / o_.timeline_bin_ns);
        if (i >= waiting_.size()) {
            waiting_.resize(i + 1, -1);
        }
        int64_t n = prefill_lb_ ? static_cast<int64_t>(prefill_lb_->num_pending()) : 0;
        for (const auto& e : prefill_) {
            n += static_cast<int64_t>(e.queue.size());
        }
        waiting_[i] = n;
    }
    void finish(uint32_t r) {
        Req& q = reqs_[r];
        q.finish_ns = now_;
        ++q.finishes;
        ++num_finished_;
    }

    const workload::Trace& trace_;
    const ClusterDescription& c_;
    const SimOptions& o_;
    double time_scale_;
    std::vector<Req> reqs_;
    std::vector<PrefillEngine> prefill_;
    std::vector<DecodeEngine> decode_;
    std::vector<cluster::DecodeRankState> ranks_;
    cluster::DecodeLb decode_lb_;
    cluster::DecodeRoundRobin decode_rr_;
    std::unique_ptr<cluster::PrefillLb> prefill_lb_;
    std::unique_ptr<BlockIdCache> shared_store_;
    std::priority_queue<Event, std::vector<Event>, Later> events_;
    std::deque<uint32_t> decode_pending_;
    // Quota releases in flight (prefill_release_ns): (prefill engine, cost).
    std::vector<std::pair<int, double>> releases_;
    uint64_t seq_ = 0;
    int64_t now_ = 0;
    int64_t num_finished_ = 0;
    size_t rr_prefill_ = 0;
    size_t wake_from_ = 0;
    std::vector<double> prefill_busy_bins_;
    std::vector<double> decode_busy_bins_;
    std::vector<int64_t> waiting_;
    SimResult res_;
    // Operations.
    int decode_ep_ = 1;
    std::vector<DecodeInstance> instances_;
    cluster::DecodeDrain drain_;
    std::unique_ptr<cluster::Autoscaler> autoscaler_;
    int spare_ = 0;
    std::deque<int64_t> provisioning_;  // ready times of machines being provisioned
    int64_t missed_tokens_since_tick_ = 0;
    double prefill_busy_at_tick_ns_ = 0;
    int64_t last_tick_ns_ = 0;
    int64_t device_ns_at_ = 0;
    double device_ns_ = 0;
    int64_t t0_ns_ = 0;
    bool online_noted_ = false;
    int64_t idle_ticks_ = 0;
};

}  // namespace dsi::sim::internal

// `--ep N` launch scheme (issue 19; docs/comm.md "Expert parallelism in the engine").
//
// Front (serve, generate): the process the user started is a front with no model — HTTP,
// tokenizer, the engine::DpFront's request table, this launcher — and starts N compute
// ranks 0..N-1 as copies of itself (the same binary and arguments plus `--ep-rank R
// --ep-group NAME --ep-pipe-fd FD`). Each joins the group's shared-memory segment (rank 0
// creates it) and runs the requests the front sends over its comm::RankPipe
// (engine::run_dp_rank): over every rank with `--ep-attention dp`, all on rank 0 with
// `rank0`. A rank that dies — rank 0 included — is seen by the front (its pipe ends, or
// waitpid), which restarts the group with the healthy ranks (S-DEPLOY; check_ranks) and
// re-runs every request as a continuation; only the front's own death ends the instance.
//
// In-process rank 0 (bench offline): the process the user started is rank 0 with its
// model and starts ranks 1..N-1; with dp they get pipes and rank 0's DpFront runs its own
// share locally; rank 0's model restarts the group when a rank dies (ExpertParallelOptions
// ::restart). A started rank dies with the process that started it (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/mutex.h"
#include "base/settings.h"
#include "base/status.h"
#include "comm/rank_pipe.h"
#include "engine/dp_front.h"
#include "serving/replica.h"

namespace dsi {

class ForkThread;  // ep_launch.cc
struct Spawned;    // ep_launch.cc

struct EpFlags {
    int ep = 1;
    int rank = 0;       // set by rank 0 for the ranks it starts
    std::string group;  // ditto
    int64_t attach_timeout_ms = 60'000;
    // Live EPLB (S-EPLB): off | prefill | decode, the phase whose SPEC defaults apply
    // (prefill: 4 redundant experts per rank, window 100 steps, rebalance every 1,000;
    // decode: 1, 1,000, 10,000); the numbers below override them when >= 0.
    std::string eplb = "decode";
    int eplb_redundant = -1;
    int64_t eplb_window_steps = -1;
    int64_t eplb_interval_steps = -1;
    bool eplb_wait_weights = false;  // benchmarks: switch at the next step (hidden flag)
    // EP failover (S-DEPLOY): on | off. On: a rank that dies makes the front (or rank 0)
    // restart the group with the healthy ranks and re-run its requests (nothing lost);
    // off: the instance fails.
    std::string failover = "on";
    // serve / generate: on — the started process is a front with no model (any rank's
    // death, rank 0's included, is survived); off — the started process is rank 0 with its
    // model (response formats and KV export run there; rank 0's death ends the instance).
    std::string front = "on";
    int ranks_now = 0;  // hidden: the group size of a restarted group's started ranks
    // NUMA pinning (comm/numa_pinning.h): off | auto | on; a faked topology for tests.
    std::string numa = "auto";
    std::string numa_topology;
    // Where attention runs: dp (every rank its own requests, sequences and KV; rank 0
    // spreads the requests) | rank0 (only rank 0 holds requests). bench offline: rank0.
    std::string attention = "dp";
    // dp: how the front picks a request's rank (engine/dp_balance.h): prefix (the rank
    // holding the longest prefix of the prompt in its prefix cache, unless its running
    // sequences exceed the least-loaded rank's by more than dp_balance_abs AND more than
    // dp_balance_rel times) | load (the least-loaded rank); the front's keys per rank.
    std::string dp_routing = "prefix";
    int64_t dp_balance_abs = 2;
    double dp_balance_rel = 1.25;
    int64_t dp_prefix_blocks = int64_t{1} << 16;
    // The all-to-all: shm | ucx (comm/ucx_group.h), and UCX's rank 0 address ("host:port";
    // empty: the started process picks a free port on 127.0.0.1 for its local ranks).
    std::string comm = "shm";
    std::string coordinator;
    // Ranks 0..local_ranks-1 start on this host (0: all --ep); the others are started by
    // hand on other hosts (--ep-rank R --ep-group NAME): UCX, rank0 attention, no failover.
    int local_ranks = 0;
    int pipe_fd = -1;  // hidden: a started rank's end of its RankPipe
    // Hidden: a started rank whose load reports carry the group's stats (the front's
    // rank 0).
    bool report_group = false;
};

// The expert-parallel options --ep's EPLB flags give (placement policy, redundant slots,
// stats window), or INVALID_ARGUMENT naming the flag.
Status apply_eplb_flags(const EpFlags& f, ExpertParallelOptions& ep);

// --ep, --ep-attach-timeout-ms, and the hidden --ep-rank / --ep-group.
void add_ep_flags(CLI::App& cmd, EpFlags* f);

// The DpFront's rank choice from --ep-dp-routing / --ep-dp-balance-* / --ep-dp-prefix-blocks
// (checked by EpLaunch::start); `model_id`: the ranks' EngineOptions::model_id;
// `prefix_cache`: theirs (--prefix-cache false: nothing to route to, the load rule).
engine::DpRouting dp_routing(const EpFlags& f, std::string model_id, bool prefix_cache);

// This process's part of an --ep group.
class EpLaunch {
public:
    // Before open_replica: fills options.expert_parallel from `f` (a no-op for --ep 1);
    // the started process checks --ep against the checkpoint's config (so a bad --ep
    // starts nothing) and starts the ranks. `front`: the started process becomes a
    // front (options then load no model and make no engine) and starts ranks 0..N-1;
    // else it is rank 0 and starts 1..N-1. `long_idle`: the ranks may wait for the next
    // request without limit (serve) rather than the default idle deadline.
    // INVALID_ARGUMENT naming the flag; INTERNAL when a rank cannot be started.
    static Result<EpLaunch> start(const EpFlags& f, Env* env, serving::ReplicaOptions& options,
                                  bool long_idle, bool front = false);
    EpLaunch() = default;
    EpLaunch(EpLaunch&&) = default;
    EpLaunch& operator=(EpLaunch&&) = default;
    ~EpLaunch();  // kills and reaps the started ranks not reaped yet

    // A started rank (run_started_rank is its whole run).
    bool started_rank() const { return started_; }
    // A front (--ep > 1 with `front`): it holds no model; make its engine::DpFront with
    // dp_link(), front_limits() and spread().
    bool front() const { return group_ != nullptr && group_->front; }
    // The front, or rank 0 with --ep-attention dp: the pipes to the started ranks, for an
    // engine::DpFront (they change at an EP failover). nullptr otherwise. Lives as long as
    // this launch.
    engine::DpRankLink* dp_link() const;
    // A front: the checks its ranks' engines make on a request (their options are the
    // front's: same flags), from the front's replica (config and tokenizer only).
    engine::RequestLimits front_limits(const serving::Replica& replica) const;
    // A front: requests over every rank (--ep-attention dp) or all on rank 0.
    bool spread() const { return spread_; }
    // The exit status of a started rank whose run ended with `s`: 0, kPeerLost when its
    // group failed because a peer died, left, never attached or stopped answering (this
    // rank is healthy: rank 0 counts it for the restarted group, S-DEPLOY), else 1.
    static constexpr int kPeerLost = 75;
    static int started_rank_exit_code(const Status& s);
    // A started rank's whole run until rank 0 ends the group: the requests its pipe
    // brings (dp, engine::run_dp_rank) and its peers' MoE exchanges. `grammars` (serve):
    // requests may bring grammar masks, rebuilt here (its vocabulary built at the start).
    Status run_started_rank(serving::Replica& replica, Env* env, bool grammars = false);
    // The front or rank 0, after its engine is done: tells the started ranks no request
    // will come, (rank 0) leaves the group, waiting for the other ranks to be idle, then
    // reaps them; UNAVAILABLE naming the first rank that failed.
    Status finish(serving::Replica& replica);

private:
    // Rank 0's started ranks, shared with the failover callback it puts in the model's
    // options (shared_ptr: the launcher and that callback both use it; one thread at a
    // time, the model's forward passes or, after the engine stopped, finish()).
    struct Group final : engine::DpRankLink {
        Group();
        ~Group() override;
        // A restart's ranks are forked here, on a thread as long-lived as the launch: a
        // started rank gets SIGTERM when the thread that forked it ends
        // (PR_SET_PDEATHSIG), and a failover runs on the thread that steps the front or
        // rank 0's model (serve: the engine thread, which ends before the drain does).
        std::unique_ptr<ForkThread> forker;
        bool front = false;       // every rank started (0..N-1), this process has no model
        bool failover = true;     // --ep-failover on
        // How long a failover waits for the old group's other ranks to see the loss and
        // exit: past --ep-attach-timeout-ms, since a rank lost before the group attached
        // leaves the others waiting that long.
        int64_t reap_deadline_ms = 20'000;
        Status broken;  // no healthy rank was left: every later check returns this
        std::vector<pid_t> pids;  // the started ranks of the current group, not yet reaped
        std::string name;         // the first group's name; restarts append -f<n>
        // Given to every started rank (a restart's too): --ep-coordinator when picked here.
        std::vector<std::string> extra_args;
        int num_experts = 0;
        int redundant_per_rank = 0;
        int num_restarts = 0;
        bool data_parallel = false;  // --ep-attention dp: a pipe per started rank
        // The DpFront reads these on its thread while a failover (on the thread of rank 0's
        // forward passes) replaces them.
        mutable Mutex mu;
        int64_t generation DSI_GUARDED_BY(mu) = 0;
        std::vector<std::shared_ptr<comm::RankPipe>> pipes DSI_GUARDED_BY(mu);
        Ranks current() const override DSI_EXCLUDES(mu);
        // The front's failover (engine/dp_front.h): a rank that exited or whose pipe
        // ended restarts the group with the healthy ranks. The restart (reap, then start)
        // runs on `forker`; the calls that follow poll it (false until it is done).
        Result<bool> check_ranks(bool pipe_ended) override DSI_EXCLUDES(mu);
        bool restarting() const override { return restarting_; }
        // The new group's ranks and pipes: the link's next generation.
        void install(Spawned spawned) DSI_EXCLUDES(mu);
        Result<bool> poll_restart() DSI_EXCLUDES(mu);
        // The instance ends: a restart in flight stops reaping (the old ranks are
        // killed) and starts nothing. Waits for it.
        void abandon_restart();
        // The front's thread (check_ranks), or the owner's after the engine stopped.
        bool restarting_ = false;
        std::atomic<bool> cancel_restart_{false};
    };
    // Rank 0's failover: reaps the started ranks, starts the group of the healthy ones.
    static Result<EpRestart> restart(Group& g);
    // Rank 0's: `healthy` ranks (of the old group, by rank) → the new group started, the
    // link's next generation (a front's restart: Group::check_ranks).
    static Result<EpRestart> start_healthy(Group& g, const std::vector<bool>& healthy);

    bool started_ = false;
    bool spread_ = true;
    bool report_group_ = false;
    int rank_ = 0;
    int pipe_fd_ = -1;              // a started rank's pipe (dp)
    std::shared_ptr<Group> group_;  // rank 0
};

}  // namespace dsi

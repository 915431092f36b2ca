#include "ep_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "base/logging.h"
#include "cluster/ep_failover.h"
#include "cluster/eplb_live.h"
#include "comm/numa_pinning.h"
#include "comm/ucx_group.h"
#include "engine/ep_rank.h"

namespace dsi {

// The ranks a spawn started.
struct Spawned {
    std::vector<pid_t> pids;
    std::vector<std::shared_ptr<comm::RankPipe>> pipes;  // data_parallel: rank r at [r - 1]
};

namespace {

// A started rank's word from its launcher that the group it is joining was abandoned (a
// peer died before it attached, which no waiting rank can see): set by SIGUSR1, polled
// by the attach (ExpertParallelOptions::abandoned). Started ranks begin with SIGUSR1
// ignored (set between fork and exec) until their handler is in place, so an early
// signal cannot kill one; the launcher repeats it while it waits.
std::atomic<bool> g_group_abandoned{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_abandon_signal(int) { g_group_abandoned.store(true, std::memory_order_relaxed); }

void install_abandon_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_abandon_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    (void)::sigaction(SIGUSR1, &sa, nullptr);
}

// The index of the first of `pids` that has exited (not reaped: WNOWAIT), or -1.
int first_exited(const std::vector<pid_t>& pids) {
    for (size_t r = 0; r < pids.size(); ++r) {
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(pids[r]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == pids[r]) {
            return static_cast<int>(r);
        }
    }
    return -1;
}

Result<std::vector<std::string>> own_command_line() {
    const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return internal_error(std::string("/proc/self/cmdline: ") + std::strerror(errno));
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
        text.append(buf, static_cast<size_t>(n));
    ::close(fd);
    std::vector<std::string> args;
    for (size_t begin = 0; begin < text.size();) {
        const size_t end = text.find('\0', begin);
        args.push_back(text.substr(begin, end - begin));
        if (end == std::string::npos) break;
        begin = end + 1;
    }
    if (args.empty()) return internal_error("/proc/self/cmdline is empty");
    return args;
}

// Waits for the ranks `first_rank`, ... (killing them first when `kill_first`); UNAVAILABLE
// names the first that did not exit 0.
Status reap(std::vector<pid_t>& pids, bool kill_first, int first_rank = 1) {
    Status first = Status::ok();
    for (size_t i = 0; i < pids.size(); ++i) {
        if (kill_first) ::kill(pids[i], SIGTERM);
        int status = 0;
        while (::waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
        }
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && first.is_ok() && !kill_first) {
            const std::string how =
                WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                  : "was killed by signal " + std::to_string(WTERMSIG(status));
            first = unavailable("--ep: rank " + std::to_string(static_cast<int>(i) + first_rank) +
                                " " + how);
        }
    }
    pids.clear();
    return first;
}

// Starts ranks `first_rank`..end-1 (a front: 0, its rank 0 reporting the group's stats;
// rank 0 itself: 1) of a group of `num_ranks`; `end` -1: num_ranks (--ep-local-ranks: the
// others are started by hand on other hosts).
Result<Spawned> spawn(int num_ranks, const std::string& group, bool restarted, bool data_parallel,
                      int first_rank, const std::vector<std::string>& extra_args, int end = -1) {
    DSI_ASSIGN_OR_RETURN(std::vector<std::string> args, own_command_line());
    const pid_t parent = ::getpid();
    Spawned out;
    for (int r = first_rank; r < (end < 0 ? num_ranks : end); ++r) {
        std::vector<std::string> a = args;
        a.insert(a.end(), {"--ep-rank", std::to_string(r), "--ep-group", group});
        a.insert(a.end(), extra_args.begin(), extra_args.end());
        if (restarted) a.insert(a.end(), {"--ep-ranks-now", std::to_string(num_ranks)});
        if (first_rank == 0 && r == 0) a.push_back("--ep-report-group");
        int child_fd = -1;
        if (data_parallel) {
            Result<comm::RankPipe::Pair> pair = comm::RankPipe::create_pair();
            if (!pair.is_ok()) {
                (void)reap(out.pids, /*kill_first=*/true);
                return pair.status();
            }
            child_fd = pair->child_fd;
            out.pipes.push_back(std::move(pair->parent));
            a.insert(a.end(), {"--ep-pipe-fd", std::to_string(child_fd)});
        }
        // Everything the child needs is built before the fork (no allocation after it).
        std::vector<char*> argv;
        for (std::string& s : a) argv.push_back(s.data());
        argv.push_back(nullptr);
        const pid_t pid = ::fork();
        if (pid < 0) {
            Status s = internal_error(std::string("fork: ") + std::strerror(errno));
            if (child_fd >= 0) ::close(child_fd);
            (void)reap(out.pids, /*kill_first=*/true);
            return s;
        }
        if (pid == 0) {
            // Dies with rank 0 (also if it died between the fork and this call).
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(1);
            if (child_fd >= 0 && !comm::RankPipe::inherit_in_child(child_fd)) ::_exit(1);
            // Ignored across the exec until the rank's handler is in place.
            struct sigaction ignore {};
            ignore.sa_handler = SIG_IGN;
            (void)::sigaction(SIGUSR1, &ignore, nullptr);
            ::execv("/proc/self/exe", argv.data());
            ::_exit(127);
        }
        if (child_fd >= 0) ::close(child_fd);  // the child's end lives in the child only
        out.pids.push_back(pid);
    }
    return out;
}

}  // namespace

// Runs jobs (the forks of a restart, and a front's whole restart with its reap) on its
// own thread, one at a time.
class ForkThread {
public:
    ForkThread() : thread_([this] { loop(); }) {}
    ~ForkThread() {
        {
            MutexLock lock(&mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    // REQUIRES: no job started and not yet waited for.
    Result<Spawned> run(std::function<Result<Spawned>()> job) DSI_EXCLUDES(mu_) {
        start(std::move(job));
        return wait();
    }
    // Starts `job` and returns at once; poll() or wait() hands its result back.
    void start(std::function<Result<Spawned>()> job) DSI_EXCLUDES(mu_) {
        MutexLock lock(&mu_);
        job_ = std::move(job);
        result_.reset();
        cv_.notify_all();
    }
    // The started job's result once it is done (once), else nullopt.
    std::optional<Result<Spawned>> poll() DSI_EXCLUDES(mu_) {
        MutexLock lock(&mu_);
        std::optional<Result<Spawned>> out = std::move(result_);
        result_.reset();
        return out;
    }
    Result<Spawned> wait() DSI_EXCLUDES(mu_) {
        MutexLock lock(&mu_);
        while (!result_) cv_.wait(&mu_);
        Result<Spawned> out = std::move(*result_);
        result_.reset();
        return out;
    }

private:
    void loop() DSI_EXCLUDES(mu_) {
        MutexLock lock(&mu_);
        for (;;) {
            while (!job_ && !stop_) cv_.wait(&mu_);
            if (!job_) return;  // stopping
            std::function<Result<Spawned>()> job = std::move(job_);
            job_ = nullptr;
            result_.emplace(job());  // the caller waits for it anyway
            cv_.notify_all();
        }
    }

    Mutex mu_;
    CondVar cv_;
    std::function<Result<Spawned>()> job_ DSI_GUARDED_BY(mu_);
    std::optional<Result<Spawned>> result_ DSI_GUARDED_BY(mu_);
    bool stop_ DSI_GUARDED_BY(mu_) = false;
    std::thread thread_;  // last: starts once the members above exist
};

EpLaunch::Group::Group() : forker(std::make_unique<ForkThread>()) {}
EpLaunch::Group::~Group() { abandon_restart(); }

void add_ep_flags(CLI::App& cmd, EpFlags* f) {
    add_setting(cmd, "--ep", f->ep,
                "expert parallelism: N rank processes on this host share the routed experts "
                "(this one and N-1 it starts; N <= the routed experts; slots per rank by the "
                "S-EPLB rounding)");
    add_setting(cmd, "--ep-attach-timeout-ms", f->attach_timeout_ms,
                "how long the --ep ranks may take to join the group");
    add_setting(cmd, "--eplb", f->eplb,
                "live expert-parallel load balancing with --ep (S-EPLB): off | prefill | "
                "decode (the phase's defaults: prefill 4 redundant experts per rank, window "
                "100 steps, rebalance every 1,000; decode 1, 1,000, 10,000)");
    add_setting(cmd, "--eplb-redundant", f->eplb_redundant,
                "redundant expert slots per rank (-1: the --eplb phase's default; 0 with off)");
    add_setting(cmd, "--eplb-window-steps", f->eplb_window_steps,
                "steps whose expert loads the placement is computed from (-1: phase default)");
    add_setting(cmd, "--eplb-interval-steps", f->eplb_interval_steps,
                "steps between placement changes (-1: phase default)");
    cmd.add_flag("--eplb-wait-weights", f->eplb_wait_weights)->group("");
    add_setting(cmd, "--ep-failover", f->failover,
                "on | off: when an --ep rank dies (rank 0 included), restart the group with "
                "the healthy ranks and re-run its requests (S-DEPLOY), or fail");
    add_setting(cmd, "--ep-front", f->front,
                "on | off (serve, generate): the started process is a front with no model "
                "and every rank's death is survived, or it is rank 0 with its model (needed "
                "to receive KV hand-overs, --role decode|both, under --ep; rank 0's death "
                "then ends the instance)");
    add_setting(cmd, "--ep-numa", f->numa,
                "off | auto | on: pin each --ep rank to a NUMA node's CPUs (ranks in blocks "
                "over the nodes, a node's CPUs split among its ranks) and prefer that node's "
                "memory for its weights; auto: only on a machine with several nodes");
    cmd.add_option("--ep-numa-topology", f->numa_topology)
        ->group("");  // tests: a faked topology, "0-3;4-7"
    add_setting(cmd, "--ep-attention", f->attention,
                "dp | rank0: with --ep, every rank runs its own requests with its own KV "
                "(attention data parallelism; rank 0 spreads the requests), or only rank 0 "
                "holds requests and the other ranks lend it their experts");
    add_setting(cmd, "--ep-dp-routing", f->dp_routing,
                "prefix | load (--ep-attention dp): send a request to the rank whose prefix "
                "cache holds the longest prefix of its prompt (as far as the front knows), "
                "unless that rank is too loaded, or always to the least-loaded rank");
    add_setting(cmd, "--ep-dp-balance-abs", f->dp_balance_abs,
                "prefix routing: the longest-prefix rank is too loaded when its running "
                "sequences exceed the least-loaded rank's by more than this...");
    add_setting(cmd, "--ep-dp-balance-rel", f->dp_balance_rel,
                "...and more than this many times (>= 1)");
    add_setting(cmd, "--ep-dp-prefix-blocks", f->dp_prefix_blocks,
                "prefix routing: the 128-token blocks the front remembers per rank (LRU; also "
                "capped by the rank's KV pool)");
    add_setting(cmd, "--ep-comm", f->comm,
                "shm | ucx: the --ep ranks' all-to-all over one shared-memory segment, or over "
                "UCX (TCP unless UCX_TLS says otherwise; ranks may be on other hosts)");
    add_setting(cmd, "--ep-coordinator", f->coordinator,
                "HOST:PORT where --ep-comm ucx's rank 0 listens and the others join (empty: "
                "a free port on 127.0.0.1)");
    add_setting(cmd, "--ep-local-ranks", f->local_ranks,
                "ranks 0..K-1 of --ep start on this host (0: all); ranks K..N-1 are started by "
                "hand on other hosts with --ep-rank R --ep-group NAME (docs/comm.md); needs "
                "--ep-comm ucx, --ep-front off, --ep-attention rank0, --ep-failover off");
    cmd.add_option("--ep-pipe-fd", f->pipe_fd)->group("");          // set by rank 0 (dp)
    cmd.add_flag("--ep-report-group", f->report_group)->group("");  // set by the front
    cmd.add_option("--ep-ranks-now", f->ranks_now)->group("");      // set by rank 0 at a restart
    cmd.add_option("--ep-rank", f->rank)->group("");                // set by rank 0 only
    cmd.add_option("--ep-group", f->group)->group("");
}

// --ep-numa: pins this rank's process to its CPUs (and memory node) before its thread pool
// exists (comm/numa_pinning.h); `num_threads` 0 becomes the rank's CPU count.
Status pin_rank_process(const EpFlags& f, int rank, int num_ranks, int& num_threads) {
    if (f.numa == "off") return Status::ok();
    if (f.numa != "auto" && f.numa != "on") {
        return invalid_argument("--ep-numa must be off, auto or on, not '" + f.numa + "'");
    }
    comm::NumaTopology topology;
    if (!f.numa_topology.empty()) {
        Result<comm::NumaTopology> t = comm::parse_numa_topology(f.numa_topology);
        if (!t.is_ok()) return t.status().with_context("--ep-numa-topology");
        topology = std::move(t).value();
    } else {
        DSI_ASSIGN_OR_RETURN(topology, comm::system_numa_topology());
    }
    if (f.numa == "auto" && topology.num_nodes() < 2) return Status::ok();
    const comm::RankPinning pinning = comm::pin_rank(topology, rank, num_ranks);
    DSI_RETURN_IF_ERROR(comm::apply_pinning(pinning, topology));
    DSI_LOG(kInfo) << "--ep rank " << rank << ": " << comm::describe(pinning)
                   << (topology.faked ? " (faked topology: CPUs only)" : "");
    if (num_threads == 0) num_threads = static_cast<int>(pinning.cpus.size());
    return Status::ok();
}

engine::DpRouting dp_routing(const EpFlags& f, std::string model_id, bool prefix_cache) {
    engine::DpRouting r;
    r.balance.prefix = f.dp_routing == "prefix" && prefix_cache;
    r.balance.balance_abs_seqs = f.dp_balance_abs;
    r.balance.balance_rel = f.dp_balance_rel;
    r.balance.max_blocks_per_rank = f.dp_prefix_blocks;
    r.model_id = std::move(model_id);
    return r;
}

Status apply_eplb_flags(const EpFlags& f, ExpertParallelOptions& ep) {
    cluster::EplbSettings settings;
    if (f.eplb == "prefill") {
        settings = cluster::EplbSettings::prefill_defaults();
    } else if (f.eplb == "decode") {
        settings = cluster::EplbSettings::decode_defaults();
    } else if (f.eplb == "off") {
        settings.redundant_experts_per_rank = 0;
    } else {
        return invalid_argument("--eplb must be off, prefill or decode, not '" + f.eplb + "'");
    }
    if (f.eplb_redundant >= 0) settings.redundant_experts_per_rank = f.eplb_redundant;
    if (f.eplb_window_steps >= 0) settings.window_steps = f.eplb_window_steps;
    if (f.eplb_interval_steps >= 0) settings.rebalance_interval_steps = f.eplb_interval_steps;
    DSI_RETURN_IF_ERROR(settings.validate().with_context("--eplb-*"));
    ep.redundant_experts_per_rank = settings.redundant_experts_per_rank;
    ep.stats_window_steps = settings.window_steps;
    ep.wait_for_moved_weights = f.eplb_wait_weights;
    ep.placement_policy = nullptr;
    // With live EPLB a replicated expert's rows are split evenly over its replicas, as the
    // policy's moe_lb assumes (kLocalFirst would send every row of rank 0 — the rank
    // that takes requests — to its own replica, whatever the placement).
    ep.replica_choice =
        f.eplb == "off" ? comm::ReplicaChoice::kLocalFirst : comm::ReplicaChoice::kRoundRobin;
    if (f.eplb != "off") {
        ep.placement_policy = cluster::live_eplb_factory(settings);
    }
    return Status::ok();
}

Result<EpLaunch> EpLaunch::start(const EpFlags& f, Env* env, serving::ReplicaOptions& o,
                                 bool long_idle, bool front) {
    EpLaunch launch;
    const bool started = !f.group.empty();
    if (f.ep == 1 && !started) return launch;
    if (f.ep < 1) return invalid_argument("--ep must be >= 1, got " + std::to_string(f.ep));
    if (f.rank < 0 || f.rank >= f.ep || (f.rank > 0 && !started)) {
        return invalid_argument("--ep-rank / --ep-group are set by rank 0 for the ranks it starts");
    }
    if (o.engine.speculative.enabled()) {
        return invalid_argument(
            "--ep does not run with --speculative yet (the MTP layer's MoE "
            "is not expert parallel)");
    }
    if (f.failover != "on" && f.failover != "off") {
        return invalid_argument("--ep-failover must be on or off, not '" + f.failover + "'");
    }
    if (f.front != "on" && f.front != "off") {
        return invalid_argument("--ep-front must be on or off, not '" + f.front + "'");
    }
    if (f.attention != "dp" && f.attention != "rank0") {
        return invalid_argument("--ep-attention must be dp or rank0, not '" + f.attention + "'");
    }
    if (f.dp_routing != "prefix" && f.dp_routing != "load") {
        return invalid_argument("--ep-dp-routing must be prefix or load, not '" + f.dp_routing +
                                "'");
    }
    if (f.dp_balance_abs < 0 || !(f.dp_balance_rel >= 1.0) || f.dp_prefix_blocks < 0) {
        return invalid_argument(
            "--ep-dp-balance-abs and --ep-dp-prefix-blocks must be >= 0, --ep-dp-balance-rel "
            ">= 1");
    }
    if (f.comm != "shm" && f.comm != "ucx") {
        return invalid_argument("--ep-comm must be shm or ucx, not '" + f.comm + "'");
    }
    if (f.comm == "ucx" && !comm::ucx_available()) {
        return unimplemented("--ep-comm ucx: this build has no UCX (libucx-dev)");
    }
    if (!f.coordinator.empty()) {
        if (Status s = comm::check_coordinator_address(f.coordinator); !s.is_ok()) {
            return invalid_argument("--ep-coordinator: " + s.message());
        }
    }
    if (f.local_ranks < 0 || f.local_ranks > f.ep) {
        return invalid_argument("--ep-local-ranks must be in [0, --ep], got " +
                                std::to_string(f.local_ranks));
    }
    if (f.local_ranks > 0 && f.local_ranks < f.ep && !started) {
        // Ranks on other hosts join by hand (docs/comm.md "A group over several hosts"):
        // no pipe reaches them and this process does not know their pids.
        if (f.comm != "ucx" || f.coordinator.empty() || f.front != "off" ||
            f.attention != "rank0" || f.failover != "off") {
            return invalid_argument(
                "--ep-local-ranks < --ep (ranks on other hosts) needs --ep-comm ucx, "
                "--ep-coordinator HOST:PORT, --ep-front off, --ep-attention rank0 and "
                "--ep-failover off");
        }
    }
    // A front keeps its model options unset: it has no model.
    ExpertParallelOptions front_ep;
    const bool is_front = front && f.front == "on" && !started;
    ExpertParallelOptions& ep = is_front ? front_ep : o.expert_parallel;
    ep.num_ranks = started && f.ranks_now > 0 ? f.ranks_now : f.ep;
    ep.rank = f.rank;
    std::random_device rd;
    ep.group = started ? f.group
                       : "dsinfer-ep-" + std::to_string(::getpid()) + "-" +
                             std::to_string(rd() % 1'000'000);
    ep.attach_timeout_ms = f.attach_timeout_ms;
    if (f.comm == "ucx") {
        ep.transport = EpTransport::kUcx;
        ep.coordinator = f.coordinator;
        if (ep.coordinator.empty() && !started) {
            // Ranks of this host over loopback: a port free now (passed to every rank).
            DSI_ASSIGN_OR_RETURN(int port, comm::pick_free_port("127.0.0.1"));
            ep.coordinator = "127.0.0.1:" + std::to_string(port);
        }
    }
    DSI_RETURN_IF_ERROR(apply_eplb_flags(f, ep));
    // The ranks may wait for the next request indefinitely; a death is still seen at once.
    if (long_idle) ep.idle_timeout_ms = int64_t{365} * 24 * 3600 * 1000;
    launch.started_ = started;
    launch.rank_ = f.rank;
    launch.pipe_fd_ = f.pipe_fd;
    launch.report_group_ = f.report_group;
    launch.spread_ = f.attention == "dp";
    if (started) {
        install_abandon_handler();
        ep.abandoned = [] { return g_group_abandoned.load(std::memory_order_relaxed); };
    }
    if (!is_front) {
        DSI_RETURN_IF_ERROR(pin_rank_process(f, ep.rank, ep.num_ranks, o.num_threads));
        if (o.num_threads == 0) o.num_threads = std::max(1, env->num_cpus() / f.ep);  // shared
    }
    if (started) return launch;
    serving::ReplicaOptions probe = o;
    probe.load_tokenizer = false;
    probe.load_model = false;
    probe.create_engine = false;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<serving::Replica> r, serving::open_replica(probe, env));
    DSI_RETURN_IF_ERROR(validate_expert_parallel(ep, r->config()));
    launch.group_ = std::make_shared<Group>();
    Group& g = *launch.group_;
    g.front = is_front;
    g.failover = f.failover == "on";
    g.reap_deadline_ms = std::max<int64_t>(20'000, f.attach_timeout_ms + 5'000);
    g.name = ep.group;
    g.num_experts = static_cast<int>(r->config().n_routed_experts);
    g.redundant_per_rank = ep.redundant_experts_per_rank;
    g.data_parallel = is_front || f.attention == "dp";
    if (is_front) {
        // Tokenizer and config only: the ranks hold the weights and the engines.
        o.load_model = false;
        o.create_engine = false;
    }
    if (ep.transport == EpTransport::kUcx && f.coordinator.empty()) {
        g.extra_args = {"--ep-coordinator", ep.coordinator};  // the port picked above
    }
    DSI_ASSIGN_OR_RETURN(Spawned spawned,
                         spawn(f.ep, ep.group, /*restarted=*/false, g.data_parallel,
                               /*first_rank=*/is_front ? 0 : 1, g.extra_args,
                               f.local_ranks > 0 ? f.local_ranks : -1));
    g.pids = std::move(spawned.pids);
    {
        MutexLock lock(&g.mu);
        g.pipes = std::move(spawned.pipes);
    }
    if (!is_front && g.failover) {
        ep.restart = [group = launch.group_](const Status&) { return restart(*group); };
    }
    if (!is_front) {
        // Rank 0 attaches in this process: a started rank that died before it attached
        // ends the wait at once (read on the thread that attaches, which is also the one
        // that restarts the group and rewrites the pids).
        ep.abandoned = [group = launch.group_] { return first_exited(group->pids) >= 0; };
    }
    return launch;
}

engine::RequestLimits EpLaunch::front_limits(const serving::Replica& replica) const {
    engine::RequestLimits limits;
    limits.vocab = replica.config().vocab_size;
    const int64_t max_len = replica.engine_options().max_model_len;
    limits.max_model_len = max_len > 0 ? max_len : replica.config().max_position_embeddings;
    limits.has_tokenizer = replica.tokenizer() != nullptr;
    return limits;
}

EpLaunch::~EpLaunch() {
    if (group_ == nullptr) return;
    group_->abandon_restart();
    (void)reap(group_->pids, /*kill_first=*/true);
}

int EpLaunch::started_rank_exit_code(const Status& s) {
    if (s.is_ok()) return 0;
    // A peer gone (UNAVAILABLE) or a peer that never came or stopped answering
    // (DEADLINE_EXCEEDED: the attach or a collective step timed out) is the group's loss,
    // not this rank's: it is healthy.
    return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded
               ? kPeerLost
               : 1;
}

namespace {

// Reaps the old group's ranks and says which were healthy. They see the group's end (the
// dead peer, or rank 0 leaving) at once -- one still attaching hears it from SIGUSR1 --
// and exit with kPeerLost: those are healthy. One
// that is dead, failed otherwise or does not exit within the deadline (or once `cancel`
// is set: the instance ends) is not.
std::vector<bool> reap_for_restart(std::vector<pid_t>& pids, int64_t deadline_ms,
                                   const std::atomic<bool>* cancel = nullptr) {
    std::vector<bool> healthy;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
    for (pid_t pid : pids) {
        int status = 0;
        pid_t got = 0;
        for (int i = 0;
             (got = ::waitpid(pid, &status, WNOHANG)) == 0 &&
             std::chrono::steady_clock::now() < deadline && !(cancel != nullptr && cancel->load());
             ++i) {
            // A rank still attaching cannot see a peer that never came: tell it (again
            // every 100 ms, in case it had not put its handler in place yet).
            if (i % 50 == 0) ::kill(pid, SIGUSR1);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (got != pid) {
            ::kill(pid, SIGKILL);
            while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            healthy.push_back(false);
            continue;
        }
        healthy.push_back(WIFEXITED(status) && WEXITSTATUS(status) == EpLaunch::kPeerLost);
    }
    pids.clear();
    return healthy;
}

// "exited with status 1" / "was killed by signal 9" / "is gone" (a closed pipe).
std::string exit_description(pid_t pid) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != pid) {
        return "closed its pipe";
    }
    return info.si_code == CLD_EXITED ? "exited with status " + std::to_string(info.si_status)
                                      : "was killed by signal " + std::to_string(info.si_status);
}

// S-DEPLOY: the size of the new group of the `healthy` ranks (EP = their count, the slots
// re-counted by the S-EPLB rounding), to be started as `group`.
Result<int> restart_size(const std::vector<bool>& healthy, int num_experts, int redundant_per_rank,
                         const std::string& group) {
    DSI_ASSIGN_OR_RETURN(
        cluster::EpRestartPlan plan,
        cluster::plan_ep_restart(healthy, num_experts, redundant_per_rank, /*min_ep_size=*/1));
    DSI_LOG(kWarning) << "--ep failover: " << plan.ep_size << " of " << healthy.size()
                      << " ranks healthy; restarting the group as " << group;
    return plan.ep_size;
}

}  // namespace

Result<EpRestart> EpLaunch::restart(Group& g) {
    std::vector<bool> healthy = {true};  // rank 0: this process
    const std::vector<bool> started = reap_for_restart(g.pids, g.reap_deadline_ms);
    healthy.insert(healthy.end(), started.begin(), started.end());
    return start_healthy(g, healthy);
}

Result<EpRestart> EpLaunch::start_healthy(Group& g, const std::vector<bool>& healthy) {
    EpRestart next;
    next.group = g.name + "-f" + std::to_string(++g.num_restarts);
    DSI_ASSIGN_OR_RETURN(next.num_ranks,
                         restart_size(healthy, g.num_experts, g.redundant_per_rank, next.group));
    Spawned spawned;
    // Rank 0 starts the others (a front restarts asynchronously: check_ranks).
    if (next.num_ranks > 1) {
        DSI_ASSIGN_OR_RETURN(spawned, g.forker->run([&g, &next] {
            return spawn(next.num_ranks, next.group, /*restarted=*/true, g.data_parallel,
                         /*first_rank=*/1, g.extra_args);
        }));
    }
    g.install(std::move(spawned));
    return next;
}

void EpLaunch::Group::install(Spawned spawned) {
    pids = std::move(spawned.pids);
    // A new generation for the DpFront: it relays what the old pipes still hold, then
    // re-runs the old ranks' requests on these (engine/dp_front.h).
    MutexLock lock(&mu);
    pipes = std::move(spawned.pipes);
    ++generation;
}

Result<bool> EpLaunch::Group::poll_restart() {
    std::optional<Result<Spawned>> done = forker->poll();
    if (!done) return false;
    restarting_ = false;
    if (!done->is_ok()) return broken = done->status();
    install(std::move(*done).value());
    return true;
}

void EpLaunch::Group::abandon_restart() {
    if (!restarting_) return;
    cancel_restart_ = true;
    Result<Spawned> r = forker->wait();
    restarting_ = false;
    // Ranks started before the cancel was seen: the instance is ending.
    if (r.is_ok()) (void)reap(r->pids, /*kill_first=*/true);
}

Result<bool> EpLaunch::Group::check_ranks(bool pipe_ended) {
    // A rank that exited (not reaped here: WNOWAIT), or the one whose pipe ended (its exit
    // follows at once: wait a little for it, to name it).
    auto exited = [this] { return first_exited(pids); };
    if (!broken.is_ok()) return broken;  // (said once, when it broke)
    if (restarting_) return poll_restart();
    int lost = exited();
    for (int i = 0; lost < 0 && pipe_ended && i < 100; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        lost = exited();
    }
    if (lost < 0 && !pipe_ended) return false;
    const std::string which =
        lost >= 0 ? "rank " + std::to_string(lost) + " " + exit_description(pids[lost])
                  : "a rank closed its pipe";
    if (!failover) {
        // The other ranks see the loss and exit with their own error (printed).
        (void)reap_for_restart(pids, reap_deadline_ms);
        return broken = unavailable("--ep: " + which + " (--ep-failover off)");
    }
    DSI_LOG(kWarning) << "--ep failover: " << which;
    // The reap (up to reap_deadline_ms: a rank lost before the group attached leaves the
    // others waiting at the attach) and the new group's start run on the fork thread; the
    // caller (the server's engine loop) goes on serving /metrics and taking requests, and
    // polls the restart at its next check.
    const std::string group = name + "-f" + std::to_string(++num_restarts);
    forker->start([old = std::move(pids), group, which, deadline_ms = reap_deadline_ms,
                   experts = num_experts, redundant = redundant_per_rank, dp = data_parallel,
                   extra = extra_args, cancel = &cancel_restart_]() mutable -> Result<Spawned> {
        const std::vector<bool> healthy = reap_for_restart(old, deadline_ms, cancel);
        if (cancel->load()) return cancelled("--ep: the instance ended during a failover");
        if (std::find(healthy.begin(), healthy.end(), true) == healthy.end()) {
            return unavailable("--ep: no healthy rank left after " + which);
        }
        DSI_ASSIGN_OR_RETURN(int ranks, restart_size(healthy, experts, redundant, group));
        // A front starts every rank of the new group (even one alone).
        return spawn(ranks, group, /*restarted=*/true, dp, /*first_rank=*/0, extra);
    });
    pids.clear();
    restarting_ = true;
    return false;
}

engine::DpRankLink::Ranks EpLaunch::Group::current() const {
    MutexLock lock(&mu);
    return {generation, pipes};
}

engine::DpRankLink* EpLaunch::dp_link() const {
    return group_ != nullptr && group_->data_parallel ? group_.get() : nullptr;
}

Status EpLaunch::run_started_rank(serving::Replica& replica, Env* env, bool grammars) {
    const std::string context = "--ep rank " + std::to_string(rank_);
    if (pipe_fd_ < 0) {  // --ep-attention rank0: experts only
        return engine::run_ep_rank(
                   *replica.engine(), *replica.model(), [] { return true; }, env)
            .with_context(context);
    }
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<comm::RankPipe> pipe, comm::RankPipe::adopt(pipe_fd_));
    // bench offline: a fresh engine per measurement, as rank 0 makes its own.
    auto reset = [&replica](bool async) -> Result<engine::Engine*> {
        engine::EngineOptions eo = replica.engine_options();
        eo.async = async;
        DSI_RETURN_IF_ERROR(replica.reset_engine(std::move(eo)));
        return replica.engine();
    };
    // S-SO under the front: the grammars it compiled arrive serialised and are rebuilt
    // here over this rank's vocabulary (the same tokenizer: the same masks).
    std::unique_ptr<grammar::PortableMaskBuilder> masks;
    if (grammars && replica.tokenizer() != nullptr) {
        grammar::CompileServiceOptions mo;
        mo.num_workers = 1;
        masks = std::make_unique<grammar::PortableMaskBuilder>(*replica.tokenizer(), mo);
        masks->start_table_warmup();  // serve's start-up warm-up, beside the rank's steps
    }
    return engine::run_dp_rank(*replica.engine(), *replica.model(), *pipe, env, reset,
                               report_group_, masks.get())
        .with_context(context);
}

Status EpLaunch::finish(serving::Replica& replica) {
    if (group_ == nullptr) return Status::ok();  // no --ep
    // A failover still reaping: the instance ends, the new group is not started.
    group_->abandon_restart();
    {
        // dp: no more requests; the ranks leave once idle.
        MutexLock lock(&group_->mu);
        for (const std::shared_ptr<comm::RankPipe>& pipe : group_->pipes) {
            (void)pipe->send(engine::dp_wire::encode_end());
        }
    }
    std::vector<pid_t>& pids = group_->pids;
    if (group_->front) {
        // The ranks leave once idle and exit; what the pipes still queue goes out first.
        for (bool pending = true; pending;) {
            pending = false;
            {
                MutexLock lock(&group_->mu);
                for (const std::shared_ptr<comm::RankPipe>& pipe : group_->pipes) {
                    // A rank gone (the flush fails) takes nothing more.
                    const bool open = pipe->flush().is_ok();
                    pending = pending || (open && pipe->has_pending_output());
                }
            }
            if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return reap(pids, /*kill_first=*/false, /*first_rank=*/0);
    }
    for (;;) {
        {
            MutexLock lock(&group_->mu);
            for (const std::shared_ptr<comm::RankPipe>& pipe : group_->pipes) (void)pipe->flush();
        }
        Result<CausalLm::GroupStep> step = replica.model()->group_idle_step(/*leaving=*/true);
        if (!step.is_ok()) {
            (void)reap(pids, /*kill_first=*/true);
            return step.status();
        }
        if (*step == CausalLm::GroupStep::kStopped || *step == CausalLm::GroupStep::kNotGrouped) {
            break;
        }
    }
    return reap(pids, /*kill_first=*/false);
}

}  // namespace dsi

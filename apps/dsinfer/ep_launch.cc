#include "ep_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "engine/ep_rank.h"

namespace dsi {
namespace {

Result<std::vector<std::string>> own_command_line() {
    const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return internal_error(std::string("/proc/self/cmdline: ") + std::strerror(errno));
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
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

// Waits for the ranks (killing them first when `kill_first`); UNAVAILABLE names the first
// that did not exit 0.
Status reap(std::vector<pid_t>& pids, bool kill_first) {
    Status first = Status::ok();
    for (size_t i = 0; i < pids.size(); ++i) {
        if (kill_first) ::kill(pids[i], SIGTERM);
        int status = 0;
        while (::waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
        }
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && first.is_ok() && !kill_first) {
            const std::string how = WIFEXITED(status)
                                        ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                        : "was killed by signal " + std::to_string(WTERMSIG(status));
            first = unavailable("--ep: rank " + std::to_string(i + 1) + " " + how);
        }
    }
    pids.clear();
    return first;
}

Result<std::vector<pid_t>> spawn(int num_ranks, const std::string& group) {
    DSI_ASSIGN_OR_RETURN(std::vector<std::string> args, own_command_line());
    const pid_t parent = ::getpid();
    std::vector<pid_t> pids;
    for (int r = 1; r < num_ranks; ++r) {
        std::vector<std::string> a = args;
        a.insert(a.end(), {"--ep-rank", std::to_string(r), "--ep-group", group});
        std::vector<char*> argv;
        for (std::string& s : a) argv.push_back(s.data());
        argv.push_back(nullptr);
        const pid_t pid = ::fork();
        if (pid < 0) {
            Status s = internal_error(std::string("fork: ") + std::strerror(errno));
            (void)reap(pids, /*kill_first=*/true);
            return s;
        }
        if (pid == 0) {
            // Dies with rank 0 (also if it died between the fork and this call).
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(1);
            ::execv("/proc/self/exe", argv.data());
            ::_exit(127);
        }
        pids.push_back(pid);
    }
    return pids;
}

}  // namespace

void add_ep_flags(CLI::App& cmd, EpFlags* f) {
    add_setting(cmd, "--ep", f->ep,
                "expert parallelism: N rank processes on this host share the routed experts "
                "(this one and N-1 it starts; N must divide the routed experts)");
    add_setting(cmd, "--ep-attach-timeout-ms", f->attach_timeout_ms,
                "how long the --ep ranks may take to join the group");
    cmd.add_option("--ep-rank", f->rank)->group("");  // set by rank 0 only
    cmd.add_option("--ep-group", f->group)->group("");
}

Result<EpLaunch> EpLaunch::start(const EpFlags& f, Env* env, serving::ReplicaOptions& o,
                                 bool long_idle) {
    EpLaunch launch;
    if (f.ep == 1 && f.rank == 0) return launch;
    if (f.ep < 1) return invalid_argument("--ep must be >= 1, got " + std::to_string(f.ep));
    if (f.rank < 0 || f.rank >= f.ep || (f.rank > 0 && f.group.empty())) {
        return invalid_argument("--ep-rank / --ep-group are set by rank 0 for the ranks it starts");
    }
    if (o.engine.speculative.enabled()) {
        return invalid_argument("--ep does not run with --speculative yet (the MTP layer's MoE "
                                "is not expert parallel)");
    }
    ExpertParallelOptions& ep = o.expert_parallel;
    ep.num_ranks = f.ep;
    ep.rank = f.rank;
    std::random_device rd;
    ep.group = f.rank > 0 ? f.group
                          : "dsinfer-ep-" + std::to_string(::getpid()) + "-" +
                                std::to_string(rd() % 1'000'000);
    ep.attach_timeout_ms = f.attach_timeout_ms;
    // Rank 0 may wait for its next request indefinitely; its death is still seen at once.
    if (long_idle) ep.idle_timeout_ms = int64_t{365} * 24 * 3600 * 1000;
    if (o.num_threads == 0) o.num_threads = std::max(1, env->num_cpus() / f.ep);  // cores shared
    launch.rank_ = f.rank;
    if (f.rank > 0) return launch;
    serving::ReplicaOptions probe = o;
    probe.load_tokenizer = false;
    probe.load_model = false;
    probe.create_engine = false;
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<serving::Replica> r, serving::open_replica(probe, env));
    DSI_RETURN_IF_ERROR(validate_expert_parallel(ep, r->config()));
    DSI_ASSIGN_OR_RETURN(launch.pids_, spawn(f.ep, ep.group));
    return launch;
}

EpLaunch::~EpLaunch() { (void)reap(pids_, /*kill_first=*/true); }

Status EpLaunch::run_started_rank(serving::Replica& replica, Env* env) {
    return engine::run_ep_rank(*replica.engine(), *replica.model(), [] { return true; }, env)
        .with_context("--ep rank " + std::to_string(rank_));
}

Status EpLaunch::finish(serving::Replica& replica) {
    for (;;) {
        Result<CausalLm::GroupStep> step = replica.model()->group_idle_step(/*leaving=*/true);
        if (!step.is_ok()) {
            (void)reap(pids_, /*kill_first=*/true);
            return step.status();
        }
        if (*step == CausalLm::GroupStep::kStopped || *step == CausalLm::GroupStep::kNotGrouped) {
            break;
        }
    }
    return reap(pids_, /*kill_first=*/false);
}

}  // namespace dsi

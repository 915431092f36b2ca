#include "ep_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

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

}  // namespace

std::string new_ep_group_name() {
    std::random_device rd;
    return "dsinfer-ep-" + std::to_string(::getpid()) + "-" + std::to_string(rd() % 1'000'000);
}

Result<std::vector<pid_t>> spawn_ep_ranks(int num_ranks, const std::string& group) {
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
            (void)reap_ep_ranks(pids, /*kill_first=*/true);
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

Status reap_ep_ranks(const std::vector<pid_t>& pids, bool kill_first) {
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
    return first;
}

}  // namespace dsi

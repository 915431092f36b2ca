// Test helpers: ranks as forked processes (comm/ and model/ expert-parallel tests).
// Not part of any library.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/clock.h"

namespace dsi::comm {

// Memory shared with forked children (MAP_SHARED | MAP_ANONYMOUS).
template <typename T>
class SharedArray {
public:
    explicit SharedArray(size_t n) : n_(n) {
        p_ = static_cast<T*>(::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE,
                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        DSI_CHECK(p_ != MAP_FAILED, "mmap");
        std::fill(p_, p_ + n_, T{});
    }
    ~SharedArray() { ::munmap(p_, bytes()); }
    T& operator[](size_t i) { return p_[i]; }
    T* data() { return p_; }

private:
    size_t bytes() const { return std::max<size_t>(n_ * sizeof(T), 1); }
    size_t n_;
    T* p_;
};

// Runs fn(rank) in n forked processes; returns each exit code (128 + signal when killed,
// -1 when it had to be killed at the timeout, so a hang fails instead of blocking).
inline std::vector<int> run_ranks(int n, const std::function<int(int)>& fn,
                                  int64_t timeout_ms = 25'000) {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
        pid_t pid = ::fork();
        DSI_CHECK(pid >= 0, "fork");
        if (pid == 0) {
            // Never return into GoogleTest in the child, whatever fn does.
            int code = 99;
            try {
                code = fn(r);
            } catch (...) {
                code = 98;
            }
            ::_exit(code);
        }
        pids.push_back(pid);
    }
    std::vector<int> codes(static_cast<size_t>(n), -2);
    const int64_t deadline = steady_clock_ns() + timeout_ms * 1'000'000;
    int left = n;
    while (left > 0) {
        for (int r = 0; r < n; ++r) {
            int status = 0;
            if (codes[r] == -2 && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                --left;
            }
        }
        if (left > 0 && steady_clock_ns() > deadline) {
            for (int r = 0; r < n; ++r) {
                if (codes[r] == -2) {
                    ::kill(pids[r], SIGKILL);
                    ::waitpid(pids[r], nullptr, 0);
                    codes[r] = -1;
                }
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return codes;
}

}  // namespace dsi::comm

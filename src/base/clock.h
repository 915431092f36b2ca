// steady_clock_ns: the process's monotonic clock in ns; thread_cpu_ns: the calling
// thread's CPU time. Both for measurements that are not policy input (stats, profiling,
// lock deadlines). Policies take time from an Env (base/env.h) so they can be replayed.
// Thread model: free functions, any thread.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace dsi {

inline int64_t steady_clock_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The calling thread's CPU time in ns (user + system); -1 where the clock is missing.
inline int64_t thread_cpu_ns() {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return -1;
    }
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace dsi

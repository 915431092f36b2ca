// steady_clock_ns: the process's monotonic clock in ns, for measurements that are not
// policy input (stats, profiling, lock deadlines). Policies take time from an Env
// (base/env.h) so they can be replayed. Thread model: a free function, any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace dsi {

inline int64_t steady_clock_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace dsi

#include "base/thread_pool.h"

#include <algorithm>

namespace dsi {
namespace {

// Spins before a worker sleeps: long enough to cover the gap between two
// kernels of one forward pass, short enough not to burn a shared core when
// idle.
constexpr int kSpinIterations = 4000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

// Chunk `index` of `parts` over [0, n) in units of `grain`.
std::pair<int64_t, int64_t> chunk(int64_t n, int64_t grain, int parts, int index) {
    int64_t units = (n + grain - 1) / grain;
    int64_t per = units / parts;
    int64_t extra = units % parts;
    int64_t begin_u = index * per + std::min<int64_t>(index, extra);
    int64_t end_u = begin_u + per + (index < extra ? 1 : 0);
    return {std::min(n, begin_u * grain), std::min(n, end_u * grain)};
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
    for (int i = 1; i < num_threads_; ++i)
        workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (std::thread& t : workers_)
        t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0)
        return;
    grain = std::max<int64_t>(1, grain);
    if (num_threads_ == 1 || n <= grain) {
        fn(0, n);
        return;
    }
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    pending_.store(num_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    auto [b, e] = chunk(n, grain, num_threads_, 0);
    if (b < e)
        fn(b, e);
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
        if (spin < kSpinIterations) {
            cpu_relax();
        } else {
            std::this_thread::yield();
        }
    }
    fn_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = generation_.load(std::memory_order_acquire);
        for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
            cpu_relax();
            gen = generation_.load(std::memory_order_acquire);
        }
        if (gen == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            continue;
        }
        seen = gen;
        if (stop_.load(std::memory_order_acquire))
            return;
        auto [b, e] = chunk(n_, grain_, num_threads_, index);
        if (b < e)
            (*fn_)(b, e);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace dsi

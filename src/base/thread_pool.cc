#include "base/thread_pool.h"

#include <algorithm>

namespace dsi {
namespace {

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
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (num_threads_ == 1 || n <= grain) {
        fn(0, n);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = &fn;
        n_ = n;
        grain_ = grain;
        pending_ = num_threads_ - 1;
        ++generation_;
    }
    work_cv_.notify_all();
    auto [b, e] = chunk(n, grain, num_threads_, 0);
    if (b < e) fn(b, e);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int64_t, int64_t)>* fn;
        int64_t n, grain;
        {
            std::unique_lock<std::mutex> lock(mu_);
            work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            fn = fn_;
            n = n_;
            grain = grain_;
        }
        auto [b, e] = chunk(n, grain, num_threads_, index);
        if (b < e) (*fn)(b, e);
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--pending_ == 0) done_cv_.notify_one();
        }
    }
}

}  // namespace dsi

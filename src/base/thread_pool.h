// ThreadPool: a persistent pool for data-parallel loops. parallel_for splits
// [0, n) into contiguous chunks, one per worker, in a fixed way that depends only
// on n and the pool size, and blocks until all chunks are done. Work is never
// stolen, so a kernel that reduces each output element inside one chunk is
// deterministic. Thread model: parallel_for may be called from one thread at a
// time (the owner); the workers only run the chunks they are given.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsi {

class ThreadPool {
public:
    // num_threads includes the calling thread; 1 means run inline.
    explicit ThreadPool(int num_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const { return num_threads_; }
    // Calls fn(begin, end) on disjoint chunks covering [0, n); chunk boundaries are
    // multiples of `grain` (except the last).
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);

    int num_threads_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // GUARDED_BY(mu_)
    int64_t n_ = 0;
    int64_t grain_ = 1;
    uint64_t generation_ = 0;  // GUARDED_BY(mu_)
    int pending_ = 0;          // GUARDED_BY(mu_)
    bool stop_ = false;        // GUARDED_BY(mu_)
};

}  // namespace dsi

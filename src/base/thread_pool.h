// ThreadPool: a persistent pool for data-parallel loops. parallel_for splits
// [0, n) into contiguous chunks, one per worker, in a fixed way that depends
// only on n and the pool size, and blocks until all chunks are done. Work is
// never stolen, so a kernel that reduces each output element inside one chunk
// is deterministic.
//
// Dispatch is a generation counter the workers spin on for a short while (then
// they sleep on it, C++20 atomic wait), and completion is a counter the caller
// spins on: no lock and no thread creation per call, a few microseconds per
// parallel_for.
//
// Thread model: parallel_for may be called from one thread at a time (the
// owner); the workers only run the chunks they are given.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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
    // Calls fn(begin, end) on disjoint chunks covering [0, n); chunk boundaries
    // are multiples of `grain` (except the last). Chunk i runs on thread i.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);

    int num_threads_;
    std::vector<std::thread> workers_;
    // Job description: written by the owner before it bumps generation_
    // (release); read by workers after they see the new generation (acquire).
    const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
    int64_t n_ = 0;
    int64_t grain_ = 1;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace dsi

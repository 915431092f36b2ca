// Off-thread access to a BlockStore for the engine (S-KV-5, S-KV-7):
//   - WriteBehind: the step loop offers full blocks; one worker thread puts them. offer()
//     copies the layers and never blocks; when the queue holds max_queued_bytes, the
//     block is dropped and counted (the cache is best-effort; the step loop must not
//     slow down).
//   - Fetcher: admission submits the hit chain's keys; one worker thread runs
//     get_many() and the caller waits on the ticket with a deadline (or polls).
//     Swap-in (S-KV-6) then copies a Block's layers one by one (Block::layer(i)).
// Thread model: offer()/submit()/flush() from any thread; one worker thread per object;
// the destructor stops the worker after the in-flight operation (queued writes not yet
// started are dropped and counted; pending fetch tickets complete with kCancelled).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvstore/block_store.h"

namespace dsi::kvstore {

class WriteBehind {
public:
    struct Options {
        int64_t max_queued_bytes = int64_t{256} << 20;
        int64_t put_timeout_ms = 5000;  // deadline of each put
    };
    // REQUIRES: store outlives this object.
    WriteBehind(BlockStore* store, Options options);
    ~WriteBehind();
    WriteBehind(const WriteBehind&) = delete;
    WriteBehind& operator=(const WriteBehind&) = delete;

    // Queues a copy of the block; false if it was dropped (queue full or stopping).
    bool offer(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers);
    // Waits until every queued block is written or dropped; false at the deadline.
    bool flush(int64_t deadline_ns);
    int64_t num_dropped() const;
    int64_t num_written() const;

private:
    struct Item {
        BlockInfo info;
        std::vector<std::vector<uint8_t>> layers;
        int64_t bytes = 0;
    };
    void run();

    BlockStore* store_;
    Options options_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Item> queue_;    // guarded by mu_
    int64_t queued_bytes_ = 0;  // guarded by mu_
    bool busy_ = false;         // guarded by mu_: the worker is writing one item
    bool stopping_ = false;     // guarded by mu_
    int64_t dropped_ = 0;       // guarded by mu_
    int64_t written_ = 0;       // guarded by mu_
    std::thread worker_;
};

// The result of one fetch; shared by the Fetcher's worker and the caller.
class FetchTicket {
public:
    // OK when the results are ready; kDeadlineExceeded if not by `deadline_ns`
    // (the fetch goes on; wait again or drop the ticket).
    Status wait(int64_t deadline_ns);
    bool done() const;
    // REQUIRES: done(). One result per submitted key, same order; a miss is kNotFound.
    std::vector<Result<Block>>& results();

private:
    friend class Fetcher;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;  // guarded by mu_
    std::vector<Result<Block>> results_;
};

class Fetcher {
public:
    // REQUIRES: store outlives this object.
    explicit Fetcher(BlockStore* store);
    ~Fetcher();
    Fetcher(const Fetcher&) = delete;
    Fetcher& operator=(const Fetcher&) = delete;

    // REQUIRES: expects empty or the same size as keys.
    std::shared_ptr<FetchTicket> submit(std::vector<StoreKey> keys, std::vector<BlockInfo> expects,
                                        int64_t deadline_ns);

private:
    struct Job {
        std::vector<StoreKey> keys;
        std::vector<BlockInfo> expects;
        int64_t deadline_ns;
        std::shared_ptr<FetchTicket> ticket;
    };
    void run();
    static void complete(FetchTicket& t, std::vector<Result<Block>> results);

    BlockStore* store_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;   // guarded by mu_
    bool stopping_ = false;  // guarded by mu_
    std::thread worker_;
};

}  // namespace dsi::kvstore

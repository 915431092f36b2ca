// Off-thread access to a BlockStore for the engine (S-KV-5, S-KV-7):
//   - WriteBehind: the step loop offers full blocks; one worker thread puts them. offer()
//     copies the layers and never blocks; when the queue holds max_queued_bytes, the
//     block is dropped and counted (the cache is best-effort; the step loop must not
//     slow down).
//   - Fetcher: admission submits the hit chain's keys; one worker thread reads them
//     and the caller waits on the ticket with a deadline (or polls). With
//     Options::buffer_bytes set, blocks are read with read_many_into into a bounded
//     pool of reused page-aligned host buffers the Fetcher owns (no allocation, no zero
//     fill, no copy out of a tier); each result holds its buffer until the last
//     reference to it is gone (the swap-in has copied it), then the buffer goes back to
//     the pool. Without it, get_many (fresh buffers per block). A zero-copy store
//     (BlockStore::zero_copy_reads, file:// io=mmap) is read with get_many into its
//     own memory; the pool's leases still bound how many fetched blocks are held.
//     Swap-in (S-KV-6) then copies a Block's layers one by one (Block::layer(i)).
// Thread model: offer()/submit()/flush() from any thread; one worker thread per object;
// the destructor stops the worker after the in-flight operation (queued writes not yet
// started are dropped and counted; pending fetch tickets complete with kCancelled).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"
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
    mutable Mutex mu_;
    CondVar cv_;
    std::deque<Item> queue_ DSI_GUARDED_BY(mu_);
    int64_t queued_bytes_ DSI_GUARDED_BY(mu_) = 0;
    bool busy_ DSI_GUARDED_BY(mu_) = false;  // the worker is writing one item
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    int64_t dropped_ DSI_GUARDED_BY(mu_) = 0;
    int64_t written_ DSI_GUARDED_BY(mu_) = 0;
    std::thread worker_;
};

// A fetched, verified block. Shared: the caller may keep it past the ticket (the
// engine hands it to the swap-in); a pooled buffer returns to the Fetcher's pool when
// the last reference goes, also after the Fetcher itself is gone.
using FetchedBlock = std::shared_ptr<const Block>;

// The result of one fetch; shared by the Fetcher's worker and the caller.
class FetchTicket {
public:
    // OK when the results are ready; kDeadlineExceeded if not by `deadline_ns`
    // (the fetch goes on; wait again or drop the ticket).
    Status wait(int64_t deadline_ns);
    bool done() const;
    // REQUIRES: done(). One result per submitted key, same order; a miss is kNotFound;
    // a key beyond the buffers the pool could give by the deadline is kResourceExhausted
    // (a miss too: the chain is read from its head).
    std::vector<Result<FetchedBlock>>& results();

private:
    friend class Fetcher;
    mutable Mutex mu_;
    CondVar cv_;
    bool done_ DSI_GUARDED_BY(mu_) = false;
    std::vector<Result<FetchedBlock>> results_;
};

// Fetch buffers, counted (tests check reuse and that none leaks).
struct FetchBufferStats {
    int64_t allocated = 0;  // buffers created (never more than max_buffers)
    int64_t in_use = 0;     // held by a result (ticket, staged block, swap-in)
    int64_t leases = 0;     // buffers handed out in all (> allocated: reused)
};

class Fetcher {
public:
    struct Options {
        // Bytes of one host buffer (>= the largest encoded block fetched; rounded up to
        // 4096). 0: no pool, get_many into fresh buffers.
        size_t buffer_bytes = 0;
        // At most this many buffers exist; a fetch waits (up to its deadline) for as
        // many as it has keys (capped at max_buffers), then reads the chain's head
        // into what it got.
        int64_t max_buffers = 0;
    };
    class BufferPool;  // internal (async_store.cc); shared with the results' buffers

    // REQUIRES: store outlives this object.
    explicit Fetcher(BlockStore* store) : Fetcher(store, Options{}) {}
    Fetcher(BlockStore* store, Options options);
    ~Fetcher();
    Fetcher(const Fetcher&) = delete;
    Fetcher& operator=(const Fetcher&) = delete;

    // REQUIRES: expects empty or the same size as keys.
    std::shared_ptr<FetchTicket> submit(std::vector<StoreKey> keys, std::vector<BlockInfo> expects,
                                        int64_t deadline_ns);
    // Thread-safe; zeros without a pool.
    FetchBufferStats buffer_stats() const;

private:
    struct Job {
        std::vector<StoreKey> keys;
        std::vector<BlockInfo> expects;
        int64_t deadline_ns;
        std::shared_ptr<FetchTicket> ticket;
    };
    void run();
    std::vector<Result<FetchedBlock>> read(const Job& job);
    static void complete(FetchTicket& t, std::vector<Result<FetchedBlock>> results);

    BlockStore* store_;
    // Shared (stated reason): a result's buffer may outlive the Fetcher (the engine's
    // staged blocks and step plans die after it); null without a pool.
    std::shared_ptr<BufferPool> pool_;
    Mutex mu_;
    CondVar cv_;
    std::deque<Job> jobs_ DSI_GUARDED_BY(mu_);
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    std::thread worker_;
};

}  // namespace dsi::kvstore

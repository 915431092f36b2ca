#include "kvstore/async_store.h"

#include <algorithm>
#include <chrono>

#include "base/mutex.h"
#include "base/env.h"

namespace dsi::kvstore {

// A bounded free list of page-aligned host buffers, created lazily up to max_buffers.
// Thread model: thread-safe (the fetch thread acquires, any thread releases).
class Fetcher::BufferPool {
public:
    BufferPool(size_t buffer_bytes, int64_t max_buffers)
        : buffer_bytes_((buffer_bytes + 4095) / 4096 * 4096), max_buffers_(max_buffers) {}

    size_t buffer_bytes() const { return buffer_bytes_; }

    // Up to `want` buffers (capped at max_buffers): waits until that many are free or
    // creatable, or `deadline_ns` passes or close() is called, then takes what there is.
    std::vector<BlockBuffer> acquire(int64_t want, int64_t deadline_ns) {
        want = std::min(want, max_buffers_);
        std::vector<BlockBuffer> out;
        int64_t create = 0;
        {
            MutexLock lock(&mu_);
            while (available() < want && !closed_) {
                const int64_t left = deadline_ns - Env::default_env()->now_ns();
                if (left <= 0) break;
                cv_.wait_for(&mu_, std::chrono::nanoseconds(std::min<int64_t>(left, 100'000'000)));
            }
            const int64_t n = std::min(want, available());
            out.reserve(static_cast<size_t>(n));
            while (static_cast<int64_t>(out.size()) < n && !free_.empty()) {
                out.push_back(std::move(free_.back()));
                free_.pop_back();
            }
            create = n - static_cast<int64_t>(out.size());
            stats_.allocated += create;
            stats_.in_use += n;
            stats_.leases += n;
        }
        for (int64_t i = 0; i < create; ++i) out.push_back(BlockBuffer::allocate(buffer_bytes_));
        return out;
    }

    void release(BlockBuffer b) {
        {
            MutexLock lock(&mu_);
            free_.push_back(std::move(b));
            --stats_.in_use;
        }
        cv_.notify_all();
    }

    void close() {
        {
            MutexLock lock(&mu_);
            closed_ = true;
        }
        cv_.notify_all();
    }

    FetchBufferStats stats() const {
        MutexLock lock(&mu_);
        return stats_;
    }

private:
    int64_t available() const DSI_REQUIRES(mu_) {
        return static_cast<int64_t>(free_.size()) + (max_buffers_ - stats_.allocated);
    }

    const size_t buffer_bytes_;
    const int64_t max_buffers_;
    mutable Mutex mu_;
    CondVar cv_;
    std::vector<BlockBuffer> free_ DSI_GUARDED_BY(mu_);
    FetchBufferStats stats_ DSI_GUARDED_BY(mu_);
    bool closed_ DSI_GUARDED_BY(mu_) = false;
};

namespace {

// A block read into a pooled buffer: the buffer goes back when the last reference to
// the block does (FetchedBlock aliases this holder).
struct PooledBlock {
    Block block;
    BlockBuffer buffer;
    std::shared_ptr<Fetcher::BufferPool> pool;
    PooledBlock(Block b, BlockBuffer buf, std::shared_ptr<Fetcher::BufferPool> p)
        : block(std::move(b)), buffer(std::move(buf)), pool(std::move(p)) {}
    ~PooledBlock() { pool->release(std::move(buffer)); }
    PooledBlock(const PooledBlock&) = delete;
    PooledBlock& operator=(const PooledBlock&) = delete;
};

}  // namespace

WriteBehind::WriteBehind(BlockStore* store, Options options)
    : store_(store), options_(options), worker_([this] { run(); }) {}

WriteBehind::~WriteBehind() {
    {
        MutexLock lock(&mu_);
        stopping_ = true;
        dropped_ += static_cast<int64_t>(queue_.size());
        store_->metrics().puts_dropped.fetch_add(static_cast<int64_t>(queue_.size()),
                                                 std::memory_order_relaxed);
        queue_.clear();
        queued_bytes_ = 0;
    }
    cv_.notify_all();
    worker_.join();
}

bool WriteBehind::offer(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers) {
    int64_t bytes = 0;
    for (const auto& l : layers) {
        bytes += static_cast<int64_t>(l.size());
    }
    {
        MutexLock lock(&mu_);
        // S-KV-7: write-behind must not slow the step loop: drop instead of waiting.
        if (stopping_ || queued_bytes_ + bytes > options_.max_queued_bytes) {
            ++dropped_;
            store_->metrics().puts_dropped.fetch_add(1, std::memory_order_relaxed);
            return false;
        }
        queued_bytes_ += bytes;
    }
    Item item;
    item.info = info;
    item.bytes = bytes;
    item.layers.reserve(layers.size());
    for (const auto& l : layers) {
        item.layers.emplace_back(l.begin(), l.end());
    }
    {
        MutexLock lock(&mu_);
        queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    return true;
}

void WriteBehind::run() {
    while (true) {
        Item item;
        {
            MutexLock lock(&mu_);
            while (!stopping_ && queue_.empty()) cv_.wait(&mu_);
            if (stopping_) {
                return;
            }
            item = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
        }
        std::vector<std::span<const uint8_t>> spans(item.layers.begin(), item.layers.end());
        Status s = store_->put(item.info, spans, deadline_after_ms(options_.put_timeout_ms));
        {
            MutexLock lock(&mu_);
            busy_ = false;
            queued_bytes_ -= item.bytes;
            (s.is_ok() ? written_ : dropped_)++;
        }
        cv_.notify_all();
    }
}

bool WriteBehind::flush(int64_t deadline_ns) {
    MutexLock lock(&mu_);
    while (!stopping_ && !(queue_.empty() && !busy_)) {
        int64_t left = deadline_ns - Env::default_env()->now_ns();
        if (left <= 0) {
            return false;
        }
        cv_.wait_for(&mu_, std::chrono::nanoseconds(std::min<int64_t>(left, 1'000'000'000)));
    }
    return true;
}

int64_t WriteBehind::num_dropped() const {
    MutexLock lock(&mu_);
    return dropped_;
}

int64_t WriteBehind::num_written() const {
    MutexLock lock(&mu_);
    return written_;
}

Status FetchTicket::wait(int64_t deadline_ns) {
    MutexLock lock(&mu_);
    while (!done_) {
        int64_t left = deadline_ns - Env::default_env()->now_ns();
        if (left <= 0) {
            return deadline_exceeded("fetch not done by its deadline");
        }
        cv_.wait_for(&mu_, std::chrono::nanoseconds(std::min<int64_t>(left, 1'000'000'000)));
    }
    return Status::ok();
}

bool FetchTicket::done() const {
    MutexLock lock(&mu_);
    return done_;
}

std::vector<Result<FetchedBlock>>& FetchTicket::results() {
    MutexLock lock(&mu_);
    DSI_CHECK(done_, "FetchTicket::results before done");
    return results_;
}

Fetcher::Fetcher(BlockStore* store, Options options)
    : store_(store),
      pool_(options.buffer_bytes > 0 && options.max_buffers > 0
                ? std::make_shared<BufferPool>(options.buffer_bytes, options.max_buffers)
                : nullptr),
      worker_([this] { run(); }) {}

Fetcher::~Fetcher() {
    std::deque<Job> left;
    {
        MutexLock lock(&mu_);
        stopping_ = true;
        left.swap(jobs_);
    }
    cv_.notify_all();
    if (pool_ != nullptr) pool_->close();  // a fetch waiting for buffers stops waiting
    worker_.join();
    for (Job& j : left) {
        std::vector<Result<FetchedBlock>> r;
        for (size_t i = 0; i < j.keys.size(); ++i) {
            r.emplace_back(cancelled("fetcher stopped"));
        }
        complete(*j.ticket, std::move(r));
    }
}

std::shared_ptr<FetchTicket> Fetcher::submit(std::vector<StoreKey> keys,
                                             std::vector<BlockInfo> expects, int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    auto ticket = std::make_shared<FetchTicket>();
    {
        MutexLock lock(&mu_);
        jobs_.push_back({std::move(keys), std::move(expects), deadline_ns, ticket});
    }
    cv_.notify_all();
    return ticket;
}

FetchBufferStats Fetcher::buffer_stats() const {
    return pool_ != nullptr ? pool_->stats() : FetchBufferStats{};
}

void Fetcher::complete(FetchTicket& t, std::vector<Result<FetchedBlock>> results) {
    {
        MutexLock lock(&t.mu_);
        t.results_ = std::move(results);
        t.done_ = true;
    }
    t.cv_.notify_all();
}

void Fetcher::run() {
    while (true) {
        Job job;
        {
            MutexLock lock(&mu_);
            while (!stopping_ && jobs_.empty()) cv_.wait(&mu_);
            if (stopping_) {
                return;
            }
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        // S-KV-5: the store -> host copy runs here, off the engine's step loop.
        complete(*job.ticket, read(job));
        job.ticket.reset();  // an abandoned ticket (aborted request) frees its buffers here
    }
}

std::vector<Result<FetchedBlock>> Fetcher::read(const Job& job) {
    std::vector<Result<FetchedBlock>> out;
    out.reserve(job.keys.size());
    if (pool_ == nullptr) {
        for (Result<Block>& r : store_->get_many(job.keys, job.expects, job.deadline_ns)) {
            if (r.is_ok()) {
                out.emplace_back(std::make_shared<const Block>(std::move(r).value()));
            } else {
                out.emplace_back(r.status());
            }
        }
        return out;
    }
    // The chain's head gets the buffers there are by the deadline; the tail is a miss.
    std::vector<BlockBuffer> bufs =
        pool_->acquire(static_cast<int64_t>(job.keys.size()), job.deadline_ns);
    const size_t n = bufs.size();
    std::vector<std::span<uint8_t>> dsts;
    for (const BlockBuffer& b : bufs) dsts.push_back(b.span());
    std::span<const BlockInfo> expects = job.expects;
    if (!expects.empty()) expects = expects.first(n);
    std::vector<Result<Block>> got;
    if (n > 0) {
        auto keys = std::span<const StoreKey>(job.keys).first(n);
        // A zero-copy store's blocks live in its own memory (file mappings): the leases
        // then only bound how many fetched blocks are held; their buffers stay untouched.
        got = store_->zero_copy_reads() ? store_->get_many(keys, expects, job.deadline_ns)
                                        : store_->read_many_into(keys, expects, dsts,
                                                                 job.deadline_ns);
    }
    for (size_t i = 0; i < n; ++i) {
        if (!got[i].is_ok()) {
            out.emplace_back(got[i].status());
            pool_->release(std::move(bufs[i]));
            continue;
        }
        auto held = std::make_shared<PooledBlock>(std::move(got[i]).value(), std::move(bufs[i]),
                                                  pool_);
        out.emplace_back(FetchedBlock(held, &held->block));
    }
    for (size_t i = n; i < job.keys.size(); ++i) {
        out.emplace_back(resource_exhausted("no fetch buffer free by the deadline"));
    }
    return out;
}

}  // namespace dsi::kvstore

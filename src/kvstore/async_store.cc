#include "kvstore/async_store.h"

#include <chrono>

#include "base/env.h"

namespace dsi::kvstore {

WriteBehind::WriteBehind(BlockStore* store, Options options)
    : store_(store), options_(options), worker_([this] { run(); }) {}

WriteBehind::~WriteBehind() {
    {
        std::lock_guard<std::mutex> lock(mu_);
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
        std::lock_guard<std::mutex> lock(mu_);
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
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    return true;
}

void WriteBehind::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) {
            return;
        }
        Item item = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        lock.unlock();
        std::vector<std::span<const uint8_t>> spans(item.layers.begin(), item.layers.end());
        Status s = store_->put(item.info, spans, deadline_after_ms(options_.put_timeout_ms));
        lock.lock();
        busy_ = false;
        queued_bytes_ -= item.bytes;
        (s.is_ok() ? written_ : dropped_)++;
        cv_.notify_all();
    }
}

bool WriteBehind::flush(int64_t deadline_ns) {
    std::unique_lock<std::mutex> lock(mu_);
    auto idle = [this] { return stopping_ || (queue_.empty() && !busy_); };
    while (!idle()) {
        int64_t left = deadline_ns - Env::default_env()->now_ns();
        if (left <= 0) {
            return false;
        }
        cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 1'000'000'000)));
    }
    return true;
}

int64_t WriteBehind::num_dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dropped_;
}

int64_t WriteBehind::num_written() const {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
}

Status FetchTicket::wait(int64_t deadline_ns) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
        int64_t left = deadline_ns - Env::default_env()->now_ns();
        if (left <= 0) {
            return deadline_exceeded("fetch not done by its deadline");
        }
        cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 1'000'000'000)));
    }
    return Status::ok();
}

bool FetchTicket::done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
}

std::vector<Result<Block>>& FetchTicket::results() {
    std::lock_guard<std::mutex> lock(mu_);
    DSI_CHECK(done_, "FetchTicket::results before done");
    return results_;
}

Fetcher::Fetcher(BlockStore* store) : store_(store), worker_([this] { run(); }) {}

Fetcher::~Fetcher() {
    std::deque<Job> left;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
        left.swap(jobs_);
    }
    cv_.notify_all();
    worker_.join();
    for (Job& j : left) {
        std::vector<Result<Block>> r;
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
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back({std::move(keys), std::move(expects), deadline_ns, ticket});
    }
    cv_.notify_all();
    return ticket;
}

void Fetcher::complete(FetchTicket& t, std::vector<Result<Block>> results) {
    {
        std::lock_guard<std::mutex> lock(t.mu_);
        t.results_ = std::move(results);
        t.done_ = true;
    }
    t.cv_.notify_all();
}

void Fetcher::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) {
            return;
        }
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        // S-KV-5: the store -> host copy runs here, off the engine's step loop.
        complete(*job.ticket, store_->get_many(job.keys, job.expects, job.deadline_ns));
        lock.lock();
    }
}

}  // namespace dsi::kvstore

#include "server/swa_pull_service.h"

#include <utility>

#include "base/check.h"
#include "base/clock.h"
#include "base/logging.h"

namespace dsi::server {

SwaPullService::SwaPullService(GenerationService* inner, SwaPullServiceOptions options,
                               std::unique_ptr<transfer::Transport> transport)
    : inner_(inner),
      options_(std::move(options)),
      transport_(transport ? std::move(transport) : transfer::make_tcp_transport()) {
    DSI_CHECK(options_.pool != nullptr, "SwaPullService needs the engine's pool");
    thread_ = std::thread([this] { loop(); });
}

SwaPullService::~SwaPullService() {
    {
        MutexLock l(&mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::deque<Job> left;
    {
        MutexLock l(&mu_);
        left.swap(queue_);
    }
    for (Job& j : left) hand_on(std::move(j));
}

void SwaPullService::start(Ticket ticket, Generation generation, Sink sink) {
    if (generation.swa_pull) {
        const bool held = options_.pool->contains(generation.swa_pull->key);
        MutexLock l(&mu_);
        if (held) {
            ++stats_.num_held;
        } else if (queue_.size() >= options_.max_queued || stopping_) {
            ++stats_.num_skipped;
        } else {
            waiting_.insert(ticket);
            queue_.push_back(Job{ticket, std::move(generation), std::move(sink)});
            cv_.notify_one();
            return;
        }
    }
    inner_->start(ticket, std::move(generation), std::move(sink));
}

void SwaPullService::hand_on(Job job) {
    bool aborted = false;
    {
        MutexLock l(&mu_);
        waiting_.erase(job.ticket);
        aborted = aborted_.erase(job.ticket) > 0;
    }
    const Ticket t = job.ticket;
    inner_->start(t, std::move(job.generation), std::move(job.sink));
    if (aborted) inner_->abort(t);  // the inner service ends it with the abort
}

void SwaPullService::loop() {
    for (;;) {
        Job job;
        bool aborted = false;
        {
            MutexLock l(&mu_);
            while (!stopping_ && queue_.empty()) cv_.wait(&mu_);
            if (stopping_) return;
            job = std::move(queue_.front());
            queue_.pop_front();
            aborted = aborted_.count(job.ticket) != 0;
        }
        if (aborted) {  // no pull: the inner service ends it with the abort
            hand_on(std::move(job));
            continue;
        }
        const int64_t start_ns = steady_clock_ns();
        Result<kv::SwaState> st =
            serving::fetch_swa_state(*transport_, *job.generation.swa_pull, options_.fetch);
        Status put = st.status();
        int64_t bytes = 0;
        if (st.is_ok()) {
            bytes = static_cast<int64_t>(st->bytes.size());
            put = options_.pool->put(st->key, st->traffic_class, std::move(st->bytes));
        }
        {
            MutexLock l(&mu_);
            if (put.is_ok()) {
                ++stats_.num_pulls;
                stats_.bytes += bytes;
                stats_.micros += (steady_clock_ns() - start_ns) / 1000;
            } else {
                ++stats_.num_failed;
            }
        }
        if (!put.is_ok()) {
            DSI_LOG(kInfo) << "SWA state pull from " << job.generation.swa_pull->address
                           << " failed (the prefill goes on without it): " << put.to_string();
        }
        hand_on(std::move(job));
    }
}

void SwaPullService::abort(Ticket ticket) {
    {
        MutexLock l(&mu_);
        if (waiting_.count(ticket) != 0) {
            aborted_.insert(ticket);
            return;
        }
    }
    inner_->abort(ticket);
}

void SwaPullService::abort_all() {
    {
        MutexLock l(&mu_);
        aborted_.insert(waiting_.begin(), waiting_.end());
    }
    inner_->abort_all();
}

ServiceStats SwaPullService::stats_snapshot() const {
    ServiceStats s = inner_->stats_snapshot();
    const SwaPullStats p = pull_stats();
    s.extra_counters.push_back({"swa_state_pulls_total",
                                "SWA states pulled from other engines before a prefill",
                                p.num_pulls});
    s.extra_counters.push_back({"swa_state_pull_failures_total",
                                "SWA state pulls that failed (prefill without)", p.num_failed});
    s.extra_counters.push_back({"swa_state_pulls_held_total",
                                "SWA state pulls asked for a state this engine held", p.num_held});
    s.extra_counters.push_back(
        {"swa_state_pulls_skipped_total", "SWA state pulls skipped (queue full)", p.num_skipped});
    s.extra_counters.push_back(
        {"swa_state_pull_bytes_total", "bytes of the pulled SWA states", p.bytes});
    s.extra_counters.push_back({"swa_state_pull_microseconds_total",
                                "time of the successful SWA state pulls, summed", p.micros});
    return s;
}

SwaPullStats SwaPullService::pull_stats() const {
    MutexLock l(&mu_);
    return stats_;
}

}  // namespace dsi::server

#include "server/handoff_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/env.h"
#include "base/logging.h"

namespace dsi::server {
namespace {

int64_t now_ns() { return Env::default_env()->now_ns(); }

}  // namespace

HandoffService::HandoffService(GenerationService* inner, HandoffServiceOptions options,
                               std::unique_ptr<transfer::Transport> transport)
    : inner_(inner), options_(std::move(options)), transport_(std::move(transport)) {
    if (transport_ == nullptr) transport_ = transfer::make_tcp_transport();
    for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
        threads_.emplace_back([this] { sender_loop(); });
    }
}

HandoffService::~HandoffService() {
    {
        MutexLock l(&mu_);
        stopping_ = true;
        for (auto& [ticket, flag] : active_) *flag = true;
        cv_.notify_all();
    }
    for (std::thread& t : threads_) t.join();
}

void HandoffService::start(Ticket ticket, Generation generation, Sink sink) {
    engine::GenerateRequest& r = generation.request;
    if (!generation.handoff || r.sampling.max_tokens <= 1 || r.sampling.n != 1 ||
        !r.resume_output.empty()) {
        // Nothing would be left for a decode engine: run it here, whole.
        generation.handoff.reset();
        inner_->start(ticket, std::move(generation), std::move(sink));
        return;
    }
    serving::HandoffTarget target = std::move(*generation.handoff);
    generation.handoff.reset();
    r.sampling.max_tokens = 1;
    r.sampling.min_tokens = std::min<int64_t>(r.sampling.min_tokens, 1);
    r.export_kv = true;
    inner_->start(ticket, std::move(generation),
                  [this, ticket, target = std::move(target), sink = std::move(sink)](Update u) {
                      if (u.finished && u.error.is_ok() &&
                          u.reason == engine::FinishReason::kLength) {
                          on_first_finish(ticket, target, sink, std::move(u));
                          return;
                      }
                      u.kv_export.reset();
                      sink(std::move(u));
                  });
}

// On the inner service's thread: the first token goes out now, the KV to a sender.
void HandoffService::on_first_finish(Ticket ticket, serving::HandoffTarget target,
                                     const Sink& sink, Update u) {
    Job job;
    job.ticket = ticket;
    job.kv = std::move(u.kv_export);
    job.target = std::move(target);
    job.sink = sink;
    job.start_ns = now_ns();
    job.aborted = std::make_shared<std::atomic<bool>>(false);
    Update first = u;
    first.finished = false;
    first.reason = engine::FinishReason::kNone;
    u.tokens.clear();
    job.last = std::move(u);
    if (job.kv != nullptr) {
        // Abortable from the moment the caller can see the first token.
        MutexLock l(&mu_);
        active_[ticket] = job.aborted;
    }
    if (!first.tokens.empty()) sink(std::move(first));
    if (job.kv == nullptr) {
        {
            MutexLock l(&mu_);
            ++stats_.num_empty;
        }
        HandoffResult none;
        none.ok = true;
        finish(job, none);
        return;
    }
    {
        MutexLock l(&mu_);
        if (!stopping_ && static_cast<int>(queue_.size()) < options_.max_queued) {
            queue_.push_back(std::move(job));
            cv_.notify_one();
            return;
        }
        ++stats_.num_failed;
    }
    HandoffResult busy;
    busy.error = "every hand-over thread is busy";
    finish(job, busy);
}

void HandoffService::finish(Job& job, HandoffResult result) {
    Update f = std::move(job.last);
    f.finished = true;
    if (job.aborted->load()) {
        f.reason = engine::FinishReason::kAbort;
    } else {
        f.reason = engine::FinishReason::kLength;
        result.micros = (now_ns() - job.start_ns) / 1000;
        f.handoff = std::move(result);
    }
    {
        MutexLock l(&mu_);
        active_.erase(job.ticket);
    }
    job.sink(std::move(f));
}

void HandoffService::sender_loop() {
    for (;;) {
        Job job;
        {
            MutexLock l(&mu_);
            while (queue_.empty() && !stopping_) cv_.wait_for(&mu_, std::chrono::milliseconds(200));
            if (queue_.empty()) return;  // stopping
            job = std::move(queue_.front());
            queue_.pop_front();
        }
        HandoffResult result;
        if (!job.aborted->load()) {
            serving::HandoffSendOptions so;
            so.self = options_.self;
            so.io_timeout = options_.io_timeout;
            so.should_abort = [flag = job.aborted] { return flag->load(); };
            Result<transfer::SendReport> sent =
                serving::send_kv_export(*transport_, *job.kv, job.target, so);
            result.ok = sent.is_ok();
            result.blocks = result.ok ? static_cast<int64_t>(job.kv->num_blocks()) : 0;
            result.bytes = result.ok ? static_cast<int64_t>(job.kv->bytes()) : 0;
            if (!sent.is_ok()) {
                result.error = sent.status().to_string();
                DSI_LOG(kInfo) << "kv hand-over to " << job.target.address
                               << " failed: " << result.error;
            }
        }
        {
            MutexLock l(&mu_);
            if (job.aborted->load()) {
                ++stats_.num_aborted;
            } else if (result.ok) {
                ++stats_.num_sent;
                stats_.blocks_sent += result.blocks;
                stats_.bytes_sent += result.bytes;
                stats_.sent_micros += (now_ns() - job.start_ns) / 1000;
            } else {
                ++stats_.num_failed;
            }
        }
        finish(job, std::move(result));
    }
}

void HandoffService::abort(Ticket ticket) {
    {
        MutexLock l(&mu_);
        if (auto it = active_.find(ticket); it != active_.end()) *it->second = true;
    }
    inner_->abort(ticket);
}

void HandoffService::abort_all() {
    {
        MutexLock l(&mu_);
        for (auto& [ticket, flag] : active_) *flag = true;
    }
    inner_->abort_all();
}

HandoffStats HandoffService::handoff_stats() const {
    MutexLock l(&mu_);
    return stats_;
}

ServiceStats HandoffService::stats_snapshot() const {
    ServiceStats s = inner_->stats_snapshot();
    const HandoffStats h = handoff_stats();
    s.extra_counters.push_back(
        {"kv_handoff_sent_total", "prefill KV hand-overs the decode engine stored", h.num_sent});
    s.extra_counters.push_back(
        {"kv_handoff_failed_total", "prefill KV hand-overs that failed", h.num_failed});
    s.extra_counters.push_back({"kv_handoff_empty_total",
                                "hand-overs without a full block to send", h.num_empty});
    s.extra_counters.push_back(
        {"kv_handoff_aborted_total", "hand-overs aborted while sending", h.num_aborted});
    s.extra_counters.push_back(
        {"kv_handoff_blocks_sent_total", "KV blocks sent to decode engines", h.blocks_sent});
    s.extra_counters.push_back(
        {"kv_handoff_bytes_sent_total", "KV bytes sent to decode engines", h.bytes_sent});
    s.extra_counters.push_back({"kv_handoff_sent_microseconds_total",
                                "export -> decode engine's Ack of the stored hand-overs, summed",
                                h.sent_micros});
    if (options_.extra_counters) {
        for (ServiceStats::Counter& c : options_.extra_counters()) {
            s.extra_counters.push_back(std::move(c));
        }
    }
    return s;
}

}  // namespace dsi::server

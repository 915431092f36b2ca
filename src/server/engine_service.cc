#include "server/engine_service.h"

#include <chrono>
#include <utility>

#include "base/logging.h"

namespace dsi::server {
namespace {
// Longest the engine thread sleeps without work before re-checking (every wait has
// a deadline, STYLE 7).
constexpr auto kIdleWait = std::chrono::milliseconds(50);
}  // namespace

EngineService::EngineService(std::unique_ptr<engine::Engine> engine)
    : owned_engine_(std::move(engine)), engine_(owned_engine_.get()) {
    thread_ = std::thread([this] { loop(); });
}

EngineService::EngineService(engine::StepEngine* engine) : engine_(engine) {
    thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() {
    stop();
    if (thread_.joinable()) thread_.join();
}

void EngineService::submit(Ticket ticket, engine::GenerateRequest request, Sink sink) {
    Command c;
    c.kind = Command::Kind::kSubmit;
    c.ticket = ticket;
    c.request = std::move(request);
    c.sink = std::move(sink);
    {
        MutexLock lock(&mu_);
        if (stopping_) {
            Update u;
            u.ticket = ticket;
            u.finished = true;
            u.reason = engine::FinishReason::kAbort;
            u.error = unavailable("server is shutting down");
            c.sink(std::move(u));
            return;
        }
        queue_.push_back(std::move(c));
        stats_.queue_depth = static_cast<int64_t>(queue_.size());
    }
    cv_.notify_one();
}

void EngineService::abort(Ticket ticket) {
    Command c;
    c.kind = Command::Kind::kAbort;
    c.ticket = ticket;
    {
        MutexLock lock(&mu_);
        queue_.push_back(std::move(c));
    }
    cv_.notify_one();
}

void EngineService::abort_all() {
    Command c;
    c.kind = Command::Kind::kAbortAll;
    {
        MutexLock lock(&mu_);
        queue_.push_back(std::move(c));
    }
    cv_.notify_one();
}

ServiceStats EngineService::stats_snapshot() const {
    MutexLock lock(&mu_);
    return stats_;
}

void EngineService::stop() {
    {
        MutexLock lock(&mu_);
        stopping_ = true;
    }
    cv_.notify_one();
}

void EngineService::wake() {
    // Under the lock: the loop checks for work and starts its wait atomically.
    MutexLock lock(&mu_);
    cv_.notify_one();
}

void EngineService::apply(Command& c) {
    switch (c.kind) {
        case Command::Kind::kSubmit: {
            const Ticket ticket = c.ticket;
            Sink sink = c.sink;
            auto cb = [this, ticket, sink](const engine::TokenEvent& ev) {
                Update u;
                u.ticket = ticket;
                if (ev.token >= 0) {
                    TokenOut t;
                    t.token = ev.token;
                    t.text = ev.text;
                    t.logprob = ev.logprob;
                    t.top_logprobs.assign(ev.top_logprobs.begin(), ev.top_logprobs.end());
                    u.tokens.push_back(std::move(t));
                }
                u.finished = ev.finished;
                u.reason = ev.reason;
                u.cached_prompt_tokens = ev.cached_prompt_tokens;
                u.kv_export = ev.kv_export;
                u.speculative = {ev.spec_draft_tokens, ev.spec_accepted_tokens,
                                 ev.spec_verify_steps};
                if (ev.finished) {
                    auto it = running_.find(ticket);
                    if (it != running_.end()) {
                        tickets_.erase(it->second);
                        running_.erase(it);
                    }
                }
                sink(std::move(u));
            };
            Result<engine::RequestId> id = engine_->add_request(std::move(c.request), cb);
            if (!id.is_ok()) {
                Update u;
                u.ticket = ticket;
                u.finished = true;
                u.reason = engine::FinishReason::kError;
                u.error = id.status();
                c.sink(std::move(u));
                return;
            }
            running_[ticket] = *id;
            tickets_[*id] = ticket;
            return;
        }
        case Command::Kind::kAbort: {
            auto it = running_.find(c.ticket);
            if (it == running_.end()) return;  // finished already
            Status s = engine_->abort(it->second);
            if (!s.is_ok()) {
                DSI_LOG(kDebug) << "abort: " << s.to_string();
            }
            return;
        }
        case Command::Kind::kAbortAll: {
            std::vector<engine::RequestId> ids;
            for (const auto& [ticket, id] : running_) ids.push_back(id);
            for (engine::RequestId id : ids) {
                Status s = engine_->abort(id);
                if (!s.is_ok()) {
                    DSI_LOG(kDebug) << "abort: " << s.to_string();
                }
            }
            return;
        }
    }
}

void EngineService::publish_stats() {
    engine::EngineStats es = engine_->stats();
    MutexLock lock(&mu_);
    stats_.engine = es;
    stats_.queue_depth = static_cast<int64_t>(queue_.size());
    stats_.num_running = static_cast<int64_t>(running_.size());
    stats_.num_step_errors = num_step_errors_;
}

void EngineService::loop() {
    std::string idle_error;  // the last idle check's error, logged once
    for (;;) {
        std::deque<Command> batch;
        bool stopping = false;
        {
            MutexLock lock(&mu_);
            if (queue_.empty() && !stopping_ && !engine_->has_work()) {
                cv_.wait_for(&mu_, kIdleWait);
            }
            batch.swap(queue_);
            stopping = stopping_;
        }
        for (Command& c : batch) apply(c);
        if (batch.empty() && !stopping && !engine_->has_work()) {
            // Idle: an engine with parts in other processes (--ep's front) checks them.
            Status s = engine_->idle_check();
            if (!s.is_ok() && s.to_string() != idle_error) {
                DSI_LOG(kError) << "engine idle check failed: " << s.to_string();
            }
            idle_error = s.is_ok() ? std::string() : s.to_string();
        }
        if (stopping) {
            Command all;
            all.kind = Command::Kind::kAbortAll;
            apply(all);
            // Drain what the aborts left in flight; bounded by the engine's step count.
            for (int i = 0; i < 1000 && engine_->has_work(); ++i) {
                if (!engine_->step().is_ok()) break;
            }
            publish_stats();
            return;
        }
        if (engine_->has_work()) {
            Status s = engine_->step();
            if (!s.is_ok()) {
                // Model errors are fatal for the engine: fail everything running.
                DSI_LOG(kError) << "engine step failed: " << s.to_string();
                ++num_step_errors_;
                Command all;
                all.kind = Command::Kind::kAbortAll;
                apply(all);
            }
        }
        publish_stats();
    }
}

}  // namespace dsi::server

#include "engine/kv_landing.h"

#include <utility>

#include "base/logging.h"
#include "kv/tiered_cache.h"

namespace dsi::engine {

std::shared_ptr<KvLanding::Ask> KvLanding::push(std::shared_ptr<Ask> a) {
    std::function<void()> waker;
    {
        MutexLock l(&mu_);
        if (!attached_) {
            a->done = true;
            a->status = unavailable("no engine takes hand-overs into its pool");
            if (a->kind == Ask::Kind::kReserve) ++stats_.refused;
            return a;
        }
        queue_.push_back(a);
        waker = waker_;
    }
    if (waker) waker();
    return a;
}

Status KvLanding::await(Ask& a, std::chrono::milliseconds wait) {
    MutexLock l(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!a.done) {
        if (!cv_.wait_until(&mu_, deadline) && !a.done) {
            a.abandoned = true;  // the engine drops whatever it takes for it
            return deadline_exceeded("the engine did not answer the hand-over in time");
        }
    }
    return a.status;
}

Result<KvLanding::Grant> KvLanding::reserve(int64_t num_tokens, std::chrono::milliseconds wait) {
    auto a = std::make_shared<Ask>();
    a->kind = Ask::Kind::kReserve;
    a->num_tokens = num_tokens;
    push(a);
    DSI_RETURN_IF_ERROR(await(*a, wait));
    MutexLock l(&mu_);
    return std::move(a->grant);
}

Status KvLanding::land(int64_t handle, std::vector<kv::BlockKey> keys, kv::BlockKey tail,
                       std::chrono::milliseconds wait) {
    {
        MutexLock l(&mu_);
        --outstanding_;  // the receiver writes no more
        cv_.notify_all();
    }
    auto a = std::make_shared<Ask>();
    a->kind = Ask::Kind::kLand;
    a->handle = handle;
    a->keys = std::move(keys);
    a->tail = tail;
    push(a);
    return await(*a, wait);
}

void KvLanding::drop(int64_t handle) {
    {
        MutexLock l(&mu_);
        --outstanding_;
        cv_.notify_all();
    }
    auto a = std::make_shared<Ask>();
    a->kind = Ask::Kind::kDrop;
    a->handle = handle;
    push(a);
}

KvLandingStats KvLanding::stats() const {
    MutexLock l(&mu_);
    return stats_;
}

void KvLanding::set_waker(std::function<void()> waker) {
    MutexLock l(&mu_);
    waker_ = std::move(waker);
}

bool KvLanding::attach() {
    MutexLock l(&mu_);
    if (attached_) return false;
    attached_ = true;
    return true;
}

bool KvLanding::has_asks() const {
    MutexLock l(&mu_);
    return !queue_.empty();
}

void KvLanding::finish(Ask& a, Status s) {
    a.done = true;
    a.status = std::move(s);
    cv_.notify_all();
}

void KvLanding::serve(kv::TieredCache& cache, int64_t now_ns, int64_t submitted_steps,
                      int64_t completed_steps, bool reserve_ok) {
    MutexLock l(&mu_);
    std::deque<std::shared_ptr<Ask>> later;
    while (!queue_.empty()) {
        std::shared_ptr<Ask> a = std::move(queue_.front());
        queue_.pop_front();
        switch (a->kind) {
            case Ask::Kind::kReserve: {
                if (a->abandoned) break;
                if (!reserve_ok) {
                    later.push_back(std::move(a));
                    break;
                }
                Result<int64_t> h = cache.reserve_landing(a->num_tokens);
                if (!h.is_ok()) {
                    ++stats_.refused;
                    finish(*a, h.status());
                    break;
                }
                a->handle = *h;
                a->grant.handle = *h;
                a->grant.layers = cache.landing_memory(*h);
                a->ready_after = submitted_steps;
                granting_.push_back(std::move(a));
                break;
            }
            case Ask::Kind::kLand: {
                if (a->abandoned) {
                    cache.drop_landing(a->handle);
                    break;
                }
                const int64_t expires =
                    now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(ttl_).count();
                Status s = cache.land(a->handle, a->keys, a->tail, expires);
                if (!s.is_ok()) cache.drop_landing(a->handle);
                finish(*a, std::move(s));
                break;
            }
            case Ask::Kind::kDrop:
                cache.drop_landing(a->handle);
                break;
        }
    }
    queue_ = std::move(later);
    grant_locked(cache, completed_steps);
}

void KvLanding::grant_ready(kv::TieredCache& cache, int64_t completed_steps) {
    MutexLock l(&mu_);
    grant_locked(cache, completed_steps);
}

void KvLanding::grant_locked(kv::TieredCache& cache, int64_t completed_steps) {
    std::vector<std::shared_ptr<Ask>> waiting;
    for (std::shared_ptr<Ask>& a : granting_) {
        if (a->ready_after > completed_steps) {
            waiting.push_back(std::move(a));
        } else if (a->abandoned) {
            cache.drop_landing(a->handle);
        } else {
            ++outstanding_;  // the receiver's to write from now on
            finish(*a, Status::ok());
        }
    }
    granting_ = std::move(waiting);
    publish_stats(cache);
}

void KvLanding::expire(kv::TieredCache& cache, int64_t now_ns) {
    cache.expire_landings(now_ns);
    MutexLock l(&mu_);
    publish_stats(cache);
}

void KvLanding::publish_stats(const kv::TieredCache& cache) {
    const kv::TieredCacheStats c = cache.stats();
    stats_.reserved = c.landings_reserved;
    stats_.landed = c.landings_landed;
    stats_.attached = c.landings_attached;
    stats_.expired = c.landings_expired;
    stats_.dropped = c.landings_dropped;
    stats_.tail_tokens = c.landing_tail_tokens;
    stats_.blocks_held = c.landing_blocks_held;
}

void KvLanding::detach() {
    MutexLock l(&mu_);
    attached_ = false;
    for (auto& a : queue_) finish(*a, unavailable("the engine is going"));
    for (auto& a : granting_) finish(*a, unavailable("the engine is going"));
    // A reservation granted above (or before) is not outstanding until its receiver
    // took it; granted ones already taken are waited for.
    queue_.clear();
    granting_.clear();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (outstanding_ > 0) {
        if (!cv_.wait_until(&mu_, deadline)) {
            DSI_LOG(kError) << "kv landing: " << outstanding_
                            << " hand-over reservations still written as the engine goes";
            break;
        }
    }
}

}  // namespace dsi::engine

// Mutex, MutexLock, CondVar: std::mutex / std::condition_variable with the
// thread-safety annotations Clang's -Wthread-safety needs (base/thread_annotations.h).
// Same cost as the std types (thin inline wrappers).
//
//   Mutex mu_;
//   int n_ DSI_GUARDED_BY(mu_);
//   void add() DSI_EXCLUDES(mu_) { MutexLock l(&mu_); ++n_; cv_.notify_all(); }
//   void wait_positive() { MutexLock l(&mu_); while (n_ <= 0) cv_.wait(&mu_); }
//
// Condition waits are written as explicit loops (as above): the analysis does not see
// into a predicate lambda, and the loop says what is awaited. Every wait in the product
// should have a deadline (wait_until), STYLE 7.
// Thread model: Mutex and CondVar are shared by threads; MutexLock is one thread's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "base/thread_annotations.h"

namespace dsi {

class DSI_CAPABILITY("mutex") Mutex {
public:
    Mutex() = default;
    Mutex(const Mutex&) = delete;
    Mutex& operator=(const Mutex&) = delete;

    void lock() DSI_ACQUIRE() { mu_.lock(); }
    void unlock() DSI_RELEASE() { mu_.unlock(); }
    bool try_lock() DSI_TRY_ACQUIRE(true) { return mu_.try_lock(); }
    // Tells the analysis the caller holds the lock (where it cannot see it).
    void assert_held() const DSI_ASSERT_CAPABILITY(this) {}

private:
    friend class CondVar;
    std::mutex mu_;
};

class DSI_SCOPED_CAPABILITY MutexLock {
public:
    explicit MutexLock(Mutex* mu) DSI_ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
    ~MutexLock() DSI_RELEASE() { mu_->unlock(); }
    MutexLock(const MutexLock&) = delete;
    MutexLock& operator=(const MutexLock&) = delete;

private:
    Mutex* mu_;
};

class CondVar {
public:
    // Releases mu while waiting; holds it again on return (spurious wake-ups happen:
    // wait in a loop on the condition).
    void wait(Mutex* mu) DSI_REQUIRES(mu) {
        std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
        cv_.wait(l);
        l.release();
    }
    // As wait(), until `deadline`; false when it passed.
    template <class Clock, class Duration>
    bool wait_until(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline)
        DSI_REQUIRES(mu) {
        std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
        const bool woke = cv_.wait_until(l, deadline) == std::cv_status::no_timeout;
        l.release();
        return woke;
    }
    template <class Rep, class Period>
    bool wait_for(Mutex* mu, const std::chrono::duration<Rep, Period>& d) DSI_REQUIRES(mu) {
        return wait_until(mu, std::chrono::steady_clock::now() + d);
    }
    void notify_one() { cv_.notify_one(); }
    void notify_all() { cv_.notify_all(); }

private:
    std::condition_variable cv_;
};

}  // namespace dsi

// Env: the process's window on the world — clock, files, threads, randomness.
//
// Everything that would make code non-replayable comes through an Env so tests and
// the simulator can substitute it (STYLE 8). Env::default_env() is the real OS;
// FakeClockEnv (below) has a manual clock for policy tests. Thread model: the default
// Env is thread-safe; FakeClockEnv's clock is a relaxed atomic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "base/status.h"

namespace dsi {

// A read-only memory mapping of a whole file. Move-only; unmapped on destruction.
// Views into data() live as long as the MappedFile.
class MappedFile {
public:
    MappedFile() = default;
    MappedFile(const void* data, size_t size, std::string path)
        : data_(static_cast<const uint8_t*>(data)), size_(size), path_(std::move(path)) {}
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    std::span<const uint8_t> bytes() const { return {data_, size_}; }
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

class Env {
public:
    virtual ~Env() = default;

    // The process-wide real environment. Never null; lives forever.
    static Env* default_env();

    // Monotonic clock.
    virtual int64_t now_ns() = 0;
    // Wall clock, nanoseconds since the Unix epoch.
    virtual int64_t wall_ns() = 0;
    virtual void sleep_ns(int64_t ns) = 0;

    virtual Result<std::string> read_file(const std::string& path) = 0;
    // Writes atomically: to `path.tmp`, then rename.
    virtual Status write_file(const std::string& path, std::string_view data) = 0;
    virtual bool file_exists(const std::string& path) = 0;
    virtual Result<uint64_t> file_size(const std::string& path) = 0;
    virtual Status create_dirs(const std::string& path) = 0;
    virtual Result<MappedFile> map_file(const std::string& path) = 0;

    // Hardware threads available to this process.
    virtual int num_cpus() = 0;
    virtual std::thread start_thread(std::function<void()> fn) = 0;

    // Non-deterministic seed material (OS entropy); deterministic code uses SplitMix64.
    virtual uint64_t random_seed() = 0;
};

// Real Env with a manually advanced monotonic clock, for policy tests.
class FakeClockEnv : public Env {
public:
    explicit FakeClockEnv(int64_t start_ns = 0) : now_ns_(start_ns) {}
    void advance_ns(int64_t ns) { now_ns_.fetch_add(ns, std::memory_order_relaxed); }

    int64_t now_ns() override { return now_ns_.load(std::memory_order_relaxed); }
    int64_t wall_ns() override { return now_ns(); }
    void sleep_ns(int64_t ns) override { advance_ns(ns); }
    Result<std::string> read_file(const std::string& p) override {
        return default_env()->read_file(p);
    }
    Status write_file(const std::string& p, std::string_view d) override {
        return default_env()->write_file(p, d);
    }
    bool file_exists(const std::string& p) override { return default_env()->file_exists(p); }
    Result<uint64_t> file_size(const std::string& p) override {
        return default_env()->file_size(p);
    }
    Status create_dirs(const std::string& p) override { return default_env()->create_dirs(p); }
    Result<MappedFile> map_file(const std::string& p) override {
        return default_env()->map_file(p);
    }
    int num_cpus() override { return default_env()->num_cpus(); }
    std::thread start_thread(std::function<void()> fn) override {
        return default_env()->start_thread(std::move(fn));
    }
    uint64_t random_seed() override { return 42; }

private:
    std::atomic<int64_t> now_ns_;
};

// SplitMix64: a tiny deterministic generator for seeds and synthetic data.
class SplitMix64 {
public:
    explicit SplitMix64(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1).
    double next_double() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    // Standard normal (Box-Muller).
    double next_normal();

private:
    uint64_t state_;
};

}  // namespace dsi

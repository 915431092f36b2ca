// FaultInjectingTransport: a Transport decorator for tests that damages what its
// connections write, deterministically from a seed (LevelDB's FaultInjectionTestEnv,
// STYLE 8). Faults apply to write() calls on the connections it makes (connect) and
// accepts (listen); write_frame issues one write per frame, so "a write" is "a frame".
//   drop     each write is silently discarded with probability drop_rate
//   delay    each write waits a uniform [0, max_delay] first
//   corrupt  each write has one byte (uniform position) flipped with probability
//            corrupt_rate, the caller's memory untouched
//   cut      after cut_after_bytes bytes in total the connection is closed: the write
//            that crosses it sends only the bytes before the cut and fails (kUnavailable)
// Decisions come from one SplitMix64 per connection seeded by (seed, connection index),
// so a given seed and write sequence damages the same bytes every run.
// Thread model: the transport is thread-safe (counters atomic); each connection is one
// thread's, like the connection it wraps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "transfer/transport.h"

namespace dsi::transfer {

struct FaultPlan {
    uint64_t seed = 1;
    double drop_rate = 0.0;
    std::chrono::milliseconds max_delay{0};
    double corrupt_rate = 0.0;
    std::optional<uint64_t> cut_after_bytes;
    // Writes before this many are left alone (e.g. 1 spares the Hello).
    uint64_t spare_first_writes = 0;
};

struct FaultCounts {
    uint64_t num_writes = 0;
    uint64_t num_dropped = 0;
    uint64_t num_delayed = 0;
    uint64_t num_corrupted = 0;
    uint64_t num_cuts = 0;
};

class FaultInjectingTransport : public Transport {
public:
    // `base` must outlive this transport and its connections.
    FaultInjectingTransport(Transport* base, FaultPlan plan) : base_(base), plan_(plan) {}

    Result<std::unique_ptr<Listener>> listen(const std::string& host, uint16_t port) override;
    Result<std::unique_ptr<Connection>> connect(const std::string& host, uint16_t port,
                                                Timeout timeout) override;

    // Wraps a connection made elsewhere.
    std::unique_ptr<Connection> wrap(std::unique_ptr<Connection> conn);
    FaultCounts counts() const;

    struct Counters {
        std::atomic<uint64_t> writes{0}, dropped{0}, delayed{0}, corrupted{0}, cuts{0};
    };

private:
    Transport* base_;
    FaultPlan plan_;
    std::atomic<uint64_t> num_connections_{0};
    Counters counters_;
};

}  // namespace dsi::transfer

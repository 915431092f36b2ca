// Test helpers shared by transfer/'s tests: a deterministic synthetic sequence (layers
// and V4-style state sections) and a destination that counts live instances, so a test
// can check that a failed or aborted transfer released its buffers.
// Thread model: TestSequence is one thread's; the live count is atomic.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "transfer/transfer_state.h"
#include "transfer/transport.h"

namespace dsi::transfer::testing {

struct TestSequence {
    BeginMessage begin;
    std::vector<std::vector<uint8_t>> layers;
    std::vector<std::vector<uint8_t>> states;

    // `num_layers` layers of `layer_bytes` each (+ a few bytes per layer so sizes differ),
    // and when `v4`, two state sections (an SWA ring and compressor accumulators).
    static TestSequence make(uint32_t num_layers, uint64_t layer_bytes, bool v4, uint64_t seed) {
        TestSequence s;
        s.begin.model_id = "test-model";
        s.begin.num_tokens = 1000;
        s.begin.block_size_tokens = 128;
        SplitMix64 rng(seed);
        auto fill = [&rng](uint64_t n) {
            std::vector<uint8_t> v(n);
            for (auto& b : v) {
                b = static_cast<uint8_t>(rng.next());
            }
            return v;
        };
        for (uint32_t l = 0; l < num_layers; ++l) {
            s.layers.push_back(fill(layer_bytes + 7 * l));
            s.begin.layer_bytes.push_back(s.layers.back().size());
        }
        if (v4) {
            s.states.push_back(fill(3 * 1024 + 5));
            s.begin.state_sections.push_back({"swa_ring", s.states.back().size()});
            s.states.push_back(fill(1024));
            s.begin.state_sections.push_back({"compressor_partial", s.states.back().size()});
        }
        return s;
    }

    SpanSource source() const {
        std::vector<std::span<const uint8_t>> l(layers.begin(), layers.end());
        std::vector<std::span<const uint8_t>> st(states.begin(), states.end());
        return SpanSource(std::move(l), std::move(st));
    }
};

// The transports this build has, by make_transport name: the network tests run on each.
inline std::vector<std::string> transport_names() {
#ifdef DSI_HAVE_UCX
    return {"tcp", "ucx"};
#else
    return {"tcp"};
#endif
}

// The named transport and a listener on a loopback port it picked.
struct Loopback {
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Listener> listener;
};
inline Result<Loopback> open_loopback(const std::string& transport_name) {
    Loopback out;
    DSI_ASSIGN_OR_RETURN(out.transport, make_transport(transport_name));
    DSI_ASSIGN_OR_RETURN(out.listener, out.transport->listen("127.0.0.1", 0));
    return out;
}

inline std::atomic<int>& live_destinations() {
    static std::atomic<int> n{0};
    return n;
}

class CountingDestination : public VectorDestination {
public:
    explicit CountingDestination(const BeginMessage& b) : VectorDestination(b) {
        live_destinations().fetch_add(1);
    }
    ~CountingDestination() override { live_destinations().fetch_sub(1); }
};

inline DestinationFactory counting_factory() {
    return [](const TransferId&, const BeginMessage& b) -> Result<std::unique_ptr<Destination>> {
        return std::unique_ptr<Destination>(std::make_unique<CountingDestination>(b));
    };
}

// True when `dest` holds exactly the sequence's bytes.
inline bool holds(const Destination& dest, const TestSequence& s) {
    const auto* v = dynamic_cast<const VectorDestination*>(&dest);
    return v != nullptr && v->layers() == s.layers && v->states() == s.states;
}

}  // namespace dsi::transfer::testing

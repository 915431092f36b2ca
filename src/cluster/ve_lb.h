// VeLb: vision-encoder load balancing (SPEC S-LB).
//
// Policy: pick a random machine among those up (each has one VE per device), then on it
// the device with the fewest image patches in flight (ties: lowest index). An image of
// w x h pixels is (w / patch) x (h / patch) patches. Randomness comes from the caller's
// seeded generator, so the choice is replayable. The caller adds the patches on dispatch
// and removes them on completion. No I/O. Thread model: not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace dsi::cluster {

// S-LB: patches = (w / patch) x (h / patch). REQUIRES: patch > 0.
Result<int64_t> image_patches(int64_t width_px, int64_t height_px, int64_t patch_px);

struct VeMachine {
    bool up = true;
    std::vector<int64_t> patches_in_flight;  // one entry per device
};

struct VeChoice {
    int machine = -1;
    int device = -1;
};

class VeLb {
public:
    explicit VeLb(uint64_t seed) : rng_(seed) {}
    // UNAVAILABLE when no machine is up with at least one device.
    Result<VeChoice> choose(const std::vector<VeMachine>& machines);

private:
    SplitMix64 rng_;
};

}  // namespace dsi::cluster

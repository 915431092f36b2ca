// XXH3-64 with the widest vector unit of this CPU (AVX-512, AVX2, else the system
// libxxhash, which Debian builds for SSE2 only: ~10 GB/s, as slow as the read's own
// copy). Same digests on every path (XXH3 is defined bit-exactly); the block checksum
// is therefore unchanged. Chosen once at run time.
// Thread model: pure functions; a state has one owner.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsi::kvstore::internal {

inline constexpr size_t kXxh3StateBytes = 576;  // sizeof(XXH3_state_t), checked in each unit
inline constexpr size_t kXxh3StateAlign = 64;

struct alignas(kXxh3StateAlign) Xxh3State {
    unsigned char bytes[kXxh3StateBytes];
};

struct Xxh3Ops {
    const char* isa;
    uint64_t (*hash)(const void* data, size_t n);
    void (*reset)(Xxh3State* s);
    void (*update)(Xxh3State* s, const void* data, size_t n);
    uint64_t (*digest)(const Xxh3State* s);
};

// The best implementation for this CPU.
const Xxh3Ops& xxh3_ops();
// Every implementation this CPU can run (tests compare them).
const Xxh3Ops* const* xxh3_ops_all(size_t* count);

}  // namespace dsi::kvstore::internal

// Little-endian field helpers and the "swa_state" section's layout, shared by the KV
// hand-over (kv_handoff.cc) and the SWA state fetch (swa_fetch.cc).
// Thread model: pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/swa_pool.h"

namespace dsi::serving::internal {

inline constexpr uint32_t kSwaStateVersion = 1;
// u32 version, u32 traffic class, u64 chain key lo, u64 hi, u64 position.
inline constexpr size_t kSwaStateHeaderBytes = 32;

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);  // little-endian hosts only (x86-64, aarch64)
    out.insert(out.end(), b, b + 4);
}
inline void put_u64(std::vector<uint8_t>& out, uint64_t v) {
    uint8_t b[8];
    std::memcpy(b, &v, 8);
    out.insert(out.end(), b, b + 8);
}
inline uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t get_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

inline bool valid_traffic_class(uint32_t c) {
    return c <= static_cast<uint32_t>(kvstore::TrafficClass::kAgent);
}

// The swa_state section's header for `st` (its bytes follow it on the wire).
inline std::vector<uint8_t> encode_state_header(const kv::SwaState& st) {
    std::vector<uint8_t> out;
    out.reserve(kSwaStateHeaderBytes);
    put_u32(out, kSwaStateVersion);
    put_u32(out, static_cast<uint32_t>(st.traffic_class));
    put_u64(out, st.key.chain.lo);
    put_u64(out, st.key.chain.hi);
    put_u64(out, static_cast<uint64_t>(st.key.position));
    return out;
}

// "host:port" -> (host, port). INVALID_ARGUMENT otherwise.
Result<std::pair<std::string, uint16_t>> split_address(const std::string& address);

}  // namespace dsi::serving::internal

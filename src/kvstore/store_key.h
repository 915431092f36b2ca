// StoreKey and TrafficClass: the value types every kvstore interface speaks.
//
// A StoreKey is an opaque 128-bit key. The engine passes its hash-chain block key
// (XXH3-128 of parent key + 128 token ids + salt, kv/block_key.h) as {lo, hi}; the
// store never interprets it beyond hashing it for placement. kvstore/ sits below kv/,
// so it does not include kv/block_key.h: convert with StoreKey{k.lo, k.hi}.
// TrafficClass is the retention class of a block (S-KV-3: agent vs chatbot TTL); it
// comes from the request and is recorded with the block.
// Thread model: value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dsi::kvstore {

struct StoreKey {
    uint64_t lo = 0;
    uint64_t hi = 0;
    bool operator==(const StoreKey&) const = default;
    auto operator<=>(const StoreKey&) const = default;
};

struct StoreKeyHash {
    size_t operator()(const StoreKey& k) const {
        return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL));
    }
};

// 32 lowercase hex digits, hi first (stable: used in file names and Redis keys).
std::string to_hex(const StoreKey& key);
// Inverse of to_hex; nullopt unless exactly 32 hex digits.
std::optional<StoreKey> key_from_hex(std::string_view hex);

enum class TrafficClass : uint8_t { kChatbot = 0, kAgent = 1 };
inline constexpr int kNumTrafficClasses = 2;

std::string_view traffic_class_name(TrafficClass c);
// "chatbot" | "agent".
std::optional<TrafficClass> parse_traffic_class(std::string_view name);

}  // namespace dsi::kvstore

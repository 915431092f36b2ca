#include "kvstore/store_key.h"

namespace dsi::kvstore {
namespace {

void put_hex64(uint64_t v, char* out) {
    static constexpr char kDigits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; --i) {
        out[i] = kDigits[v & 0xf];
        v >>= 4;
    }
}

std::optional<uint64_t> parse_hex64(std::string_view s) {
    uint64_t v = 0;
    for (char c : s) {
        int d;
        if (c >= '0' && c <= '9') {
            d = c - '0';
        } else if (c >= 'a' && c <= 'f') {
            d = c - 'a' + 10;
        } else if (c >= 'A' && c <= 'F') {
            d = c - 'A' + 10;
        } else {
            return std::nullopt;
        }
        v = (v << 4) | static_cast<uint64_t>(d);
    }
    return v;
}

}  // namespace

std::string to_hex(const StoreKey& key) {
    std::string out(32, '0');
    put_hex64(key.hi, out.data());
    put_hex64(key.lo, out.data() + 16);
    return out;
}

std::optional<StoreKey> key_from_hex(std::string_view hex) {
    if (hex.size() != 32) {
        return std::nullopt;
    }
    auto hi = parse_hex64(hex.substr(0, 16));
    auto lo = parse_hex64(hex.substr(16));
    if (!hi || !lo) {
        return std::nullopt;
    }
    return StoreKey{*lo, *hi};
}

std::string_view traffic_class_name(TrafficClass c) {
    return c == TrafficClass::kAgent ? "agent" : "chatbot";
}

std::optional<TrafficClass> parse_traffic_class(std::string_view name) {
    if (name == "chatbot") {
        return TrafficClass::kChatbot;
    }
    if (name == "agent") {
        return TrafficClass::kAgent;
    }
    return std::nullopt;
}

}  // namespace dsi::kvstore

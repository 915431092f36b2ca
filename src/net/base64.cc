#include "net/base64.h"

#include <array>
#include <cstdint>

namespace dsi::net {

namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_decode_table() {
    std::array<int8_t, 256> t{};
    for (auto& v : t) v = -1;
    for (size_t i = 0; i < kAlphabet.size(); ++i) {
        t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
    }
    return t;
}

constexpr std::array<int8_t, 256> kDecode = make_decode_table();

}  // namespace

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16 |
                           static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8 |
                           static_cast<uint8_t>(bytes[i + 2]);
        for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
    }
    const size_t rest = bytes.size() - i;
    if (rest > 0) {
        uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
        if (rest == 2) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
        out.push_back(kAlphabet[(v >> 18) & 63]);
        out.push_back(kAlphabet[(v >> 12) & 63]);
        out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
        out.push_back('=');
    }
    return out;
}

Result<std::string> base64_decode(std::string_view text) {
    if (text.size() % 4 != 0) {
        return invalid_argument("base64 length " + std::to_string(text.size()) +
                                " is not a multiple of 4");
    }
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        const bool last = i + 4 == text.size();
        int pad = 0;
        uint32_t v = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char c = text[i + k];
            if (c == '=') {
                // Padding only in the last group's last one or two places.
                if (!last || k < 2) return invalid_argument("base64 padding in the middle");
                ++pad;
                v <<= 6;
                continue;
            }
            if (pad > 0) return invalid_argument("base64 data after padding");
            const int8_t d = kDecode[static_cast<uint8_t>(c)];
            if (d < 0) return invalid_argument("base64 has a character outside its alphabet");
            v = v << 6 | static_cast<uint32_t>(d);
        }
        out.push_back(static_cast<char>(v >> 16));
        if (pad < 2) out.push_back(static_cast<char>(v >> 8 & 0xff));
        if (pad < 1) out.push_back(static_cast<char>(v & 0xff));
    }
    return out;
}

}  // namespace dsi::net

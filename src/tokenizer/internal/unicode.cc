#include "tokenizer/internal/unicode.h"

#include <unicode/uchar.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

namespace dsi::tokenizer_internal {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kBlockBits = 8;
constexpr uint32_t kBlockSize = 1u << kBlockBits;
constexpr uint32_t kNumBlocks = (kMaxCp + 1) >> kBlockBits;

uint16_t compute_class(uint32_t cp) {
    const auto c = static_cast<UChar32>(cp);
    uint16_t flags = 0;
    switch (static_cast<UCharCategory>(u_charType(c))) {
        case U_UPPERCASE_LETTER:
        case U_LOWERCASE_LETTER:
        case U_TITLECASE_LETTER:
        case U_MODIFIER_LETTER:
        case U_OTHER_LETTER:
            flags |= kL;
            break;
        case U_NON_SPACING_MARK:
        case U_ENCLOSING_MARK:
        case U_COMBINING_SPACING_MARK:
            flags |= kM;
            break;
        case U_DECIMAL_DIGIT_NUMBER:
        case U_LETTER_NUMBER:
        case U_OTHER_NUMBER:
            flags |= kN;
            break;
        case U_CONNECTOR_PUNCTUATION:
        case U_DASH_PUNCTUATION:
        case U_START_PUNCTUATION:
        case U_END_PUNCTUATION:
        case U_INITIAL_PUNCTUATION:
        case U_FINAL_PUNCTUATION:
        case U_OTHER_PUNCTUATION:
            flags |= kP;
            break;
        case U_MATH_SYMBOL:
        case U_CURRENCY_SYMBOL:
        case U_MODIFIER_SYMBOL:
        case U_OTHER_SYMBOL:
            flags |= kS;
            break;
        default:
            break;
    }
    // Oniguruma's Unicode \s is 09-0D, 85, Zs, Zl, Zp; this equals the White_Space
    // property that Rust's regex crate uses for \s (checked in unicode_test).
    if (u_isUWhiteSpace(c)) flags |= kSpace;
    if (cp == '\r' || cp == '\n') flags |= kCrLf;
    if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) ||
        (cp >= 0x30A0 && cp <= 0x30FF)) {
        flags |= kCjk;
    }
    if (cp < 0x80) {
        if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) flags |= kAsciiAlpha;
        if ((cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
            (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E)) {
            flags |= kAsciiPunct;
        }
    }
    const UCharCategory cat = static_cast<UCharCategory>(u_charType(c));
    if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (flags & kM) || cat == U_DECIMAL_DIGIT_NUMBER ||
        cat == U_CONNECTOR_PUNCTUATION || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
        flags |= kWord;
    }
    return flags;
}

// Two-stage table: stage1 maps a 256-code-point block to a deduplicated block of
// flags in stage2. About 300 distinct blocks, so ~150 KiB in all.
struct ClassTable {
    std::array<uint16_t, kNumBlocks> stage1{};
    std::vector<uint16_t> stage2;

    ClassTable() {
        std::map<std::vector<uint16_t>, uint16_t> seen;
        std::vector<uint16_t> block(kBlockSize);
        for (uint32_t b = 0; b < kNumBlocks; ++b) {
            for (uint32_t i = 0; i < kBlockSize; ++i)
                block[i] = compute_class((b << kBlockBits) | i);
            auto [it, inserted] =
                seen.emplace(block, static_cast<uint16_t>(stage2.size() / kBlockSize));
            if (inserted) stage2.insert(stage2.end(), block.begin(), block.end());
            stage1[b] = it->second;
        }
    }
};

const ClassTable& class_table() {
    static const ClassTable* table = new ClassTable();  // never destroyed
    return *table;
}

// Bytes after the lead byte, and the valid range of the first continuation byte.
struct LeadInfo {
    uint8_t num_cont;
    uint8_t lo;
    uint8_t hi;
};

LeadInfo lead_info(unsigned char b) {
    if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
    if (b == 0xE0) return {2, 0xA0, 0xBF};
    if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
    if (b == 0xED) return {2, 0x80, 0x9F};
    if (b == 0xF0) return {3, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
    if (b == 0xF4) return {3, 0x80, 0x8F};
    return {0, 0, 0};  // 80..C1, F5..FF: never valid as a lead byte
}

}  // namespace

uint16_t cp_class(uint32_t cp) {
    if (cp > kMaxCp) return 0;
    const ClassTable& t = class_table();
    return t.stage2[(static_cast<size_t>(t.stage1[cp >> kBlockBits]) << kBlockBits) |
                    (cp & (kBlockSize - 1))];
}

Utf8Step utf8_step(std::string_view bytes) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    if (p[0] < 0x80) return {Utf8Step::kValid, 1};
    const LeadInfo info = lead_info(p[0]);
    if (info.num_cont == 0) return {Utf8Step::kInvalid, 1};
    for (size_t k = 1; k <= info.num_cont; ++k) {
        if (k >= bytes.size()) return {Utf8Step::kIncomplete, k};
        const unsigned char lo = (k == 1) ? info.lo : 0x80;
        const unsigned char hi = (k == 1) ? info.hi : 0xBF;
        if (p[k] < lo || p[k] > hi) return {Utf8Step::kInvalid, k};
    }
    return {Utf8Step::kValid, static_cast<size_t>(info.num_cont) + 1};
}

size_t valid_utf8_prefix(std::string_view bytes) {
    size_t i = 0;
    const size_t n = bytes.size();
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, bytes.data() + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        if (static_cast<unsigned char>(bytes[i]) < 0x80) {
            ++i;
            continue;
        }
        const Utf8Step step = utf8_step(bytes.substr(i));
        if (step.kind != Utf8Step::kValid) return i;
        i += step.len;
    }
    return n;
}

std::string utf8_lossy(std::string_view bytes) {
    size_t i = valid_utf8_prefix(bytes);
    if (i == bytes.size()) return std::string(bytes);
    std::string out(bytes.substr(0, i));
    out.reserve(bytes.size() + 16);
    while (i < bytes.size()) {
        const Utf8Step step = utf8_step(bytes.substr(i));
        if (step.kind == Utf8Step::kValid) {
            out.append(bytes.substr(i, step.len));
        } else {
            out.append("\xEF\xBF\xBD");
        }
        i += step.len;
    }
    return out;
}

void append_utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
        out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

}  // namespace dsi::tokenizer_internal

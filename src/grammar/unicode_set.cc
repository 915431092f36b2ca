#include "grammar/unicode_set.h"

#include <algorithm>
#include <string>

namespace dsi::grammar {

namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

// Byte ranges of UTF-8 sequences covering [lo, hi] (same encoded length), split so
// each byte position ranges independently (the construction of Rust regex-syntax).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ExprPtr>* out) {
    auto len = [](uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; };
    // Split at encoding-length boundaries first.
    static constexpr uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (uint32_t b : kBounds) {
        if (lo <= b && hi > b) {
            utf8_sequences(lo, b, out);
            utf8_sequences(b + 1, hi, out);
            return;
        }
    }
    int n = len(lo);
    for (int i = 1; i < n; ++i) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, out);
                utf8_sequences(hi & ~m, hi, out);
                return;
            }
        }
    }
    std::string a = utf8_encode(lo), b = utf8_encode(hi);
    std::vector<ExprPtr> seq;
    for (size_t k = 0; k < a.size(); ++k) {
        ByteSet s;
        s.set_range(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
        seq.push_back(e_bytes(s));
    }
    out->push_back(e_seq(std::move(seq)));
}

ExprPtr utf8_expr(const CodepointSet& set) {
    std::vector<ExprPtr> alts;
    ByteSet ascii;
    for (auto [lo, hi] : set.ranges()) {
        if (lo < 0x80) {
            ascii.set_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(std::min(hi, 0x7Fu)));
            if (hi < 0x80) continue;
            lo = 0x80;
        }
        utf8_sequences(lo, hi, &alts);
    }
    if (!ascii.empty()) alts.insert(alts.begin(), e_bytes(ascii));
    return e_alt(std::move(alts));
}

}  // namespace

std::string utf8_encode(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

CodepointSet CodepointSet::all() {
    CodepointSet s;
    s.add(0, kMaxCodepoint);
    return s;
}

void CodepointSet::add(uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    hi = std::min(hi, kMaxCodepoint);
    // Surrogates are not scalar values: cut them out.
    if (lo <= kSurrogateHi && hi >= kSurrogateLo) {
        if (lo < kSurrogateLo) ranges_.push_back({lo, kSurrogateLo - 1});
        if (hi > kSurrogateHi) ranges_.push_back({kSurrogateHi + 1, hi});
    } else {
        ranges_.push_back({lo, hi});
    }
    normalize();
}

void CodepointSet::add(const CodepointSet& other) {
    ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
    normalize();
}

void CodepointSet::normalize() {
    std::sort(ranges_.begin(), ranges_.end());
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (auto r : ranges_) {
        if (!out.empty() && r.first <= out.back().second + 1) {
            out.back().second = std::max(out.back().second, r.second);
        } else {
            out.push_back(r);
        }
    }
    ranges_ = std::move(out);
}

CodepointSet CodepointSet::complement() const {
    CodepointSet out;
    uint32_t next = 0;
    for (auto [lo, hi] : ranges_) {
        if (lo > next) out.add(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodepoint) out.add(next, kMaxCodepoint);
    return out;
}

CodepointSet CodepointSet::minus(const CodepointSet& other) const {
    CodepointSet c = other.complement();
    // Intersection of this and c.
    CodepointSet out;
    for (auto [a, b] : ranges_) {
        for (auto [c0, c1] : c.ranges_) {
            uint32_t lo = std::max(a, c0), hi = std::min(b, c1);
            if (lo <= hi) out.ranges_.push_back({lo, hi});
        }
    }
    out.normalize();
    return out;
}

bool CodepointSet::contains(uint32_t cp) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(cp, kMaxCodepoint + 1));
    if (it == ranges_.begin()) return false;
    --it;
    return cp >= it->first && cp <= it->second;
}

ExprPtr codepoints_expr(const CodepointSet& set, CharEncoding encoding) {
    if (encoding == CharEncoding::kUtf8) return utf8_expr(set);
    CodepointSet special;
    special.add(0, 0x1F);
    special.add('"', '"');
    special.add('\\', '\\');
    std::vector<ExprPtr> alts;
    alts.push_back(utf8_expr(set.minus(special)));
    // Controls without a short escape are spelled \u00XX (lowercase hex), grouped as
    // "\u00" (0|1) [low digits]: the same strings as one literal per control, but ~3
    // alternatives instead of 27 (lowering them at every trie node of an object's
    // declared keys was most of the front end's time on issue 21's corpus).
    ByteSet low_digits[2];
    for (uint32_t cp = 0; cp < 0x20; ++cp) {
        if (!set.contains(cp)) continue;
        switch (cp) {
            case '\b': alts.push_back(e_literal("\\b")); break;
            case '\f': alts.push_back(e_literal("\\f")); break;
            case '\n': alts.push_back(e_literal("\\n")); break;
            case '\r': alts.push_back(e_literal("\\r")); break;
            case '\t': alts.push_back(e_literal("\\t")); break;
            default: low_digits[cp >> 4].set(static_cast<uint8_t>("0123456789abcdef"[cp & 15]));
        }
    }
    std::vector<ExprPtr> escaped;
    for (int hi = 0; hi < 2; ++hi) {
        if (!low_digits[hi].empty()) {
            escaped.push_back(e_seq({e_byte(static_cast<uint8_t>('0' + hi)), e_bytes(low_digits[hi])}));
        }
    }
    if (!escaped.empty()) alts.push_back(e_seq({e_literal("\\u00"), e_alt(std::move(escaped))}));
    if (set.contains('"')) alts.push_back(e_literal("\\\""));
    if (set.contains('\\')) alts.push_back(e_literal("\\\\"));
    return e_alt(std::move(alts));
}

ExprPtr json_string_char_any() {
    static const ExprPtr kChar = [] {
        CodepointSet raw = CodepointSet::all();
        CodepointSet special;
        special.add(0, 0x1F);
        special.add('"', '"');
        special.add('\\', '\\');
        ByteSet hex, hex_no_d, d, lo8;
        for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
        hex_no_d = hex;
        hex_no_d.words['d' >> 6] &= ~(uint64_t{1} << ('d' & 63));
        hex_no_d.words['D' >> 6] &= ~(uint64_t{1} << ('D' & 63));
        d.set('d');
        d.set('D');
        lo8.set_range('0', '7');
        ByteSet simple;
        for (char c : std::string("\"\\/bfnrt")) simple.set(static_cast<uint8_t>(c));
        ExprPtr h = e_bytes(hex);
        // \uXXXX that is not a surrogate: first digit not d, or d followed by 0-7.
        ExprPtr u = e_seq({e_literal("\\u"),
                           e_alt({e_seq({e_bytes(hex_no_d), h}), e_seq({e_bytes(d), e_bytes(lo8)})}),
                           h, h});
        return e_alt({utf8_expr(raw.minus(special)), e_seq({e_byte('\\'), e_bytes(simple)}), u});
    }();
    return kChar;
}

}  // namespace dsi::grammar

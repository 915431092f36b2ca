#include "grammar/regex.h"

#include <string>

namespace dsi::grammar {

namespace {

bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint32_t hex_val(char c) {
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

CodepointSet digits() {
    CodepointSet s;
    s.add('0', '9');
    return s;
}
CodepointSet word() {
    CodepointSet s;
    s.add('0', '9');
    s.add('A', 'Z');
    s.add('a', 'z');
    s.add('_', '_');
    return s;
}
CodepointSet space() {
    // ECMAScript WhiteSpace + LineTerminator.
    CodepointSet s;
    s.add(0x09, 0x0D);
    s.add(0x20, 0x20);
    s.add(0xA0, 0xA0);
    s.add(0x1680, 0x1680);
    s.add(0x2000, 0x200A);
    s.add(0x2028, 0x2029);
    s.add(0x202F, 0x202F);
    s.add(0x205F, 0x205F);
    s.add(0x3000, 0x3000);
    s.add(0xFEFF, 0xFEFF);
    return s;
}

class RegexParser {
public:
    RegexParser(std::string_view p, CharEncoding enc, const Limits& limits)
        : p_(p), enc_(enc), limits_(limits) {}

    Result<ExprPtr> parse(RegexMatch match) {
        // Top level: alternatives, each may carry ^ at its start and $ at its end.
        std::vector<ExprPtr> alts;
        while (true) {
            bool anchored_start = false, anchored_end = false;
            if (peek('^')) {
                ++pos_;
                anchored_start = true;
            }
            DSI_ASSIGN_OR_RETURN(ExprPtr body, parse_alternative(0, &anchored_end));
            std::vector<ExprPtr> seq;
            ExprPtr any = e_star(codepoints_expr(CodepointSet::all(), enc_));
            if (match == RegexMatch::kSearch && !anchored_start) seq.push_back(any);
            seq.push_back(body);
            if (match == RegexMatch::kSearch && !anchored_end) seq.push_back(any);
            alts.push_back(e_seq(std::move(seq)));
            if (pos_ >= p_.size()) break;
            if (p_[pos_] == '|') {
                ++pos_;
                continue;
            }
            return error("unbalanced ')'");
        }
        return e_alt(std::move(alts));
    }

private:
    Status error(const std::string& what) const {
        return invalid_argument("regex /" + std::string(p_) + "/ at offset " +
                                std::to_string(pos_) + ": " + what);
    }
    Status unsupported(const std::string& what) const {
        return unimplemented("regex /" + std::string(p_) + "/ at offset " +
                             std::to_string(pos_) + ": " + what + " is not supported");
    }
    bool peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }

    // alternative ('|' alternative)* up to ')' or end.
    Result<ExprPtr> parse_disjunction(int depth) {
        if (depth > limits_.max_nesting) return resource_exhausted_error();
        std::vector<ExprPtr> alts;
        while (true) {
            DSI_ASSIGN_OR_RETURN(ExprPtr a, parse_alternative(depth, nullptr));
            alts.push_back(a);
            if (peek('|')) {
                ++pos_;
                continue;
            }
            break;
        }
        return e_alt(std::move(alts));
    }

    Status resource_exhausted_error() const {
        return resource_exhausted("regex /" + std::string(p_).substr(0, 64) +
                                  "/: groups nested deeper than " +
                                  std::to_string(limits_.max_nesting));
    }

    // terms until '|' or ')' or end. At top level (anchored_end != nullptr) a final
    // '$' is allowed.
    Result<ExprPtr> parse_alternative(int depth, bool* anchored_end) {
        std::vector<ExprPtr> seq;
        while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
            char c = p_[pos_];
            if (c == '$') {
                bool at_end = pos_ + 1 == p_.size() || p_[pos_ + 1] == '|';
                if (anchored_end != nullptr && at_end) {
                    ++pos_;
                    *anchored_end = true;
                    break;
                }
                return unsupported("'$' anywhere but the end of a top-level alternative");
            }
            if (c == '^') return unsupported("'^' anywhere but the start of a top-level alternative");
            size_t atom_start = pos_;
            DSI_ASSIGN_OR_RETURN(ExprPtr atom, parse_atom(depth));
            DSI_ASSIGN_OR_RETURN(ExprPtr q, parse_quantifier(atom, atom_start));
            seq.push_back(q);
        }
        if (anchored_end == nullptr && peek(')') && depth == 0) return error("unbalanced ')'");
        return e_seq(std::move(seq));
    }

    Result<ExprPtr> parse_quantifier(ExprPtr atom, size_t atom_start) {
        if (pos_ >= p_.size()) return atom;
        uint32_t min = 0, max = 0;
        char c = p_[pos_];
        if (c == '*') {
            min = 0, max = kUnbounded, ++pos_;
        } else if (c == '+') {
            min = 1, max = kUnbounded, ++pos_;
        } else if (c == '?') {
            min = 0, max = 1, ++pos_;
        } else if (c == '{') {
            size_t save = pos_;
            ++pos_;
            auto number = [&](uint32_t* out) {
                size_t s = pos_;
                uint64_t v = 0;
                while (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
                    v = std::min<uint64_t>(v * 10 + (p_[pos_] - '0'), uint64_t{1} << 40);
                    ++pos_;
                }
                *out = static_cast<uint32_t>(std::min<uint64_t>(v, kUnbounded - 1));
                return pos_ > s;
            };
            if (!number(&min)) {
                pos_ = save;  // Annex B: a '{' that starts no quantifier is literal
                return atom;
            }
            max = min;
            if (peek(',')) {
                ++pos_;
                if (!number(&max)) max = kUnbounded;
            }
            if (!peek('}')) {
                pos_ = save;
                return atom;
            }
            ++pos_;
            if (max < min) return error("quantifier {m,n} with n < m");
            uint32_t bound = max == kUnbounded ? min : max;
            if (bound > limits_.max_repeat) {
                return resource_exhausted("regex /" + std::string(p_).substr(0, 64) +
                                          "/ at offset " + std::to_string(save) +
                                          ": repetition bound " + std::to_string(bound) +
                                          " above the limit of " +
                                          std::to_string(limits_.max_repeat));
            }
        } else {
            return atom;
        }
        if (peek('?')) ++pos_;  // lazy: same language
        if (pos_ < p_.size() && (p_[pos_] == '*' || p_[pos_] == '+' || p_[pos_] == '?')) {
            return error("nothing to repeat");
        }
        if (atom == nullptr) return error("nothing to repeat");
        if (max == kUnbounded && expr_nullable(*atom)) {
            pos_ = atom_start;
            return unsupported("an unbounded quantifier over a group that can match empty");
        }
        return e_repeat(atom, min, max);
    }

    Result<uint32_t> parse_hex(size_t n) {
        if (pos_ + n > p_.size()) return error("truncated hex escape");
        uint32_t v = 0;
        for (size_t i = 0; i < n; ++i) {
            if (!is_hex(p_[pos_ + i])) return error("bad hex escape");
            v = v * 16 + hex_val(p_[pos_ + i]);
        }
        pos_ += n;
        return v;
    }

    // After a backslash. Sets *set to a class (for \d etc.) or *cp to one code point.
    Status parse_escape(bool in_class, CodepointSet* set, uint32_t* cp, bool* is_set) {
        if (pos_ >= p_.size()) return error("trailing backslash");
        char c = p_[pos_++];
        *is_set = false;
        switch (c) {
            case 'd': *set = digits(); *is_set = true; return Status::ok();
            case 'D': *set = digits().complement(); *is_set = true; return Status::ok();
            case 'w': *set = word(); *is_set = true; return Status::ok();
            case 'W': *set = word().complement(); *is_set = true; return Status::ok();
            case 's': *set = space(); *is_set = true; return Status::ok();
            case 'S': *set = space().complement(); *is_set = true; return Status::ok();
            case 't': *cp = '\t'; return Status::ok();
            case 'n': *cp = '\n'; return Status::ok();
            case 'r': *cp = '\r'; return Status::ok();
            case 'f': *cp = '\f'; return Status::ok();
            case 'v': *cp = '\v'; return Status::ok();
            case '0':
                if (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
                    --pos_;
                    return unsupported("octal escape");
                }
                *cp = 0;
                return Status::ok();
            case 'b':
                if (in_class) {
                    *cp = '\b';
                    return Status::ok();
                }
                --pos_;
                return unsupported("word boundary \\b");
            case 'B': --pos_; return unsupported("word boundary \\B");
            case 'c':
                if (pos_ < p_.size() && std::isalpha(static_cast<unsigned char>(p_[pos_]))) {
                    *cp = static_cast<uint32_t>(p_[pos_++]) % 32;
                    return Status::ok();
                }
                return error("bad \\c escape");
            case 'x': {
                DSI_ASSIGN_OR_RETURN(*cp, parse_hex(2));
                return Status::ok();
            }
            case 'u': {
                if (peek('{')) {
                    ++pos_;
                    uint32_t v = 0;
                    size_t s = pos_;
                    while (pos_ < p_.size() && is_hex(p_[pos_]) && pos_ - s < 8) {
                        v = v * 16 + hex_val(p_[pos_++]);
                    }
                    if (pos_ == s || !peek('}') || v > kMaxCodepoint) return error("bad \\u{...}");
                    ++pos_;
                    *cp = v;
                    return Status::ok();
                }
                DSI_ASSIGN_OR_RETURN(uint32_t v, parse_hex(4));
                if (v >= 0xD800 && v <= 0xDBFF && pos_ + 6 <= p_.size() && p_[pos_] == '\\' &&
                    p_[pos_ + 1] == 'u') {
                    size_t save = pos_;
                    pos_ += 2;
                    auto lo = parse_hex(4);
                    if (lo.is_ok() && *lo >= 0xDC00 && *lo <= 0xDFFF) {
                        *cp = 0x10000 + ((v - 0xD800) << 10) + (*lo - 0xDC00);
                        return Status::ok();
                    }
                    pos_ = save;
                }
                *cp = v;
                return Status::ok();
            }
            case 'p':
            case 'P': --pos_; return unsupported("Unicode property escape \\p{...}");
            case 'k': --pos_; return unsupported("named back-reference \\k<...>");
            default:
                if (c >= '1' && c <= '9') {
                    --pos_;
                    return unsupported("back-reference");
                }
                if (static_cast<unsigned char>(c) >= 0x80) {
                    --pos_;
                    return decode_utf8(cp);
                }
                *cp = static_cast<uint8_t>(c);  // identity escape
                return Status::ok();
        }
    }

    Status decode_utf8(uint32_t* cp) {
        unsigned char c = static_cast<unsigned char>(p_[pos_]);
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || pos_ + n > p_.size()) return error("invalid UTF-8 in pattern");
        uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < n; ++i) {
            unsigned char d = static_cast<unsigned char>(p_[pos_ + i]);
            if ((d >> 6) != 2) return error("invalid UTF-8 in pattern");
            v = (v << 6) | (d & 0x3F);
        }
        pos_ += n;
        *cp = v;
        return Status::ok();
    }

    Result<ExprPtr> parse_class() {
        // After '['.
        bool negate = false;
        if (peek('^')) {
            negate = true;
            ++pos_;
        }
        CodepointSet set;
        bool first = true;
        while (true) {
            if (pos_ >= p_.size()) return error("unterminated character class");
            if (p_[pos_] == ']' && !(first && false)) {
                ++pos_;
                break;
            }
            first = false;
            CodepointSet lo_set;
            uint32_t lo = 0;
            bool lo_is_set = false;
            DSI_RETURN_IF_ERROR(class_atom(&lo_set, &lo, &lo_is_set));
            if (peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
                ++pos_;
                CodepointSet hi_set;
                uint32_t hi = 0;
                bool hi_is_set = false;
                DSI_RETURN_IF_ERROR(class_atom(&hi_set, &hi, &hi_is_set));
                if (lo_is_set || hi_is_set) return error("class escape used as a range bound");
                if (hi < lo) return error("range out of order in character class");
                set.add(lo, hi);
                continue;
            }
            if (lo_is_set) {
                set.add(lo_set);
            } else {
                set.add(lo, lo);
            }
        }
        if (negate) set = set.complement();
        return codepoints_expr(set, enc_);
    }

    Status class_atom(CodepointSet* set, uint32_t* cp, bool* is_set) {
        *is_set = false;
        if (p_[pos_] == '\\') {
            ++pos_;
            return parse_escape(true, set, cp, is_set);
        }
        return decode_utf8(cp);
    }

    Result<ExprPtr> parse_atom(int depth) {
        char c = p_[pos_];
        switch (c) {
            case '(': {
                ++pos_;
                if (peek('?')) {
                    if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
                        pos_ += 2;
                    } else if (pos_ + 2 < p_.size() && p_[pos_ + 1] == '<' &&
                               p_[pos_ + 2] != '=' && p_[pos_ + 2] != '!') {
                        size_t close = p_.find('>', pos_);
                        if (close == std::string_view::npos) return error("bad group name");
                        pos_ = close + 1;
                    } else {
                        return unsupported("lookaround or inline flag group");
                    }
                }
                DSI_ASSIGN_OR_RETURN(ExprPtr inner, parse_disjunction(depth + 1));
                if (!peek(')')) return error("missing ')'");
                ++pos_;
                return inner;
            }
            case '[':
                ++pos_;
                return parse_class();
            case '.': {
                ++pos_;
                CodepointSet s;
                s.add('\n', '\n');
                s.add('\r', '\r');
                s.add(0x2028, 0x2029);
                return codepoints_expr(s.complement(), enc_);
            }
            case '\\': {
                ++pos_;
                CodepointSet set;
                uint32_t cp = 0;
                bool is_set = false;
                DSI_RETURN_IF_ERROR(parse_escape(false, &set, &cp, &is_set));
                if (!is_set) set.add(cp, cp);
                return codepoints_expr(set, enc_);
            }
            case '*':
            case '+':
            case '?':
                return error("nothing to repeat");
            case '{': {
                // Literal unless it forms a quantifier (then nothing precedes it).
                size_t save = pos_;
                ++pos_;
                while (pos_ < p_.size() && ((p_[pos_] >= '0' && p_[pos_] <= '9') || p_[pos_] == ','))
                    ++pos_;
                bool quant = peek('}') && pos_ > save + 1 && p_[save + 1] != ',';
                pos_ = save + 1;
                if (quant) return error("nothing to repeat");
                CodepointSet s;
                s.add('{', '{');
                return codepoints_expr(s, enc_);
            }
            default: {
                uint32_t cp = 0;
                DSI_RETURN_IF_ERROR(decode_utf8(&cp));
                CodepointSet s;
                s.add(cp, cp);
                return codepoints_expr(s, enc_);
            }
        }
    }

    std::string_view p_;
    CharEncoding enc_;
    const Limits& limits_;
    size_t pos_ = 0;
};

}  // namespace

bool expr_nullable(const Expr& e) {
    switch (e.kind) {
        case Expr::Kind::kEmpty: return true;
        case Expr::Kind::kFail:
        case Expr::Kind::kBytes:
        case Expr::Kind::kRule: return false;
        case Expr::Kind::kSeq:
            for (const auto& c : e.children) {
                if (!expr_nullable(*c)) return false;
            }
            return true;
        case Expr::Kind::kAlt:
            for (const auto& c : e.children) {
                if (expr_nullable(*c)) return true;
            }
            return false;
        case Expr::Kind::kRepeat: return e.min == 0 || expr_nullable(*e.children[0]);
    }
    return false;
}

Result<ExprPtr> compile_regex(std::string_view pattern, RegexMatch match,
                              CharEncoding encoding, const Limits& limits) {
    RegexParser parser(pattern, encoding, limits);
    return parser.parse(match);
}

}  // namespace dsi::grammar

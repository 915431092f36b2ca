#include "grammar/ebnf.h"

#include <unordered_map>

#include "grammar/unicode_set.h"

namespace dsi::grammar {

namespace {

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

class EbnfParser {
public:
    EbnfParser(std::string_view text, const Limits& limits)
        : s_(text), limits_(limits), builder_(limits) {}

    Result<Grammar> parse() {
        skip_space();
        while (pos_ < s_.size()) {
            size_t start = pos_;
            std::string name = parse_name();
            if (name.empty()) return error("expected a rule name");
            skip_space();
            if (s_.substr(pos_, 3) != "::=") return error("expected '::=' after rule name");
            pos_ += 3;
            uint32_t id = rule_id(name);
            if (builder_.is_defined(id)) {
                pos_ = start;
                return error("rule '" + name + "' defined twice");
            }
            DSI_ASSIGN_OR_RETURN(ExprPtr body, parse_alternatives(0));
            builder_.define(id, body);
            skip_space();
        }
        auto root = names_.find("root");
        if (root == names_.end()) return invalid_argument("EBNF grammar has no 'root' rule");
        for (auto& [name, id] : names_) {
            if (!builder_.is_defined(id)) {
                return invalid_argument("EBNF rule '" + name + "' is used but never defined");
            }
        }
        return builder_.build(root->second);
    }

private:
    Status error(const std::string& what) const {
        int line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return invalid_argument("EBNF line " + std::to_string(line) + " column " +
                                std::to_string(col) + ": " + what);
    }

    uint32_t rule_id(const std::string& name) {
        auto it = names_.find(name);
        if (it != names_.end()) return it->second;
        uint32_t id = builder_.declare(name);
        names_.emplace(name, id);
        return id;
    }

    void skip_space() {
        while (pos_ < s_.size()) {
            char c = s_[pos_];
            if (c == '#') {
                while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                ++pos_;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        size_t b = pos_;
        while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
        return std::string(s_.substr(b, pos_ - b));
    }

    // Is the text at pos_ the start of the next rule (`name ::=`)?
    bool at_rule_start() {
        size_t save = pos_;
        std::string name = parse_name();
        skip_space();
        bool yes = !name.empty() && s_.substr(pos_, 3) == "::=";
        pos_ = save;
        return yes;
    }

    Result<ExprPtr> parse_alternatives(int depth) {
        if (depth > limits_.max_nesting) return error("groups nested too deeply");
        std::vector<ExprPtr> alts;
        while (true) {
            DSI_ASSIGN_OR_RETURN(ExprPtr seq, parse_sequence(depth));
            alts.push_back(seq);
            skip_space();
            if (pos_ < s_.size() && s_[pos_] == '|') {
                ++pos_;
                continue;
            }
            break;
        }
        return e_alt(std::move(alts));
    }

    Result<ExprPtr> parse_sequence(int depth) {
        std::vector<ExprPtr> items;
        while (true) {
            skip_space();
            if (pos_ >= s_.size()) break;
            char c = s_[pos_];
            if (c == '|' || c == ')') break;
            if (is_name_char(c) && at_rule_start()) break;
            ExprPtr item;
            if (c == '"') {
                ++pos_;
                DSI_ASSIGN_OR_RETURN(item, parse_literal());
            } else if (c == '[') {
                ++pos_;
                DSI_ASSIGN_OR_RETURN(item, parse_class());
            } else if (c == '(') {
                ++pos_;
                DSI_ASSIGN_OR_RETURN(item, parse_alternatives(depth + 1));
                skip_space();
                if (pos_ >= s_.size() || s_[pos_] != ')') return error("missing ')'");
                ++pos_;
            } else if (c == '.') {
                ++pos_;
                item = codepoints_expr(CodepointSet::all(), CharEncoding::kUtf8);
            } else if (is_name_char(c)) {
                item = e_rule(rule_id(parse_name()));
            } else {
                return error(std::string("unexpected character '") + c + "'");
            }
            DSI_ASSIGN_OR_RETURN(item, parse_postfix(item));
            items.push_back(item);
        }
        return e_seq(std::move(items));
    }

    Result<ExprPtr> parse_postfix(ExprPtr item) {
        while (pos_ < s_.size()) {
            char c = s_[pos_];
            if (c == '*') {
                item = e_star(item);
            } else if (c == '+') {
                item = e_plus(item);
            } else if (c == '?') {
                item = e_opt(item);
            } else if (c == '{') {
                ++pos_;
                auto num = [&](uint32_t* v) {
                    size_t b = pos_;
                    uint64_t x = 0;
                    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
                        x = std::min<uint64_t>(x * 10 + (s_[pos_++] - '0'), uint64_t{1} << 40);
                    }
                    *v = static_cast<uint32_t>(std::min<uint64_t>(x, kUnbounded - 1));
                    return pos_ > b;
                };
                uint32_t min = 0, max = 0;
                skip_space();
                if (!num(&min)) return error("expected a number in {m,n}");
                max = min;
                skip_space();
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    skip_space();
                    if (!num(&max)) max = kUnbounded;
                    skip_space();
                }
                if (pos_ >= s_.size() || s_[pos_] != '}') return error("expected '}'");
                if (max < min) return error("repetition {m,n} with n < m");
                uint32_t bound = max == kUnbounded ? min : max;
                if (bound > limits_.max_repeat) {
                    return error("repetition bound " + std::to_string(bound) +
                                 " above the limit of " + std::to_string(limits_.max_repeat));
                }
                item = e_repeat(item, min, max);
            } else {
                break;
            }
            ++pos_;
        }
        return item;
    }

    Result<uint32_t> parse_char(bool in_class) {
        if (pos_ >= s_.size()) return error("unterminated literal");
        unsigned char c = static_cast<unsigned char>(s_[pos_]);
        if (c == '\\') {
            ++pos_;
            if (pos_ >= s_.size()) return error("trailing backslash");
            char e = s_[pos_++];
            auto hex = [&](int n) -> Result<uint32_t> {
                uint32_t v = 0;
                for (int i = 0; i < n; ++i) {
                    if (pos_ >= s_.size()) return error("truncated escape");
                    char h = s_[pos_++];
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0) return error("bad hex digit in escape");
                    v = v * 16 + d;
                }
                if (v > kMaxCodepoint) return error("escape beyond U+10FFFF");
                return v;
            };
            switch (e) {
                case 'n': return uint32_t{'\n'};
                case 'r': return uint32_t{'\r'};
                case 't': return uint32_t{'\t'};
                case 'x': return hex(2);
                case 'u': return hex(4);
                case 'U': return hex(8);
                case '\\': case '"': case '\'': case '[': case ']': case '-': case '^':
                    return static_cast<uint32_t>(e);
                default:
                    --pos_;
                    return error(std::string("unknown escape '\\") + e + "'");
            }
        }
        (void)in_class;
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || pos_ + n > s_.size()) return error("invalid UTF-8");
        uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < n; ++i) {
            unsigned char d = static_cast<unsigned char>(s_[pos_ + i]);
            if ((d >> 6) != 2) return error("invalid UTF-8");
            v = (v << 6) | (d & 0x3F);
        }
        pos_ += n;
        return v;
    }

    Result<ExprPtr> parse_literal() {
        std::string bytes;
        while (true) {
            if (pos_ >= s_.size()) return error("unterminated string literal");
            if (s_[pos_] == '"') {
                ++pos_;
                break;
            }
            if (s_[pos_] == '\n') return error("newline in string literal");
            DSI_ASSIGN_OR_RETURN(uint32_t cp, parse_char(false));
            bytes += utf8_encode(cp);
        }
        return e_literal(bytes);
    }

    Result<ExprPtr> parse_class() {
        bool negate = false;
        if (pos_ < s_.size() && s_[pos_] == '^') {
            negate = true;
            ++pos_;
        }
        CodepointSet set;
        while (true) {
            if (pos_ >= s_.size()) return error("unterminated character class");
            if (s_[pos_] == ']') {
                ++pos_;
                break;
            }
            DSI_ASSIGN_OR_RETURN(uint32_t lo, parse_char(true));
            uint32_t hi = lo;
            if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
                ++pos_;
                DSI_ASSIGN_OR_RETURN(hi, parse_char(true));
                if (hi < lo) return error("character range out of order");
            }
            set.add(lo, hi);
        }
        if (negate) set = set.complement();
        return codepoints_expr(set, CharEncoding::kUtf8);
    }

    std::string_view s_;
    const Limits& limits_;
    GrammarBuilder builder_;
    std::unordered_map<std::string, uint32_t> names_;
    size_t pos_ = 0;
};

}  // namespace

Result<Grammar> compile_ebnf(std::string_view text, const Limits& limits) {
    EbnfParser parser(text, limits);
    return parser.parse();
}

}  // namespace dsi::grammar

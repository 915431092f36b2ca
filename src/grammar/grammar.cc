#include "grammar/grammar.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace dsi::grammar {

namespace {

ExprPtr make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

uint32_t class_symbol(uint32_t id) { return Grammar::kTagClass | id; }
uint32_t rule_symbol(uint32_t id) { return Grammar::kTagRule | id; }

void put_u32(std::string* out, uint32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);
    out->append(b, 4);
}

}  // namespace

ExprPtr e_empty() {
    static const ExprPtr kEmpty = make(Expr{});
    return kEmpty;
}

ExprPtr e_fail() {
    static const ExprPtr kFail = make(Expr{.kind = Expr::Kind::kFail});
    return kFail;
}

ExprPtr e_bytes(const ByteSet& set) {
    if (set.empty()) return e_fail();
    return make(Expr{.kind = Expr::Kind::kBytes, .bytes = set});
}

ExprPtr e_byte(uint8_t b) {
    ByteSet s;
    s.set(b);
    return e_bytes(s);
}

ExprPtr e_literal(std::string_view bytes) {
    std::vector<ExprPtr> items;
    items.reserve(bytes.size());
    for (char c : bytes) items.push_back(e_byte(static_cast<uint8_t>(c)));
    return e_seq(std::move(items));
}

ExprPtr e_seq(std::vector<ExprPtr> items) {
    std::vector<ExprPtr> flat;
    for (auto& it : items) {
        if (it->kind == Expr::Kind::kEmpty) continue;
        if (it->kind == Expr::Kind::kFail) return e_fail();
        if (it->kind == Expr::Kind::kSeq) {
            flat.insert(flat.end(), it->children.begin(), it->children.end());
        } else {
            flat.push_back(std::move(it));
        }
    }
    if (flat.empty()) return e_empty();
    if (flat.size() == 1) return flat[0];
    return make(Expr{.kind = Expr::Kind::kSeq, .children = std::move(flat)});
}

ExprPtr e_alt(std::vector<ExprPtr> items) {
    std::vector<ExprPtr> flat;
    for (auto& it : items) {
        if (it->kind == Expr::Kind::kFail) continue;
        if (it->kind == Expr::Kind::kAlt) {
            flat.insert(flat.end(), it->children.begin(), it->children.end());
        } else {
            flat.push_back(std::move(it));
        }
    }
    if (flat.empty()) return e_fail();
    if (flat.size() == 1) return flat[0];
    return make(Expr{.kind = Expr::Kind::kAlt, .children = std::move(flat)});
}

ExprPtr e_repeat(ExprPtr item, uint32_t min, uint32_t max) {
    if (max == 0) return e_empty();
    if (min == 1 && max == 1) return item;
    if (item->kind == Expr::Kind::kEmpty) return e_empty();
    if (item->kind == Expr::Kind::kFail) return min == 0 ? e_empty() : e_fail();
    return make(Expr{.kind = Expr::Kind::kRepeat, .children = {std::move(item)}, .min = min,
                     .max = max});
}

ExprPtr e_opt(ExprPtr item) { return e_repeat(std::move(item), 0, 1); }
ExprPtr e_star(ExprPtr item) { return e_repeat(std::move(item), 0, kUnbounded); }
ExprPtr e_plus(ExprPtr item) { return e_repeat(std::move(item), 1, kUnbounded); }
ExprPtr e_rule(uint32_t rule_id) { return make(Expr{.kind = Expr::Kind::kRule, .rule = rule_id}); }

uint32_t GrammarBuilder::declare(std::string name) {
    names_.push_back(std::move(name));
    bodies_.push_back(nullptr);
    return static_cast<uint32_t>(names_.size() - 1);
}

void GrammarBuilder::define(uint32_t id, ExprPtr body) {
    DSI_CHECK(id < bodies_.size() && bodies_[id] == nullptr, "rule defined twice: ", id);
    bodies_[id] = std::move(body);
}

uint32_t GrammarBuilder::class_id(const ByteSet& set) {
    std::string key(reinterpret_cast<const char*>(set.words), sizeof(set.words));
    auto [it, inserted] = class_index_.emplace(key, static_cast<uint32_t>(classes_.size()));
    if (inserted) classes_.push_back(set);
    return it->second;
}

Status GrammarBuilder::check_size() const {
    if (num_symbols_ > limits_.max_elements) {
        return resource_exhausted("grammar too large: more than " +
                                  std::to_string(limits_.max_elements) + " elements");
    }
    if (names_.size() > limits_.max_rules) {
        return resource_exhausted("grammar too large: more than " +
                                  std::to_string(limits_.max_rules) + " rules");
    }
    return Status::ok();
}

Result<uint32_t> GrammarBuilder::aux_rule_for(const ExprPtr& e) {
    auto it = aux_rules_.find(e.get());
    if (it != aux_rules_.end()) return it->second;
    uint32_t id = declare("_aux" + std::to_string(names_.size()));
    aux_rules_.emplace(e.get(), id);
    bodies_[id] = e;
    DSI_RETURN_IF_ERROR(check_size());
    return id;
}

Result<uint32_t> GrammarBuilder::single_symbol(const ExprPtr& e, bool* never) {
    *never = false;
    switch (e->kind) {
        case Expr::Kind::kFail:
            *never = true;
            return 0u;
        case Expr::Kind::kBytes:
            return class_symbol(class_id(e->bytes));
        case Expr::Kind::kRule:
            return rule_symbol(e->rule);
        default: {
            DSI_ASSIGN_OR_RETURN(uint32_t id, aux_rule_for(e));
            return rule_symbol(id);
        }
    }
}

Result<uint32_t> GrammarBuilder::repeat_tail_rule(const ExprPtr& item_expr, uint32_t item_sym,
                                                  uint32_t count) {
    auto& memo = tail_rules_[item_expr.get()];
    auto it = memo.find(count);
    if (it != memo.end()) return it->second;
    if (count == kUnbounded) {
        // S ::= item S | ""  (right recursion: the matcher's tail call keeps stacks flat)
        uint32_t id = declare("_star" + std::to_string(names_.size()));
        memo.emplace(count, id);
        lowered_.resize(names_.size());
        lowered_done_.resize(names_.size(), false);
        lowered_[id] = {{item_sym, rule_symbol(id)}, {}};
        lowered_done_[id] = true;
        bodies_[id] = e_empty();  // placeholder: already lowered
        num_symbols_ += 4;
        DSI_RETURN_IF_ERROR(check_size());
        return id;
    }
    // O_k ::= item O_{k-1} | ""  with O_1 ::= item | "".
    uint32_t prev = 0;
    for (uint32_t k = 1; k <= count; ++k) {
        auto found = memo.find(k);
        if (found != memo.end()) {
            prev = found->second;
            continue;
        }
        uint32_t id = declare("_opt" + std::to_string(names_.size()));
        memo.emplace(k, id);
        counted_rules_.insert(id);
        lowered_.resize(names_.size());
        lowered_done_.resize(names_.size(), false);
        if (k == 1) {
            lowered_[id] = {{item_sym}, {}};
        } else {
            lowered_[id] = {{item_sym, rule_symbol(prev)}, {}};
        }
        lowered_done_[id] = true;
        bodies_[id] = e_empty();
        num_symbols_ += 4;
        DSI_RETURN_IF_ERROR(check_size());
        prev = id;
    }
    return prev;
}

Result<bool> GrammarBuilder::append_symbols(const ExprPtr& e, std::vector<uint32_t>* out) {
    switch (e->kind) {
        case Expr::Kind::kEmpty:
            return true;
        case Expr::Kind::kFail:
            return false;
        case Expr::Kind::kBytes:
            if (e->bytes.empty()) return false;
            out->push_back(class_symbol(class_id(e->bytes)));
            return true;
        case Expr::Kind::kRule:
            out->push_back(rule_symbol(e->rule));
            return true;
        case Expr::Kind::kSeq:
            for (const auto& c : e->children) {
                DSI_ASSIGN_OR_RETURN(bool ok, append_symbols(c, out));
                if (!ok) return false;
            }
            return true;
        case Expr::Kind::kAlt: {
            if (e->children.empty()) return false;
            if (e->children.size() == 1) return append_symbols(e->children[0], out);
            DSI_ASSIGN_OR_RETURN(uint32_t id, aux_rule_for(e));
            out->push_back(rule_symbol(id));
            return true;
        }
        case Expr::Kind::kRepeat: {
            const ExprPtr& item = e->children[0];
            if ((e->max != kUnbounded && e->max > limits_.max_repeat) ||
                e->min > limits_.max_repeat) {
                return resource_exhausted("repetition bound above the limit of " +
                                          std::to_string(limits_.max_repeat));
            }
            bool never = false;
            DSI_ASSIGN_OR_RETURN(uint32_t sym, single_symbol(item, &never));
            if (never) return e->min == 0;
            for (uint32_t i = 0; i < e->min; ++i) out->push_back(sym);
            if (e->max == kUnbounded) {
                DSI_ASSIGN_OR_RETURN(uint32_t id, repeat_tail_rule(item, sym, kUnbounded));
                out->push_back(rule_symbol(id));
            } else if (e->max > e->min) {
                DSI_ASSIGN_OR_RETURN(uint32_t id, repeat_tail_rule(item, sym, e->max - e->min));
                out->push_back(rule_symbol(id));
            }
            num_symbols_ += e->min;
            DSI_RETURN_IF_ERROR(check_size());
            return true;
        }
    }
    return false;
}

Result<std::vector<std::vector<uint32_t>>> GrammarBuilder::alternatives_of(const ExprPtr& e) {
    std::vector<std::vector<uint32_t>> alts;
    if (e->kind == Expr::Kind::kAlt) {
        for (const auto& c : e->children) {
            DSI_ASSIGN_OR_RETURN(auto sub, alternatives_of(c));
            for (auto& a : sub) alts.push_back(std::move(a));
        }
        return alts;
    }
    std::vector<uint32_t> seq;
    DSI_ASSIGN_OR_RETURN(bool ok, append_symbols(e, &seq));
    if (ok) alts.push_back(std::move(seq));
    return alts;
}

Status GrammarBuilder::lower_rule(uint32_t id) {
    lowered_.resize(names_.size());
    lowered_done_.resize(names_.size(), false);
    if (lowered_done_[id]) return Status::ok();
    if (bodies_[id] == nullptr) {
        return invalid_argument("rule '" + names_[id] + "' is referenced but never defined");
    }
    ExprPtr body = bodies_[id];
    DSI_ASSIGN_OR_RETURN(auto alts, alternatives_of(body));
    size_t n = 0;
    for (const auto& a : alts) n += a.size() + 1;
    num_symbols_ += n;
    DSI_RETURN_IF_ERROR(check_size());
    lowered_.resize(names_.size());
    lowered_done_.resize(names_.size(), false);
    lowered_[id] = std::move(alts);
    lowered_done_[id] = true;
    return Status::ok();
}

Status GrammarBuilder::check_left_recursion() const {
    size_t n = names_.size();
    std::vector<bool> nullable(n, false);
    auto sym_nullable = [&](uint32_t s) {
        return Grammar::tag(s) == Grammar::kTagRule && nullable[Grammar::payload(s)];
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; ++r) {
            if (nullable[r]) continue;
            for (const auto& alt : lowered_[r]) {
                bool all = true;
                for (uint32_t s : alt) all = all && sym_nullable(s);
                if (all) {
                    nullable[r] = true;
                    changed = true;
                    break;
                }
            }
        }
    }
    // Edges r -> s where s can be the first thing r derives.
    std::vector<std::vector<uint32_t>> edges(n);
    for (size_t r = 0; r < n; ++r) {
        for (const auto& alt : lowered_[r]) {
            for (uint32_t s : alt) {
                if (Grammar::tag(s) != Grammar::kTagRule) break;
                edges[r].push_back(Grammar::payload(s));
                if (!nullable[Grammar::payload(s)]) break;
            }
        }
    }
    std::vector<uint8_t> color(n, 0);
    std::vector<uint32_t> path;
    // Iterative DFS (grammars can be deep).
    for (size_t start = 0; start < n; ++start) {
        if (color[start] != 0) continue;
        std::vector<std::pair<uint32_t, size_t>> st{{static_cast<uint32_t>(start), 0}};
        color[start] = 1;
        while (!st.empty()) {
            auto& [r, i] = st.back();
            if (i < edges[r].size()) {
                uint32_t s = edges[r][i++];
                if (color[s] == 1) {
                    std::string cycle;
                    bool on = false;
                    for (auto& [q, unused] : st) {
                        (void)unused;
                        if (q == s) on = true;
                        if (on) cycle += "'" + names_[q] + "' -> ";
                    }
                    cycle += "'" + names_[s] + "'";
                    return invalid_argument("left recursion: " + cycle);
                }
                if (color[s] == 0) {
                    color[s] = 1;
                    st.push_back({s, 0});
                }
            } else {
                color[r] = 2;
                st.pop_back();
            }
        }
    }
    return Status::ok();
}

// Inlines references to small non-recursive rules (a JSON string character, an
// escape) into the alternatives of right-recursive loops that use them. The language is unchanged.
// Why: the mask tables (matcher.h) decide tokens per rule; a loop `s ::= c s | ""`
// whose body `c` is its own rule returns to its caller after every character, so
// every token spanning two characters would be context-dependent. Inlined, the loop
// stays inside one rule and such tokens are decided at compile time.
void GrammarBuilder::inline_byte_rules() {
    constexpr size_t kMaxInlineAlts = 64;
    constexpr size_t kMaxInlineSymbols = 512;
    constexpr size_t kMaxRuleAlts = 256;  // per referring rule after inlining
    const size_t n = names_.size();
    // Inlinable: small *once fully inlined itself*, and every rule it references is
    // inlinable (so, never recursive); found by rounds up to a fixpoint. The bound is
    // on the flattened size because inlining is transitive: a bounded repetition
    // `[a-z0-9-]{0,61}` lowers to a chain O_61 ::= c O_60 | "" of small rules, which
    // flattened into a loop body gave 62 alternatives of up to 63 positions (the
    // e-mail format's domain label): a state then held one stack per alternative, each
    // at a position of its own, and the first mask in each label built ~60 tables
    // (issue 21: up to 150 ms per step). Kept as rules, a step moves to one new position.
    std::vector<bool> inlinable(n, false);
    std::vector<size_t> flat_alts(n, 0), flat_symbols(n, 0);  // sizes once flattened
    const size_t kCap = kMaxInlineSymbols + 1;                 // saturating counts
    for (bool grew = true; grew;) {
        grew = false;
        for (uint32_t r = 0; r < n; ++r) {
            const auto& alts = lowered_[r];
            if (inlinable[r] || alts.empty() || alts.size() > kMaxInlineAlts) continue;
            size_t num_alts = 0;
            size_t symbols = 0;
            bool ok = true;
            for (const auto& alt : alts) {
                // The alternative's flattened count is the product of its references'
                // counts; each reference's symbols appear once per combination of the
                // others, each plain symbol once per combination.
                size_t count = 1;
                for (uint32_t sym : alt) {
                    if (Grammar::tag(sym) != Grammar::kTagRule) continue;
                    const uint32_t callee = Grammar::payload(sym);
                    ok = ok && inlinable[callee];
                    count = std::min(kCap, count * std::max<size_t>(flat_alts[callee], 1));
                }
                if (!ok) break;
                for (uint32_t sym : alt) {
                    if (Grammar::tag(sym) != Grammar::kTagRule) {
                        symbols += count;
                    } else {
                        const uint32_t callee = Grammar::payload(sym);
                        symbols += flat_symbols[callee] * (count / std::max<size_t>(flat_alts[callee], 1));
                    }
                    symbols = std::min(kCap, symbols);
                }
                num_alts = std::min(kCap, num_alts + count);
            }
            if (ok && num_alts <= kMaxInlineAlts && symbols <= kMaxInlineSymbols) {
                inlinable[r] = true;
                flat_alts[r] = num_alts;
                flat_symbols[r] = symbols;
                grew = true;
            }
        }
    }
    for (uint32_t id = 0; id < n; ++id) {
        // Its own alternatives have nothing to inline (but O_1 ::= item | "" of a
        // bounded repetition, whose item is inlined like the other links').
        if (inlinable[id] && counted_rules_.count(id) == 0) continue;
        std::vector<std::vector<uint32_t>> work(lowered_[id].rbegin(), lowered_[id].rend());
        std::vector<std::vector<uint32_t>> out;
        bool changed = false;
        while (!work.empty()) {
            std::vector<uint32_t> alt = std::move(work.back());
            work.pop_back();
            // Only loop bodies (`id ::= ... id`) and the items of bounded repetitions
            // (`O_k ::= item O_{k-1}`, a tail call: a string with maxLength 1,024 left
            // its character rule with 1,024 callers, so every token spanning two
            // characters was context-dependent, ~100K checked per mask; issue 21):
            // elsewhere inlining multiplies positions without keeping tokens inside a
            // rule. The tail reference itself is not inlined.
            const bool loop = !alt.empty() && alt.back() == (Grammar::kTagRule | id);
            const bool counted = !loop && !alt.empty() && counted_rules_.count(id) > 0;
            const bool tail_ref = counted && Grammar::tag(alt.back()) == Grammar::kTagRule &&
                                  counted_rules_.count(Grammar::payload(alt.back())) > 0;
            const size_t scan_end = tail_ref ? alt.size() - 1 : alt.size();
            size_t k = 0;
            while ((loop || counted) && k < scan_end &&
                   !(Grammar::tag(alt[k]) == Grammar::kTagRule && inlinable[Grammar::payload(alt[k])])) {
                ++k;
            }
            if (!(loop || counted) || k >= scan_end) k = alt.size();
            const size_t pending = out.size() + work.size() + 1;
            const auto* body = k < alt.size() ? &lowered_[Grammar::payload(alt[k])] : nullptr;
            if (body == nullptr || pending - 1 + body->size() > kMaxRuleAlts ||
                num_symbols_ > limits_.max_elements) {
                out.push_back(std::move(alt));
                continue;
            }
            changed = true;
            for (auto it = body->rbegin(); it != body->rend(); ++it) {
                std::vector<uint32_t> next(alt.begin(), alt.begin() + static_cast<ptrdiff_t>(k));
                next.insert(next.end(), it->begin(), it->end());
                next.insert(next.end(), alt.begin() + static_cast<ptrdiff_t>(k) + 1, alt.end());
                num_symbols_ += next.size() + 1;
                work.push_back(std::move(next));
            }
        }
        if (changed) lowered_[id] = std::move(out);
    }
}

// A rule is productive when some alternative derives a finite byte string (all its
// symbols productive). Alternatives using an unproductive rule can never complete:
// a matcher entering one would allow tokens that lead to a dead end (a schema like
// {"enum": []} as a required property), so they are dropped, and a root that derives
// nothing is an error the caller can report (HTTP 400) instead of a request that can
// only produce garbage.
Status GrammarBuilder::drop_unproductive(uint32_t root) {
    const size_t n = names_.size();
    std::vector<bool> productive(n, false);
    auto sym_ok = [&](uint32_t s) {
        return Grammar::tag(s) != Grammar::kTagRule || productive[Grammar::payload(s)];
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; ++r) {
            if (productive[r]) continue;
            for (const auto& alt : lowered_[r]) {
                if (std::all_of(alt.begin(), alt.end(), sym_ok)) {
                    productive[r] = true;
                    changed = true;
                    break;
                }
            }
        }
    }
    if (!productive[root]) {
        return invalid_argument("the grammar accepts no input (rule '" + names_[root] +
                                "' derives no string: nothing satisfies it)");
    }
    for (size_t r = 0; r < n; ++r) {
        auto& alts = lowered_[r];
        alts.erase(std::remove_if(alts.begin(), alts.end(),
                                  [&](const std::vector<uint32_t>& alt) {
                                      return !std::all_of(alt.begin(), alt.end(), sym_ok);
                                  }),
                   alts.end());
    }
    return Status::ok();
}

Result<Grammar> GrammarBuilder::build(uint32_t root) {
    lowered_.resize(names_.size());
    lowered_done_.resize(names_.size(), false);
    for (uint32_t id = 0; id < names_.size(); ++id) {
        DSI_RETURN_IF_ERROR(lower_rule(id));
    }
    inline_byte_rules();
    DSI_RETURN_IF_ERROR(check_size());
    DSI_RETURN_IF_ERROR(drop_unproductive(root));
    DSI_RETURN_IF_ERROR(check_left_recursion());
    Grammar g;
    g.classes_ = classes_;
    g.rule_names_ = names_;
    g.root_ = root;
    g.rule_alts_.resize(names_.size());
    g.elements_.reserve(num_symbols_ + 1);
    for (uint32_t id = 0; id < names_.size(); ++id) {
        for (const auto& alt : lowered_[id]) {
            g.rule_alts_[id].push_back(static_cast<uint32_t>(g.elements_.size()));
            g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
            g.elements_.push_back(Grammar::kEnd);
        }
    }
    if (g.elements_.size() >= (size_t{1} << 30)) return resource_exhausted("grammar too large");
    return g;
}

std::string Grammar::to_string() const {
    auto class_str = [&](const ByteSet& s) {
        std::string out = "[";
        for (int b = 0; b < 256; ++b) {
            if (!s.test(static_cast<uint8_t>(b))) continue;
            int e = b;
            while (e + 1 < 256 && s.test(static_cast<uint8_t>(e + 1))) ++e;
            auto one = [&](int c) {
                if (c >= 0x21 && c < 0x7f && c != ']' && c != '\\' && c != '-') {
                    out += static_cast<char>(c);
                } else {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\x%02X", c);
                    out += buf;
                }
            };
            one(b);
            if (e > b) {
                out += '-';
                one(e);
            }
            b = e;
        }
        return out + "]";
    };
    std::string out;
    for (uint32_t r = 0; r < rule_alts_.size(); ++r) {
        out += rule_names_[r] + " ::=";
        bool first = true;
        for (uint32_t start : rule_alts_[r]) {
            out += first ? " " : " | ";
            first = false;
            if (elements_[start] == kEnd) out += "\"\"";
            for (uint32_t p = start; elements_[p] != kEnd; ++p) {
                if (p != start) out += ' ';
                uint32_t e = elements_[p];
                out += tag(e) == kTagClass ? class_str(classes_[payload(e)])
                                           : rule_names_[payload(e)];
            }
        }
        if (rule_alts_[r].empty()) out += " <fail>";
        out += '\n';
    }
    return out;
}

std::string Grammar::serialize() const {
    std::string out = "DSIG1";
    put_u32(&out, root_);
    put_u32(&out, static_cast<uint32_t>(classes_.size()));
    for (const auto& c : classes_) out.append(reinterpret_cast<const char*>(c.words), 32);
    put_u32(&out, static_cast<uint32_t>(elements_.size()));
    for (uint32_t e : elements_) put_u32(&out, e);
    put_u32(&out, static_cast<uint32_t>(rule_alts_.size()));
    for (size_t r = 0; r < rule_alts_.size(); ++r) {
        put_u32(&out, static_cast<uint32_t>(rule_names_[r].size()));
        out += rule_names_[r];
        put_u32(&out, static_cast<uint32_t>(rule_alts_[r].size()));
        for (uint32_t a : rule_alts_[r]) put_u32(&out, a);
    }
    return out;
}

Result<Grammar> Grammar::deserialize(std::string_view bytes) {
    size_t off = 0;
    auto need = [&](size_t n) { return off + n <= bytes.size(); };
    auto get = [&](uint32_t* v) {
        if (!need(4)) return false;
        std::memcpy(v, bytes.data() + off, 4);
        off += 4;
        return true;
    };
    auto bad = [](const char* what) {
        return data_loss(std::string("serialized grammar: ") + what);
    };
    if (bytes.substr(0, 5) != "DSIG1") return bad("bad magic");
    off = 5;
    Grammar g;
    uint32_t n = 0;
    if (!get(&g.root_) || !get(&n) || !need(size_t{n} * 32)) return bad("truncated classes");
    g.classes_.resize(n);
    for (auto& c : g.classes_) {
        std::memcpy(c.words, bytes.data() + off, 32);
        off += 32;
    }
    if (!get(&n) || !need(size_t{n} * 4)) return bad("truncated elements");
    g.elements_.resize(n);
    for (auto& e : g.elements_) (void)get(&e);
    uint32_t num_rules = 0;
    if (!get(&num_rules)) return bad("truncated rules");
    for (uint32_t r = 0; r < num_rules; ++r) {
        uint32_t len = 0, num_alts = 0;
        if (!get(&len) || !need(len)) return bad("truncated rule name");
        g.rule_names_.emplace_back(bytes.substr(off, len));
        off += len;
        if (!get(&num_alts) || !need(size_t{num_alts} * 4)) return bad("truncated alternatives");
        g.rule_alts_.emplace_back(num_alts);
        for (auto& a : g.rule_alts_.back()) (void)get(&a);
    }
    // Validate every reference so a damaged file cannot send the matcher out of bounds.
    if (g.root_ >= num_rules) return bad("root out of range");
    if (g.elements_.empty() || g.elements_.back() != kEnd) return bad("elements not terminated");
    for (uint32_t e : g.elements_) {
        uint32_t t = tag(e);
        if (t == kTagClass && payload(e) >= g.classes_.size()) return bad("class out of range");
        if (t == kTagRule && payload(e) >= num_rules) return bad("rule out of range");
        if (t == kTagEnd && e != kEnd) return bad("bad element");
        if (t == kTagMask) return bad("bad element tag");
    }
    for (const auto& alts : g.rule_alts_) {
        for (uint32_t a : alts) {
            if (a >= g.elements_.size()) return bad("alternative out of range");
        }
    }
    if (off != bytes.size()) return bad("trailing bytes");
    return g;
}

}  // namespace dsi::grammar

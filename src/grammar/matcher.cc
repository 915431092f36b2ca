#include "grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace dsi::grammar {

namespace {
inline uint64_t hash_pair(uint32_t a, uint32_t b) {
    uint64_t x = (uint64_t{a} << 32) | b;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}
// Stores `accepted` in `table` as a bitmask or a sorted id list, whichever is smaller.
void set_accepted(std::vector<int32_t> accepted, size_t vocab_size, PositionTokens* table) {
    // Dense when a bitmask is smaller than the id list.
    const size_t words = (vocab_size + 63) / 64;
    if (accepted.size() * 4 > words * 8) {
        table->accepted_bits.assign(words, 0);
        for (int32_t id : accepted) table->accepted_bits[id >> 6] |= uint64_t{1} << (id & 63);
    } else {
        std::sort(accepted.begin(), accepted.end());
        table->accepted_ids = std::move(accepted);
    }
}

// Appends the ids `t` accepts.
void append_accepted(const PositionTokens& t, std::vector<int32_t>* out) {
    out->insert(out->end(), t.accepted_ids.begin(), t.accepted_ids.end());
    for (size_t w = 0; w < t.accepted_bits.size(); ++w) {
        for (uint64_t bits = t.accepted_bits[w]; bits != 0; bits &= bits - 1) {
            out->push_back(
                static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits))));
        }
    }
}

// Expansion deeper than this means a grammar the left-recursion check missed.
constexpr int kMaxExpandDepth = 100000;
}  // namespace

int64_t TokenBitmask::count() const {
    int64_t n = 0;
    for (uint64_t w : words_) n += std::popcount(w);
    return n;
}

void apply_token_bitmask(std::span<float> logits, const TokenBitmask& mask) {
    const float kNegInf = -std::numeric_limits<float>::infinity();
    size_t n = std::min(logits.size(), static_cast<size_t>(mask.size()));
    auto words = mask.words();
    for (size_t w = 0; w * 64 < n; ++w) {
        uint64_t bits = words[w];
        if (bits == ~uint64_t{0}) continue;
        size_t end = std::min(n, w * 64 + 64);
        for (size_t i = w * 64; i < end; ++i) {
            if (!((bits >> (i & 63)) & 1)) logits[i] = kNegInf;
        }
    }
    for (size_t i = n; i < logits.size(); ++i) logits[i] = kNegInf;
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab,
                                 MatcherOptions options)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), options_(options) {
    // Possible stack tops: class elements of the rules reachable from the root (rules
    // left unreferenced by inlining are never entered).
    const auto& elems = grammar_.elements();
    slot_of_pos_.assign(elems.size(), 0);
    std::vector<bool> reached(grammar_.num_rules(), false);
    std::vector<uint32_t> todo = {grammar_.root()};
    reached[grammar_.root()] = true;
    while (!todo.empty()) {
        uint32_t r = todo.back();
        todo.pop_back();
        for (uint32_t start : grammar_.alternatives(r)) {
            for (uint32_t pos = start; elems[pos] != Grammar::kEnd; ++pos) {
                uint32_t e = elems[pos];
                if (Grammar::tag(e) == Grammar::kTagClass) {
                    slot_of_pos_[pos] = static_cast<uint32_t>(class_positions_.size());
                    class_positions_.push_back(pos);
                } else if (!reached[Grammar::payload(e)]) {
                    reached[Grammar::payload(e)] = true;
                    todo.push_back(Grammar::payload(e));
                }
            }
        }
    }
    std::sort(class_positions_.begin(), class_positions_.end());
    for (uint32_t i = 0; i < class_positions_.size(); ++i) slot_of_pos_[class_positions_[i]] = i;
    compute_chains(reached);
    compute_links(reached);
    compute_key_floors();
    table_cache_ = options_.table_cache ? options_.table_cache
                                        : std::make_shared<PositionTableCache>();
    tables_ = std::make_unique<std::atomic<const PositionTokens*>[]>(class_positions_.size() + 1);
    for (size_t i = 0; i <= class_positions_.size(); ++i) tables_[i].store(nullptr);
}

CompiledGrammar::~CompiledGrammar() = default;

GrammarMatcher& CompiledGrammar::builder() const {
    if (builder_ == nullptr) {
        // Non-owning: the builder lives inside this grammar.
        builder_ = std::make_unique<GrammarMatcher>(
            std::shared_ptr<const CompiledGrammar>(std::shared_ptr<void>(), this));
    }
    return *builder_;
}

std::unique_ptr<PositionTokens> CompiledGrammar::build_table(uint32_t pos, size_t levels,
                                                             int first_byte) const {
    std::lock_guard<std::mutex> lock(builder_mu_);
    GrammarMatcher& b = builder();
    if (!b.memo_active_) b.memo_begin();
    return b.build_position_tokens(pos, levels, first_byte);
}

std::unique_ptr<PositionTokens> CompiledGrammar::refine_table(uint32_t pos, size_t levels,
                                                              const PositionTokens& fewer) const {
    std::lock_guard<std::mutex> lock(builder_mu_);
    return builder().refine_position_tokens(pos, levels, fewer);
}

std::unique_ptr<PositionTokens> CompiledGrammar::narrow_table(uint32_t pos, size_t levels,
                                                              size_t max_bytes,
                                                              const PositionTokens& longer) const {
    std::lock_guard<std::mutex> lock(builder_mu_);
    num_narrowed_.fetch_add(1, std::memory_order_relaxed);
    return builder().narrow_position_tokens(pos, levels, max_bytes, longer);
}

void CompiledGrammar::compute_chains(const std::vector<bool>& reached) {
    const auto& elems = grammar_.elements();
    const uint32_t n = static_cast<uint32_t>(grammar_.num_rules());
    rule_of_slot_.assign(class_positions_.size(), 0);
    // Reference sites of each reached rule; a rule's own tail self-reference returns
    // to the same caller, so it adds no site.
    constexpr uint32_t kNoSite = UINT32_MAX;
    constexpr uint32_t kMany = UINT32_MAX - 1;
    std::vector<uint32_t> site(n, kNoSite), site_rule(n, 0);
    for (uint32_t r = 0; r < n; ++r) {
        if (!reached[r]) continue;
        for (uint32_t start : grammar_.alternatives(r)) {
            for (uint32_t pos = start; elems[pos] != Grammar::kEnd; ++pos) {
                uint32_t e = elems[pos];
                if (Grammar::tag(e) == Grammar::kTagClass) {
                    rule_of_slot_[slot_of_pos_[pos]] = r;
                    continue;
                }
                uint32_t callee = Grammar::payload(e);
                const bool tail = elems[pos + 1] == Grammar::kEnd;
                if (callee == r && tail) continue;
                // Tail sites of one rule are one site: each returns where that rule
                // does (a bounded repetition's link O_k ::= c1 O_{k-1} | c2 O_{k-1} | "",
                // one alternative per kind of JSON string character).
                if (site[callee] != kNoSite && site[callee] != kMany && tail &&
                    elems[site[callee] + 1] == Grammar::kEnd && site_rule[callee] == r) {
                    continue;
                }
                site[callee] = site[callee] == kNoSite ? pos : kMany;
                site_rule[callee] = r;
            }
        }
    }
    // Follow unique sites upwards, memoised per rule: a rule reached through a tail
    // site continues as its caller does, so a bounded repetition's chain O_k ::= c O_{k-1}
    // (maxLength 1,024) shares one continuation instead of walking up k sites. At most
    // kMaxChain positions (longer chains end as unknown); a cycle of single sites (not
    // reached from the root) ends as unknown.
    constexpr size_t kMaxChain = 16;
    chains_.assign(n, {kChainUnknown});
    std::vector<uint8_t> mark(n, 0);  // 0 unvisited, 1 on the current walk, 2 done
    std::vector<uint32_t> path;
    for (uint32_t r = 0; r < n; ++r) {
        if (!reached[r] || mark[r] == 2) continue;
        path.clear();
        std::vector<uint32_t> tail;
        for (uint32_t cur = r;; cur = site_rule[cur]) {
            if (mark[cur] == 2) {
                tail = chains_[cur];
                break;
            }
            if (mark[cur] == 1) {
                tail = {kChainUnknown};
                break;
            }
            if (cur == grammar_.root() && site[cur] == kNoSite) {
                tail = {kChainAccept};
            } else if (site[cur] == kNoSite || site[cur] == kMany) {
                tail = {kChainUnknown};
            } else {
                mark[cur] = 1;
                path.push_back(cur);
                continue;
            }
            chains_[cur] = tail;
            mark[cur] = 2;
            break;
        }
        for (size_t i = path.size(); i-- > 0;) {
            const uint32_t q = path[i];
            const uint32_t s = site[q];
            std::vector<uint32_t> chain;
            if (elems[s + 1] != Grammar::kEnd) chain.push_back(s + 1);
            chain.insert(chain.end(), tail.begin(), tail.end());
            if (chain.size() > kMaxChain + 1) {
                chain.resize(kMaxChain);
                chain.push_back(kChainUnknown);
            }
            chains_[q] = chain;
            mark[q] = 2;
            tail = std::move(chain);
        }
    }
}

void CompiledGrammar::compute_links(const std::vector<bool>& reached) {
    const auto& elems = grammar_.elements();
    const uint32_t n = static_cast<uint32_t>(grammar_.num_rules());
    link_items_.assign(n, 0);
    link_longer_.assign(n, kNoRule);
    // A rule's item alternatives: all but one empty alternative, each a run of byte
    // classes optionally ending in a reference to one successor rule (the same for
    // every alternative). Returns false when the rule is not of that shape.
    constexpr uint32_t kNoNext = UINT32_MAX;
    auto shape = [&](uint32_t r, uint32_t* next, std::vector<std::vector<uint32_t>>* items) {
        *next = kNoNext;
        items->clear();
        bool have_empty = false;
        bool first = true;
        for (uint32_t start : grammar_.alternatives(r)) {
            if (elems[start] == Grammar::kEnd) {
                if (have_empty) return false;
                have_empty = true;
                continue;
            }
            std::vector<uint32_t> item;
            uint32_t q = start;
            for (; Grammar::tag(elems[q]) == Grammar::kTagClass; ++q) item.push_back(elems[q]);
            uint32_t succ = kNoNext;
            if (Grammar::tag(elems[q]) == Grammar::kTagRule && elems[q + 1] == Grammar::kEnd) {
                succ = Grammar::payload(elems[q]);
            } else if (elems[q] != Grammar::kEnd) {
                return false;
            }
            if (item.empty() || succ == r) return false;
            if (first) {
                *next = succ;
                first = false;
            } else if (succ != *next) {
                return false;
            }
            items->push_back(std::move(item));
        }
        return have_empty && !first;
    };
    // From each unvisited rule, follow successors to the chain's end (O_1), then count
    // back. Iterative: chains are as long as the repetition bound (up to 20,000).
    std::vector<uint8_t> done(n, 0);
    std::vector<uint32_t> path;
    std::vector<std::vector<uint32_t>> items_r, items_s;
    uint32_t next = 0;
    for (uint32_t r0 = 0; r0 < n; ++r0) {
        if (done[r0]) continue;
        path.clear();
        uint32_t cur = r0;
        while (!done[cur] && shape(cur, &next, &items_r)) {
            done[cur] = 1;  // on this walk; its count is set below
            path.push_back(cur);
            if (next == kNoNext) break;
            cur = next;
        }
        if (path.empty()) {
            done[r0] = 1;
            continue;
        }
        // Count back from the walk's end; a link counts only when its successor is a
        // link with the same items (or it is the last, O_1).
        for (size_t i = path.size(); i-- > 0;) {
            const uint32_t r = path[i];
            shape(r, &next, &items_r);
            if (next == kNoNext) {
                link_items_[r] = 1;
                continue;
            }
            if (link_items_[next] == 0) continue;
            uint32_t next2 = 0;
            shape(next, &next2, &items_s);
            if (items_r == items_s) {
                link_items_[r] = link_items_[next] + 1;
                if (reached[r] && chains_[r] == chains_[next]) link_longer_[next] = r;
            }
        }
    }
}

uint32_t CompiledGrammar::longer_link_position(uint32_t pos) const {
    const uint32_t r = rule_of_slot_[slot_of_pos_[pos]];
    const uint32_t longer = link_longer_[r];
    // Links further from the end are keyed as the unbounded loop (position_key()), so
    // their tables are shared; the first link that is not (its successor is followed)
    // is narrowed too.
    if (longer == kNoRule ||
        link_items_[r] > static_cast<uint32_t>(vocab_->max_token_bytes()) + 2) {
        return kNoPosition;
    }
    // The same item alternative (empty ones skipped: compute_links() compared the
    // items in order) at the same offset.
    const auto& elems = grammar_.elements();
    const auto& alts = grammar_.alternatives(r);
    const auto& longer_alts = grammar_.alternatives(longer);
    size_t i = 0, j = 0;
    for (; i < alts.size(); ++i) {
        if (elems[alts[i]] == Grammar::kEnd) continue;
        while (elems[longer_alts[j]] == Grammar::kEnd) ++j;
        uint32_t end = alts[i];
        while (Grammar::tag(elems[end]) == Grammar::kTagClass) ++end;
        if (pos >= alts[i] && pos < end) return longer_alts[j] + (pos - alts[i]);
        ++j;
    }
    return kNoPosition;
}

void CompiledGrammar::compute_key_floors() {
    const auto& elems = grammar_.elements();
    const uint32_t n = static_cast<uint32_t>(grammar_.num_rules());
    const uint32_t max_items = static_cast<uint32_t>(vocab_->max_token_bytes()) + 1;
    // position_key() follows a reference unless the rule is written as a loop.
    auto followed = [&](uint32_t r) { return link_items_[r] <= max_items; };
    // Bytes of a rule's own block in a key: 'A' + count, per alternative its classes
    // (33), followed references (5; a loop's is not counted) and 'E'.
    std::vector<uint64_t> own(n, 5);
    std::vector<std::vector<uint32_t>> succ(n);
    for (uint32_t r = 0; r < n; ++r) {
        for (uint32_t start : grammar_.alternatives(r)) {
            for (uint32_t q = start; elems[q] != Grammar::kEnd; ++q) {
                if (Grammar::tag(elems[q]) == Grammar::kTagClass) {
                    own[r] += 33;
                } else if (followed(Grammar::payload(elems[q]))) {
                    own[r] += 5;
                    succ[r].push_back(Grammar::payload(elems[q]));
                }
            }
            own[r] += 1;
        }
    }
    // Strongly connected components (Tarjan, iterative: reference chains are as long
    // as repetition bounds), completed sinks first. A component's rules are all in the
    // key of anything reaching it, and so is one heaviest component below it: the
    // floor is their sum (each rule's block is written once).
    constexpr uint32_t kUnset = UINT32_MAX;
    std::vector<uint32_t> index(n, kUnset), low(n, 0), comp(n, kUnset), stack;
    std::vector<uint8_t> on_stack(n, 0);
    std::vector<std::pair<uint32_t, uint32_t>> calls;  // (rule, next successor)
    std::vector<uint64_t> comp_floor;
    uint32_t counter = 0;
    auto enter = [&](uint32_t r) {
        index[r] = low[r] = counter++;
        stack.push_back(r);
        on_stack[r] = 1;
        calls.push_back({r, 0});
    };
    for (uint32_t r0 = 0; r0 < n; ++r0) {
        if (index[r0] != kUnset) continue;
        enter(r0);
        while (!calls.empty()) {
            const uint32_t v = calls.back().first;
            if (calls.back().second < succ[v].size()) {
                const uint32_t w = succ[v][calls.back().second++];
                if (index[w] == kUnset) {
                    enter(w);
                } else if (on_stack[w]) {
                    low[v] = std::min(low[v], index[w]);
                }
                continue;
            }
            calls.pop_back();
            if (!calls.empty()) low[calls.back().first] = std::min(low[calls.back().first], low[v]);
            if (low[v] != index[v]) continue;
            const uint32_t c = static_cast<uint32_t>(comp_floor.size());
            uint64_t sum = 0;
            size_t first = stack.size();
            do {
                --first;
                comp[stack[first]] = c;
                on_stack[stack[first]] = 0;
                sum += own[stack[first]];
            } while (stack[first] != v);
            uint64_t below = 0;
            for (size_t i = first; i < stack.size(); ++i) {
                for (uint32_t w : succ[stack[i]]) {
                    if (comp[w] != c) below = std::max(below, comp_floor[comp[w]]);
                }
            }
            stack.resize(first);
            comp_floor.push_back(sum + below);
        }
    }
    key_floor_bytes_.assign(n, 0);
    for (uint32_t r = 0; r < n; ++r) key_floor_bytes_[r] = comp_floor[comp[r]];
}

std::shared_ptr<const PositionTokens> PositionTableCache::find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
        ++misses_;
        return nullptr;
    }
    ++hits_;
    return it->second;
}

std::shared_ptr<const PositionTokens> PositionTableCache::insert(
    const std::string& key, std::shared_ptr<const PositionTokens> table) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    size_t cost = table->num_bytes() + key.size();
    if (bytes_ + cost > max_bytes_) return table;
    bytes_ += cost;
    map_.emplace(key, table);
    return table;
}

PositionTableCache::Stats PositionTableCache::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return Stats{hits_, misses_, static_cast<int64_t>(map_.size()), static_cast<int64_t>(bytes_)};
}

std::string CompiledGrammar::position_key(uint32_t pos, size_t levels, int first_byte,
                                          size_t max_key_bytes) const {
    // Larger reachable grammars (whole objects) are rarely repeated; their walks are
    // cheap because literal keys prune the trie early.
    const auto& elems = grammar_.elements();
    const auto& classes = grammar_.classes();
    // Scratch per thread (position_key runs on any matcher's thread): rules and
    // classes numbered locally in order of first use, valid while their stamp is this
    // call's. Before, an unordered_map per call, every class written whole (33 bytes
    // each) and 4-byte numbers (keys of ~11 KB at the object members of webhook
    // schemas) made the keys the largest part of a step that meets new positions
    // (issue 21: the mask p99).
    struct Scratch {
        std::vector<uint32_t> rule_stamp, rule_local, class_stamp, class_local, rules;
        uint32_t stamp = 0;
    };
    thread_local Scratch sc;
    if (++sc.stamp == 0) {  // wrapped: forget every old stamp
        std::fill(sc.rule_stamp.begin(), sc.rule_stamp.end(), 0);
        std::fill(sc.class_stamp.begin(), sc.class_stamp.end(), 0);
        sc.stamp = 1;
    }
    if (sc.rule_stamp.size() < grammar_.num_rules()) {
        sc.rule_stamp.resize(grammar_.num_rules(), 0);
        sc.rule_local.resize(grammar_.num_rules(), 0);
    }
    if (sc.class_stamp.size() < classes.size()) {
        sc.class_stamp.resize(classes.size(), 0);
        sc.class_local.resize(classes.size(), 0);
    }
    // Known to pass the cap before writing anything: the rules the position's own
    // sequence (and the continuation it is keyed with) refers to are all written.
    const uint32_t max_items = static_cast<uint32_t>(vocab_->max_token_bytes()) + 1;
    const std::vector<uint32_t>& chain = continuation(pos);
    const size_t used = std::min(levels, chain.size() - 1);
    uint64_t floor_bytes = 0;
    auto floor_of = [&](uint32_t q) {
        for (; elems[q] != Grammar::kEnd; ++q) {
            if (Grammar::tag(elems[q]) != Grammar::kTagRule) continue;
            const uint32_t r = Grammar::payload(elems[q]);
            if (link_items_[r] <= max_items) {
                floor_bytes = std::max(floor_bytes, key_floor_bytes_[r]);
            }
        }
    };
    floor_of(pos);
    for (size_t k = 0; k < used; ++k) floor_of(chain[k]);
    if (sizeof(uint64_t) + floor_bytes > max_key_bytes) return "";
    std::string key;
    key.reserve(512);
    // The size the key would have with every class written whole: the caps below
    // (max_key_bytes) keep their meaning, so what is shared does not change.
    size_t full_bytes = 0;
    uint64_t fp = vocab_->fingerprint();
    key.append(reinterpret_cast<const char*>(&fp), sizeof(fp));
    std::vector<uint32_t>& rules = sc.rules;
    rules.clear();
    uint32_t num_local_classes = 0;
    bool first_class = true;
    // Numbers as LEB128 varints (prefix-free, so the key stays injective): local rule
    // and class numbers, alternative counts are small.
    auto put32 = [&](uint32_t v) {
        while (v >= 0x80) {
            key.push_back(static_cast<char>(0x80 | (v & 0x7f)));
            v >>= 7;
        }
        key.push_back(static_cast<char>(v));
    };
    // A class is written whole at its first use ('C' + 32 bytes) and then as its
    // local number ('c' + 4 bytes): injective, since the numbers follow the order of
    // the whole writes. The position's own class is never numbered, since a
    // first_byte key overwrites it below.
    auto put_class = [&](uint32_t e) {
        const uint32_t c = Grammar::payload(e);
        full_bytes += 33;
        if (!first_class && sc.class_stamp[c] == sc.stamp) {
            key.push_back('c');
            put32(sc.class_local[c]);
            return;
        }
        key.push_back('C');
        key.append(reinterpret_cast<const char*>(classes[c].words), 32);
        if (!first_class) {
            sc.class_stamp[c] = sc.stamp;
            sc.class_local[c] = num_local_classes++;
        }
        first_class = false;
    };
    // A repetition link with more items left than a token has bytes: written as the
    // unbounded loop over its items (link_items_), so equal for every such count.
    auto emit_loop = [&](uint32_t r) {
        key.push_back('L');
        put32(static_cast<uint32_t>(grammar_.alternatives(r).size()));
        full_bytes += 6;
        for (uint32_t start : grammar_.alternatives(r)) {
            for (uint32_t q = start; Grammar::tag(elems[q]) == Grammar::kTagClass; ++q) put_class(elems[q]);
            key.push_back('E');
            ++full_bytes;
        }
        key.push_back('E');
    };
    auto emit_seq = [&](uint32_t q) {
        for (;; ++q) {
            uint32_t e = elems[q];
            uint32_t tag = Grammar::tag(e);
            if (tag == Grammar::kTagEnd) {
                key.push_back('E');
                ++full_bytes;
                return;
            }
            if (tag == Grammar::kTagClass) {
                put_class(e);
                continue;
            }
            uint32_t r = Grammar::payload(e);
            if (link_items_[r] > max_items) {
                emit_loop(r);
                continue;
            }
            if (sc.rule_stamp[r] != sc.stamp) {
                sc.rule_stamp[r] = sc.stamp;
                sc.rule_local[r] = static_cast<uint32_t>(rules.size());
                rules.push_back(r);
            }
            key.push_back('R');
            put32(sc.rule_local[r]);
            full_bytes += 5;
        }
    };
    emit_seq(pos);
    for (size_t k = 0; k < used; ++k) {
        key.push_back('K');
        ++full_bytes;
        emit_seq(chain[k]);
    }
    key.push_back('T');
    put32(used == chain.size() - 1 ? chain.back() : kChainUnknown);
    full_bytes += 5;
    for (size_t qi = 0; qi < rules.size(); ++qi) {
        const auto& alts = grammar_.alternatives(rules[qi]);
        key.push_back('A');
        put32(static_cast<uint32_t>(alts.size()));
        full_bytes += 5;
        for (uint32_t a : alts) {
            emit_seq(a);
            if (sizeof(fp) + full_bytes > max_key_bytes) return "";
        }
    }
    DSI_DCHECK(sizeof(fp) + full_bytes >= floor_bytes, "position_key: floor above the key");
    if (first_byte >= 0) {
        // The position's own class, written first (after the fingerprint and 'C').
        ByteSet only;
        only.set(static_cast<uint8_t>(first_byte));
        std::memcpy(key.data() + sizeof(fp) + 1, only.words, sizeof(only.words));
    }
    return key;
}

const PositionTokens* CompiledGrammar::store_position_tokens(
    uint32_t pos, std::shared_ptr<const PositionTokens> table) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = tables_[slot_of_pos_[pos]];
    if (const PositionTokens* have = slot.load(std::memory_order_acquire)) return have;
    if (table_bytes_ + table->num_bytes() > options_.max_position_table_bytes) return nullptr;
    table_bytes_ += table->num_bytes();
    table_uncertain_ += static_cast<int64_t>(table->uncertain.size());
    owned_tables_.push_back(std::move(table));
    slot.store(owned_tables_.back().get(), std::memory_order_release);
    return owned_tables_.back().get();
}

CompiledGrammar::TableStats CompiledGrammar::table_stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return TableStats{static_cast<int64_t>(class_positions_.size()),
                      static_cast<int64_t>(owned_tables_.size()),
                      static_cast<int64_t>(table_bytes_), table_uncertain_,
                      num_narrowed_.load(std::memory_order_relaxed)};
}

bool CompiledGrammar::lookup_mask(const std::string& key, TokenBitmask* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
        misses_.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    auto words = out->words();
    std::memcpy(words.data(), it->second.data(),
                std::min(words.size(), it->second.size()) * sizeof(uint64_t));
    hits_.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void CompiledGrammar::store_mask(const std::string& key, const TokenBitmask& mask) const {
    std::lock_guard<std::mutex> lock(mu_);
    // Bounded: when full, stop caching (the walk stays correct, only slower). A
    // state set that large is unusual; the bound keeps memory predictable.
    if (cache_.size() >= options_.mask_cache_entries) return;
    auto w = mask.words();
    cache_.emplace(key, std::vector<uint64_t>(w.begin(), w.end()));
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return CacheStats{hits_.load(), misses_.load(), static_cast<int64_t>(cache_.size())};
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : compiled_(std::move(grammar)),
      g_(&compiled_->grammar()),
      elems_(&g_->elements()),
      classes_(&g_->classes()) {
    slots_.assign(1024, 0);
    initial_state();
}

uint32_t GrammarMatcher::node(uint32_t pos, uint32_t parent) {
    size_t mask = slots_.size() - 1;
    size_t i = hash_pair(pos, parent) & mask;
    while (slots_[i] != 0) {
        const Node& n = nodes_[slots_[i] - 1];
        if (n.pos == pos && n.parent == parent) return slots_[i] - 1;
        i = (i + 1) & mask;
    }
    uint32_t id = static_cast<uint32_t>(nodes_.size());
    nodes_.push_back(Node{pos, parent});
    slots_[i] = id + 1;
    if (nodes_.size() * 2 > slots_.size()) rehash();
    return id;
}

void GrammarMatcher::rehash() {
    slots_.assign(slots_.size() * 2, 0);
    size_t mask = slots_.size() - 1;
    for (uint32_t id = 0; id < nodes_.size(); ++id) {
        size_t i = hash_pair(nodes_[id].pos, nodes_[id].parent) & mask;
        while (slots_[i] != 0) i = (i + 1) & mask;
        slots_[i] = id + 1;
    }
}

void GrammarMatcher::truncate_pool(size_t mark) {
    // Nodes are removed in reverse insertion order, so clearing each one's slot keeps
    // every remaining probe chain intact (a later key never sits before an earlier
    // key's slot on that key's chain once everything inserted after it is gone).
    size_t mask = slots_.size() - 1;
    while (nodes_.size() > mark) {
        uint32_t id = static_cast<uint32_t>(nodes_.size() - 1);
        const Node& n = nodes_.back();
        size_t i = hash_pair(n.pos, n.parent) & mask;
        while (slots_[i] != id + 1) i = (i + 1) & mask;
        slots_[i] = 0;
        nodes_.pop_back();
    }
}

void GrammarMatcher::expand(uint32_t pos, uint32_t parent, std::vector<uint32_t>* out,
                            int depth) {
    if (depth > kMaxExpandDepth) {
        overflow_ = true;
        return;
    }
    const auto& elems = *elems_;
    while (true) {
        uint32_t e = elems[pos];
        uint32_t tag = Grammar::tag(e);
        if (tag == Grammar::kTagClass) {
            uint32_t id = node(pos, parent);
            if (id >= out_gen_.size()) out_gen_.resize(std::max<size_t>(nodes_.size(), 2 * size_t{id} + 64), 0);
            if (out_gen_[id] != expand_gen_) {
                if (out->size() >= compiled_->options().max_stacks) {
                    overflow_ = true;
                    return;
                }
                out_gen_[id] = expand_gen_;
                out->push_back(id);
            }
            return;
        }
        if (tag == Grammar::kTagEnd) {
            if (parent == kNone) {
                if (std::find(out->begin(), out->end(), kNone) == out->end()) out->push_back(kNone);
                return;
            }
            if (parent == kContext) {
                reached_context_ = true;
                return;
            }
            Node p = nodes_[parent];
            pos = p.pos;
            parent = p.parent;
            continue;
        }
        // Rule reference: continuation after it (tail call when it ends the alternative).
        uint32_t rule = Grammar::payload(e);
        if (!mark_visited(pos, parent)) return;  // nullable cycle, or expanded already
        uint32_t cont = elems[pos + 1] == Grammar::kEnd ? parent : node(pos + 1, parent);
        const auto& alts = g_->alternatives(rule);
        for (uint32_t a : alts) expand(a, cont, out, depth + 1);
        return;
    }
}

void GrammarMatcher::begin_expansion() {
    if (++expand_gen_ == 0) {  // wrapped: no stamp may look current
        std::fill(out_gen_.begin(), out_gen_.end(), 0);
        for (auto& v : visit_slots_) v.gen = 0;
        expand_gen_ = 1;
    }
    num_visited_ = 0;
}

bool GrammarMatcher::mark_visited(uint32_t pos, uint32_t parent) {
    if ((num_visited_ + 1) * 2 > visit_slots_.size()) {
        std::vector<VisitSlot> old = std::move(visit_slots_);
        visit_slots_.assign(std::max<size_t>(64, old.size() * 2), VisitSlot{0, 0});
        const size_t mask = visit_slots_.size() - 1;
        for (const VisitSlot& v : old) {
            if (v.gen != expand_gen_) continue;
            size_t i = hash_pair(static_cast<uint32_t>(v.key >> 32), static_cast<uint32_t>(v.key)) & mask;
            while (visit_slots_[i].gen == expand_gen_) i = (i + 1) & mask;
            visit_slots_[i] = v;
        }
    }
    const uint64_t key = (uint64_t{pos} << 32) | parent;
    const size_t mask = visit_slots_.size() - 1;
    size_t i = hash_pair(pos, parent) & mask;
    while (visit_slots_[i].gen == expand_gen_) {
        if (visit_slots_[i].key == key) return false;
        i = (i + 1) & mask;
    }
    visit_slots_[i] = VisitSlot{key, expand_gen_};
    ++num_visited_;
    return true;
}

void GrammarMatcher::step(std::span<const uint32_t> in, uint8_t b, std::vector<uint32_t>* out) {
    out->clear();
    begin_expansion();
    const auto& classes = *classes_;
    const auto& elems = *elems_;
    for (uint32_t id : in) {
        if (id == kNone) continue;
        const Node n = nodes_[id];
        if (!classes[Grammar::payload(elems[n.pos])].test(b)) continue;
        expand(n.pos + 1, n.parent, out, 0);
    }
    if (out->size() > 1) std::sort(out->begin(), out->end());
}

void GrammarMatcher::initial_state() {
    nodes_.clear();
    std::fill(slots_.begin(), slots_.end(), 0);
    history_.clear();
    State s;
    begin_expansion();
    for (uint32_t a : g_->alternatives(g_->root())) expand(a, kNone, &s.stacks, 0);
    std::sort(s.stacks.begin(), s.stacks.end());
    s.pool_mark = nodes_.size();
    history_.push_back(std::move(s));
}

bool GrammarMatcher::is_accepted() const {
    const State& s = history_.back();
    return !s.terminated && !s.stacks.empty() && s.stacks.back() == kNone;
}

bool GrammarMatcher::advance_state_bytes(std::string_view bytes, std::vector<uint32_t>* stacks) {
    std::vector<uint32_t>& a = scratch_a_;
    std::vector<uint32_t>& b = scratch_b_;
    a = *stacks;
    for (char c : bytes) {
        overflow_ = false;
        step(a, static_cast<uint8_t>(c), &b);
        if (b.empty() || overflow_) return false;
        std::swap(a, b);
    }
    *stacks = a;
    return true;
}

bool GrammarMatcher::advance(int32_t token_id) {
    const State& cur = history_.back();
    if (cur.terminated || token_id < 0 || token_id >= compiled_->vocab().size()) return false;
    if (compiled_->vocab().is_stop(token_id)) {
        if (!is_accepted()) return false;
        State s{cur.stacks, nodes_.size(), true};
        history_.push_back(std::move(s));
        return true;
    }
    std::string_view bytes = compiled_->vocab().token_bytes(token_id);
    if (bytes.empty()) return false;
    return advance_bytes(bytes);
}

bool GrammarMatcher::advance_bytes(std::string_view bytes) {
    const State& cur = history_.back();
    if (cur.terminated) return false;
    size_t mark = nodes_.size();
    std::vector<uint32_t> stacks = cur.stacks;
    if (!advance_state_bytes(bytes, &stacks)) {
        truncate_pool(mark);
        return false;
    }
    history_.push_back(State{std::move(stacks), nodes_.size(), false});
    return true;
}

Status GrammarMatcher::rollback(int n) {
    if (n < 0 || n > num_steps()) {
        return out_of_range("rollback(" + std::to_string(n) + ") past the " +
                            std::to_string(num_steps()) + " steps taken");
    }
    history_.resize(history_.size() - n);
    truncate_pool(history_.back().pool_mark);
    return Status::ok();
}

std::string GrammarMatcher::state_key(std::span<const uint32_t> stacks) const {
    std::vector<std::vector<uint32_t>> chains;
    chains.reserve(stacks.size());
    for (uint32_t id : stacks) {
        std::vector<uint32_t> chain;
        for (uint32_t n = id; n != kNone; n = nodes_[n].parent) chain.push_back(nodes_[n].pos);
        chains.push_back(std::move(chain));
    }
    std::sort(chains.begin(), chains.end());
    std::string key;
    for (const auto& c : chains) {
        key.append(reinterpret_cast<const char*>(c.data()), c.size() * sizeof(uint32_t));
        uint32_t sep = kNone;
        key.append(reinterpret_cast<const char*>(&sep), sizeof(sep));
    }
    return key;
}

void GrammarMatcher::fill_mask(TokenBitmask* mask) {
    const State& cur = history_.back();
    if (cur.terminated) {
        mask->clear();
        return;
    }
    std::string key = state_key(cur.stacks);
    if (compiled_->lookup_mask(key, mask)) return;
    fill_mask_uncached(mask);
    compiled_->store_mask(key, *mask);
}

void GrammarMatcher::ensure_levels() {
    size_t depth_cap = static_cast<size_t>(compiled_->vocab().max_token_bytes()) + 1;
    if (levels_.size() < depth_cap) {
        levels_.resize(depth_cap);
        level_marks_.resize(depth_cap);
        ctx_.resize(depth_cap);
        sid_.resize(depth_cap);
    }
}

void GrammarMatcher::plain_walk_mask(TokenBitmask* mask) {
    mask->clear();
    const State& cur = history_.back();
    if (cur.terminated) return;
    if (is_accepted()) {
        for (int32_t s : compiled_->vocab().stop_ids()) mask->set(s);
    }
    walk_trie(cur.stacks, mask);
}

size_t GrammarMatcher::VecHash::operator()(const std::vector<uint32_t>& v) const {
    uint64_t h = v.size();
    for (uint32_t x : v) h = hash_pair(static_cast<uint32_t>(h), x) ^ (h >> 17);
    return static_cast<size_t>(h);
}

void GrammarMatcher::memo_begin() {
    memo_mark_ = nodes_.size();
    memo_states_.clear();
    memo_first_.clear();
    memo_index_.clear();
    num_memo_trans_states_ = 0;
    memo_intern({});  // id 0: the dead state
    memo_active_ = true;
}

void GrammarMatcher::memo_end() {
    subtree_cache_.clear();
    subtree_bytes_ = 0;
    memo_states_.clear();
    memo_first_.clear();
    memo_index_.clear();
    num_memo_trans_states_ = 0;
    memo_active_ = false;
    truncate_pool(memo_mark_);
}

uint32_t GrammarMatcher::memo_intern(const std::vector<uint32_t>& stacks) {
    // Look up before inserting: most transitions lead to a known state, and inserting
    // copies the key.
    auto found = memo_index_.find(stacks);
    if (found != memo_index_.end()) return found->second;
    const uint32_t id = static_cast<uint32_t>(memo_states_.size());
    memo_index_.emplace(stacks, id);
    memo_states_.push_back(stacks);
    ByteSet first;
    for (uint32_t n : stacks) {
        if (n == kNone) continue;
        const ByteSet& c = (*classes_)[Grammar::payload((*elems_)[nodes_[n].pos])];
        for (int w = 0; w < 4; ++w) first.words[w] |= c.words[w];
    }
    memo_first_.push_back(first);
    if ((id >> kTransBlockShift) >= memo_trans_.size()) {
        memo_trans_.emplace_back(size_t{256} << kTransBlockShift);
    }
    std::fill_n(&trans(id, 0), 256, kUnknownTrans);
    ++num_memo_trans_states_;
    return id;
}

uint32_t GrammarMatcher::memo_step(uint32_t sid, uint8_t b) {
    uint32_t t = trans(sid, b);
    if (t != kUnknownTrans) return t;
    // No stack takes `b`: dead, and nothing was expanded, so no path reached the
    // caller. Most trie children of a node are such bytes; skipping step() for them
    // matters for states of many stacks (an object's remaining optional keys).
    if (!memo_first_[sid].test(b)) {
        trans(sid, b) = 0;
        return 0;
    }
    overflow_ = false;
    reached_context_ = false;
    step(memo_states_[sid], b, &scratch_a_);
    uint32_t next = overflow_ || scratch_a_.empty() ? 0 : memo_intern(scratch_a_);
    t = next | (reached_context_ ? kCtxBit : 0);
    trans(sid, b) = t;
    return t;
}

template <class Live, class Dead, class Enter>
void GrammarMatcher::walk(std::span<const uint32_t> stacks, bool memo, Live on_live, Dead on_dead,
                          Enter on_enter, int first_byte) {
    const auto& trie = compiled_->vocab().trie();
    ensure_levels();
    size_t base_mark = nodes_.size();
    if (memo) {
        sid_[0] = memo_intern(std::vector<uint32_t>(stacks.begin(), stacks.end()));
    } else {
        levels_[0].assign(stacks.begin(), stacks.end());
    }
    level_marks_[0] = base_mark;
    ctx_[0] = 0;
    // Quick prune: first bytes any stack can take.
    ByteSet first;
    for (uint32_t id : stacks) {
        if (id == kNone) continue;
        const ByteSet& c = (*classes_)[Grammar::payload((*elems_)[nodes_[id].pos])];
        for (int w = 0; w < 4; ++w) first.words[w] |= c.words[w];
    }
    if (first_byte >= 0) {
        const bool takes = first.test(static_cast<uint8_t>(first_byte));
        first = ByteSet();
        if (takes) first.set(static_cast<uint8_t>(first_byte));
    }
    uint32_t n = static_cast<uint32_t>(trie.size() - 1);
    uint32_t i = 0;
    while (i < n) {
        const auto& t = trie[i];
        if (t.depth == 1 && !first.test(t.byte)) {
            i = t.subtree_end;
            continue;
        }
        size_t d = t.depth;
        bool live;
        if (memo) {
            // Interned states and memoised transitions: a lazily built DFA.
            uint32_t r = memo_step(sid_[d - 1], t.byte);
            sid_[d] = r & ~kCtxBit;
            ctx_[d] = ctx_[d - 1] | static_cast<uint8_t>(r >> 31);
            live = sid_[d] != 0;
        } else {
            truncate_pool(level_marks_[d - 1]);
            overflow_ = false;
            reached_context_ = false;
            step(levels_[d - 1], t.byte, &levels_[d]);
            ctx_[d] = ctx_[d - 1] | (reached_context_ ? 1 : 0);
            live = !levels_[d].empty() && !overflow_;
            level_marks_[d] = nodes_.size();
        }
        if (!live) {
            on_dead(i, ctx_[d] != 0);
            i = t.subtree_end;
            continue;
        }
        if (memo && on_enter(i, sid_[d] | (ctx_[d] != 0 ? kCtxBit : 0))) {
            i = t.subtree_end;
            continue;
        }
        on_live(i);
        ++i;
    }
    if (!memo) truncate_pool(base_mark);
}

void GrammarMatcher::walk_trie(std::span<const uint32_t> stacks, TokenBitmask* mask) {
    const auto& trie = compiled_->vocab().trie();
    const auto& trie_tokens = compiled_->vocab().trie_tokens();
    walk(
        stacks, false,
        [&](uint32_t i) {
            for (uint32_t k = trie[i].token_begin; k < trie[i + 1].token_begin; ++k) {
                mask->set(trie_tokens[k]);
            }
        },
        [](uint32_t, bool) {}, [](uint32_t, uint32_t) { return false; });
}

uint32_t GrammarMatcher::table_start(uint32_t pos, size_t levels) {
    const std::vector<uint32_t>& chain = compiled_->continuation(pos);
    const size_t used = std::min(levels, chain.size() - 1);
    uint32_t parent = used == chain.size() - 1 && chain.back() == CompiledGrammar::kChainAccept
                          ? kNone
                          : kContext;
    for (size_t k = used; k-- > 0;) parent = node(chain[k], parent);
    return node(pos, parent);
}

std::unique_ptr<PositionTokens> GrammarMatcher::build_position_tokens(uint32_t pos, size_t levels,
                                                                      int first_byte) {
    const Vocabulary& vocab = compiled_->vocab();
    const auto& trie = vocab.trie();
    const auto& trie_tokens = vocab.trie_tokens();
    std::vector<int32_t> accepted;
    auto table = std::make_unique<PositionTokens>();
    std::string_view prev_uncertain;
    // A session's memo grows with the states seen; restart it past a bound (the
    // subtree results are keyed by its state ids, so they go with it).
    const bool own_session = !memo_active_;
    if (own_session || memo_states_.size() > kMaxMemoStates ||
        subtree_bytes_ > kMaxSubtreeBytes) {
        if (memo_active_) memo_end();
        memo_begin();
    }
    uint32_t start = table_start(pos, levels);
    auto add_uncertain = [&](uint32_t k) {
        std::string_view b = vocab.token_bytes(trie_tokens[k]);
        size_t lcp = 0;
        while (lcp < prev_uncertain.size() && lcp < b.size() && prev_uncertain[lcp] == b[lcp]) {
            ++lcp;
        }
        table->uncertain.push_back(k);
        table->uncertain_lcp.push_back(static_cast<uint8_t>(std::min<size_t>(lcp, 255)));
        prev_uncertain = b;
    };
    // Subtree results by (memo state, trie node): a later walk (another position of
    // this grammar) reaching the same trie node in the same state replays them. Big
    // subtrees only; the typical hit is the rest of a string after a key's first
    // characters.
    struct Open {
        uint64_t key;
        uint32_t end;
        size_t accepted_at;
        size_t uncertain_at;
    };
    std::vector<Open> open;
    auto close_until = [&](uint32_t i) {
        while (!open.empty() && open.back().end <= i) {
            const Open& o = open.back();
            SubtreeResult r;
            r.accepted.assign(accepted.begin() + static_cast<ptrdiff_t>(o.accepted_at), accepted.end());
            r.uncertain.assign(table->uncertain.begin() + static_cast<ptrdiff_t>(o.uncertain_at),
                               table->uncertain.end());
            subtree_bytes_ += (r.accepted.size() + r.uncertain.size()) * 4 + 64;
            subtree_cache_.emplace(o.key, std::move(r));
            open.pop_back();
        }
    };
    walk(
        std::span<const uint32_t>(&start, 1), true,
        [&](uint32_t i) {
            for (uint32_t k = trie[i].token_begin; k < trie[i + 1].token_begin; ++k) {
                accepted.push_back(trie_tokens[k]);
            }
        },
        [&](uint32_t i, bool reached_context) {
            // Nothing inside the rule continues: the subtree's tokens are all rejected,
            // or all depend on the caller.
            close_until(i);
            if (!reached_context) return;
            for (uint32_t k = trie[i].token_begin; k < trie[trie[i].subtree_end].token_begin; ++k) {
                add_uncertain(k);
            }
        },
        [&](uint32_t i, uint32_t state) {
            close_until(i);
            const uint32_t end = trie[i].subtree_end;
            if (trie[end].token_begin - trie[i].token_begin < kMinSubtreeTokens) return false;
            const uint64_t key = (uint64_t{state} << 32) | i;
            auto it = subtree_cache_.find(key);
            if (it == subtree_cache_.end()) {
                open.push_back(Open{key, end, accepted.size(), table->uncertain.size()});
                return false;
            }
            accepted.insert(accepted.end(), it->second.accepted.begin(), it->second.accepted.end());
            for (uint32_t k : it->second.uncertain) add_uncertain(k);
            return true;
        },
        first_byte);
    close_until(UINT32_MAX);
    if (own_session) memo_end();
    set_accepted(std::move(accepted), vocab.size(), table.get());
    return table;
}

void GrammarMatcher::step_candidates(uint32_t pos, size_t levels,
                                     std::span<const uint32_t> candidates,
                                     std::span<const uint8_t> lcps, std::vector<int32_t>* accepted,
                                     PositionTokens* table) {
    // Each candidate is stepped from the deeper stack through the memo session's
    // states (build_position_tokens()'s walk, so its verdicts): alive after its last
    // byte = accepted; dead after some path returned to the (still unknown) caller =
    // uncertain; else rejected. Consecutive candidates share prefixes (trie order).
    const Vocabulary& vocab = compiled_->vocab();
    const auto& trie_tokens = vocab.trie_tokens();
    if (!memo_active_ || memo_states_.size() > kMaxMemoStates ||
        subtree_bytes_ > kMaxSubtreeBytes) {
        if (memo_active_) memo_end();
        memo_begin();
    }
    ensure_levels();
    const uint32_t start = table_start(pos, levels);
    sid_[0] = memo_intern(std::vector<uint32_t>(1, start));
    ctx_[0] = 0;
    std::string_view prev_uncertain;
    auto add_uncertain = [&](uint32_t k, std::string_view b) {
        size_t lcp = 0;
        while (lcp < prev_uncertain.size() && lcp < b.size() && prev_uncertain[lcp] == b[lcp]) {
            ++lcp;
        }
        table->uncertain.push_back(k);
        table->uncertain_lcp.push_back(static_cast<uint8_t>(std::min<size_t>(lcp, 255)));
        prev_uncertain = b;
    };
    size_t valid = 0;  // sid_[0..valid] hold the previous candidate's prefix
    for (size_t u = 0; u < candidates.size(); ++u) {
        const uint32_t k = candidates[u];
        const std::string_view bytes = vocab.token_bytes(trie_tokens[k]);
        size_t d = std::min<size_t>(valid, lcps[u]);
        for (; d < bytes.size(); ++d) {
            if (sid_[d] == 0) break;  // a shared prefix that died
            const uint32_t r = memo_step(sid_[d], static_cast<uint8_t>(bytes[d]));
            sid_[d + 1] = r & ~kCtxBit;
            ctx_[d + 1] = ctx_[d] | static_cast<uint8_t>(r >> 31);
        }
        valid = d;
        if (sid_[d] != 0) {
            accepted->push_back(trie_tokens[k]);
        } else if (ctx_[d] != 0) {
            add_uncertain(k, bytes);
        }
    }
}

std::unique_ptr<PositionTokens> GrammarMatcher::refine_position_tokens(
    uint32_t pos, size_t levels, const PositionTokens& fewer) {
    // Tokens `fewer` accepts or rejects stay so: their paths never leave the rule.
    auto table = std::make_unique<PositionTokens>();
    std::vector<int32_t> accepted;
    append_accepted(fewer, &accepted);
    step_candidates(pos, levels, fewer.uncertain, fewer.uncertain_lcp, &accepted, table.get());
    set_accepted(std::move(accepted), compiled_->vocab().size(), table.get());
    return table;
}

std::unique_ptr<PositionTokens> GrammarMatcher::narrow_position_tokens(
    uint32_t pos, size_t levels, size_t max_bytes, const PositionTokens& longer) {
    // Tokens of at most max_bytes bytes keep `longer`'s verdicts; those it rejects stay
    // rejected (pos accepts a subset). The rest -- its uncertain ones and the long ones
    // it accepts -- are stepped, collected in trie order through a bit per trie token.
    const Vocabulary& vocab = compiled_->vocab();
    const auto& trie_tokens = vocab.trie_tokens();
    const std::span<const uint32_t> long_tokens = vocab.trie_tokens_longer_than(max_bytes);
    std::vector<uint64_t> picked((trie_tokens.size() + 63) / 64, 0);
    auto pick = [&](uint32_t k) { picked[k >> 6] |= uint64_t{1} << (k & 63); };
    for (uint32_t k : longer.uncertain) pick(k);
    auto table = std::make_unique<PositionTokens>();
    std::vector<int32_t> accepted;
    if (!longer.accepted_bits.empty()) {
        table->accepted_bits = longer.accepted_bits;
        for (uint32_t k : long_tokens) {
            const int32_t id = trie_tokens[k];
            uint64_t& w = table->accepted_bits[id >> 6];
            const uint64_t bit = uint64_t{1} << (id & 63);
            if ((w & bit) != 0) {
                w &= ~bit;
                pick(k);
            }
        }
    } else {
        for (uint32_t k : long_tokens) {
            if (std::binary_search(longer.accepted_ids.begin(), longer.accepted_ids.end(),
                                   trie_tokens[k])) {
                pick(k);
            }
        }
        for (int32_t id : longer.accepted_ids) {
            if (vocab.token_bytes(id).size() <= max_bytes) accepted.push_back(id);
        }
    }
    std::vector<uint32_t> candidates;
    std::vector<uint8_t> lcps;
    std::string_view prev;
    for (size_t w = 0; w < picked.size(); ++w) {
        for (uint64_t bits = picked[w]; bits != 0; bits &= bits - 1) {
            const uint32_t k = static_cast<uint32_t>(w * 64 + std::countr_zero(bits));
            const std::string_view b = vocab.token_bytes(trie_tokens[k]);
            size_t lcp = 0;
            while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
            candidates.push_back(k);
            lcps.push_back(static_cast<uint8_t>(std::min<size_t>(lcp, 255)));
            prev = b;
        }
    }
    step_candidates(pos, levels, candidates, lcps, &accepted, table.get());
    if (!table->accepted_bits.empty()) {
        for (int32_t id : accepted) table->accepted_bits[id >> 6] |= uint64_t{1} << (id & 63);
    } else {
        set_accepted(std::move(accepted), vocab.size(), table.get());
    }
    return table;
}

std::unique_ptr<PositionTokens> GrammarMatcher::from_longer_link(uint32_t pos) {
    const uint32_t longer_pos = compiled_->longer_link_position(pos);
    if (longer_pos == CompiledGrammar::kNoPosition) return nullptr;
    // Recursive: O_{k+1}'s table comes from O_{k+2}'s, up to the first link whose table
    // is shared as the unbounded loop's (or the repetition's first link).
    const PositionTokens* longer = table_for(longer_pos);
    if (longer == nullptr) return nullptr;
    return compiled_->narrow_table(pos, SIZE_MAX, compiled_->link_items_at(pos), *longer);
}

std::shared_ptr<const PositionTokens> GrammarMatcher::cached_or_built(uint32_t pos,
                                                                      size_t levels) {
    std::string key = compiled_->position_key(pos, levels);
    PositionTableCache& cache = compiled_->table_cache();
    std::shared_ptr<const PositionTokens> table;
    if (!key.empty()) table = cache.find(key);
    if (table) return table;
    // Walking the vocabulary for a wide class costs milliseconds (~7 ms for a key's
    // first character in an object with additional properties: each object, with its
    // own later members, has a table of its own, and large objects none shared).
    // Instead, refine the table with an unknown caller, whose per-byte parts are
    // shared by every such position (issue 21: the slowest mask steps).
    std::shared_ptr<const PositionTokens> fewer = levels > 0 ? by_first_byte(pos) : nullptr;
    if (fewer != nullptr && fewer->uncertain.size() <= kMaxRefineTokens) {
        table = compiled_->continuation(pos).size() <= 1
                    ? fewer
                    : compiled_->refine_table(pos, levels, *fewer);
    } else {
        table = compiled_->build_table(pos, levels);
    }
    if (!key.empty()) table = cache.insert(key, std::move(table));
    return table;
}

std::shared_ptr<const PositionTokens> GrammarMatcher::by_first_byte(uint32_t pos) {
    const ByteSet& cls = (*classes_)[Grammar::payload((*elems_)[pos])];
    int num_bytes = 0;
    for (uint64_t w : cls.words) num_bytes += std::popcount(w);
    if (num_bytes < kMinSplitBytes) return nullptr;
    const std::string key = compiled_->position_key(pos, 0, -1, kMaxSplitKeyBytes);
    if (key.empty()) return nullptr;
    PositionTableCache& cache = compiled_->table_cache();
    if (auto whole = cache.find(key)) return whole;
    // Tokens of different first bytes lie in disjoint trie subtrees: the tables add
    // up, and an uncertain token's shared prefix never spans two of them.
    auto table = std::make_unique<PositionTokens>();
    std::vector<int32_t> accepted;
    for (int b = 0; b < 256; ++b) {
        if (!cls.test(static_cast<uint8_t>(b))) continue;
        const std::string byte_key = compiled_->position_key(pos, 0, b, kMaxSplitKeyBytes);
        std::shared_ptr<const PositionTokens> part = cache.find(byte_key);
        if (part == nullptr) part = cache.insert(byte_key, compiled_->build_table(pos, 0, b));
        append_accepted(*part, &accepted);
        table->uncertain.insert(table->uncertain.end(), part->uncertain.begin(),
                                part->uncertain.end());
        table->uncertain_lcp.insert(table->uncertain_lcp.end(), part->uncertain_lcp.begin(),
                                    part->uncertain_lcp.end());
    }
    set_accepted(std::move(accepted), compiled_->vocab().size(), table.get());
    return cache.insert(key, std::move(table));
}

std::unique_ptr<PositionTokens> GrammarMatcher::run_tokens(uint32_t pos) {
    const std::vector<uint32_t>& elems = *elems_;
    size_t run = 0;
    while (Grammar::tag(elems[pos + run]) == Grammar::kTagClass) ++run;
    if (run < 2) return nullptr;
    // A token that ends where the rule ends is left uncertain (as a walk would
    // decide it through the caller).
    const bool ends_rule = elems[pos + run] == Grammar::kEnd;
    const Vocabulary& vocab = compiled_->vocab();
    const auto& trie = vocab.trie();
    const auto& trie_tokens = vocab.trie_tokens();
    auto table = std::make_unique<PositionTokens>();
    std::vector<int32_t> accepted;
    std::string_view prev;
    auto add_uncertain = [&](uint32_t k) {
        std::string_view b = vocab.token_bytes(trie_tokens[k]);
        size_t lcp = 0;
        while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
        table->uncertain.push_back(k);
        table->uncertain_lcp.push_back(static_cast<uint8_t>(std::min<size_t>(lcp, 255)));
        prev = b;
    };
    size_t visited = 0;
    // Trie nodes in pre-order: the children of a range are found by skipping subtrees.
    struct Frame {
        uint32_t next, end;
        size_t depth;
    };
    std::vector<Frame> frames = {{0, static_cast<uint32_t>(trie.size() - 1), 0}};
    while (!frames.empty()) {
        Frame& f = frames.back();
        if (f.next >= f.end) {
            frames.pop_back();
            continue;
        }
        const uint32_t j = f.next;
        const size_t d = f.depth;
        f.next = trie[j].subtree_end;
        if (++visited > kMaxRunNodes) return nullptr;
        const ByteSet& cls = (*classes_)[Grammar::payload(elems[pos + d])];
        if (!cls.test(trie[j].byte)) continue;  // leaves the run: rejected
        const bool last = d + 1 == run;
        for (uint32_t k = trie[j].token_begin; k < trie[j + 1].token_begin; ++k) {
            if (last && ends_rule) {
                add_uncertain(k);
            } else {
                accepted.push_back(trie_tokens[k]);
            }
        }
        if (!last) {
            frames.push_back({j + 1, trie[j].subtree_end, d + 1});  // f is stale now
            continue;
        }
        const uint32_t deeper_begin = trie[j + 1].token_begin;
        const uint32_t deeper_end = trie[trie[j].subtree_end].token_begin;
        if (table->uncertain.size() + (deeper_end - deeper_begin) > kMaxRunUncertain) {
            return nullptr;
        }
        for (uint32_t k = deeper_begin; k < deeper_end; ++k) add_uncertain(k);
    }
    if (table->uncertain.size() > kMaxRunUncertain) return nullptr;
    set_accepted(std::move(accepted), vocab.size(), table.get());
    return table;
}

const PositionTokens* GrammarMatcher::table_for(uint32_t pos) {
    if (const PositionTokens* t = compiled_->position_tokens(pos)) return t;
    // A run of classes (a key literal and its ':'; the rest of a literal) needs no
    // key and no walk: the trie along the run decides its tokens (issue 21: such
    // positions, one per optional member of an object at each member boundary and
    // one per character inside a key, were most of the new tables of the p99 steps).
    if (std::unique_ptr<PositionTokens> run = run_tokens(pos)) {
        return compiled_->store_position_tokens(pos, std::move(run));
    }
    if (std::unique_ptr<PositionTokens> narrowed = from_longer_link(pos)) {
        return compiled_->store_position_tokens(pos, std::move(narrowed));
    }
    // First from one level of the position's static continuation (then an unknown
    // caller): such tables are small to key, so they are shared by every grammar with
    // the same rule (a JSON string, a number), and walks from different positions that
    // reach the same rule meet the same states. When many tokens still depend on the
    // caller (a rule that returns after one character), build again from the whole
    // static continuation.
    constexpr size_t kMaxSharedUncertain = 1024;
    std::shared_ptr<const PositionTokens> table = cached_or_built(pos, 1);
    if (table->uncertain.size() > kMaxSharedUncertain &&
        compiled_->continuation(pos).size() > 2) {
        table = cached_or_built(pos, SIZE_MAX);
    }
    return compiled_->store_position_tokens(pos, std::move(table));
}

void GrammarMatcher::precompute() {
    for (uint32_t pos : compiled_->class_positions()) {
        if (table_for(pos) == nullptr) break;  // memory bound reached
    }
}

void GrammarMatcher::check_uncertain(uint32_t id, const PositionTokens& t, TokenBitmask* mask) {
    const Vocabulary& vocab = compiled_->vocab();
    const auto& trie_tokens = vocab.trie_tokens();
    ensure_levels();
    size_t base_mark = nodes_.size();
    levels_[0].assign(1, id);
    level_marks_[0] = base_mark;
    size_t valid = 0;                    // levels_[0..valid] hold the previous token's prefix
    size_t fail_at = SIZE_MAX;           // the previous token's first fatal prefix length
    for (size_t u = 0; u < t.uncertain.size(); ++u) {
        int32_t tok = trie_tokens[t.uncertain[u]];
        size_t lcp = t.uncertain_lcp[u];
        if (fail_at <= lcp) continue;  // shares a prefix no stack takes
        fail_at = SIZE_MAX;
        valid = std::min(valid, lcp);
        if (mask->test(tok)) continue;
        std::string_view bytes = vocab.token_bytes(tok);
        truncate_pool(level_marks_[valid]);
        size_t d = valid;
        for (; d < bytes.size(); ++d) {
            overflow_ = false;
            step(levels_[d], static_cast<uint8_t>(bytes[d]), &levels_[d + 1]);
            if (levels_[d + 1].empty() || overflow_) break;
            level_marks_[d + 1] = nodes_.size();
        }
        if (d == bytes.size()) {
            mask->set(tok);
            valid = d;
        } else {
            fail_at = d + 1;
            valid = d;
        }
    }
    truncate_pool(base_mark);
}

void GrammarMatcher::fill_mask_uncached(TokenBitmask* mask) {
    mask->clear();
    const State& cur = history_.back();
    if (cur.terminated) return;
    if (is_accepted()) {
        for (int32_t s : compiled_->vocab().stop_ids()) mask->set(s);
    }
    auto words = mask->words();
    uint32_t prev_pos = kNone;
    for (uint32_t id : cur.stacks) {
        if (id == kNone) continue;
        uint32_t pos = nodes_[id].pos;
        const PositionTokens* t = table_for(pos);
        if (t == nullptr) {
            walk_trie(std::span<const uint32_t>(&id, 1), mask);
            continue;
        }
        if (pos != prev_pos) {  // stacks are sorted by node id, so equal tops often adjoin
            if (!t->accepted_bits.empty()) {
                for (size_t w = 0; w < words.size(); ++w) words[w] |= t->accepted_bits[w];
            } else {
                for (int32_t a : t->accepted_ids) mask->set(a);
            }
            prev_pos = pos;
        }
        check_uncertain(id, *t, mask);
    }
}

int GrammarMatcher::fill_draft_masks(std::span<const int32_t> draft,
                                     std::span<TokenBitmask> masks) {
    DSI_CHECK(masks.size() == draft.size() + 1, "fill_draft_masks: need draft.size() + 1 masks");
    int accepted = 0;
    fill_mask(&masks[0]);
    for (size_t i = 0; i < draft.size(); ++i) {
        if (accepted == static_cast<int>(i) && advance(draft[i])) {
            ++accepted;
            fill_mask(&masks[i + 1]);
        } else {
            masks[i + 1].clear();
        }
    }
    DSI_CHECK(rollback(accepted).is_ok());
    return accepted;
}

}  // namespace dsi::grammar

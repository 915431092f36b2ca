#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

namespace dsi::grammar {

namespace {
// Tokens longer than this never enter the trie (depth is a uint8_t); none of the
// DeepSeek V3 vocabulary comes close.
constexpr size_t kMaxTrieDepth = 255;
}  // namespace

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(
    const Tokenizer& tokenizer, const std::vector<int32_t>& extra_stop_ids) {
    std::vector<std::string> tokens(tokenizer.vocab_size());
    std::vector<int32_t> stops = extra_stop_ids;
    if (tokenizer.eos_id() >= 0) stops.push_back(tokenizer.eos_id());
    for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
        // Added tokens (specials, placeholders) are never text under a grammar.
        if (tokenizer.is_added(id) || tokenizer.is_special(id)) continue;
        tokens[id] = std::string(tokenizer.token_bytes(id));
    }
    return from_tokens(std::move(tokens), std::move(stops));
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokens(std::vector<std::string> tokens,
                                                          std::vector<int32_t> stop_ids) {
    auto v = std::shared_ptr<Vocabulary>(new Vocabulary());
    v->tokens_ = std::move(tokens);
    std::sort(stop_ids.begin(), stop_ids.end());
    stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
    for (int32_t s : stop_ids) {
        if (s >= 0 && s < v->size()) {
            v->stop_ids_.push_back(s);
            v->tokens_[s].clear();  // a stop id is never text
        }
    }
    v->build();
    return v;
}

bool Vocabulary::is_stop(int32_t id) const {
    return std::binary_search(stop_ids_.begin(), stop_ids_.end(), id);
}

void Vocabulary::build() {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint8_t b) {
        h ^= b;
        h *= 1099511628211ull;
    };
    std::vector<int32_t> order;
    for (int32_t id = 0; id < size(); ++id) {
        for (char c : tokens_[id]) mix(static_cast<uint8_t>(c));
        mix(0xFF);
        mix(0xFE);
        if (!tokens_[id].empty() && tokens_[id].size() <= kMaxTrieDepth) order.push_back(id);
    }
    for (int32_t s : stop_ids_) {
        for (int k = 0; k < 4; ++k) mix(static_cast<uint8_t>(s >> (8 * k)));
    }
    fingerprint_ = h;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return tokens_[a] != tokens_[b] ? tokens_[a] < tokens_[b] : a < b;
    });
    // Pre-order trie from the sorted list: a token shares with its predecessor the
    // nodes of their common prefix; new nodes are appended for the rest.
    std::vector<uint32_t> path;  // node index per depth-1 along the current token
    std::string_view prev;
    for (int32_t id : order) {
        std::string_view t = tokens_[id];
        size_t common = 0;
        while (common < prev.size() && common < t.size() && prev[common] == t[common]) ++common;
        path.resize(common);
        for (size_t d = common; d < t.size(); ++d) {
            path.push_back(static_cast<uint32_t>(trie_.size()));
            trie_.push_back(TrieNode{static_cast<uint8_t>(t[d]), static_cast<uint8_t>(d + 1), 0,
                                     static_cast<uint32_t>(trie_tokens_.size())});
        }
        trie_tokens_.push_back(id);
        max_token_bytes_ = std::max(max_token_bytes_, static_cast<int>(t.size()));
        prev = t;
    }
    // Token ranges: node i owns tokens [token_begin(i), token_begin(i+1)) only when
    // they end at i; tokens were appended right after their last node was created or
    // found, so fix up: a node's range is the tokens appended while it was the
    // deepest node of the path. Recompute explicitly.
    std::vector<uint32_t> owner(trie_tokens_.size());
    {
        std::vector<uint32_t> p;
        std::string_view pv;
        size_t node_count = 0, k = 0;
        for (int32_t id : order) {
            std::string_view t = tokens_[id];
            size_t common = 0;
            while (common < pv.size() && common < t.size() && pv[common] == t[common]) ++common;
            p.resize(common);
            for (size_t d = common; d < t.size(); ++d) p.push_back(static_cast<uint32_t>(node_count++));
            owner[k++] = p.back();
            pv = t;
        }
    }
    // Tokens are in pre-order of their owner already (sorted bytes): token_begin(i) =
    // first token whose owner >= i.
    size_t k = 0;
    for (uint32_t i = 0; i < trie_.size(); ++i) {
        while (k < owner.size() && owner[k] < i) ++k;
        trie_[i].token_begin = static_cast<uint32_t>(k);
    }
    trie_.push_back(TrieNode{0, 0, 0, static_cast<uint32_t>(trie_tokens_.size())});
    // Subtree ends: the next node with depth <= this depth.
    std::vector<uint32_t> st;
    uint32_t n = static_cast<uint32_t>(trie_.size() - 1);
    for (uint32_t i = 0; i < n; ++i) {
        while (!st.empty() && trie_[st.back()].depth >= trie_[i].depth) {
            trie_[st.back()].subtree_end = i;
            st.pop_back();
        }
        st.push_back(i);
    }
    for (uint32_t i : st) trie_[i].subtree_end = n;
    by_length_.resize(trie_tokens_.size());
    for (uint32_t i = 0; i < by_length_.size(); ++i) by_length_[i] = i;
    auto len = [&](uint32_t i) { return tokens_[trie_tokens_[i]].size(); };
    std::stable_sort(by_length_.begin(), by_length_.end(),
                     [&](uint32_t a, uint32_t b) { return len(a) > len(b); });
    num_longer_.assign(static_cast<size_t>(max_token_bytes_) + 1, 0);
    for (uint32_t i : by_length_) {
        for (size_t b = 0; b < len(i); ++b) ++num_longer_[b];
    }
}

}  // namespace dsi::grammar

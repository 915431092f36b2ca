// Vocabulary: the tokenizer's tokens as the grammar matcher sees them — raw bytes
// per id, the ids that end a sequence (EOS), ids never allowed under a grammar
// (special / added tokens other than the stop ids), and a byte trie over all
// allowed tokens in pre-order for the mask walk (matcher.h). Built once per
// tokenizer and shared by every compiled grammar for it (shared_ptr: many compiled
// grammars and the compile service hold it; lifetime is the longest holder's).
//
// Thread model: immutable after construction; any number of threads may read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsi::grammar {

class Vocabulary {
public:
    // Tokens of `tokenizer`; stop ids = its eos_id() plus `extra_stop_ids`.
    static std::shared_ptr<const Vocabulary> from_tokenizer(
        const Tokenizer& tokenizer, const std::vector<int32_t>& extra_stop_ids = {});
    // For tests: token i has bytes tokens[i]; empty bytes = never allowed.
    static std::shared_ptr<const Vocabulary> from_tokens(std::vector<std::string> tokens,
                                                         std::vector<int32_t> stop_ids);

    int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
    std::string_view token_bytes(int32_t id) const { return tokens_[id]; }
    const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
    bool is_stop(int32_t id) const;
    // Identifies the vocabulary (hash of every token's bytes and the stop ids); part
    // of the compile-service cache key.
    uint64_t fingerprint() const { return fingerprint_; }

    // Pre-order byte trie (root excluded). Node i: its byte, its depth (1 = first
    // byte), the index one past its subtree, and the tokens ending exactly there
    // (trie_tokens()[token_begin(i) .. token_begin(i + 1))).
    struct TrieNode {
        uint8_t byte;
        uint8_t depth;
        uint32_t subtree_end;
        uint32_t token_begin;
    };
    const std::vector<TrieNode>& trie() const { return trie_; }
    const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
    int max_token_bytes() const { return max_token_bytes_; }
    // Indices into trie_tokens() of the tokens longer than `num_bytes` bytes, longest
    // first (a bounded repetition narrows a table by them; matcher.cc). The view lives
    // as long as this Vocabulary.
    std::span<const uint32_t> trie_tokens_longer_than(size_t num_bytes) const {
        const size_t n = num_bytes < num_longer_.size() ? num_longer_[num_bytes] : 0;
        return std::span<const uint32_t>(by_length_.data(), n);
    }

private:
    void build();

    std::vector<std::string> tokens_;
    std::vector<int32_t> stop_ids_;
    std::vector<TrieNode> trie_;        // plus one sentinel with token_begin = total
    std::vector<int32_t> trie_tokens_;
    int max_token_bytes_ = 0;
    std::vector<uint32_t> by_length_;   // trie_tokens_ indices, longest first
    std::vector<uint32_t> num_longer_;  // [n]: how many tokens are longer than n bytes
    uint64_t fingerprint_ = 0;
};

}  // namespace dsi::grammar

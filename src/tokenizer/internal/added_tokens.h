// AddedTokenMatcher: finds added tokens (special and not) in text the way Hugging
// Face `tokenizers` AddedVocabulary::find_matches does: a leftmost-longest scan
// (Aho-Corasick LeftmostLongest there, a byte trie here), then the single_word,
// lstrip and rstrip rules. Thread model: immutable after construction; split() is
// const and safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsi::tokenizer_internal {

struct AddedToken {
    int32_t id = -1;
    std::string content;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = true;
    bool special = false;
};

class AddedTokenMatcher {
public:
    AddedTokenMatcher() = default;
    // The tokens to match (one matching phase); pointers must outlive the matcher.
    explicit AddedTokenMatcher(const std::vector<const AddedToken*>& tokens);

    struct Split {
        size_t begin;
        size_t end;
        int32_t id;  // -1: ordinary text
    };
    // Splits `text` into ordinary-text and added-token ranges covering it in order
    // (byte offsets into `text`); appends them to *out. Empty text gives nothing.
    void split(std::string_view text, std::vector<Split>* out) const;

    bool empty() const { return tokens_.empty(); }

private:
    struct Node {
        int32_t token = -1;  // index into tokens_ when a token ends here
        std::vector<std::pair<uint8_t, int32_t>> children;
    };
    // Longest token starting at text[i]: returns its index and sets *end, or -1.
    int32_t longest_at(std::string_view text, size_t i, size_t* end) const;

    std::vector<const AddedToken*> tokens_;
    std::vector<Node> nodes_;
    bool first_byte_[256] = {};
};

}  // namespace dsi::tokenizer_internal

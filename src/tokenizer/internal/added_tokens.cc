#include "tokenizer/internal/added_tokens.h"

#include <algorithm>

#include "tokenizer/internal/unicode.h"

namespace dsi::tokenizer_internal {
namespace {

// Class of the last code point of text[0, end) (valid UTF-8), 0 when empty.
uint16_t class_before(std::string_view text, size_t end) {
    if (end == 0) return 0;
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
    size_t len;
    return class_at(text.data(), i, &len);
}

uint16_t class_after(std::string_view text, size_t begin) {
    if (begin >= text.size()) return 0;
    size_t len;
    return class_at(text.data(), begin, &len);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens)
    : tokens_(tokens) {
    nodes_.emplace_back();
    for (size_t t = 0; t < tokens_.size(); ++t) {
        const std::string& s = tokens_[t]->content;
        if (s.empty()) continue;
        first_byte_[static_cast<uint8_t>(s[0])] = true;
        int32_t node = 0;
        for (char ch : s) {
            const auto b = static_cast<uint8_t>(ch);
            int32_t child = -1;
            for (const auto& [label, to] : nodes_[node].children) {
                if (label == b) child = to;
            }
            if (child < 0) {
                child = static_cast<int32_t>(nodes_.size());
                nodes_[node].children.emplace_back(b, child);
                nodes_.emplace_back();
            }
            node = child;
        }
        // The first of two identical contents wins, like HF's pattern order.
        if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
    }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t i, size_t* end) const {
    int32_t node = 0;
    int32_t best = -1;
    for (size_t j = i; j < text.size(); ++j) {
        const auto b = static_cast<uint8_t>(text[j]);
        int32_t next = -1;
        for (const auto& [label, to] : nodes_[node].children) {
            if (label == b) {
                next = to;
                break;
            }
        }
        if (next < 0) break;
        node = next;
        if (nodes_[node].token >= 0) {
            best = nodes_[node].token;
            *end = j + 1;
        }
    }
    return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Split>* out) const {
    size_t start_offset = 0;
    size_t i = 0;
    while (i < text.size()) {
        if (!first_byte_[static_cast<uint8_t>(text[i])]) {
            ++i;
            continue;
        }
        size_t end = 0;
        const int32_t t = longest_at(text, i, &end);
        if (t < 0) {
            ++i;
            continue;
        }
        const AddedToken& tok = *tokens_[t];
        size_t start = i;
        size_t stop = end;
        i = end;  // the scan resumes after the match, kept or not
        if (tok.single_word) {
            // HF: discard unless bounded by non-word characters (Rust-regex \w).
            const bool start_space = start == 0 || !(class_before(text, start) & kWord);
            const bool stop_space = stop == text.size() || !(class_after(text, stop) & kWord);
            if (!start_space || !stop_space) continue;
        }
        if (tok.lstrip) {
            size_t s = start;
            while (s > start_offset) {
                size_t p = s - 1;
                while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
                size_t len;
                if (!(class_at(text.data(), p, &len) & kSpace)) break;
                s = p;
            }
            start = s;
        }
        if (tok.rstrip) {
            while (stop < text.size()) {
                size_t len;
                if (!(class_at(text.data(), stop, &len) & kSpace)) break;
                stop += len;
            }
            // HF resumes its scan at the match end even when rstrip took the
            // spaces after it; resuming after them avoids overlapping splits.
            i = stop;
        }
        if (start_offset < start) out->push_back({start_offset, start, -1});
        out->push_back({start, stop, tok.id});
        start_offset = stop;
    }
    if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

}  // namespace dsi::tokenizer_internal

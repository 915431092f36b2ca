// BpeModel: byte-level BPE over token ids. A piece of raw bytes starts as one
// symbol per byte (the byte-level alphabet's token id) and pairs are merged in
// rank order, lowest rank first and leftmost first among equal ranks, exactly as
// Hugging Face `tokenizers` merges a word. Short pieces use an in-place O(n^2)
// scan (fast for the usual 2-16 bytes); long ones a heap over a linked list.
//
// Two shortcuts, both exact: a piece that is itself a vocab token which BPE
// reproduces as that single token (checked for every token at build) is looked
// up directly; and results of short pieces are memoised in a small per-thread
// direct-mapped cache keyed by (model instance, bytes), so the model itself
// stays immutable.
// Thread model: immutable after build(); encode_piece() is safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dsi::tokenizer_internal {

// The GPT-2 byte-level alphabet: byte -> code point of its printable stand-in.
uint32_t byte_to_char(uint8_t b);
// Inverse of byte_to_char; -1 for code points outside the alphabet.
int byte_of_char(uint32_t cp);
// A raw byte string -> its byte-level spelling (what tokenizer.json's vocab holds).
std::string byte_level_encode(std::string_view raw);

class BpeModel {
public:
    // `vocab` maps byte-level token strings to ids; `merges` are pairs in rank
    // order. Fails with INVALID_ARGUMENT naming the first bad merge or the byte
    // missing from the alphabet.
    static Result<BpeModel> build(const std::unordered_map<std::string, int32_t>& vocab,
                                  const std::vector<std::pair<std::string, std::string>>& merges,
                                  bool ignore_merges);

    // Appends the ids of one pre-token piece (raw bytes, non-empty).
    void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

    // Same without the cache (the reference the cache is tested against).
    void encode_piece_uncached(std::string_view piece, std::vector<int32_t>* out) const;

    size_t num_merges() const { return num_merges_; }

private:
    // Open-addressing pair table, one 64-bit word per slot (2 MiB for DeepSeek
    // V3, so lookups mostly hit cache): bits 0..20 right id, 21..41 left id,
    // 42..63 rank. The merged id is merge_ids_[rank], read only when merging.
    static constexpr int kIdBits = 21;
    static constexpr uint64_t kIdMask = (1ULL << kIdBits) - 1;
    static constexpr uint64_t kKeyMask = (1ULL << (2 * kIdBits)) - 1;
    static constexpr uint64_t kEmpty = ~0ULL;
    static constexpr uint32_t kNoRank = ~0u;
    static constexpr uint32_t kMaxRank = (1u << (64 - 2 * kIdBits)) - 2;

    // Rank and result of merging (left, right); rank kNoRank when no such merge.
    inline uint32_t rank_of(int32_t left, int32_t right) const;
    void insert(int32_t left, int32_t right, uint32_t rank);

    // The id of `piece` when BPE encodes it as exactly one token, else -1.
    int32_t whole_token(std::string_view piece) const;
    void build_whole_tokens(const std::unordered_map<std::string, int32_t>& vocab);
    void merge_small(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;
    void merge_large(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;

    int32_t byte_ids_[256] = {};
    std::vector<uint64_t> table_;
    std::vector<int32_t> merge_ids_;  // by rank
    uint64_t mask_ = 0;
    size_t num_merges_ = 0;
    bool ignore_merges_ = false;
    std::unordered_map<std::string, int32_t> raw_vocab_;  // ignore_merges only
    // Whole-token table: open addressing over (hash, id); raw bytes of id are
    // whole_bytes_[whole_offsets_[i] .. whole_offsets_[i + 1]) for slot i's entry.
    struct WholeSlot {
        uint64_t hash;  // 0: empty
        int32_t id;
        uint32_t entry;
    };
    std::vector<WholeSlot> whole_table_;
    std::string whole_bytes_;
    std::vector<uint32_t> whole_offsets_;
    uint64_t instance_ = 0;  // distinguishes models in the per-thread cache
};

}  // namespace dsi::tokenizer_internal

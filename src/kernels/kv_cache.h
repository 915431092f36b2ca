// KvCache: where the MLA forward pass keeps each token's compressed KV.
//
// MLA caches, per layer and position, the normalised latent c_kv (kv_lora_rank
// floats) followed by the rotated shared rope key k_pe (qk_rope_head_dim floats):
// one "latent row" of kv_lora_rank + qk_rope_head_dim values, stored in the model's
// KV dtype (kernels/attention.h: f32, bf16 or e4m3 with per-16 scales) and so taking
// DeepseekModel::kv_row_floats() 4-byte words; row() points at the row's first word. The engine's paged
// block KV implements this interface over 128-token blocks; ContiguousKvCache is
// one contiguous buffer per sequence. The interface lives here, below both model/
// (which reads and writes rows through it) and kv/ (whose PagedKvCache implements it
// over pool blocks), so neither depends on the other; its block size is the attention
// kernel's tile, the one definition of the 128-token block (S-KV-9).
//
// Hybrid models (DeepSeek V4) keep more than latent rows: a KvLayout names several
// cache groups (each: layers x entries, one entry per 1, 4 or 128 tokens, so a
// compressed-KV group of ratio r holds entry p / r of position p) plus one fixed-size
// per-sequence state slot (sliding-window ring, compressor partial windows). entry()
// addresses any group, state() the slot; row() is group 0 at one entry per token.
// Thread model: owned by one sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "kernels/attention.h"

namespace dsi {

// One cache group of a KvLayout: layers x (one entry per tokens_per_entry positions) x
// floats_per_entry 4-byte words.
struct KvGroupLayout {
    std::string name;
    int64_t num_layers = 0;
    int64_t tokens_per_entry = 1;  // divides kernels::kKvBlockTokens
    int64_t floats_per_entry = 0;
};

// What a model keeps per sequence: paged groups (grow with the sequence, 128-token
// blocks) and one fixed state slot of state_floats words (0: none).
struct KvLayout {
    std::vector<KvGroupLayout> groups;
    int64_t state_floats = 0;
    // Whether the cache of a prefix can be reused by another sequence (or restored after
    // a preemption) from its paged groups alone. False when the state slot depends on
    // the whole history (V4: the window ring and the compressors' partial windows);
    // `not_reusable_reason` then says why, for the engine's log.
    bool prefix_reusable = true;
    std::string not_reusable_reason;
    // Whether a copy of the state slot taken right after a step that ends at a block
    // boundary B, with the paged groups of positions [0, B), resumes the sequence from B
    // bitwise (V4: the lengths, window rings and compressor accumulators are all in the
    // slot and nothing in it depends on where the slot lives). The engine then caches
    // prefixes with such copies (the SWA state cache, docs/swa_cache.md).
    bool state_snapshot_resumes = false;
    // SWA bounded replay (S-SWA, docs/swa_cache.md): the model honours SequenceStep's
    // replay_end, decoder_begin and context (V4.1), so a prefix hit without a stored SWA
    // state replays one unit with truncated attention instead of falling back.
    bool swa_bounded_replay = false;
    // The S-KV-8 stored region of the state slot as [begin, end) float offsets (V4.1:
    // the lengths, the Engram token ids and the encoder layers' window rings). With
    // bounded replay on, the SWA state cache keeps only these words; the rest (the
    // dropped region: decoder windows, partial groups) is rebuilt by replay. Empty: the
    // whole slot is the stored region.
    std::vector<std::pair<int64_t, int64_t>> swa_stored_ranges;
};

class KvCache {
public:
    virtual ~KvCache() = default;
    // Positions [0, capacity()) can be written.
    virtual int64_t capacity() const = 0;
    // REQUIRES: 0 <= layer < num_layers, 0 <= pos < capacity(). The row lives as long
    // as the cache.
    virtual float* row(int64_t layer, int64_t pos) = 0;
    // The entry of `group` holding position `pos` (entry pos / tokens_per_entry).
    // REQUIRES: group < the layout's groups, 0 <= layer < its num_layers, 0 <= pos <
    // capacity(). Default: group 0 is the only group and has one entry per token.
    virtual float* entry(size_t group, int64_t layer, int64_t pos) {
        DSI_CHECK(group == 0, "this cache has one group");
        return row(layer, pos);
    }
    // The sequence's state slot (KvLayout::state_floats words), nullptr when the layout
    // has none. Lives as long as the cache.
    virtual float* state() { return nullptr; }

    // Positions per block of latent_blocks(): the paged KV's block size.
    static constexpr int64_t kLatentBlockTokens = kernels::kKvBlockTokens;
    // The rows of `layer` for positions [0, num_positions) as a block table for
    // kernels/attention.h: `blocks` gets the row of each position b *
    // kLatentBlockTokens; returns the stride in floats between consecutive
    // positions inside one block. Both implementations keep a block's rows evenly
    // spaced (checked). One or two row() calls per block, none per position.
    // REQUIRES: 1 <= num_positions <= capacity().
    int64_t latent_blocks(int64_t layer, int64_t num_positions,
                          std::vector<const float*>& blocks) {
        DSI_CHECK(num_positions >= 1 && num_positions <= capacity());
        const int64_t nb = (num_positions + kLatentBlockTokens - 1) / kLatentBlockTokens;
        blocks.resize(static_cast<size_t>(nb));
        // From the first two rows even when only one is read (a 1-token sequence):
        // the attention kernel checks the stride against the row size.
        const int64_t stride =
            capacity() >= 2 ? static_cast<int64_t>(row(layer, 1) - row(layer, 0)) : 0;
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t p = b * kLatentBlockTokens;
            blocks[static_cast<size_t>(b)] = row(layer, p);
            if (p + 1 < num_positions) {
                DSI_CHECK(row(layer, p + 1) - row(layer, p) == stride);
            }
        }
        return stride;
    }
};

// One buffer per sequence: every group laid out [layer][entry][floats], then the state.
class ContiguousKvCache final : public KvCache {
public:
    // One group of latent rows (one entry per token), no state.
    ContiguousKvCache(int64_t num_layers, int64_t row_floats, int64_t capacity)
        : ContiguousKvCache(KvLayout{{KvGroupLayout{"rows", num_layers, 1, row_floats}}, 0},
                            capacity) {}
    // REQUIRES: every group's tokens_per_entry >= 1.
    ContiguousKvCache(const KvLayout& layout, int64_t capacity) : capacity_(capacity) {
        int64_t floats = 0;
        for (const KvGroupLayout& g : layout.groups) {
            DSI_CHECK(g.tokens_per_entry >= 1);
            const int64_t entries = (capacity + g.tokens_per_entry - 1) / g.tokens_per_entry;
            groups_.push_back({floats, g.num_layers, entries, g.tokens_per_entry, g.floats_per_entry});
            floats += g.num_layers * entries * g.floats_per_entry;
        }
        state_offset_ = floats;
        has_state_ = layout.state_floats > 0;
        data_.resize(static_cast<size_t>(floats + layout.state_floats));
    }

    int64_t capacity() const override { return capacity_; }
    float* row(int64_t layer, int64_t pos) override { return entry(0, layer, pos); }
    float* entry(size_t group, int64_t layer, int64_t pos) override {
        DSI_DCHECK(group < groups_.size());
        const Group& g = groups_[group];
        DSI_DCHECK(layer >= 0 && layer < g.num_layers && pos >= 0 && pos < capacity_);
        return data_.data() + g.offset +
               (layer * g.entries + pos / g.tokens_per_entry) * g.floats_per_entry;
    }
    float* state() override { return has_state_ ? data_.data() + state_offset_ : nullptr; }
    // Bytes of the buffer (every group at full capacity plus the state).
    int64_t bytes() const { return static_cast<int64_t>(data_.size() * sizeof(float)); }

private:
    struct Group {
        int64_t offset, num_layers, entries, tokens_per_entry, floats_per_entry;
    };
    int64_t capacity_;
    std::vector<Group> groups_;
    int64_t state_offset_ = 0;
    bool has_state_ = false;
    std::vector<float> data_;
};

}  // namespace dsi

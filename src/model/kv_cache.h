// KvCache: where the MLA forward pass keeps each token's compressed KV.
//
// MLA caches, per layer and position, the normalised latent c_kv (kv_lora_rank
// floats) followed by the rotated shared rope key k_pe (qk_rope_head_dim floats):
// one "latent row" of kv_lora_rank + qk_rope_head_dim values, stored in the model's
// KV dtype (kernels/attention.h: f32, bf16 or e4m3 with per-16 scales) and so taking
// DeepseekModel::kv_row_floats() 4-byte words; row() points at the row's first word. The engine's paged
// block KV implements this interface over 128-token blocks; ContiguousKvCache is
// one contiguous buffer per sequence. Thread model: owned by one sequence, used by
// one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "base/check.h"

namespace dsi {

class KvCache {
public:
    virtual ~KvCache() = default;
    // Positions [0, capacity()) can be written.
    virtual int64_t capacity() const = 0;
    // REQUIRES: 0 <= layer < num_layers, 0 <= pos < capacity(). The row lives as long
    // as the cache.
    virtual float* row(int64_t layer, int64_t pos) = 0;

    // Positions per block of latent_blocks(): the paged KV's block size.
    static constexpr int64_t kLatentBlockTokens = 128;
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

class ContiguousKvCache final : public KvCache {
public:
    ContiguousKvCache(int64_t num_layers, int64_t row_floats, int64_t capacity)
        : num_layers_(num_layers),
          row_floats_(row_floats),
          capacity_(capacity),
          data_(static_cast<size_t>(num_layers * row_floats * capacity)) {}

    int64_t capacity() const override { return capacity_; }
    float* row(int64_t layer, int64_t pos) override {
        DSI_DCHECK(layer >= 0 && layer < num_layers_ && pos >= 0 && pos < capacity_);
        return data_.data() + (layer * capacity_ + pos) * row_floats_;
    }

private:
    int64_t num_layers_;
    int64_t row_floats_;
    int64_t capacity_;
    std::vector<float> data_;
};

}  // namespace dsi

// KvCache: where the MLA forward pass keeps each token's compressed KV.
//
// MLA caches, per layer and position, the normalised latent c_kv (kv_lora_rank
// floats) followed by the rotated shared rope key k_pe (qk_rope_head_dim floats):
// one "latent row" of kv_lora_rank + qk_rope_head_dim floats. The engine's paged
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

// KvExport: a sequence's published full blocks copied out of the engine's pool for a
// prefill -> decode hand-over (issue 18, docs/cluster.md "KV hand-over"). It holds
// what the KV store would hold for each block (kvstore/block_format.h: key, model,
// dtype, token hash, one byte range per layer), laid out layer-major so one layer of
// every block is one contiguous range on the wire (transfer/: one Begin layer per
// model layer, a State section with the block list). V4 / V4.1 (state-slot layouts):
// one layer per store layer (every cache group's layers, group order; their sizes differ
// by group) and the SWA state at the blocks' end, without which the blocks cannot be
// continued from (docs/cluster.md "V4 / V4.1 hand-over").
// Thread model: an immutable value once made (shared between threads as const).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/swa_pool.h"
#include "kvstore/block_format.h"

namespace dsi::kv {

struct KvExport {
    std::string model_id;  // the cache identity (EngineOptions::model_id)
    uint32_t dtype = 0;    // the store's dtype code
    kvstore::TrafficClass traffic_class = kvstore::TrafficClass::kChatbot;
    uint32_t block_tokens = 0;
    // Per layer: one layer of one block (V2/V3: all equal; V4: by cache group).
    std::vector<uint64_t> layer_block_bytes;
    std::vector<kvstore::StoreKey> keys;    // hash-chain keys, block order
    std::vector<uint64_t> token_hashes;     // kvstore::token_ids_hash per block
    // layers[l]: layer l of block 0, 1, ... (keys.size() * layer_block_bytes[l] bytes),
    // then the tail's rows of that layer (tail_bytes(l)).
    std::vector<std::vector<uint8_t>> layers;
    // The rows past the last full block (V2/V3, one entry per token: issue 18's partial
    // block), 0..block_tokens - 1 of them: the tail block's first tail_tokens rows of every
    // layer, keyed by kv::tail_key after the last full block's key, so the decode engine
    // attaches them only to the same tokens. 0: none (V4 / V4.1 never carry one).
    uint32_t tail_tokens = 0;
    kvstore::StoreKey tail_key;
    uint64_t tail_token_hash = 0;  // kvstore::token_ids_hash of the tail's tokens
    // State-slot layouts: the stored SWA state (slot + seal, as SwaStatePool holds it) at
    // position num_blocks() x block_tokens, keyed by the last block's chain key. Null for
    // V2/V3.
    std::shared_ptr<const SwaState> swa_state;

    size_t num_blocks() const { return keys.size(); }
    uint32_t num_layers() const { return static_cast<uint32_t>(layers.size()); }
    // The tail's bytes of layer l (its rows of one block's layer slice).
    uint64_t tail_bytes(size_t l) const {
        return block_tokens == 0 ? 0 : layer_block_bytes[l] / block_tokens * tail_tokens;
    }
    uint64_t num_tokens() const { return num_blocks() * block_tokens + tail_tokens; }
    // Block and tail bytes of every layer, plus the SWA state's.
    uint64_t bytes() const {
        uint64_t n = swa_state ? swa_state->bytes.size() : 0;
        for (size_t l = 0; l < layer_block_bytes.size(); ++l) {
            n += num_blocks() * layer_block_bytes[l] + tail_bytes(l);
        }
        return n;
    }
    // The store's header fields of block b.
    kvstore::BlockInfo info(size_t b) const {
        kvstore::BlockInfo i;
        i.key = keys[b];
        i.model = kvstore::model_identity(model_id);
        i.num_layers = num_layers();
        i.dtype = dtype;
        i.num_tokens = block_tokens;
        i.token_hash = token_hashes[b];
        i.traffic_class = traffic_class;
        return i;
    }
    // Layer l of block b.
    std::span<const uint8_t> layer(size_t l, size_t b) const {
        return std::span<const uint8_t>(layers[l]).subspan(b * layer_block_bytes[l],
                                                           layer_block_bytes[l]);
    }
};

}  // namespace dsi::kv

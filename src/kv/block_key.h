// BlockKey: the identity of one full 128-token KV block in the prefix index.
//
// A full block's key is a hash chain (S-KV-4):
//   key_i = XXH3-128(key_{i-1} || token ids of block i || salt)
// with key_{-1} = 0. The salt is XXH3-128(model identity, per-request cache_salt), so
// two models, or two tenants with different cache_salt values, never share a key and
// cannot probe each other's prefixes. Matching is on keys only (metadata), never on
// KV contents. Only full blocks have keys; a partial tail block is never shared.
// Thread model: pure functions and value types.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/attention.h"

namespace dsi::kv {

// S-KV-9: storage granularity; every cache kind's block spans this many tokens. The
// one definition is the attention kernel's tile (kernels/attention.h).
inline constexpr int64_t kBlockTokens = kernels::kKvBlockTokens;

// Blocks that hold `tokens` positions.
inline constexpr int64_t blocks_for_tokens(int64_t tokens) {
    return (tokens + kBlockTokens - 1) / kBlockTokens;
}

struct BlockKey {
    uint64_t lo = 0;
    uint64_t hi = 0;
    bool operator==(const BlockKey&) const = default;
};

struct BlockKeyHash {
    size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 31)); }
};

// The salt of a (model, cache_salt) pair. An empty cache_salt is a valid salt of its own.
BlockKey make_salt(std::string_view model_id, std::string_view cache_salt);

// One link of the chain. REQUIRES: tokens.size() == kBlockTokens.
BlockKey chain_key(const BlockKey& parent, std::span<const int32_t> tokens, const BlockKey& salt);

// The key of a partial tail block (1..kBlockTokens - 1 tokens) after the chain's `parent`
// (BlockKey{} for none): a KV hand-over's tail rows are attached only to a sequence whose
// tokens give the same key (issue 18). Never equal to a full block's key (the length is
// hashed too); never in the prefix index.
BlockKey tail_key(const BlockKey& parent, std::span<const int32_t> tokens, const BlockKey& salt);

// Keys of every full block of `tokens` (floor(size / kBlockTokens) keys).
std::vector<BlockKey> chain_keys(std::span<const int32_t> tokens, const BlockKey& salt);

}  // namespace dsi::kv

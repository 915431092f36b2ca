#include "kv/block_key.h"

#include <xxhash.h>

#include <cstring>
#include <string>

#include "base/check.h"

namespace dsi::kv {

BlockKey make_salt(std::string_view model_id, std::string_view cache_salt) {
    // Length-prefixed so ("ab", "c") and ("a", "bc") differ.
    std::string buf;
    const uint64_t n = model_id.size();
    buf.append(reinterpret_cast<const char*>(&n), sizeof n);
    buf.append(model_id);
    buf.append(cache_salt);
    const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
    return {h.low64, h.high64};
}

BlockKey chain_key(const BlockKey& parent, std::span<const int32_t> tokens, const BlockKey& salt) {
    DSI_CHECK_EQ(static_cast<int64_t>(tokens.size()), kBlockTokens);
    // One contiguous buffer: parent || tokens || salt.
    uint8_t buf[sizeof(BlockKey) * 2 + kBlockTokens * sizeof(int32_t)];
    std::memcpy(buf, &parent, sizeof parent);
    std::memcpy(buf + sizeof parent, tokens.data(), tokens.size_bytes());
    std::memcpy(buf + sizeof parent + tokens.size_bytes(), &salt, sizeof salt);
    const XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
    return {h.low64, h.high64};
}

BlockKey tail_key(const BlockKey& parent, std::span<const int32_t> tokens, const BlockKey& salt) {
    DSI_CHECK(!tokens.empty() && static_cast<int64_t>(tokens.size()) < kBlockTokens);
    // parent || tokens || salt || token count (a full block's buffer has no count).
    uint8_t buf[sizeof(BlockKey) * 2 + kBlockTokens * sizeof(int32_t) + sizeof(uint32_t)];
    const auto count = static_cast<uint32_t>(tokens.size());
    size_t n = 0;
    std::memcpy(buf, &parent, sizeof parent);
    n += sizeof parent;
    std::memcpy(buf + n, tokens.data(), tokens.size_bytes());
    n += tokens.size_bytes();
    std::memcpy(buf + n, &salt, sizeof salt);
    n += sizeof salt;
    std::memcpy(buf + n, &count, sizeof count);
    n += sizeof count;
    const XXH128_hash_t h = XXH3_128bits(buf, n);
    return {h.low64, h.high64};
}

std::vector<BlockKey> chain_keys(std::span<const int32_t> tokens, const BlockKey& salt) {
    const size_t n = tokens.size() / kBlockTokens;
    std::vector<BlockKey> keys;
    keys.reserve(n);
    BlockKey parent;
    for (size_t i = 0; i < n; ++i) {
        parent = chain_key(parent, tokens.subspan(i * kBlockTokens, kBlockTokens), salt);
        keys.push_back(parent);
    }
    return keys;
}

}  // namespace dsi::kv

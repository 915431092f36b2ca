// The on-store block format: one full 128-token KV block of one sequence prefix,
// every layer's bytes, behind a versioned, checksummed header.
//
// A block is stored whole (one file, one object, or k+m erasure-coded chunks of it).
// Layout (little-endian, all fields fixed width):
//
//   offset  size  field
//   0       8     magic "DSIKVBLK"
//   8       2     format version (kBlockFormatVersion)
//   10      2     traffic class (TrafficClass; GC reads it from the header)
//   12      4     num_layers            (1 .. kMaxLayers)
//   16      16    key                   (StoreKey: the engine's hash-chain key)
//   32      16    model identity        (XXH3-128 of the model id string)
//   48      4     dtype                 (engine's dtype code, opaque here)
//   52      4     num_tokens            (tokens covered, 1 .. kMaxTokens)
//   56      8     token-id hash         (XXH3-64 of the int32 token ids)
//   64      8     payload bytes         (sum of the layer sizes)
//   72      8     payload checksum      (XXH3-64 of the payload)
//   80      8*L   layer sizes
//   80+8L   8     header checksum       (XXH3-64 of bytes [0, 80+8L))
//   88+8L   ...   payload: layer 0 bytes, layer 1 bytes, ...
//
// Policy: a block that fails any check (size, magic, version, limits, either checksum,
// or a mismatch with what the reader expects: key, model, layers, dtype, tokens) is a
// miss, never used. decode_block() says why in its Status (kDataLoss for damage,
// kFailedPrecondition for a well-formed block of another model/shape).
// Thread model: pure functions and value types.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kvstore/store_key.h"

namespace dsi::kvstore {

inline constexpr uint16_t kBlockFormatVersion = 1;
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxTokens = 1 << 16;
// Refuse blocks above this size (a corrupted length must not make us allocate 1 TB).
inline constexpr uint64_t kMaxBlockBytes = uint64_t{4} << 30;
inline constexpr size_t kFixedHeaderBytes = 80;

// What a block is: identity and shape, checked on every read.
struct BlockInfo {
    StoreKey key;
    StoreKey model;  // model_identity(model_id)
    uint32_t num_layers = 0;
    uint32_t dtype = 0;
    uint32_t num_tokens = 0;
    uint64_t token_hash = 0;  // token_ids_hash(ids); 0 = not checked on read
    TrafficClass traffic_class = TrafficClass::kChatbot;
};

StoreKey model_identity(std::string_view model_id);
uint64_t token_ids_hash(std::span<const int32_t> token_ids);

// Header bytes for `num_layers` layers.
size_t header_bytes(uint32_t num_layers);

// Serialises info + layers. REQUIRES: layers.size() == info.num_layers, within limits
// (else kInvalidArgument).
Result<std::vector<uint8_t>> encode_block(const BlockInfo& info,
                                          std::span<const std::span<const uint8_t>> layers);

// Bytes encode_block would produce for these layers; kInvalidArgument over the limits.
Result<size_t> encoded_size(const BlockInfo& info,
                            std::span<const std::span<const uint8_t>> layers);
// encode_block into memory the caller owns (a shm slot). REQUIRES: dst.size() ==
// *encoded_size(info, layers).
Status encode_block_to(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                       std::span<uint8_t> dst);

// Page-aligned bytes that are never zero-filled: reads land here directly (no memset
// pass over a block that the read overwrites anyway).
class BlockBuffer {
public:
    BlockBuffer() = default;
    // Contents undefined. REQUIRES: n > 0.
    static BlockBuffer allocate(size_t n);
    // Takes a read-only file mapping (mmap of `n` bytes at `addr`); munmap when the
    // buffer goes. The holder never writes to it (the pages are PROT_READ).
    static BlockBuffer adopt_mapping(void* addr, size_t n);
    uint8_t* data() const { return data_.get(); }
    size_t size() const { return size_; }
    std::span<uint8_t> span() const { return {data_.get(), size_}; }
    // Shrinks the visible size (the allocation stays). REQUIRES: n <= size().
    void truncate(size_t n);

private:
    struct Free {
        size_t map_bytes;  // > 0: munmap this length, else free() (value-initialised: 0)
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Free> data_;
    size_t size_ = 0;
};

// The payload checksum computed while a block arrives in order, chunk by chunk: the
// read path hashes each chunk while it is still in cache instead of in a second pass
// over the whole block. Thread model: one owner.
class PayloadHasher {
public:
    PayloadHasher();
    ~PayloadHasher();
    PayloadHasher(PayloadHasher&&) noexcept;
    PayloadHasher& operator=(PayloadHasher&&) noexcept;
    // The next bytes of the encoded block. REQUIRES: chunks in order, contiguous.
    void update(std::span<const uint8_t> chunk);
    // XXH3-64 of the payload seen so far; nullopt when the header's layer count is
    // unusable (decode_block then says why).
    std::optional<uint64_t> digest() const;

private:
    struct State;
    std::unique_ptr<State> s_;
};

// A decoded block: owns the encoded bytes (or, from read_many_into, views bytes the
// caller owns); layer views live as long as the Block (and the caller's buffer).
class Block {
public:
    Block() = default;
    const BlockInfo& info() const { return info_; }
    uint32_t num_layers() const { return info_.num_layers; }
    // REQUIRES: i < num_layers().
    std::span<const uint8_t> layer(uint32_t i) const;
    std::span<const uint8_t> payload() const;
    // The whole encoded block (header + payload), e.g. to copy to another tier.
    std::span<const uint8_t> encoded() const { return bytes_; }
    size_t size_bytes() const { return bytes_.size(); }
    // The verified payload checksum from the header.
    uint64_t payload_checksum() const;
    // False for a view into a caller's buffer (read_many_into).
    bool owns_bytes() const { return !vec_.empty() || buf_.data() != nullptr; }

private:
    friend Result<Block> decode_view(std::span<const uint8_t> bytes, const BlockInfo* expect,
                                     std::optional<uint64_t> payload_hash);
    friend Result<Block> decode_block(std::vector<uint8_t> bytes, const BlockInfo* expect);
    friend Result<Block> decode_block(BlockBuffer bytes, const BlockInfo* expect,
                                      std::optional<uint64_t> payload_hash);
    BlockInfo info_;
    std::vector<uint8_t> vec_;  // owned storage, or
    BlockBuffer buf_;           // owned storage, or neither (a view)
    std::span<const uint8_t> bytes_;
    std::vector<uint64_t> layer_offsets_;  // num_layers + 1 entries, into bytes_
};

// Validates and decodes. With `expect`, the key, model, layer count, dtype, token count
// and (when expect->token_hash != 0) the token hash must match. Never reads past bytes.
Result<Block> decode_block(std::vector<uint8_t> bytes, const BlockInfo* expect);
// Same, over a BlockBuffer; `payload_hash`, when given, is the payload's XXH3-64 already
// computed during the read (PayloadHasher), so the payload is not hashed again.
Result<Block> decode_block(BlockBuffer bytes, const BlockInfo* expect,
                           std::optional<uint64_t> payload_hash = std::nullopt);
// Same checks over bytes the caller owns; the Block is a view that lives as long as
// `bytes`.
Result<Block> decode_view(std::span<const uint8_t> bytes, const BlockInfo* expect,
                          std::optional<uint64_t> payload_hash = std::nullopt);

// Reads only the fixed part of a header (for GC scans): checks magic, version, limits
// and the header checksum when `prefix` holds the whole header; returns the info.
// REQUIRES: nothing; short or bad input is kDataLoss.
Result<BlockInfo> peek_block_info(std::span<const uint8_t> prefix);

}  // namespace dsi::kvstore

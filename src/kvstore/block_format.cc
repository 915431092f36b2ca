// Block encode/decode. Every read path goes through decode_block, so "a block that
// fails any check is a miss" (issue 8) holds for every tier.
#include "kvstore/block_format.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>

#include "kvstore/internal/xxh3_fast.h"

namespace dsi::kvstore {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'I', 'K', 'V', 'B', 'L', 'K'};

template <typename T>
void store_le(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof(T));  // the project targets little-endian hosts only
}

template <typename T>
T load_le(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

StoreKey load_key(const uint8_t* p) { return {load_le<uint64_t>(p), load_le<uint64_t>(p + 8)}; }

void store_key(uint8_t* p, const StoreKey& k) {
    store_le<uint64_t>(p, k.lo);
    store_le<uint64_t>(p + 8, k.hi);
}

// Parses and checks the header in `bytes` (which may be only a prefix of the block).
// On success fills info and layer sizes.
Status parse_header(std::span<const uint8_t> bytes, BlockInfo& info,
                    std::vector<uint64_t>* layer_sizes, uint64_t* payload_bytes,
                    uint64_t* payload_checksum) {
    if (bytes.size() < kFixedHeaderBytes) {
        return data_loss("block shorter than its fixed header");
    }
    const uint8_t* p = bytes.data();
    if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
        return data_loss("bad block magic");
    }
    uint16_t version = load_le<uint16_t>(p + 8);
    if (version != kBlockFormatVersion) {
        return data_loss("unsupported block format version " + std::to_string(version));
    }
    uint16_t cls = load_le<uint16_t>(p + 10);
    if (cls >= kNumTrafficClasses) {
        return data_loss("bad traffic class");
    }
    info.traffic_class = static_cast<TrafficClass>(cls);
    info.num_layers = load_le<uint32_t>(p + 12);
    if (info.num_layers == 0 || info.num_layers > kMaxLayers) {
        return data_loss("layer count out of range");
    }
    size_t hdr = header_bytes(info.num_layers);
    if (bytes.size() < hdr) {
        return data_loss("block shorter than its header");
    }
    info.key = load_key(p + 16);
    info.model = load_key(p + 32);
    info.dtype = load_le<uint32_t>(p + 48);
    info.num_tokens = load_le<uint32_t>(p + 52);
    if (info.num_tokens == 0 || info.num_tokens > kMaxTokens) {
        return data_loss("token count out of range");
    }
    info.token_hash = load_le<uint64_t>(p + 56);
    uint64_t want = load_le<uint64_t>(p + hdr - 8);
    if (XXH3_64bits(p, hdr - 8) != want) {
        return data_loss("header checksum mismatch");
    }
    uint64_t total = load_le<uint64_t>(p + 64);
    if (total > kMaxBlockBytes) {
        return data_loss("payload size over the limit");
    }
    uint64_t sum = 0;
    if (layer_sizes != nullptr) {
        layer_sizes->resize(info.num_layers);
    }
    for (uint32_t i = 0; i < info.num_layers; ++i) {
        uint64_t n = load_le<uint64_t>(p + kFixedHeaderBytes + 8 * i);
        if (n > kMaxBlockBytes) {
            return data_loss("layer size over the limit");
        }
        sum += n;
        if (layer_sizes != nullptr) {
            (*layer_sizes)[i] = n;
        }
    }
    if (sum != total) {
        return data_loss("layer sizes do not add up to the payload size");
    }
    if (payload_bytes != nullptr) {
        *payload_bytes = total;
    }
    if (payload_checksum != nullptr) {
        *payload_checksum = load_le<uint64_t>(p + 72);
    }
    return Status::ok();
}

}  // namespace

StoreKey model_identity(std::string_view model_id) {
    XXH128_hash_t h = XXH3_128bits(model_id.data(), model_id.size());
    return {h.low64, h.high64};
}

uint64_t token_ids_hash(std::span<const int32_t> token_ids) {
    return XXH3_64bits(token_ids.data(), token_ids.size_bytes());
}

size_t header_bytes(uint32_t num_layers) { return kFixedHeaderBytes + 8 * size_t{num_layers} + 8; }

Result<size_t> encoded_size(const BlockInfo& info,
                            std::span<const std::span<const uint8_t>> layers) {
    if (info.num_layers == 0 || info.num_layers > kMaxLayers) {
        return invalid_argument("num_layers out of range");
    }
    if (layers.size() != info.num_layers) {
        return invalid_argument("layers.size() != num_layers");
    }
    if (info.num_tokens == 0 || info.num_tokens > kMaxTokens) {
        return invalid_argument("num_tokens out of range");
    }
    uint64_t total = 0;
    for (const auto& l : layers) {
        total += l.size();
    }
    if (total > kMaxBlockBytes) {
        return invalid_argument("block over kMaxBlockBytes");
    }
    return header_bytes(info.num_layers) + total;
}

Status encode_block_to(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                       std::span<uint8_t> dst) {
    DSI_ASSIGN_OR_RETURN(size_t size, encoded_size(info, layers));
    DSI_CHECK_EQ(dst.size(), size);
    size_t hdr = header_bytes(info.num_layers);
    uint64_t total = size - hdr;
    uint8_t* p = dst.data();
    std::memcpy(p, kMagic, sizeof(kMagic));
    store_le<uint16_t>(p + 8, kBlockFormatVersion);
    store_le<uint16_t>(p + 10, static_cast<uint16_t>(info.traffic_class));
    store_le<uint32_t>(p + 12, info.num_layers);
    store_key(p + 16, info.key);
    store_key(p + 32, info.model);
    store_le<uint32_t>(p + 48, info.dtype);
    store_le<uint32_t>(p + 52, info.num_tokens);
    store_le<uint64_t>(p + 56, info.token_hash);
    store_le<uint64_t>(p + 64, total);
    uint8_t* out = p + hdr;
    for (uint32_t i = 0; i < info.num_layers; ++i) {
        store_le<uint64_t>(p + kFixedHeaderBytes + 8 * i, layers[i].size());
        if (!layers[i].empty()) {
            std::memcpy(out, layers[i].data(), layers[i].size());
        }
        out += layers[i].size();
    }
    store_le<uint64_t>(p + 72, internal::xxh3_ops().hash(p + hdr, total));
    store_le<uint64_t>(p + hdr - 8, XXH3_64bits(p, hdr - 8));
    return Status::ok();
}

Result<std::vector<uint8_t>> encode_block(const BlockInfo& info,
                                          std::span<const std::span<const uint8_t>> layers) {
    DSI_ASSIGN_OR_RETURN(size_t size, encoded_size(info, layers));
    std::vector<uint8_t> out(size);
    DSI_RETURN_IF_ERROR(encode_block_to(info, layers, out));
    return out;
}

void BlockBuffer::Free::operator()(uint8_t* p) const {
    if (map_bytes > 0) {
        ::munmap(p, map_bytes);
    } else {
        std::free(p);
    }
}

BlockBuffer BlockBuffer::adopt_mapping(void* addr, size_t n) {
    DSI_CHECK(addr != nullptr && n > 0);
    BlockBuffer b;
    b.data_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(addr), Free{n});
    b.size_ = n;
    return b;
}

BlockBuffer BlockBuffer::allocate(size_t n) {
    DSI_CHECK(n > 0);
    constexpr size_t kAlign = 4096;  // page-aligned: O_DIRECT-ready, no split cache lines
    BlockBuffer b;
    b.data_.reset(
        static_cast<uint8_t*>(std::aligned_alloc(kAlign, (n + kAlign - 1) / kAlign * kAlign)));
    DSI_CHECK(b.data_ != nullptr);
    b.size_ = n;
    return b;
}

void BlockBuffer::truncate(size_t n) {
    DSI_CHECK_LE(n, size_);
    size_ = n;
}

struct PayloadHasher::State {
    internal::Xxh3State xxh;
    uint64_t seen = 0;           // bytes of the encoded block seen
    uint64_t payload_begin = 0;  // header size; 0 until known
    bool bad = false;            // unusable layer count
    uint8_t head[16] = {};       // the first 16 bytes (layer count at offset 12)
};

PayloadHasher::PayloadHasher() : s_(std::make_unique<State>()) {
    internal::xxh3_ops().reset(&s_->xxh);
}

PayloadHasher::~PayloadHasher() = default;
PayloadHasher::PayloadHasher(PayloadHasher&&) noexcept = default;
PayloadHasher& PayloadHasher::operator=(PayloadHasher&&) noexcept = default;

void PayloadHasher::update(std::span<const uint8_t> chunk) {
    State& s = *s_;
    if (s.bad) {
        return;
    }
    for (size_t i = 0; s.seen + i < sizeof(s.head) && i < chunk.size(); ++i) {
        s.head[s.seen + i] = chunk[i];
    }
    const uint64_t begin = s.seen;
    s.seen += chunk.size();
    if (s.payload_begin == 0) {
        if (s.seen < sizeof(s.head)) {
            return;
        }
        uint32_t layers = load_le<uint32_t>(s.head + 12);
        if (layers == 0 || layers > kMaxLayers) {
            s.bad = true;
            return;
        }
        s.payload_begin = header_bytes(layers);
    }
    if (s.seen <= s.payload_begin) {
        return;
    }
    const uint64_t skip = s.payload_begin > begin ? s.payload_begin - begin : 0;
    internal::xxh3_ops().update(&s.xxh, chunk.data() + skip, chunk.size() - skip);
}

std::optional<uint64_t> PayloadHasher::digest() const {
    if (s_->bad || s_->payload_begin == 0) {
        return std::nullopt;
    }
    return internal::xxh3_ops().digest(&s_->xxh);
}

std::span<const uint8_t> Block::layer(uint32_t i) const {
    DSI_CHECK_LT(i, info_.num_layers);
    return bytes_.subspan(layer_offsets_[i], layer_offsets_[i + 1] - layer_offsets_[i]);
}

std::span<const uint8_t> Block::payload() const {
    if (layer_offsets_.empty()) {
        return {};
    }
    return bytes_.subspan(layer_offsets_.front());
}

uint64_t Block::payload_checksum() const {
    DSI_CHECK_LE(kFixedHeaderBytes, bytes_.size());
    return load_le<uint64_t>(bytes_.data() + 72);
}

Result<Block> decode_view(std::span<const uint8_t> bytes, const BlockInfo* expect,
                          std::optional<uint64_t> payload_hash) {
    Block b;
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    uint64_t checksum = 0;
    DSI_RETURN_IF_ERROR(parse_header(bytes, b.info_, &sizes, &total, &checksum));
    size_t hdr = header_bytes(b.info_.num_layers);
    if (bytes.size() != hdr + total) {
        return data_loss(bytes.size() < hdr + total ? "block truncated"
                                                    : "block has trailing bytes");
    }
    uint64_t got =
        payload_hash ? *payload_hash : internal::xxh3_ops().hash(bytes.data() + hdr, total);
    if (got != checksum) {
        return data_loss("payload checksum mismatch");
    }
    if (expect != nullptr) {
        const BlockInfo& e = *expect;
        if (e.key != b.info_.key) {
            return failed_precondition("block key mismatch");
        }
        if (e.model != b.info_.model || e.num_layers != b.info_.num_layers ||
            e.dtype != b.info_.dtype || e.num_tokens != b.info_.num_tokens) {
            return failed_precondition("block is of another model or shape");
        }
        if (e.token_hash != 0 && e.token_hash != b.info_.token_hash) {
            return failed_precondition("block token-id hash mismatch");
        }
    }
    b.layer_offsets_.resize(sizes.size() + 1);
    b.layer_offsets_[0] = hdr;
    for (size_t i = 0; i < sizes.size(); ++i) {
        b.layer_offsets_[i + 1] = b.layer_offsets_[i] + sizes[i];
    }
    b.bytes_ = bytes;
    return b;
}

Result<Block> decode_block(std::vector<uint8_t> bytes, const BlockInfo* expect) {
    DSI_ASSIGN_OR_RETURN(Block b, decode_view(bytes, expect, std::nullopt));
    b.vec_ = std::move(bytes);  // the heap storage (and so bytes_) stays where it is
    return b;
}

Result<Block> decode_block(BlockBuffer bytes, const BlockInfo* expect,
                           std::optional<uint64_t> payload_hash) {
    DSI_ASSIGN_OR_RETURN(Block b, decode_view(bytes.span(), expect, payload_hash));
    b.buf_ = std::move(bytes);
    return b;
}

Result<BlockInfo> peek_block_info(std::span<const uint8_t> prefix) {
    BlockInfo info;
    DSI_RETURN_IF_ERROR(parse_header(prefix, info, nullptr, nullptr, nullptr));
    return info;
}

}  // namespace dsi::kvstore

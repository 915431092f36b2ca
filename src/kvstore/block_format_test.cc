#include "kvstore/block_format.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kvstore/internal/xxh3_fast.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;

std::vector<uint8_t> encode(const testing::TestBlock& b) {
    auto spans = b.spans();
    auto r = encode_block(b.info, spans);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return *r;
}

TEST(BlockFormat, RoundTrip) {
    auto b = make_block(1, 5, 333);
    auto bytes = encode(b);
    EXPECT_EQ(bytes.size(), header_bytes(5) + 5 * 333);
    auto d = decode_block(bytes, &b.info);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    ASSERT_EQ(d->num_layers(), 5u);
    for (uint32_t i = 0; i < 5; ++i) {
        auto l = d->layer(i);
        ASSERT_EQ(l.size(), 333u);
        EXPECT_EQ(0, std::memcmp(l.data(), b.layers[i].data(), 333));
    }
    EXPECT_EQ(d->info().key, b.info.key);
    EXPECT_EQ(d->info().token_hash, b.info.token_hash);
}

TEST(BlockFormat, EmptyAndUnevenLayers) {
    auto b = make_block(2, 3, 10);
    b.layers[1].clear();
    b.layers[2].resize(77, 9);
    auto bytes = encode(b);
    auto d = decode_block(bytes, &b.info);
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(d->layer(1).size(), 0u);
    EXPECT_EQ(d->layer(2).size(), 77u);
}

TEST(BlockFormat, EveryFlippedByteIsRejected) {
    auto b = make_block(3, 2, 64);
    auto good = encode(b);
    for (size_t i = 0; i < good.size(); ++i) {
        auto bad = good;
        bad[i] ^= 0x41;
        auto d = decode_block(bad, &b.info);
        EXPECT_FALSE(d.is_ok()) << "flip at byte " << i;
    }
}

TEST(BlockFormat, EveryTruncationIsRejected) {
    auto b = make_block(4, 3, 50);
    auto good = encode(b);
    for (size_t n = 0; n < good.size(); ++n) {
        std::vector<uint8_t> cut(good.begin(), good.begin() + n);
        auto d = decode_block(cut, nullptr);
        ASSERT_FALSE(d.is_ok()) << "length " << n;
        EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
    }
    auto extra = good;
    extra.push_back(0);
    EXPECT_EQ(decode_block(extra, nullptr).status().code(), StatusCode::kDataLoss);
}

TEST(BlockFormat, MismatchWithExpectationIsRejected) {
    auto b = make_block(5);
    auto bytes = encode(b);
    auto check = [&](auto mutate) {
        BlockInfo e = b.info;
        mutate(e);
        auto d = decode_block(bytes, &e);
        ASSERT_FALSE(d.is_ok());
        EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
    };
    check([](BlockInfo& e) { e.key.lo ^= 1; });
    check([](BlockInfo& e) { e.model = model_identity("other-model"); });
    check([](BlockInfo& e) { e.num_layers += 1; });
    check([](BlockInfo& e) { e.dtype += 1; });
    check([](BlockInfo& e) { e.num_tokens = 64; });
    check([](BlockInfo& e) { e.token_hash ^= 1; });
    BlockInfo no_hash = b.info;
    no_hash.token_hash = 0;  // 0: the reader does not check token ids
    EXPECT_TRUE(decode_block(bytes, &no_hash).is_ok());
}

TEST(BlockFormat, LimitsOnEncode) {
    auto b = make_block(6, 2, 8);
    auto spans = b.spans();
    BlockInfo info = b.info;
    info.num_layers = 3;
    EXPECT_EQ(encode_block(info, spans).status().code(), StatusCode::kInvalidArgument);
    info = b.info;
    info.num_tokens = 0;
    EXPECT_EQ(encode_block(info, spans).status().code(), StatusCode::kInvalidArgument);
    info.num_layers = 0;
    EXPECT_EQ(encode_block(info, {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockFormat, HugeDeclaredSizesAreRejectedWithoutAllocating) {
    auto b = make_block(7, 1, 8);
    auto bytes = encode(b);
    // Declare a 1 TB layer and fix up the header checksum: still a miss.
    uint64_t huge = uint64_t{1} << 40;
    std::memcpy(bytes.data() + 64, &huge, 8);
    std::memcpy(bytes.data() + kFixedHeaderBytes, &huge, 8);
    EXPECT_EQ(decode_block(bytes, nullptr).status().code(), StatusCode::kDataLoss);
    // A layer count beyond the limit.
    auto bytes2 = encode(b);
    uint32_t layers = kMaxLayers + 1;
    std::memcpy(bytes2.data() + 12, &layers, 4);
    EXPECT_EQ(decode_block(bytes2, nullptr).status().code(), StatusCode::kDataLoss);
}

TEST(BlockFormat, PeekReadsTheHeaderOnly) {
    auto b = make_block(8, 3, 100, TrafficClass::kAgent);
    auto bytes = encode(b);
    auto info = peek_block_info(std::span<const uint8_t>(bytes.data(), header_bytes(3)));
    ASSERT_TRUE(info.is_ok());
    EXPECT_EQ(info->traffic_class, TrafficClass::kAgent);
    EXPECT_EQ(info->key, b.info.key);
    EXPECT_FALSE(peek_block_info(std::span<const uint8_t>(bytes.data(), 20)).is_ok());
}

// The streaming checksum over any split of the block equals the one-pass checksum;
// a bad layer count yields no digest.
TEST(BlockFormat, PayloadHasherMatchesOnePassOverAnySplit) {
    auto b = make_block(5, 3, 777);
    auto bytes = encode(b);
    for (size_t step : {size_t{1}, size_t{7}, size_t{15}, size_t{100}, bytes.size()}) {
        PayloadHasher h;
        for (size_t off = 0; off < bytes.size(); off += step) {
            const size_t n = std::min(step, bytes.size() - off);
            h.update(std::span<const uint8_t>(bytes).subspan(off, n));
        }
        ASSERT_TRUE(h.digest().has_value());
        auto d = decode_block(bytes, nullptr);
        ASSERT_TRUE(d.is_ok());
        EXPECT_EQ(*h.digest(), d->payload_checksum()) << "step " << step;
        BlockBuffer buf = BlockBuffer::allocate(bytes.size());
        std::memcpy(buf.data(), bytes.data(), bytes.size());
        EXPECT_TRUE(decode_block(std::move(buf), &b.info, h.digest()).is_ok());
    }
    // A digest that does not match (a chunk changed after hashing) is a miss.
    BlockBuffer buf = BlockBuffer::allocate(bytes.size());
    std::memcpy(buf.data(), bytes.data(), bytes.size());
    EXPECT_EQ(decode_block(std::move(buf), &b.info, uint64_t{42}).status().code(),
              StatusCode::kDataLoss);
    auto bad = bytes;
    bad[12] = 0;  // layer count 0
    bad[13] = bad[14] = bad[15] = 0;
    PayloadHasher h;
    h.update(bad);
    EXPECT_FALSE(h.digest().has_value());
    PayloadHasher short_input;
    short_input.update(std::span<const uint8_t>(bytes).first(10));
    EXPECT_FALSE(short_input.digest().has_value());
}

// Every XXH3 implementation this CPU runs gives the library's digest, one-shot and
// streamed, at every length around the algorithm's size classes.
TEST(BlockFormat, Xxh3ImplementationsAgree) {
    std::vector<uint8_t> data(5000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + (i >> 7));
    size_t count = 0;
    const internal::Xxh3Ops* const* all = internal::xxh3_ops_all(&count);
    ASSERT_GE(count, 1u);
    EXPECT_STREQ(all[count - 1]->isa, "libxxhash");
    const internal::Xxh3Ops& ref = *all[count - 1];
    for (size_t n : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 4999, 5000}) {
        for (size_t k = 0; k < count; ++k) {
            EXPECT_EQ(all[k]->hash(data.data(), n), ref.hash(data.data(), n)) << all[k]->isa << n;
            internal::Xxh3State st;
            all[k]->reset(&st);
            for (size_t off = 0; off < n; off += 300) {
                all[k]->update(&st, data.data() + off, std::min<size_t>(300, n - off));
            }
            EXPECT_EQ(all[k]->digest(&st), ref.hash(data.data(), n)) << all[k]->isa << n;
        }
    }
}

TEST(StoreKey, HexRoundTrip) {
    StoreKey k{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    EXPECT_EQ(to_hex(k), "fedcba98765432100123456789abcdef");
    EXPECT_EQ(key_from_hex(to_hex(k)), k);
    EXPECT_FALSE(key_from_hex("xyz").has_value());
    EXPECT_FALSE(key_from_hex(std::string(32, 'g')).has_value());
}

}  // namespace
}  // namespace dsi::kvstore

// Block pool, prefix index, LRU, state slots and the paged KvCache.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "kv/paged_kv_cache.h"
#include "kv/state_slots.h"

namespace dsi::kv {
namespace {

std::vector<CacheGroupSpec> mla(int64_t layers = 2, int64_t floats = 8) {
    return {CacheGroupSpec{"mla", layers, 1, floats}};
}

std::vector<int32_t> tokens(size_t n, int32_t base) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), base);
    return t;
}

TEST(BlockKeyTest, ChainDependsOnPrefixAndSalt) {
    const BlockKey salt = make_salt("model-a", "");
    auto a = tokens(3 * kBlockTokens + 5, 0);
    auto keys = chain_keys(a, salt);
    ASSERT_EQ(keys.size(), 3u);
    // Same prefix, different tail block: first two keys equal.
    auto b = a;
    b[2 * kBlockTokens + 1] = 999;
    auto keys_b = chain_keys(b, salt);
    EXPECT_EQ(keys[0], keys_b[0]);
    EXPECT_EQ(keys[1], keys_b[1]);
    EXPECT_NE(keys[2], keys_b[2]);
    // A change in block 0 changes every later key (chain).
    b = a;
    b[0] = 7;
    keys_b = chain_keys(b, salt);
    for (size_t i = 0; i < 3; ++i) EXPECT_NE(keys[i], keys_b[i]);
    // Salts: model identity and cache_salt both separate; no concatenation ambiguity.
    EXPECT_NE(chain_keys(a, make_salt("model-a", "t1"))[0], keys[0]);
    EXPECT_NE(chain_keys(a, make_salt("model-b", ""))[0], keys[0]);
    EXPECT_NE(make_salt("ab", "c"), make_salt("a", "bc"));
}

TEST(BlockPoolTest, CreateRejectsBadSpecs) {
    EXPECT_FALSE(BlockPool::create({}, 4).is_ok());
    EXPECT_FALSE(BlockPool::create(mla(), 0).is_ok());
    EXPECT_FALSE(BlockPool::create({CacheGroupSpec{"x", 1, 3, 4}}, 4).is_ok());  // 3 ∤ 128
    EXPECT_FALSE(BlockPool::create({CacheGroupSpec{"x", 0, 1, 4}}, 4).is_ok());
}

TEST(BlockPoolTest, AllocateIsAllOrNothingAndReleaseFrees) {
    auto pool = BlockPool::create(mla(), 4).value();
    auto a = pool->allocate(3).value();
    EXPECT_EQ(pool->num_available(), 1);
    auto fail = pool->allocate(2);
    EXPECT_EQ(fail.status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(pool->num_available(), 1);
    pool->release_all(a);
    EXPECT_EQ(pool->num_available(), 4);
    EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(BlockPoolTest, PublishedBlocksAreCachedThenEvictedLru) {
    auto pool = BlockPool::create(mla(), 4).value();
    const BlockKey salt = make_salt("m", "");
    auto t = tokens(2 * kBlockTokens, 0);
    auto keys = chain_keys(t, salt);
    auto blocks = pool->allocate(2).value();
    EXPECT_TRUE(pool->publish(blocks[0], keys[0]));
    EXPECT_TRUE(pool->publish(blocks[1], keys[1]));
    EXPECT_FALSE(pool->publish(blocks[1], keys[1]));  // already keyed
    pool->release_all(blocks);
    EXPECT_EQ(pool->stats().num_cached, 2);
    EXPECT_EQ(pool->peek(keys).num_hit_blocks, 2);
    EXPECT_EQ(pool->peek(keys).num_unreferenced, 2);
    // A second sequence matches both and pins them.
    auto hit = pool->match_and_pin(keys);
    EXPECT_EQ(hit, blocks);
    EXPECT_EQ(pool->stats().num_cached, 0);
    EXPECT_EQ(pool->stats().hit_blocks, 2);
    std::vector<int32_t> expect(4, 0);
    expect[blocks[0]] = expect[blocks[1]] = 1;
    EXPECT_TRUE(pool->check_invariants(expect).is_ok());
    pool->release_all(hit);  // tail released first -> evicted first
    // Taking 3 blocks: 2 free + the LRU head, which is the chain's tail block.
    auto more = pool->allocate(3).value();
    EXPECT_EQ(pool->stats().evictions, 1);
    EXPECT_EQ(pool->peek(keys).num_hit_blocks, 1);  // the head survives
    pool->release_all(more);
    EXPECT_TRUE(pool->check_invariants().is_ok());
    // A different salt never matches.
    EXPECT_EQ(pool->peek(chain_keys(t, make_salt("m", "tenant"))).num_hit_blocks, 0);
}

TEST(BlockPoolTest, DuplicateKeyStaysPrivate) {
    auto pool = BlockPool::create(mla(), 4).value();
    BlockKey k{1, 2};
    auto a = pool->allocate(2).value();
    EXPECT_TRUE(pool->publish(a[0], k));
    EXPECT_FALSE(pool->publish(a[1], k));
    pool->release_all(a);
    EXPECT_EQ(pool->stats().num_cached, 1);
    EXPECT_EQ(pool->stats().num_free, 3);
    EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(BlockPoolTest, InvariantCheckCatchesWrongOwnerCounts) {
    auto pool = BlockPool::create(mla(), 2).value();
    auto a = pool->allocate(1).value();
    std::vector<int32_t> expect(2, 0);
    EXPECT_FALSE(pool->check_invariants(expect).is_ok());
    expect[a[0]] = 1;
    EXPECT_TRUE(pool->check_invariants(expect).is_ok());
}

// Many random owners allocating, publishing, matching and releasing; invariants hold
// throughout and everything is free or cached at the end.
TEST(BlockPoolTest, RandomStressKeepsInvariants) {
    auto pool = BlockPool::create(mla(), 64).value();
    std::mt19937_64 rng(7);
    std::map<int, std::vector<BlockId>> owners;
    std::vector<BlockKey> universe;
    for (int i = 0; i < 40; ++i) universe.push_back({rng(), rng()});
    int next_owner = 0;
    for (int it = 0; it < 5000; ++it) {
        const int op = static_cast<int>(rng() % 4);
        if (op == 0 || owners.empty()) {
            // Match a random chain prefix, then allocate the rest.
            const size_t start = rng() % 30;
            std::vector<BlockKey> chain(universe.begin() + static_cast<long>(start),
                                        universe.begin() + static_cast<long>(start + rng() % 8));
            std::vector<BlockId> held = pool->match_and_pin(chain);
            auto fresh = pool->allocate(static_cast<int64_t>(rng() % 6));
            if (fresh.is_ok()) {
                for (BlockId b : *fresh) {
                    if (rng() % 2) pool->publish(b, universe[rng() % universe.size()]);
                    held.push_back(b);
                }
            }
            owners[next_owner++] = held;
        } else {
            auto it2 = owners.begin();
            std::advance(it2, static_cast<long>(rng() % owners.size()));
            pool->release_all(it2->second);
            owners.erase(it2);
        }
        if (it % 97 == 0) {
            std::vector<int32_t> expect(64, 0);
            for (const auto& [o, held] : owners) {
                for (BlockId b : held) ++expect[b];
            }
            ASSERT_TRUE(pool->check_invariants(expect).is_ok())
                << pool->check_invariants(expect).to_string();
        }
    }
    for (auto& [o, held] : owners) pool->release_all(held);
    ASSERT_TRUE(pool->check_invariants(std::vector<int32_t>(64, 0)).is_ok());
    EXPECT_EQ(pool->num_used(), 0);
}

TEST(PagedKvCacheTest, RowsMapThroughTheBlockTable) {
    auto pool = BlockPool::create(mla(3, 4), 8).value();
    auto blocks = pool->allocate(3).value();
    PagedKvCache cache(pool.get(), 0, {blocks[2], blocks[0]});
    EXPECT_EQ(cache.capacity(), 2 * kBlockTokens);
    EXPECT_EQ(cache.row(0, 0), pool->data(0, blocks[2]));
    EXPECT_EQ(cache.row(1, 5), pool->data(0, blocks[2]) + (kBlockTokens + 5) * 4);
    EXPECT_EQ(cache.row(2, kBlockTokens + 1),
              pool->data(0, blocks[0]) + (2 * kBlockTokens + 1) * 4);
}

TEST(PagedKvCacheTest, SeveralCacheKindsShareBlockIds) {
    // An MLA-like group plus a 4x compressed group and a 128x group (V4-style).
    std::vector<CacheGroupSpec> groups = {{"mla", 2, 1, 8}, {"c4", 2, 4, 16}, {"c128", 1, 128, 32}};
    auto pool = BlockPool::create(groups, 4).value();
    EXPECT_EQ(groups[1].entries_per_block(), 32);
    EXPECT_EQ(pool->bytes_per_block(), (2 * 128 * 8 + 2 * 32 * 16 + 1 * 1 * 32) * 4);
    auto b = pool->allocate(1).value();
    PagedKvCache c4(pool.get(), 1, b);
    EXPECT_EQ(c4.row(0, 0), c4.row(0, 3));  // 4 tokens per entry
    EXPECT_EQ(c4.row(1, 4), pool->data(1, b[0]) + (32 + 1) * 16);
    PagedKvCache c128(pool.get(), 2, b);
    EXPECT_EQ(c128.row(0, 127), pool->data(2, b[0]));
}

TEST(StateSlotPoolTest, AllocateReleaseExhaust) {
    StateSlotPool slots(2, 134 * 4);
    auto a = slots.allocate().value();
    auto b = slots.allocate().value();
    EXPECT_NE(a, b);
    EXPECT_EQ(slots.allocate().status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(slots.data(b) - slots.data(a), (b - a) * 134 * 4);
    slots.release(a);
    EXPECT_TRUE(slots.check_invariants().is_ok());
    EXPECT_EQ(slots.num_free(), 1);
}

}  // namespace
}  // namespace dsi::kv

// sim::BlockCache: the simulator's model of one engine's prefix cache.
#include "sim/block_id_cache.h"

#include <gtest/gtest.h>

namespace dsi::sim {
namespace {

TEST(BlockIdCacheTest, PrefixMatchLruAndTtl) {
    BlockIdCache s(/*capacity_blocks=*/4, /*ttl_ns=*/100);
    const uint64_t a[] = {1, 2, 3};
    const uint64_t b[] = {1, 2, 9};
    EXPECT_EQ(s.match(a, 0), 0);
    s.insert(a, 0);
    EXPECT_EQ(s.match(b, 10), 2);  // prefix only
    EXPECT_EQ(s.peek(a, 10), 3);
    const uint64_t c[] = {7, 8};
    s.insert(c, 20);  // 5 blocks > 4: evicts the LRU block (3)
    EXPECT_EQ(s.size(), 4);
    EXPECT_EQ(s.evictions(), 1);
    EXPECT_EQ(s.match(a, 30), 2);
    EXPECT_EQ(s.match(c, 200), 0);  // TTL from last use
    EXPECT_EQ(s.expirations(), 1);
    BlockIdCache unlimited(0, 0);
    unlimited.insert(a, 0);
    EXPECT_EQ(unlimited.match(a, int64_t{1} << 60), 3);
}

}  // namespace
}  // namespace dsi::sim

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kvstore/file_store.h"
#include "kvstore/gc_policy.h"
#include "kvstore/gc_worker.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

constexpr int64_t kHour = 3600 * kNsPerSecond;

GcEntry entry(uint64_t id, int64_t size, int64_t last_access, TrafficClass c) {
    return {StoreKey{id, 0}, size, last_access, c};
}

std::vector<uint64_t> ids(const std::vector<StoreKey>& keys) {
    std::vector<uint64_t> out;
    for (const auto& k : keys) {
        out.push_back(k.lo);
    }
    return out;
}

TEST(GcPolicy, DefaultTtlsAreAgentThreeDaysChatbotSeven) {
    RetentionSettings s;
    EXPECT_EQ(s.ttl_ns[static_cast<int>(TrafficClass::kAgent)], 3 * kNsPerDay);
    EXPECT_EQ(s.ttl_ns[static_cast<int>(TrafficClass::kChatbot)], 7 * kNsPerDay);
}

TEST(GcPolicy, PerClassTtlFromLastAccess) {
    FakeClockEnv clock(100 * kNsPerDay);
    GcPolicy policy(RetentionSettings{}, &clock);
    int64_t now = clock.wall_ns();
    std::vector<GcEntry> blocks = {
        entry(1, 10, now - 2 * kNsPerDay, TrafficClass::kAgent),    // kept
        entry(2, 10, now - 4 * kNsPerDay, TrafficClass::kAgent),    // expired
        entry(3, 10, now - 4 * kNsPerDay, TrafficClass::kChatbot),  // kept
        entry(4, 10, now - 8 * kNsPerDay, TrafficClass::kChatbot),  // expired
        entry(5, 10, now - 3 * kNsPerDay, TrafficClass::kAgent),    // exactly the TTL: kept
    };
    GcPlan plan = policy.plan(blocks, 1'000'000);
    EXPECT_EQ(ids(plan.expired), (std::vector<uint64_t>{2, 4}));
    EXPECT_TRUE(plan.evicted.empty());
    EXPECT_EQ(plan.used_bytes_after, 30);
    // Two days on: the agent blocks expire, the younger chatbot block stays.
    clock.advance_ns(2 * kNsPerDay);
    plan = policy.plan(blocks, 1'000'000);
    EXPECT_EQ(ids(plan.expired), (std::vector<uint64_t>{1, 2, 4, 5}));
}

TEST(GcPolicy, TtlIsASetting) {
    FakeClockEnv clock(100 * kNsPerDay);
    RetentionSettings s;
    s.ttl_ns[static_cast<int>(TrafficClass::kAgent)] = kHour;
    s.ttl_ns[static_cast<int>(TrafficClass::kChatbot)] = 0;  // no TTL
    GcPolicy policy(s, &clock);
    int64_t now = clock.wall_ns();
    std::vector<GcEntry> blocks = {entry(1, 1, now - 2 * kHour, TrafficClass::kAgent),
                                   entry(2, 1, now - 365 * kNsPerDay, TrafficClass::kChatbot)};
    EXPECT_EQ(ids(policy.plan(blocks, 100).expired), (std::vector<uint64_t>{1}));
}

TEST(GcPolicy, WatermarksEvictLruDownToLowMark) {
    FakeClockEnv clock(10 * kNsPerDay);
    RetentionSettings s;
    s.high_watermark = 0.9;
    s.low_watermark = 0.5;
    GcPolicy policy(s, &clock);
    int64_t now = clock.wall_ns();
    std::vector<GcEntry> blocks;
    // 10 blocks of 10 bytes, accessed in a shuffled order.
    int64_t order[10] = {5, 2, 9, 0, 7, 3, 8, 1, 6, 4};
    for (uint64_t i = 0; i < 10; ++i) {
        blocks.push_back(entry(i, 10, now - kHour * (10 - order[i]), TrafficClass::kChatbot));
    }
    // 100 bytes used of 120: 83 % < 90 %: nothing.
    EXPECT_TRUE(policy.plan(blocks, 120).evicted.empty());
    // Of 100 capacity: 100 % > 90 %: evict oldest until <= 50.
    GcPlan plan = policy.plan(blocks, 100);
    EXPECT_EQ(ids(plan.evicted), (std::vector<uint64_t>{3, 7, 1, 5, 9}));
    EXPECT_EQ(plan.used_bytes_after, 50);
    EXPECT_EQ(plan.evicted_bytes, 50);
}

TEST(GcPolicy, ExpiryCountsTowardsTheWatermark) {
    FakeClockEnv clock(10 * kNsPerDay);
    GcPolicy policy(RetentionSettings{}, &clock);
    int64_t now = clock.wall_ns();
    std::vector<GcEntry> blocks = {entry(1, 50, now - 4 * kNsPerDay, TrafficClass::kAgent),
                                   entry(2, 45, now - kHour, TrafficClass::kChatbot)};
    GcPlan plan = policy.plan(blocks, 100);
    EXPECT_EQ(ids(plan.expired), (std::vector<uint64_t>{1}));
    EXPECT_TRUE(plan.evicted.empty()) << "45 of 100 after expiry is under the high mark";
}

TEST(GcPolicy, TiesBreakByKeyAndBadSettingsAreRejected) {
    FakeClockEnv clock(kNsPerDay);
    RetentionSettings s;
    s.high_watermark = 0.5;
    s.low_watermark = 0.5;
    GcPolicy policy(s, &clock);
    std::vector<GcEntry> blocks = {entry(9, 10, clock.wall_ns(), TrafficClass::kChatbot),
                                   entry(3, 10, clock.wall_ns(), TrafficClass::kChatbot)};
    EXPECT_EQ(ids(policy.plan(blocks, 30).evicted), (std::vector<uint64_t>{3}));
    RetentionSettings bad;
    bad.low_watermark = 0.95;
    EXPECT_FALSE(bad.validate().is_ok());
    bad.low_watermark = 0;
    EXPECT_FALSE(bad.validate().is_ok());
    bad.low_watermark = 0.5;
    bad.high_watermark = 1.5;
    EXPECT_FALSE(bad.validate().is_ok());
}

TEST(GcWorker, FileStoreExpiresByClassAndEvictsUnderWatermark) {
    testing::TempDir dir;
    FileStoreOptions o;
    o.fsync = false;
    o.atime_granularity_s = 0;  // every hit touches the atime
    auto store = std::move(FileBlockStore::open(dir.path(), o)).value();
    std::vector<testing::TestBlock> blocks;
    for (uint64_t i = 0; i < 6; ++i) {
        blocks.push_back(
            testing::make_block(i, 2, 1000, i < 2 ? TrafficClass::kAgent : TrafficClass::kChatbot));
        auto spans = blocks.back().spans();
        ASSERT_TRUE(store->put(blocks.back().info, spans).is_ok());
    }
    // Four days later: the agent blocks have expired, the chatbot blocks have not.
    FakeClockEnv clock(Env::default_env()->wall_ns() + 4 * kNsPerDay);
    GcWorker worker(store.get(), GcPolicy(RetentionSettings{}, &clock));
    auto r = worker.run_once();
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->expired, 2);
    EXPECT_EQ(r->evicted, 0);
    EXPECT_FALSE(*store->contains(blocks[0].info.key));
    EXPECT_TRUE(*store->contains(blocks[2].info.key));
    auto m = store->metrics().snapshot();
    EXPECT_EQ(m.ttl_expiries, 2);
    EXPECT_EQ(m.gc_runs, 1);

    // Touch block 5 so it is the most recently used, then shrink capacity to force LRU.
    // The kernel stamps file times from its coarse clock (one tick, 1-10 ms): without the
    // wait, the touch can carry the same atime as the puts and the LRU order is a tie.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(store->get(blocks[5].info.key, nullptr).is_ok());
    int64_t block_bytes = static_cast<int64_t>(header_bytes(2) + 2000);
    FileStoreOptions small = o;
    small.capacity_bytes = block_bytes * 2;  // 4 blocks held: well over 90 %
    auto capped = std::move(FileBlockStore::open(dir.path(), small)).value();
    GcWorker worker2(capped.get(), GcPolicy(RetentionSettings{}, &clock));
    r = worker2.run_once();
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->evicted, 3) << "down to <= 80 % of 2 blocks: one block left";
    EXPECT_TRUE(*capped->contains(blocks[5].info.key)) << "the most recently used stays";
    EXPECT_EQ(capped->metrics().snapshot().gc_evictions, 3);
}

TEST(GcWorker, StartStopDoesNotHang) {
    testing::TempDir dir;
    auto store = std::move(FileBlockStore::open(dir.path())).value();
    FakeClockEnv clock(0);
    GcWorker worker(store.get(), GcPolicy(RetentionSettings{}, &clock));
    worker.start(3600 * kNsPerSecond);
    int64_t t0 = Env::default_env()->now_ns();
    while (store->metrics().snapshot().gc_runs == 0 &&
           Env::default_env()->now_ns() - t0 < 5 * kNsPerSecond) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    worker.stop();
    EXPECT_EQ(store->metrics().snapshot().gc_runs, 1);
}

}  // namespace
}  // namespace dsi::kvstore

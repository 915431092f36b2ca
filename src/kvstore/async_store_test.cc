#include "kvstore/async_store.h"

#include <gtest/gtest.h>

#include "kvstore/file_store.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;

TEST(WriteBehind, WritesEverythingThenFetcherReadsItBack) {
    testing::TempDir dir;
    auto store = std::move(FileBlockStore::open(dir.path())).value();
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    {
        WriteBehind wb(store.get(), {});
        for (uint64_t i = 0; i < 10; ++i) {
            auto b = make_block(i, 2, 2000);
            auto spans = b.spans();
            EXPECT_TRUE(wb.offer(b.info, spans));
            keys.push_back(b.info.key);
            infos.push_back(b.info);
        }  // the caller's buffers are gone: offer copied them
        ASSERT_TRUE(wb.flush(deadline_after_ms(10'000)));
        EXPECT_EQ(wb.num_written(), 10);
    }
    keys.push_back(make_block(99).info.key);
    infos.push_back(make_block(99).info);
    Fetcher fetcher(store.get());
    auto ticket = fetcher.submit(keys, infos, deadline_after_ms(10'000));
    ASSERT_TRUE(ticket->wait(deadline_after_ms(10'000)).is_ok());
    auto& r = ticket->results();
    ASSERT_EQ(r.size(), 11u);
    for (size_t i = 0; i < 10; ++i) {
        EXPECT_TRUE(r[i].is_ok()) << i;
    }
    EXPECT_EQ(r[10].status().code(), StatusCode::kNotFound);
}

TEST(WriteBehind, FullQueueDropsAndCounts) {
    testing::TempDir dir;
    auto store = std::move(FileBlockStore::open(dir.path())).value();
    WriteBehind::Options o;
    o.max_queued_bytes = 3000;  // one 2x1000-byte block fits, a second does not until drained
    WriteBehind wb(store.get(), o);
    auto big = make_block(1, 2, 4000);
    auto spans = big.spans();
    EXPECT_FALSE(wb.offer(big.info, spans));
    EXPECT_EQ(wb.num_dropped(), 1);
    EXPECT_EQ(store->metrics().snapshot().puts_dropped, 1);
    auto small = make_block(2, 2, 1000);
    auto s2 = small.spans();
    EXPECT_TRUE(wb.offer(small.info, s2));
    EXPECT_TRUE(wb.flush(deadline_after_ms(10'000)));
}

TEST(Fetcher, WaitHonoursItsDeadline) {
    testing::TempDir dir;
    FileStoreOptions o;
    auto store = std::move(FileBlockStore::open(dir.path(), o)).value();
    std::vector<StoreKey> keys;
    for (uint64_t i = 0; i < 64; ++i) {
        auto b = make_block(i, 8, 1 << 16);
        auto spans = b.spans();
        ASSERT_TRUE(store->put(b.info, spans).is_ok());
        keys.push_back(b.info.key);
    }
    Fetcher fetcher(store.get());
    auto ticket = fetcher.submit(keys, {}, kNoDeadline);
    Status s = ticket->wait(Env::default_env()->now_ns());  // already due
    EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(ticket->wait(deadline_after_ms(30'000)).is_ok());
    EXPECT_EQ(ticket->results().size(), 64u);
}

}  // namespace
}  // namespace dsi::kvstore

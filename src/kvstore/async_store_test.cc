#include "kvstore/async_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <chrono>
#include <thread>

#include "base/env.h"

#include "kvstore/file_store.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;

// Submits and waits (10 s) for the fetch; the ticket holds the results.
std::shared_ptr<FetchTicket> fetch_now(Fetcher& fetcher, const std::vector<StoreKey>& keys,
                                       const std::vector<BlockInfo>& infos) {
    auto ticket = fetcher.submit(keys, infos, deadline_after_ms(10'000));
    EXPECT_TRUE(ticket->wait(deadline_after_ms(10'000)).is_ok());
    EXPECT_TRUE(ticket->done());
    return ticket;
}

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
    auto ticket = fetch_now(fetcher, keys, infos);
    ASSERT_TRUE(ticket->done());
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

// The fetch thread drops its own reference to a ticket just after completing it.
int64_t in_use_when_settled(const Fetcher& f, int64_t want) {
    const int64_t deadline = deadline_after_ms(10'000);
    while (f.buffer_stats().in_use != want && Env::default_env()->now_ns() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return f.buffer_stats().in_use;
}

// Pooled fetch buffers: bounded, reused, back in the pool when the last reference to a
// block goes (also after the Fetcher), and a fetch larger than the pool reads its head.
TEST(Fetcher, PooledBuffersAreBoundedReusedAndReleased) {
    testing::TempDir dir;
    FileStoreOptions so;
    so.map_reads = false;  // reads into the pooled buffers (the mapped path: below)
    auto store = std::move(FileBlockStore::open(dir.path(), so)).value();
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (uint64_t i = 0; i < 6; ++i) {
        auto b = make_block(i, 4, 3000);
        auto spans = b.spans();
        ASSERT_TRUE(store->put(b.info, spans).is_ok());
        keys.push_back(b.info.key);
        infos.push_back(b.info);
    }
    Fetcher::Options o;
    o.buffer_bytes = header_bytes(4) + 4 * 3000;
    o.max_buffers = 4;
    FetchedBlock kept;
    {
        Fetcher fetcher(store.get(), o);
        for (int round = 0; round < 3; ++round) {
            auto t = fetcher.submit(keys, infos, deadline_after_ms(10'000));
            ASSERT_TRUE(t->wait(deadline_after_ms(10'000)).is_ok());
            auto& r = t->results();
            ASSERT_EQ(r.size(), 6u);
            for (size_t i = 0; i < 4; ++i) {
                ASSERT_TRUE(r[i].is_ok()) << i;
                EXPECT_FALSE((*r[i])->owns_bytes());  // a view into a pooled buffer
                EXPECT_EQ((*r[i])->info().key, keys[i]);
            }
            EXPECT_EQ(r[4].status().code(), StatusCode::kResourceExhausted);
            EXPECT_EQ(fetcher.buffer_stats().in_use, 4);
            if (round == 2) kept = *r[0];
        }  // each ticket dropped: its buffers go back
        EXPECT_EQ(in_use_when_settled(fetcher, 1), 1);  // `kept`
        const FetchBufferStats st = fetcher.buffer_stats();
        EXPECT_EQ(st.allocated, 4);
        EXPECT_EQ(st.leases, 12);
        // A miss returns its buffer at once.
        auto t = fetcher.submit({StoreKey{7, 7}}, {}, deadline_after_ms(10'000));
        ASSERT_TRUE(t->wait(deadline_after_ms(10'000)).is_ok());
        EXPECT_EQ(t->results()[0].status().code(), StatusCode::kNotFound);
        EXPECT_EQ(in_use_when_settled(fetcher, 1), 1);
    }
    // The Fetcher is gone; the block it read is still readable, then released.
    EXPECT_EQ(kept->layer(0).size(), 3000u);
    kept.reset();
}

// A zero-copy store (file:// io=mmap): the Fetcher hands out the store's mapped blocks,
// still no more at once than its pool allows, and every lease comes back.
TEST(Fetcher, ZeroCopyStoreBlocksAreBoundedByThePool) {
    testing::TempDir dir;
    FileStoreOptions so;
    so.map_reads = true;
    auto store = std::move(FileBlockStore::open(dir.path(), so)).value();
    if (!store->zero_copy_reads()) {
        GTEST_SKIP() << "kernel without MADV_POPULATE_READ: reads use pread";
    }
    std::vector<testing::TestBlock> blocks;
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (uint64_t i = 0; i < 6; ++i) {
        blocks.push_back(make_block(i, 4, 3000));
        auto spans = blocks.back().spans();
        ASSERT_TRUE(store->put(blocks.back().info, spans).is_ok());
        keys.push_back(blocks.back().info.key);
        infos.push_back(blocks.back().info);
    }
    Fetcher::Options o;
    o.buffer_bytes = header_bytes(4) + 4 * 3000;
    o.max_buffers = 4;
    Fetcher fetcher(store.get(), o);
    {
        auto t = fetch_now(fetcher, keys, infos);
        ASSERT_TRUE(t->done());
        auto& r = t->results();
        ASSERT_EQ(r.size(), 6u);
        for (size_t i = 0; i < 4; ++i) {
            ASSERT_TRUE(r[i].is_ok()) << i;
            EXPECT_TRUE((*r[i])->owns_bytes());  // the store's mapping, not a pool buffer
            EXPECT_EQ(0, std::memcmp((*r[i])->layer(3).data(), blocks[i].layers[3].data(), 3000));
        }
        EXPECT_EQ(r[4].status().code(), StatusCode::kResourceExhausted);
        EXPECT_EQ(fetcher.buffer_stats().in_use, 4);
    }
    EXPECT_EQ(in_use_when_settled(fetcher, 0), 0);
}

}  // namespace
}  // namespace dsi::kvstore

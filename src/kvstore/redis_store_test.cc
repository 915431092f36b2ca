// Integration tests: each starts its own redis-server(s) on free loopback ports.
#include "kvstore/redis_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "kvstore/gc_worker.h"
#include "kvstore/redis_test_server.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;
using testing::RedisTestServer;
using testing::TestBlock;

class RedisStoreTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!testing::have_redis_server()) {
            GTEST_SKIP() << "redis-server not installed (scripts/setup.sh installs it)";
        }
    }
    void start(int n) {
        for (int i = 0; i < n; ++i) {
            servers_.push_back(std::make_unique<RedisTestServer>());
            ASSERT_TRUE(servers_.back()->ready()) << "redis-server did not start";
        }
    }
    std::unique_ptr<RedisBlockStore> open(int k, int m, int64_t timeout_ms = 300) {
        RedisStoreOptions o;
        for (auto& s : servers_) {
            o.servers.push_back({"127.0.0.1", s->port()});
        }
        o.k = k;
        o.m = m;
        o.io_timeout_ms = timeout_ms;
        o.down_backoff_ms = 60'000;
        auto r = RedisBlockStore::open(o);
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        return std::move(r).value();
    }
    int server_index(int port) const {
        for (size_t i = 0; i < servers_.size(); ++i) {
            if (servers_[i]->port() == port) {
                return static_cast<int>(i);
            }
        }
        return -1;
    }
    std::vector<std::unique_ptr<RedisTestServer>> servers_;
};

std::vector<TestBlock> put_blocks(RedisBlockStore& store, int n, size_t layer_bytes = 3000) {
    std::vector<TestBlock> blocks;
    for (int i = 0; i < n; ++i) {
        blocks.push_back(make_block(static_cast<uint64_t>(i) + 1000, 3, layer_bytes + i));
        auto spans = blocks.back().spans();
        EXPECT_TRUE(store.put(blocks.back().info, spans).is_ok());
    }
    return blocks;
}

void expect_same(const Block& got, const TestBlock& want) {
    ASSERT_EQ(got.num_layers(), want.layers.size());
    for (uint32_t i = 0; i < got.num_layers(); ++i) {
        ASSERT_EQ(got.layer(i).size(), want.layers[i].size());
        ASSERT_EQ(0,
                  std::memcmp(got.layer(i).data(), want.layers[i].data(), want.layers[i].size()));
    }
}

TEST_F(RedisStoreTest, OneServerRoundTrip) {
    start(1);
    auto store = open(1, 0);
    auto blocks = put_blocks(*store, 5);
    std::vector<StoreKey> chain;
    for (auto& b : blocks) {
        auto got = store->get(b.info.key, &b.info);
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        expect_same(*got, b);
        chain.push_back(b.info.key);
    }
    chain.insert(chain.begin() + 3, make_block(1).info.key);  // a hole at 3
    EXPECT_EQ(*store->match_prefix(chain), 3);
    ASSERT_TRUE(store->remove(blocks[0].info.key).is_ok());
    EXPECT_FALSE(*store->contains(blocks[0].info.key));
    EXPECT_EQ(store->get(blocks[0].info.key, nullptr).status().code(), StatusCode::kNotFound);
    auto m = store->metrics().snapshot();
    EXPECT_EQ(m.hits, 5);
    EXPECT_EQ(m.misses, 1);
    EXPECT_EQ(m.puts, 5);
}

TEST_F(RedisStoreTest, DeadServerMakesItsBlocksMissesAndNothingHangs) {
    start(3);
    auto store = open(1, 0);
    auto blocks = put_blocks(*store, 30);
    int victim = store->window(blocks[0].info.key)[0];
    servers_[static_cast<size_t>(victim)]->kill9();
    int64_t t0 = Env::default_env()->now_ns();
    int hits = 0;
    int misses = 0;
    for (auto& b : blocks) {
        auto got = store->get(b.info.key, &b.info);
        bool on_victim = store->window(b.info.key)[0] == victim;
        EXPECT_EQ(got.is_ok(), !on_victim);
        (got.is_ok() ? hits : misses)++;
    }
    EXPECT_GT(misses, 0);
    EXPECT_GT(hits, 0);
    // Serving goes on: new blocks land on live servers.
    auto more = make_block(77);
    auto spans = more.spans();
    EXPECT_TRUE(store->put(more.info, spans).is_ok());
    EXPECT_TRUE(store->get(more.info.key, &more.info).is_ok());
    double seconds = (Env::default_env()->now_ns() - t0) / 1e9;
    EXPECT_LT(seconds, 5.0);
    EXPECT_GT(store->metrics().snapshot().errors, 0);
}

TEST_F(RedisStoreTest, ErasureCodedBlocksSurviveMServersDown) {
    start(6);
    auto store = open(3, 2);
    auto blocks = put_blocks(*store, 20, 10'000);
    servers_[1]->kill9();
    servers_[4]->kill9();
    for (auto& b : blocks) {
        auto got = store->get(b.info.key, &b.info);
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        expect_same(*got, b);
    }
    EXPECT_GT(store->metrics().snapshot().degraded_reads, 0);
    // A third server down: blocks with 3 chunks there are misses, never wrong data.
    servers_[2]->kill9();
    int64_t t0 = Env::default_env()->now_ns();
    int hits = 0;
    for (auto& b : blocks) {
        auto got = store->get(b.info.key, &b.info);
        if (got.is_ok()) {
            expect_same(*got, b);
            ++hits;
        } else {
            EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
        }
    }
    EXPECT_LT((Env::default_env()->now_ns() - t0) / 1e9, 5.0);
    std::printf("with 3 of 6 servers down, k=3 m=2: %d of 20 blocks readable\n", hits);
}

// get_many reads a batch in two pipelined rounds; each key keeps its own outcome: hit,
// repaired by parity, damaged beyond repair, absent, of another model, or a duplicate.
TEST_F(RedisStoreTest, GetManyKeepsEachKeysOutcome) {
    start(5);
    auto store = open(2, 1);
    auto blocks = put_blocks(*store, 10, 7000);
    for (auto& s : servers_) {
        s->command("SET", "c:" + to_hex(blocks[3].info.key) + ":0", std::string(50, 'x'));
        s->command("SET", "c:" + to_hex(blocks[5].info.key) + ":0", std::string(50, 'x'));
        s->command("SET", "c:" + to_hex(blocks[5].info.key) + ":1", std::string(50, 'x'));
    }
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (const auto& b : blocks) {
        keys.push_back(b.info.key);
        infos.push_back(b.info);
    }
    keys.push_back(make_block(77).info.key);  // never written
    infos.push_back(make_block(77).info);
    keys.push_back(blocks[0].info.key);  // duplicate
    infos.push_back(blocks[0].info);
    keys.push_back(blocks[1].info.key);  // expected as another model's block
    infos.push_back(blocks[1].info);
    infos.back().model = model_identity("another");
    auto r = store->get_many(keys, infos);
    ASSERT_EQ(r.size(), keys.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
        if (i == 5) {
            EXPECT_EQ(r[i].status().code(), StatusCode::kNotFound) << "2 of 3 chunks damaged";
            continue;
        }
        ASSERT_TRUE(r[i].is_ok()) << i << ": " << r[i].status().to_string();
        expect_same(*r[i], blocks[i]);
    }
    EXPECT_EQ(r[10].status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(r[11].is_ok());
    expect_same(*r[11], blocks[0]);
    EXPECT_EQ(r[12].status().code(), StatusCode::kNotFound);
    auto m = store->metrics().snapshot();
    EXPECT_EQ(m.degraded_reads, 1);  // block 3
    EXPECT_EQ(m.hits, 10);
    // A server down: every block with a chunk there comes from parity, in the same batch.
    servers_[2]->kill9();
    keys.resize(blocks.size());
    infos.resize(blocks.size());
    r = store->get_many(keys, infos);
    int hits = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        if (r[i].is_ok()) {
            expect_same(*r[i], blocks[i]);
            ++hits;
        } else {
            EXPECT_EQ(r[i].status().code(), StatusCode::kNotFound);
            EXPECT_TRUE(i == 3 || i == 5) << i << " was intact: readable with one server down";
        }
    }
    EXPECT_GE(hits, 8);
    EXPECT_GT(store->metrics().snapshot().degraded_reads, 1);
}

// read_many_into: data chunks land in the caller's buffers (also when parity rebuilds
// one); a buffer that holds the block but not the last chunk's padding still works; a
// smaller one is kInvalidArgument.
TEST_F(RedisStoreTest, ReadManyIntoCallerBuffers) {
    start(3);
    auto store = open(2, 1);
    auto blocks = put_blocks(*store, 4, 7000);  // odd sizes for blocks 1, 3: 1 byte padding
    for (auto& s : servers_) {
        s->command("SET", "c:" + to_hex(blocks[2].info.key) + ":0", std::string(50, 'x'));
    }
    std::vector<size_t> sizes;
    for (const auto& b : blocks) {
        sizes.push_back(header_bytes(3) + b.layers[0].size() * 3);
    }
    ASSERT_EQ(sizes[1] % 2, 1u);
    std::vector<std::vector<uint8_t>> mem = {
        std::vector<uint8_t>(sizes[0] + 4096), std::vector<uint8_t>(sizes[1]),
        std::vector<uint8_t>(sizes[2] + 1), std::vector<uint8_t>(sizes[3] - 1),
        std::vector<uint8_t>(4096)};
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (const auto& b : blocks) {
        keys.push_back(b.info.key);
        infos.push_back(b.info);
    }
    keys.push_back(make_block(77).info.key);
    infos.push_back(make_block(77).info);
    std::vector<std::span<uint8_t>> dsts(mem.begin(), mem.end());
    auto r = store->read_many_into(keys, infos, dsts);
    ASSERT_EQ(r.size(), 5u);
    for (size_t i : {0u, 1u, 2u}) {
        ASSERT_TRUE(r[i].is_ok()) << i << ": " << r[i].status().to_string();
        EXPECT_FALSE(r[i]->owns_bytes());
        EXPECT_EQ(r[i]->encoded().data(), mem[i].data()) << "in the caller's buffer";
        expect_same(*r[i], blocks[i]);
    }
    EXPECT_EQ(r[3].status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r[4].status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store->metrics().snapshot().degraded_reads, 1);  // block 2, rebuilt in place
}

TEST_F(RedisStoreTest, DamagedChunkIsRepairedByParityOrIsAMiss) {
    start(4);
    auto ec = open(2, 1);
    auto plain = open(1, 0);
    auto b = make_block(5, 2, 5000);
    auto c = make_block(6, 2, 5000);
    auto sb = b.spans();
    auto sc = c.spans();
    ASSERT_TRUE(ec->put(b.info, sb).is_ok());
    ASSERT_TRUE(plain->put(c.info, sc).is_ok());
    // Overwrite chunk 0 of each with garbage on every server.
    for (auto& s : servers_) {
        s->command("SET", "c:" + to_hex(b.info.key) + ":0", std::string(100, 'x'));
        s->command("SET", "c:" + to_hex(c.info.key) + ":0", std::string(8 + 5000, 'y'));
    }
    auto got = ec->get(b.info.key, &b.info);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    expect_same(*got, b);
    EXPECT_EQ(plain->get(c.info.key, &c.info).status().code(), StatusCode::kNotFound);
    EXPECT_GE(plain->metrics().snapshot().corrupt, 1);
}

TEST_F(RedisStoreTest, UnresponsiveServerTimesOut) {
    // A socket that completes the TCP handshake (backlog) but never answers.
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::listen(fd, 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    RedisStoreOptions o;
    o.servers.push_back({"127.0.0.1", ntohs(a.sin_port)});
    o.io_timeout_ms = 200;
    auto store = std::move(RedisBlockStore::open(o)).value();
    auto b = make_block(1);
    auto spans = b.spans();
    int64_t t0 = Env::default_env()->now_ns();
    EXPECT_FALSE(store->put(b.info, spans).is_ok());
    EXPECT_FALSE(store->get(b.info.key, nullptr).is_ok());
    EXPECT_FALSE(*store->contains(b.info.key));
    EXPECT_LT((Env::default_env()->now_ns() - t0) / 1e9, 2.0);
    EXPECT_EQ(store->metrics().snapshot().puts_dropped, 1);
    ::close(fd);
}

TEST_F(RedisStoreTest, GcWorkerExpiresByClass) {
    start(2);
    auto store = open(1, 1);
    std::vector<TestBlock> blocks;
    for (uint64_t i = 0; i < 4; ++i) {
        blocks.push_back(
            make_block(i, 1, 100, i % 2 ? TrafficClass::kAgent : TrafficClass::kChatbot));
        auto spans = blocks.back().spans();
        ASSERT_TRUE(store->put(blocks.back().info, spans).is_ok());
    }
    auto listed = store->list_blocks();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(listed->size(), 4u);
    FakeClockEnv clock(Env::default_env()->wall_ns() + 5 * kNsPerDay);
    GcWorker worker(store.get(), GcPolicy(RetentionSettings{}, &clock));
    auto r = worker.run_once();
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->expired, 2);
    for (auto& b : blocks) {
        EXPECT_EQ(*store->contains(b.info.key), b.info.traffic_class == TrafficClass::kChatbot);
    }
}

TEST(RedisStoreOptions, MalformedUrisAreRejected) {
    for (const char* uri :
         {"redis://", "redis://h:0", "redis://h:99999", "redis://h:x", "redis://a:1,b:2?k=2&m=1",
          "redis://a:1?k=0", "redis://a:1?timeout_ms=0", "redis://a:1?k=-1"}) {
        EXPECT_FALSE(open_block_store(uri).is_ok()) << uri;
    }
    auto ok = open_block_store("redis://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?k=2&m=1");
    ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
    EXPECT_EQ((*ok)->uri(), "redis://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?k=2&m=1");
}

}  // namespace
}  // namespace dsi::kvstore

#include "kvstore/file_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;
using testing::TempDir;

std::unique_ptr<FileBlockStore> open_store(const std::string& dir, FileStoreOptions o = {}) {
    auto r = FileBlockStore::open(dir, std::move(o));
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return std::move(r).value();
}

int count_files(const std::string& dir) {
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
        n += e.is_regular_file() ? 1 : 0;
    }
    return n;
}

// Every read method: pread, io_uring, and mmap (get/get_many map the file; read_many_into
// still preads).
enum class ReadMethod { kPread, kUring, kMmap };

class FileStoreTest : public ::testing::TestWithParam<ReadMethod> {
protected:
    FileStoreOptions options() const {
        FileStoreOptions o;
        o.use_io_uring = GetParam() == ReadMethod::kUring;
        o.map_reads = GetParam() == ReadMethod::kMmap;
        return o;
    }
    TempDir dir_;
};

TEST_P(FileStoreTest, PutGetContainsRemove) {
    auto store = open_store(dir_.path(), options());
    auto b = make_block(1, 3, 5000);
    EXPECT_FALSE(*store->contains(b.info.key));
    auto spans = b.spans();
    ASSERT_TRUE(store->put(b.info, spans).is_ok());
    EXPECT_TRUE(*store->contains(b.info.key));
    auto got = store->get(b.info.key, &b.info);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    for (uint32_t i = 0; i < 3; ++i) {
        ASSERT_EQ(0, std::memcmp(got->layer(i).data(), b.layers[i].data(), 5000));
    }
    ASSERT_TRUE(store->remove(b.info.key).is_ok());
    EXPECT_EQ(store->get(b.info.key, &b.info).status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(store->remove(b.info.key).is_ok());  // absent is OK
    auto m = store->metrics().snapshot();
    EXPECT_EQ(m.hits, 1);
    EXPECT_EQ(m.misses, 1);
    EXPECT_EQ(m.puts, 1);
    EXPECT_GT(m.bytes_written, 15000);
    EXPECT_GT(m.bytes_read, 15000);
}

TEST_P(FileStoreTest, GetManyMixesHitsAndMisses) {
    auto store = open_store(dir_.path(), options());
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (uint64_t s = 0; s < 20; ++s) {
        auto b = make_block(s, 2, 4096 + s);
        if (s % 3 != 0) {
            auto spans = b.spans();
            ASSERT_TRUE(store->put(b.info, spans).is_ok());
        }
        keys.push_back(b.info.key);
        infos.push_back(b.info);
    }
    auto r = store->get_many(keys, infos);
    ASSERT_EQ(r.size(), 20u);
    for (size_t s = 0; s < 20; ++s) {
        EXPECT_EQ(r[s].is_ok(), s % 3 != 0) << s;
        if (r[s].is_ok()) {
            EXPECT_EQ(r[s]->layer(1).size(), 4096 + s);
        }
    }
}

TEST_P(FileStoreTest, MatchPrefixStopsAtFirstHole) {
    auto store = open_store(dir_.path(), options());
    std::vector<StoreKey> chain;
    for (uint64_t s = 0; s < 8; ++s) {
        auto b = make_block(100 + s, 1, 16);
        chain.push_back(b.info.key);
        if (s != 3) {
            auto spans = b.spans();
            ASSERT_TRUE(store->put(b.info, spans).is_ok());
        }
    }
    EXPECT_EQ(*store->match_prefix(chain), 3);
    EXPECT_EQ(*store->match_prefix(std::span<const StoreKey>(chain).subspan(4)), 4);
    EXPECT_EQ(*store->match_prefix({}), 0);
    EXPECT_EQ(store->metrics().snapshot().bytes_read, 0);  // metadata only
}

TEST_P(FileStoreTest, CorruptedOrTruncatedFileIsAMiss) {
    auto store = open_store(dir_.path(), options());
    auto a = make_block(1, 2, 3000);
    auto b = make_block(2, 2, 3000);
    auto c = make_block(3, 2, 3000);
    for (auto* x : {&a, &b, &c}) {
        auto spans = x->spans();
        ASSERT_TRUE(store->put(x->info, spans).is_ok());
    }
    {  // flip one payload byte
        std::fstream f(store->block_path(a.info.key),
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(static_cast<std::streamoff>(header_bytes(2) + 100));
        f.put('\x5a');
    }
    std::filesystem::resize_file(store->block_path(b.info.key), header_bytes(2) + 10);
    std::filesystem::resize_file(store->block_path(c.info.key), 5);
    for (auto* x : {&a, &b, &c}) {
        auto r = store->get(x->info.key, &x->info);
        EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
        EXPECT_FALSE(*store->contains(x->info.key)) << "damaged file is removed";
    }
    auto m = store->metrics().snapshot();
    EXPECT_EQ(m.corrupt, 3);
    EXPECT_EQ(m.hits, 0);
    // A rewrite of the same key works again.
    auto spans = a.spans();
    ASSERT_TRUE(store->put(a.info, spans).is_ok());
    EXPECT_TRUE(store->get(a.info.key, &a.info).is_ok());
}

// Blocks larger than one read chunk (so several chunks per file, hashed in order) read
// into buffers the caller owns; a damaged chunk in the middle is a miss there too.
TEST_P(FileStoreTest, ReadManyIntoCallerBuffers) {
    auto store = open_store(dir_.path(), options());
    auto a = make_block(11, 3, 300'000);  // ~900 KB: 4 chunks
    auto b = make_block(12, 2, 700);
    auto c = make_block(13, 3, 300'000);
    for (auto* x : {&a, &b, &c}) {
        auto spans = x->spans();
        ASSERT_TRUE(store->put(x->info, spans).is_ok());
    }
    {  // damage c in its third chunk
        std::fstream f(store->block_path(c.info.key),
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(600'000);
        f.put('\x01');
    }
    auto missing = make_block(14, 2, 700);
    std::vector<std::vector<uint8_t>> mem(4, std::vector<uint8_t>(1 << 20, 0xee));
    std::vector<uint8_t> small(100);
    std::vector<StoreKey> keys = {a.info.key, b.info.key, c.info.key, missing.info.key,
                                  b.info.key};
    std::vector<BlockInfo> expects = {a.info, b.info, c.info, missing.info, b.info};
    std::vector<std::span<uint8_t>> dsts = {mem[0], mem[1], mem[2], mem[3], small};
    auto r = store->read_many_into(keys, expects, dsts);
    ASSERT_EQ(r.size(), 5u);
    ASSERT_TRUE(r[0].is_ok()) << r[0].status().to_string();
    ASSERT_TRUE(r[1].is_ok()) << r[1].status().to_string();
    EXPECT_FALSE(r[0]->owns_bytes());
    EXPECT_EQ(r[0]->encoded().data(), mem[0].data()) << "read in place, no copy";
    for (uint32_t l = 0; l < 3; ++l) {
        ASSERT_EQ(0, std::memcmp(r[0]->layer(l).data(), a.layers[l].data(), 300'000));
    }
    ASSERT_EQ(0, std::memcmp(r[1]->layer(1).data(), b.layers[1].data(), 700));
    EXPECT_EQ(r[2].status().code(), StatusCode::kNotFound) << r[2].status().to_string();
    EXPECT_EQ(r[3].status().code(), StatusCode::kNotFound);
    EXPECT_EQ(r[4].status().code(), StatusCode::kInvalidArgument) << "buffer too small";
    EXPECT_EQ(store->metrics().snapshot().corrupt, 1);
    // get_many over the same multi-chunk block agrees.
    auto g = store->get(a.info.key, &a.info);
    ASSERT_TRUE(g.is_ok());
    EXPECT_TRUE(g->owns_bytes());
    EXPECT_EQ(0, std::memcmp(g->encoded().data(), mem[0].data(), g->size_bytes()));
}

TEST_P(FileStoreTest, BlockOfAnotherModelIsAMiss) {
    auto store = open_store(dir_.path(), options());
    auto a = make_block(1);
    auto spans = a.spans();
    ASSERT_TRUE(store->put(a.info, spans).is_ok());
    BlockInfo other = a.info;
    other.model = model_identity("another");
    EXPECT_EQ(store->get(a.info.key, &other).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store->metrics().snapshot().corrupt, 1);
    EXPECT_TRUE(store->get(a.info.key, &a.info).is_ok()) << "kept: it is not damaged";
}

TEST_P(FileStoreTest, InjectedFullDiskDropsWritesAndReadsGoOn) {
    bool full = false;
    FileStoreOptions o = options();
    o.inject_write_errno = [&full](size_t) { return full ? ENOSPC : 0; };
    auto store = open_store(dir_.path(), o);
    auto a = make_block(1);
    auto b = make_block(2);
    auto sa = a.spans();
    auto sb = b.spans();
    ASSERT_TRUE(store->put(a.info, sa).is_ok());
    full = true;
    Status s = store->put(b.info, sb);
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(store->metrics().snapshot().puts_dropped, 1);
    EXPECT_FALSE(*store->contains(b.info.key));
    EXPECT_TRUE(store->get(a.info.key, &a.info).is_ok());
    EXPECT_EQ(count_files(dir_.path() + "/tmp"), 0) << "no tmp file left behind";
}

TEST_P(FileStoreTest, PastDeadlineDoesNotHang) {
    auto store = open_store(dir_.path(), options());
    std::vector<StoreKey> keys;
    for (uint64_t s = 0; s < 8; ++s) {
        auto b = make_block(s, 4, 1 << 16);
        auto spans = b.spans();
        ASSERT_TRUE(store->put(b.info, spans).is_ok());
        keys.push_back(b.info.key);
    }
    auto r = store->get_many(keys, {}, Env::default_env()->now_ns() - 1);
    ASSERT_EQ(r.size(), keys.size());
    for (auto& x : r) {
        EXPECT_TRUE(x.is_ok() || x.status().code() == StatusCode::kDeadlineExceeded ||
                    x.status().code() == StatusCode::kNotFound);
    }
}

TEST_P(FileStoreTest, ConcurrentWritersAndReadersNeverSeeAPartialBlock) {
    auto store = open_store(dir_.path(), options());
    auto b = make_block(9, 8, 64 << 10);
    std::atomic<bool> stop{false};
    std::atomic<int> bad{0};
    std::atomic<int> hits{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&] {
            auto spans = b.spans();
            for (int i = 0; i < 20; ++i) {
                EXPECT_TRUE(store->put(b.info, spans).is_ok());
            }
        });
    }
    threads.emplace_back([&] {
        while (!stop.load()) {
            auto r = store->get(b.info.key, &b.info);
            if (r.is_ok()) {
                ++hits;
            } else if (r.status().code() != StatusCode::kNotFound) {
                ++bad;
            }
        }
    });
    threads[0].join();
    threads[1].join();
    stop = true;
    threads[2].join();
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(store->metrics().snapshot().corrupt, 0);
}

// Damage at every place a chunked read could get wrong: in the first, a middle and the
// last chunk, on both sides of a chunk boundary, in the header, and a file shorter or
// longer than its header says (also cut exactly at a chunk boundary). Each is a miss
// through get and read_many_into, also when the file's fd is already cached.
TEST_P(FileStoreTest, DamageInAnyChunkOrAWrongLengthIsAMiss) {
    auto store = open_store(dir_.path(), options());
    constexpr size_t kChunk = size_t{256} << 10;  // FileBlockStore's read chunk
    const auto good = make_block(1, 3, 300'000);    // ~900 KB: 4 chunks
    const size_t size = header_bytes(3) + 900'000;
    struct Damage {
        const char* what;
        int64_t flip_at;   // byte to flip, or -1
        int64_t new_size;  // resize to, or -1
    };
    const Damage cases[] = {
        {"header", 20, -1},
        {"first chunk payload", static_cast<int64_t>(header_bytes(3)) + 7, -1},
        {"last byte of chunk 0", kChunk - 1, -1},
        {"first byte of chunk 1", kChunk, -1},
        {"middle chunk", 2 * kChunk + 1000, -1},
        {"last chunk, last byte", static_cast<int64_t>(size) - 1, -1},
        {"one byte short", -1, static_cast<int64_t>(size) - 1},
        {"cut at a chunk boundary", -1, kChunk},
        {"one byte long", -1, static_cast<int64_t>(size) + 1},
        {"a chunk long", -1, static_cast<int64_t>(size + kChunk)},
    };
    std::vector<uint8_t> mem(size + 2 * kChunk);
    for (bool cached : {false, true}) {
        for (const Damage& d : cases) {
            SCOPED_TRACE(std::string(d.what) + (cached ? ", fd cached" : ""));
            auto spans = good.spans();
            ASSERT_TRUE(store->put(good.info, spans).is_ok());
            if (cached) {
                ASSERT_TRUE(store->get(good.info.key, &good.info).is_ok());
            }
            const std::string path = store->block_path(good.info.key);
            ASSERT_EQ(std::filesystem::file_size(path), size);
            auto damage = [&]() {
                if (d.flip_at >= 0) {  // in place: a cached fd sees it
                    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
                    f.seekg(d.flip_at);
                    char c = 0;
                    f.get(c);
                    f.seekp(d.flip_at);
                    f.put(static_cast<char>(c ^ 0x10));
                } else {
                    std::filesystem::resize_file(path, static_cast<uintmax_t>(d.new_size));
                }
            };
            damage();
            std::vector<std::span<uint8_t>> dsts = {mem};
            auto into = store->read_many_into(std::span(&good.info.key, 1),
                                              std::span(&good.info, 1), dsts);
            EXPECT_EQ(into[0].status().code(), StatusCode::kNotFound)
                << into[0].status().to_string();
            ASSERT_TRUE(store->put(good.info, spans).is_ok());
            ASSERT_TRUE(store->get(good.info.key, &good.info).is_ok()) << "rewritten: a hit";
            damage();
            auto got = store->get(good.info.key, &good.info);
            EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().to_string();
            EXPECT_FALSE(*store->contains(good.info.key)) << "damaged file is removed";
        }
    }
    EXPECT_EQ(store->metrics().snapshot().corrupt, 2 * 2 * std::size(cases));
}

// A cached fd never serves a block that was removed (GC, here from another store
// object as from another process) or replaced (a put renames a new file over it), nor
// one deleted behind the store's back.
TEST_P(FileStoreTest, FdCacheNeverServesARemovedOrReplacedBlock) {
    auto store = open_store(dir_.path(), options());
    auto other = open_store(dir_.path(), options());  // "another process": its own cache
    auto v1 = make_block(1, 2, 3000);
    auto v2 = v1;  // same key and header, other bytes
    for (auto& l : v2.layers) {
        for (auto& x : l) x = static_cast<uint8_t>(x ^ 0xa5);
    }
    auto s1 = v1.spans();
    auto s2 = v2.spans();
    auto read_back = [&](const testing::TestBlock& want) {
        auto r = store->get(v1.info.key, &v1.info);
        ASSERT_TRUE(r.is_ok()) << r.status().to_string();
        EXPECT_EQ(0, std::memcmp(r->layer(1).data(), want.layers[1].data(), 3000));
    };
    ASSERT_TRUE(store->put(v1.info, s1).is_ok());
    read_back(v1);
    EXPECT_EQ(store->num_cached_fds(), 1u);
    // Removed by another process's GC.
    ASSERT_TRUE(other->remove(v1.info.key).is_ok());
    EXPECT_EQ(store->get(v1.info.key, &v1.info).status().code(), StatusCode::kNotFound);
    // Replaced by another writer: the cached fd is the old file's.
    ASSERT_TRUE(other->put(v1.info, s1).is_ok());
    read_back(v1);
    ASSERT_TRUE(other->put(v2.info, s2).is_ok());
    read_back(v2);
    // Deleted behind every store's back.
    ASSERT_EQ(::unlink(store->block_path(v1.info.key).c_str()), 0);
    EXPECT_EQ(store->get(v1.info.key, &v1.info).status().code(), StatusCode::kNotFound);
    // The store's own replace and remove.
    ASSERT_TRUE(store->put(v1.info, s1).is_ok());
    read_back(v1);
    ASSERT_TRUE(store->put(v2.info, s2).is_ok());
    read_back(v2);
    ASSERT_TRUE(store->remove(v1.info.key).is_ok());
    EXPECT_EQ(store->num_cached_fds(), 0u);
    EXPECT_EQ(store->get(v1.info.key, &v1.info).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store->metrics().snapshot().corrupt, 0);
}

TEST_P(FileStoreTest, FdCacheIsBounded) {
    FileStoreOptions o = options();
    o.fd_cache_entries = 3;
    auto store = open_store(dir_.path(), o);
    std::vector<testing::TestBlock> blocks;
    for (uint64_t s = 0; s < 8; ++s) {
        blocks.push_back(make_block(s, 2, 500));
        auto spans = blocks.back().spans();
        ASSERT_TRUE(store->put(blocks.back().info, spans).is_ok());
    }
    for (int round = 0; round < 2; ++round) {
        for (const auto& b : blocks) {
            ASSERT_TRUE(store->get(b.info.key, &b.info).is_ok());
        }
    }
    EXPECT_EQ(store->num_cached_fds(), 3u);
    // A duplicate key in one batch opens twice; only one fd stays cached.
    std::vector<StoreKey> keys = {blocks[0].info.key, blocks[0].info.key};
    for (auto& r : store->get_many(keys, {})) EXPECT_TRUE(r.is_ok());
    EXPECT_EQ(store->num_cached_fds(), 3u);
    o.fd_cache_entries = 0;
    auto uncached = open_store(dir_.path(), o);
    ASSERT_TRUE(uncached->get(blocks[0].info.key, &blocks[0].info).is_ok());
    EXPECT_EQ(uncached->num_cached_fds(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Io, FileStoreTest,
                         ::testing::Values(ReadMethod::kUring, ReadMethod::kPread,
                                           ReadMethod::kMmap),
                         [](const auto& p) {
                             return p.param == ReadMethod::kUring   ? "uring"
                                    : p.param == ReadMethod::kPread ? "pread"
                                                                    : "mmap";
                         });

// A mapped block stays valid and unchanged after its file is removed and the key
// rewritten with other bytes (the mapping is of the old file).
TEST(FileStore, MappedBlockOutlivesItsFile) {
    TempDir dir;
    FileStoreOptions o;
    o.map_reads = true;
    auto store = open_store(dir.path(), o);
    if (!store->using_mmap()) {
        GTEST_SKIP() << "kernel without MADV_POPULATE_READ: reads use pread";
    }
    auto v1 = make_block(5, 2, 100'000);
    auto v2 = v1;
    for (auto& x : v2.layers[0]) x = static_cast<uint8_t>(~x);
    auto s1 = v1.spans();
    auto s2 = v2.spans();
    ASSERT_TRUE(store->put(v1.info, s1).is_ok());
    auto held = store->get(v1.info.key, &v1.info);
    ASSERT_TRUE(held.is_ok());
    EXPECT_TRUE(held->owns_bytes());
    ASSERT_TRUE(store->remove(v1.info.key).is_ok());
    ASSERT_TRUE(store->put(v2.info, s2).is_ok());
    auto fresh = store->get(v1.info.key, &v1.info);
    ASSERT_TRUE(fresh.is_ok());
    EXPECT_EQ(0, std::memcmp(held->layer(0).data(), v1.layers[0].data(), 100'000));
    EXPECT_EQ(0, std::memcmp(fresh->layer(0).data(), v2.layers[0].data(), 100'000));
    Block moved = std::move(held).value();  // the mapping moves with the block
    EXPECT_EQ(0, std::memcmp(moved.layer(1).data(), v1.layers[1].data(), 100'000));
}

TEST(FileStore, ReportsWhetherIoUringIsUsed) {
    TempDir dir;
    FileStoreOptions o;
    o.use_io_uring = false;
    EXPECT_FALSE(open_store(dir.path(), o)->using_io_uring());
    EXPECT_FALSE(open_store(dir.path())->using_io_uring()) << "pread is the default";
    // With io_uring requested the store either has a ring or fell back; both work.
    o.use_io_uring = true;
    auto s = open_store(dir.path(), o);
    std::printf("io_uring available: %d\n", s->using_io_uring() ? 1 : 0);
}

TEST(FileStore, KillNineMidWriteLeavesNothingVisible) {
    TempDir dir;
    auto b = make_block(42, 16, 1 << 20);  // 16 MiB
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(pipefd[0]);
        FileStoreOptions o;
        int calls = 0;
        // After the first chunk is on disk, tell the parent and stall mid-block.
        o.inject_write_errno = [&](size_t) {
            if (++calls == 2) {
                char c = 1;
                (void)!::write(pipefd[1], &c, 1);
                ::sleep(30);
            }
            return 0;
        };
        auto store = FileBlockStore::open(dir.path(), o);
        auto spans = b.spans();
        (void)(*store)->put(b.info, spans);
        ::_exit(0);
    }
    ::close(pipefd[1]);
    struct pollfd p = {pipefd[0], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 20'000), 1) << "child never started writing";
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::close(pipefd[0]);
    EXPECT_TRUE(WIFSIGNALED(status));
    auto store = open_store(dir.path());
    EXPECT_FALSE(*store->contains(b.info.key));
    EXPECT_EQ(store->get(b.info.key, &b.info).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(count_files(dir.path() + "/blocks"), 0);
    EXPECT_EQ(count_files(dir.path() + "/tmp"), 1) << "the partial tmp file is all there is";
    EXPECT_EQ(store->sweep_tmp(0), 1);
    auto listed = store->list_blocks();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_TRUE(listed->empty());
}

TEST(FileStore, RealWriteLimitDropsWritesAndReadsGoOn) {
    // A real kernel write failure without root: RLIMIT_FSIZE in a child (EFBIG).
    TempDir dir;
    {
        auto store = open_store(dir.path());
        auto small = make_block(1, 2, 1000);
        auto spans = small.spans();
        ASSERT_TRUE(store->put(small.info, spans).is_ok());
    }
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {64 << 10, 64 << 10};
        ::setrlimit(RLIMIT_FSIZE, &lim);
        auto store = std::move(FileBlockStore::open(dir.path())).value();
        auto big = make_block(2, 4, 100 << 10);
        auto spans = big.spans();
        Status s = store->put(big.info, spans);
        auto small = make_block(1, 2, 1000);
        bool read_ok = store->get(small.info.key, &small.info).is_ok();
        auto m = store->metrics().snapshot();
        bool ok = s.code() == StatusCode::kResourceExhausted && m.puts_dropped == 1 && read_ok &&
                  !*store->contains(big.info.key);
        ::_exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(count_files(dir.path() + "/tmp"), 0);
}

TEST(FileStore, OpenRejectsEmptyPathAndUris) {
    EXPECT_EQ(FileBlockStore::open("").status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(open_block_store("nonsense").is_ok());
    EXPECT_FALSE(open_block_store("ftp://x").is_ok());
    TempDir dir;
    EXPECT_FALSE(open_block_store("file://" + dir.path() + "?io=bogus").is_ok());
    EXPECT_FALSE(open_block_store("file://" + dir.path() + "?fd_cache=-1").is_ok());
    auto mapped = open_block_store("file://" + dir.path() + "?io=mmap&fd_cache=0");
    ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
    EXPECT_FALSE(open_block_store("file://" + dir.path() + "?capacity=-5").is_ok());
    EXPECT_FALSE(open_block_store("file://" + dir.path() + "?x").is_ok());
    auto s = open_block_store("file://" + dir.path() + "?io=pread&capacity=1000");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(*(*s)->capacity_bytes(), 1000);
}

}  // namespace
}  // namespace dsi::kvstore

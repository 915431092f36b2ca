#include "kvstore/fetch_service.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "kvstore/file_store.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;
using testing::TempDir;
using testing::TestBlock;

std::string unique_name(const char* what) {
    static int counter = 0;
    return std::string("dsi_fetch_") + what + "_" + std::to_string(::getpid()) + "_" +
           std::to_string(counter++);
}

std::unique_ptr<FileBlockStore> open_files(const std::string& dir) {
    FileStoreOptions o;
    o.fsync = false;
    auto r = FileBlockStore::open(dir, o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : nullptr;
}

bool same_layers(const Block& got, const TestBlock& want) {
    for (uint32_t l = 0; l < want.info.num_layers; ++l) {
        if (got.layer(l).size() != want.layers[l].size() ||
            std::memcmp(got.layer(l).data(), want.layers[l].data(), want.layers[l].size()) != 0) {
            return false;
        }
    }
    return true;
}

// The blocks, a file store holding the first `stored` of them, an shm pool, a socket path.
struct Fixture {
    TempDir dir;
    std::string socket = dir.path() + "/fetch.sock";
    std::string shm_name = unique_name("shm");
    std::vector<TestBlock> blocks;
    std::unique_ptr<FileBlockStore> files;
    std::unique_ptr<ShmBlockStore> shm;

    explicit Fixture(int n, int stored, int64_t shm_slots = 16, int64_t slot_bytes = 64 << 10) {
        files = open_files(dir.path() + "/store");
        auto pool = ShmBlockStore::open({.name = shm_name, .num_slots = shm_slots,
                                         .slot_bytes = slot_bytes, .unlink_on_close = true});
        EXPECT_TRUE(pool.is_ok()) << pool.status().to_string();
        if (pool.is_ok()) shm = std::move(pool).value();
        for (int i = 0; i < n; ++i) blocks.push_back(make_block(100 + i, 3, 2000));
        for (int i = 0; i < stored; ++i) {
            auto spans = blocks[i].spans();
            EXPECT_TRUE(files->put(blocks[i].info, spans).is_ok());
        }
    }
    std::vector<StoreKey> keys() const {
        std::vector<StoreKey> k;
        for (const TestBlock& b : blocks) k.push_back(b.info.key);
        return k;
    }
    std::vector<BlockInfo> infos() const {
        std::vector<BlockInfo> e;
        for (const TestBlock& b : blocks) e.push_back(b.info);
        return e;
    }
    std::unique_ptr<FetchService> serve(BlockStore* lower = nullptr) {
        FetchServiceOptions o;
        o.socket_path = socket;
        auto s = FetchService::start(shm.get(), lower ? lower : files.get(), o);
        EXPECT_TRUE(s.is_ok()) << s.status().to_string();
        return s.is_ok() ? std::move(s).value() : nullptr;
    }
    // read_many_into through the engine-side store, into fresh buffers.
    std::vector<Result<Block>> read(FetchProcessStore& store, std::vector<BlockBuffer>* bufs,
                                    int64_t deadline_ns = kNoDeadline) {
        std::vector<std::span<uint8_t>> dsts;
        bufs->clear();
        for (size_t i = 0; i < blocks.size(); ++i) {
            bufs->push_back(BlockBuffer::allocate(64 << 10));
            dsts.push_back(bufs->back().span());
        }
        auto k = keys();
        auto e = infos();
        return store.read_many_into(k, e, dsts, deadline_ns);
    }
};

TEST(FetchService, ProcessFillsShmAndTheEngineReadsFromThere) {
    Fixture f(4, 3);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    std::vector<BlockBuffer> bufs;
    auto got = f.read(store, &bufs);
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(got[i].is_ok()) << i << ": " << got[i].status().to_string();
        EXPECT_TRUE(same_layers(*got[i], f.blocks[i]));
        EXPECT_TRUE(*f.shm->contains(f.blocks[i].info.key)) << "published into shm";
    }
    EXPECT_EQ(got[3].status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store.fetch_stats().fetched_by_process, 3);
    EXPECT_EQ(store.fetch_stats().fallback_reads, 0);
    FetchServiceStats s = service->stats();
    EXPECT_EQ(s.requests, 1);
    EXPECT_EQ(s.fetched, 3);
    EXPECT_EQ(s.misses, 1);
    EXPECT_GT(s.bytes_fetched, 3 * 6000);
    // Again: the three are shm hits now; only the absent one goes to the process.
    got = f.read(store, &bufs);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(got[i].is_ok());
    EXPECT_EQ(service->stats().requests, 2);
    EXPECT_EQ(service->stats().keys, 5);
    // get_many takes the same path.
    auto k = f.keys();
    auto many = store.get_many(std::span<const StoreKey>(k).first(3), {});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(many[i].is_ok() && same_layers(*many[i], f.blocks[i]));
}

TEST(FetchService, ExpectationsAreCheckedByTheProcess) {
    Fixture f(2, 2);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    auto k = f.keys();
    auto e = f.infos();
    e[1].model = model_identity("another-model");
    auto got = store.get_many(k, e);
    EXPECT_TRUE(got[0].is_ok());
    EXPECT_EQ(got[1].status().code(), StatusCode::kNotFound);
    EXPECT_FALSE(*f.shm->contains(k[1])) << "a mismatched block is never published";
    EXPECT_EQ(service->stats().misses, 1);
}

TEST(FetchService, WithoutTheProcessTheEngineReadsTheStoreItself) {
    Fixture f(3, 3);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);  // nobody listens
    std::vector<BlockBuffer> bufs;
    auto got = f.read(store, &bufs);
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(got[i].is_ok()) << got[i].status().to_string();
        EXPECT_TRUE(same_layers(*got[i], f.blocks[i]));
    }
    EXPECT_EQ(store.fetch_stats().fallback_reads, 3);
    EXPECT_EQ(store.fetch_stats().fetched_by_process, 0);
}

TEST(FetchService, SeparateProcessKilledMidServiceLeavesServingUp) {
    Fixture f(6, 6);
    const pid_t pid = ::fork();
    if (pid == 0) {
        // The fetch process: its own mapping of the pool, its own store client.
        ShmStoreOptions o;
        o.name = f.shm_name;
        o.num_slots = 16;
        o.slot_bytes = 64 << 10;
        auto shm = ShmBlockStore::open(o);
        FileStoreOptions fo;
        fo.fsync = false;
        auto files = FileBlockStore::open(f.dir.path() + "/store", fo);
        if (!shm.is_ok() || !files.is_ok()) ::_exit(2);
        FetchServiceOptions so;
        so.socket_path = f.socket;
        auto s = FetchService::start(shm->get(), files->get(), so);
        if (!s.is_ok()) ::_exit(3);
        while (true) ::pause();  // until SIGKILL
    }
    ASSERT_GT(pid, 0);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    auto k = f.keys();
    auto e = f.infos();
    // Wait for the child to listen (bounded).
    for (int i = 0; i < 500 && store.fetch_stats().fetched_by_process == 0; ++i) {
        auto got = store.get_many(std::span<const StoreKey>(k).first(1),
                                  std::span<const BlockInfo>(e).first(1));
        ASSERT_TRUE(got[0].is_ok());
        if (store.fetch_stats().fetched_by_process == 0) {
            ASSERT_TRUE(f.shm->remove(k[0]).is_ok());  // fell back: try again
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    ASSERT_EQ(store.fetch_stats().fetched_by_process, 1) << "the child process never served";
    auto two = store.get_many(std::span<const StoreKey>(k).subspan(1, 2),
                              std::span<const BlockInfo>(e).subspan(1, 2));
    ASSERT_TRUE(two[0].is_ok() && two[1].is_ok());
    EXPECT_EQ(store.fetch_stats().fetched_by_process, 3);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    const int64_t fallback_before = store.fetch_stats().fallback_reads;
    auto rest = store.get_many(std::span<const StoreKey>(k).subspan(3),
                               std::span<const BlockInfo>(e).subspan(3));
    for (size_t i = 0; i < rest.size(); ++i) {
        ASSERT_TRUE(rest[i].is_ok()) << rest[i].status().to_string();
        EXPECT_TRUE(same_layers(*rest[i], f.blocks[3 + i]));
    }
    EXPECT_EQ(store.fetch_stats().fallback_reads - fallback_before, 3);
}

// Sends one raw datagram; true when the service then closed the connection.
bool closed_after(const std::string& path, const std::vector<uint8_t>& msg) {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return false;
    }
    (void)::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
    uint8_t buf[64];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);  // blocks until reply or close
    ::close(fd);
    return n == 0;
}

std::vector<uint8_t> header(uint32_t magic, uint16_t version, uint32_t count, size_t keys) {
    std::vector<uint8_t> m(24 + keys * 56, 0);
    std::memcpy(m.data(), &magic, 4);
    std::memcpy(m.data() + 4, &version, 2);
    std::memcpy(m.data() + 8, &count, 4);
    const uint32_t timeout_ms = 1000;
    std::memcpy(m.data() + 12, &timeout_ms, 4);
    return m;
}

TEST(FetchService, MalformedRequestsCloseOnlyThatConnection) {
    Fixture f(2, 2);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    constexpr uint32_t kMagic = 0x51465344;
    EXPECT_TRUE(closed_after(f.socket, {1, 2, 3}));                    // short
    EXPECT_TRUE(closed_after(f.socket, header(0xdeadbeef, 1, 0, 0)));  // magic
    EXPECT_TRUE(closed_after(f.socket, header(kMagic, 9, 0, 0)));      // version
    EXPECT_TRUE(closed_after(f.socket, header(kMagic, 1, 2, 1)));      // count vs length
    EXPECT_TRUE(closed_after(f.socket, header(kMagic, 1, kFetchMaxKeys + 1, kFetchMaxKeys + 1)));
    std::vector<uint8_t> bad_flag = header(kMagic, 1, 1, 1);
    bad_flag[24 + 44] = 7;  // has_expect must be 0 or 1
    EXPECT_TRUE(closed_after(f.socket, bad_flag));
    std::vector<uint8_t> huge(100'000, 0xab);  // larger than any request
    EXPECT_TRUE(closed_after(f.socket, huge));
    EXPECT_EQ(service->stats().bad_requests, 7);
    // A well-formed empty request is answered, and a real client is still served.
    EXPECT_FALSE(closed_after(f.socket, header(kMagic, 1, 0, 0)));
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    auto k = f.keys();
    auto got = store.get_many(k, f.infos());
    EXPECT_TRUE(got[0].is_ok() && got[1].is_ok());
    EXPECT_EQ(store.fetch_stats().fetched_by_process, 2);
}

TEST(FetchService, LateProcessAnswersDeadlineExceededAndNothingHangs) {
    Fixture f(2, 2);
    // The process's view of the same directory, wedged until the test releases it.
    auto base = FileBlockStore::open(f.dir.path() + "/store");
    ASSERT_TRUE(base.is_ok());
    struct Slow : BlockStore {
        BlockStore* inner;
        std::atomic<bool> released{false};
        explicit Slow(BlockStore* s) : inner(s) {}
        Status put(const BlockInfo& i, std::span<const std::span<const uint8_t>> l,
                   int64_t d) override { return inner->put(i, l, d); }
        Result<Block> get(const StoreKey& k, const BlockInfo* e, int64_t d) override {
            return inner->get(k, e, d);
        }
        std::vector<Result<Block>> read_many_into(std::span<const StoreKey> k,
                                                  std::span<const BlockInfo> e,
                                                  std::span<const std::span<uint8_t>> dst,
                                                  int64_t d) override {
            while (!released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return inner->read_many_into(k, e, dst, d);
        }
        Result<bool> contains(const StoreKey& k, int64_t d) override {
            return inner->contains(k, d);
        }
        Status remove(const StoreKey& k) override { return inner->remove(k); }
        std::string uri() const override { return "slow"; }
        Result<std::vector<GcEntry>> list_blocks() override { return inner->list_blocks(); }
        Result<int64_t> capacity_bytes() override { return inner->capacity_bytes(); }
        StoreMetrics& metrics() override { return inner->metrics(); }
    } slow(base->get());
    auto service = f.serve(&slow);
    ASSERT_NE(service, nullptr);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    auto k = f.keys();
    auto e = f.infos();
    // The process cannot answer before `released`: the call ends at its deadline.
    auto got = store.get_many(k, e, deadline_after_ms(50));
    for (auto& r : got) EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_EQ(store.fetch_stats().fallback_reads, 0) << "past the deadline nothing is read";
    slow.released = true;
    // The late reply is never taken as the answer to the next request.
    auto again = store.get_many(k, e, kNoDeadline);
    for (size_t i = 0; i < again.size(); ++i) {
        ASSERT_TRUE(again[i].is_ok()) << again[i].status().to_string();
        EXPECT_TRUE(same_layers(*again[i], f.blocks[i]));
    }
}

TEST(FetchService, FullShmPoolFallsBackToAnEngineRead) {
    Fixture f(2, 2, /*shm_slots=*/1, /*slot_bytes=*/4096);  // every block is larger
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    FetchProcessStore store(f.shm.get(), f.files.get(), f.socket);
    auto got = store.get_many(f.keys(), f.infos());
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(got[i].is_ok()) << got[i].status().to_string();
        EXPECT_TRUE(same_layers(*got[i], f.blocks[i]));
    }
    EXPECT_EQ(service->stats().shm_full, 2);
    EXPECT_EQ(store.fetch_stats().fallback_reads, 2);
}

TEST(FetchService, LongKeyListsAreSplitIntoRequestsWithinTheLimit) {
    Fixture f(0, 0, 4);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    std::vector<StoreKey> keys;
    for (uint64_t i = 0; i < kFetchMaxKeys + 44; ++i) keys.push_back({i + 1, 99});
    FetchClient client(f.socket);
    auto codes = client.fetch(keys, {}, kNoDeadline);
    ASSERT_TRUE(codes.is_ok()) << codes.status().to_string();
    ASSERT_EQ(codes->size(), keys.size());
    for (FetchCode c : *codes) EXPECT_EQ(c, FetchCode::kMiss);
    EXPECT_EQ(service->stats().requests, 2);
    EXPECT_EQ(service->stats().misses, static_cast<int64_t>(keys.size()));
}

TEST(FetchService, BadOptionsAreRefused) {
    Fixture f(0, 0);
    FetchServiceOptions o;
    o.socket_path = std::string(200, 'x');
    EXPECT_EQ(FetchService::start(f.shm.get(), f.files.get(), o).status().code(),
              StatusCode::kInvalidArgument);
    o.socket_path = f.dir.path() + "/no/such/dir/s.sock";
    EXPECT_EQ(FetchService::start(f.shm.get(), f.files.get(), o).status().code(),
              StatusCode::kUnavailable);
    o.socket_path = f.socket;
    o.max_connections = 0;
    EXPECT_EQ(FetchService::start(f.shm.get(), f.files.get(), o).status().code(),
              StatusCode::kInvalidArgument);
    FetchClient client(std::string(200, 'y'));
    StoreKey k{1, 2};
    EXPECT_EQ(client.fetch(std::span<const StoreKey>(&k, 1), {}, kNoDeadline).status().code(),
              StatusCode::kInvalidArgument);
}

TEST(FetchService, OpenedByUri) {
    Fixture f(2, 2);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    // The engine attaches to the pool the process fills (same name and geometry).
    auto s = open_block_store("shm://" + f.shm_name + "?slots=16&fetcher=" + f.socket +
                              "&slot_bytes=65536|file://" + f.dir.path() + "/store?fsync=0");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    auto* store = dynamic_cast<FetchProcessStore*>(s->get());
    ASSERT_NE(store, nullptr);
    EXPECT_NE(store->uri().find(f.socket), std::string::npos);
    auto got = store->get_many(f.keys(), f.infos());
    EXPECT_TRUE(got[0].is_ok() && got[1].is_ok());
    EXPECT_EQ(store->fetch_stats().fetched_by_process, 2);
    const std::string empty_fetcher =
        "shm://" + f.shm_name + "?slots=16&slot_bytes=65536&fetcher=|file://" + f.dir.path();
    EXPECT_EQ(open_block_store(empty_fetcher).status().code(), StatusCode::kInvalidArgument);
}

TEST(FetchService, StopEndsIdleConnectionsAndIsIdempotent) {
    Fixture f(1, 1);
    auto service = f.serve();
    ASSERT_NE(service, nullptr);
    FetchClient client(f.socket);
    auto k = f.keys();
    ASSERT_TRUE(client.fetch(k, {}, kNoDeadline).is_ok());  // leaves an idle connection
    service->stop();
    service->stop();
    EXPECT_EQ(client.fetch(k, {}, kNoDeadline).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dsi::kvstore

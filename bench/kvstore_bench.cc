// KV store throughput (issue 8): file:// put/get (io_uring and pread) and Redis put/get
// (plain and erasure-coded), each against a plain sequential write/read of the same
// bytes measured in the same run. Blocks are V3-shaped: 61 layers x 128 tokens x 656 B
// (e4m3 MLA latent + rope + scales). Usage: kvstore_bench [DIR] [NUM_BLOCKS].
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/file_store.h"
#include "kvstore/redis_store.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/test_util.h"

using namespace dsi;
using namespace dsi::kvstore;

namespace {

constexpr uint32_t kLayers = 61;
constexpr size_t kLayerBytes = 128 * 656;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
    std::string what;
    double mb_s;
    double ratio;  // to the plain sequential baseline
};

// Plain sequential write (+fsync) and read of `bytes` bytes in 1 MiB calls.
std::pair<double, double> raw_baseline(const std::string& dir, size_t bytes) {
    std::string path = dir + "/raw.bin";
    std::vector<uint8_t> buf(1 << 20, 0x5a);
    auto t0 = std::chrono::steady_clock::now();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < bytes; done += buf.size()) {
        (void)!::write(fd, buf.data(), std::min(buf.size(), bytes - done));
    }
    ::fsync(fd);
    ::close(fd);
    double w = bytes / 1e6 / seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    fd = ::open(path.c_str(), O_RDONLY);
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
    double r = bytes / 1e6 / seconds_since(t0);
    ::unlink(path.c_str());
    return {w, r};
}

std::pair<double, double> store_rates(BlockStore& store,
                                      const std::vector<testing::TestBlock>& blocks, bool batch) {
    size_t bytes = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& b : blocks) {
        auto spans = b.spans();
        if (!store.put(b.info, spans).is_ok()) {
            std::fprintf(stderr, "put failed\n");
        }
        bytes += kLayers * kLayerBytes;
    }
    double w = bytes / 1e6 / seconds_since(t0);
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    for (const auto& b : blocks) {
        keys.push_back(b.info.key);
        infos.push_back(b.info);
    }
    t0 = std::chrono::steady_clock::now();
    size_t ok = 0;
    if (batch) {
        for (size_t i = 0; i < keys.size(); i += 8) {
            size_t n = std::min<size_t>(8, keys.size() - i);
            auto r = store.get_many(std::span(keys).subspan(i, n), std::span(infos).subspan(i, n));
            for (auto& x : r) {
                ok += x.is_ok();
            }
        }
    } else {
        for (size_t i = 0; i < keys.size(); ++i) {
            ok += store.get(keys[i], &infos[i]).is_ok();
        }
    }
    double r = bytes / 1e6 / seconds_since(t0);
    if (ok != keys.size()) {
        std::fprintf(stderr, "only %zu of %zu reads hit\n", ok, keys.size());
    }
    return {w, r};
}

}  // namespace

int main(int argc, char** argv) {
    // KVSTORE_BENCH_REUSE=1: keep freed block buffers in the heap (no fresh mmap + page
    // faults per block), as an engine reusing its host buffers would.
    if (const char* reuse = std::getenv("KVSTORE_BENCH_REUSE"); reuse && reuse[0] == '1') {
        mallopt(M_MMAP_THRESHOLD, 256 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
    testing::TempDir tmp;
    std::string dir = argc > 1 ? argv[1] : tmp.path();
    int num_blocks = argc > 2 ? std::atoi(argv[2]) : 32;
    std::vector<testing::TestBlock> blocks;
    for (int i = 0; i < num_blocks; ++i) {
        blocks.push_back(testing::make_block(static_cast<uint64_t>(i), kLayers, kLayerBytes));
    }
    const size_t bytes = static_cast<size_t>(num_blocks) * kLayers * kLayerBytes;
    std::printf("blocks: %d x %.2f MB = %.0f MB; dir %s\n", num_blocks,
                kLayers * kLayerBytes / 1e6, bytes / 1e6, dir.c_str());
    auto [raw_w, raw_r] = raw_baseline(dir, bytes);
    std::printf("| store | write MB/s | vs raw write | read MB/s | vs raw read |\n|---|---|---|---|---|\n");
    std::printf("| raw sequential file (1 MiB calls, fsync at end) | %.0f | 1.00 | %.0f | 1.00 |\n",
                raw_w, raw_r);
    auto report = [&](const char* name, std::pair<double, double> wr) {
        std::printf("| %s | %.0f | %.2f | %.0f | %.2f |\n", name, wr.first, wr.first / raw_w,
                    wr.second, wr.second / raw_r);
        std::fflush(stdout);
    };
    for (int mode = 0; mode < 3; ++mode) {
        std::string sub = dir + "/store" + std::to_string(mode);
        FileStoreOptions o;
        o.use_io_uring = mode != 1;
        o.fsync = mode != 2;
        auto store = std::move(FileBlockStore::open(sub, o)).value();
        const char* names[] = {"file:// io_uring get_many(8), fsync per block",
                               "file:// pread get, fsync per block",
                               "file:// io_uring get_many(8), no fsync"};
        report(names[mode], store_rates(*store, blocks, mode != 1));
        std::error_code ec;
        std::filesystem::remove_all(sub, ec);
    }
    if (testing::have_redis_server()) {
        std::vector<std::unique_ptr<testing::RedisTestServer>> servers;
        for (int i = 0; i < 6; ++i) {
            servers.push_back(std::make_unique<testing::RedisTestServer>());
        }
        for (auto [k, m, n] : {std::tuple{1, 0, 1}, std::tuple{4, 2, 6}}) {
            RedisStoreOptions o;
            for (int i = 0; i < n; ++i) {
                o.servers.push_back({"127.0.0.1", servers[i]->port()});
            }
            o.k = k;
            o.m = m;
            o.io_timeout_ms = 10'000;
            auto store = std::move(RedisBlockStore::open(o)).value();
            std::string name = "redis k=" + std::to_string(k) + " m=" + std::to_string(m) + " (" +
                               std::to_string(n) + " servers, loopback)";
            report(name.c_str(), store_rates(*store, blocks, false));
        }
    }
    return 0;
}

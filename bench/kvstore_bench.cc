// KV store throughput (issue 8): file:// put/get (io_uring and pread; fresh buffers and
// caller-owned reused buffers) and Redis put/get (plain and erasure-coded), each against
// a plain sequential write/read of the same bytes measured in the same run.
// Block shapes: the `small` preset's (3 layers x 128 tokens x 576 floats, f32 and bf16
// rows) and a V3-shaped one (61 layers x 128 tokens x 656 B e4m3 latent+rope+scales).
// Usage: kvstore_bench [DIR] [MB_PER_SHAPE] [shape,...]   (shapes: small-f32,small-bf16,v3)
// Reads: best of 3 passes for every row (the raw baseline too).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kvstore/file_store.h"
#include "kvstore/redis_store.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/test_util.h"

using namespace dsi;
using namespace dsi::kvstore;

namespace {

constexpr int kPasses = 3;
constexpr size_t kBatch = 8;

struct Shape {
    const char* name;
    uint32_t layers;
    size_t layer_bytes;
};

constexpr Shape kShapes[] = {
    {"small-f32", 3, 128 * 576 * 4},
    {"small-bf16", 3, 128 * 576 * 2},
    {"v3", 61, 128 * 656},
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Plain sequential write (+fsync) and read of `bytes` bytes in 1 MiB calls into one
// reused buffer (best of kPasses reads).
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
    double r = 0;
    for (int pass = 0; pass < kPasses; ++pass) {
        t0 = std::chrono::steady_clock::now();
        fd = ::open(path.c_str(), O_RDONLY);
        while (::read(fd, buf.data(), buf.size()) > 0) {
        }
        ::close(fd);
        r = std::max(r, bytes / 1e6 / seconds_since(t0));
    }
    ::unlink(path.c_str());
    return {w, r};
}

enum class ReadMode { kGet, kGetMany, kReadInto };

double write_rate(BlockStore& store, const std::vector<testing::TestBlock>& blocks) {
    size_t bytes = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& b : blocks) {
        auto spans = b.spans();
        if (!store.put(b.info, spans).is_ok()) {
            std::fprintf(stderr, "put failed\n");
        }
        for (const auto& l : b.layers) bytes += l.size();
    }
    return bytes / 1e6 / seconds_since(t0);
}

// Payload MB/s of reading every block back (best of kPasses).
double read_rate(BlockStore& store, const std::vector<testing::TestBlock>& blocks, ReadMode mode) {
    std::vector<StoreKey> keys;
    std::vector<BlockInfo> infos;
    size_t bytes = 0;
    for (const auto& b : blocks) {
        keys.push_back(b.info.key);
        infos.push_back(b.info);
        for (const auto& l : b.layers) bytes += l.size();
    }
    // Caller-owned buffers, allocated and touched once, reused by every batch (as the
    // engine's host buffers / shm slots are).
    const size_t block_bytes = header_bytes(blocks[0].info.num_layers) + bytes / blocks.size();
    std::vector<BlockBuffer> mem;
    std::vector<std::span<uint8_t>> dsts;
    for (size_t i = 0; i < kBatch; ++i) {
        mem.push_back(BlockBuffer::allocate(block_bytes));
        std::memset(mem.back().data(), 0, block_bytes);
        dsts.push_back(mem.back().span());
    }
    double best = 0;
    for (int pass = 0; pass < kPasses; ++pass) {
        size_t ok = 0;
        auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < keys.size(); i += kBatch) {
            size_t n = std::min(kBatch, keys.size() - i);
            auto k = std::span(keys).subspan(i, n);
            auto e = std::span(infos).subspan(i, n);
            if (mode == ReadMode::kGet) {
                for (size_t j = 0; j < n; ++j) ok += store.get(k[j], &e[j]).is_ok();
            } else {
                auto r = mode == ReadMode::kGetMany
                             ? store.get_many(k, e)
                             : store.read_many_into(k, e, std::span(dsts).first(n));
                for (auto& x : r) ok += x.is_ok();
            }
        }
        best = std::max(best, bytes / 1e6 / seconds_since(t0));
        if (ok != keys.size()) {
            std::fprintf(stderr, "only %zu of %zu reads hit\n", ok, keys.size());
        }
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    testing::TempDir tmp;
    std::string dir = argc > 1 ? argv[1] : tmp.path();
    double mb_per_shape = argc > 2 ? std::atof(argv[2]) : 128;
    std::string wanted = argc > 3 ? argv[3] : "small-f32,small-bf16,v3";
    std::unique_ptr<std::vector<std::unique_ptr<testing::RedisTestServer>>> servers;
    for (const Shape& shape : kShapes) {
        if (("," + wanted + ",").find("," + std::string(shape.name) + ",") == std::string::npos) {
            continue;
        }
        const size_t block_payload = shape.layers * shape.layer_bytes;
        const int num_blocks = std::max(8, static_cast<int>(mb_per_shape * 1e6 / block_payload));
        std::vector<testing::TestBlock> blocks;
        for (int i = 0; i < num_blocks; ++i) {
            blocks.push_back(
                testing::make_block(static_cast<uint64_t>(i), shape.layers, shape.layer_bytes));
        }
        const size_t bytes = static_cast<size_t>(num_blocks) * block_payload;
        std::printf("\nshape %s: %d blocks x %.3f MB = %.0f MB; dir %s\n", shape.name, num_blocks,
                    block_payload / 1e6, bytes / 1e6, dir.c_str());
        auto [raw_w, raw_r] = raw_baseline(dir, bytes);
        std::printf(
            "| store | write MB/s | vs raw write | read MB/s | vs raw read |\n|---|---|---|---|---|\n");
        std::printf("| raw sequential file (1 MiB calls, fsync at end) | %.0f | 1.00 | %.0f | 1.00 |\n",
                    raw_w, raw_r);
        auto report = [&](const std::string& name, double w, double r) {
            std::printf("| %s | %.0f | %.2f | %.0f | %.2f |\n", name.c_str(), w, w / raw_w, r,
                        r / raw_r);
            std::fflush(stdout);
        };
        struct FileRow {
            const char* name;
            bool uring;
            bool fsync;
            ReadMode mode;
        };
        const FileRow rows[] = {
            {"file:// io_uring, fsync per block; get_many(8) fresh buffers", true, true,
             ReadMode::kGetMany},
            {"file:// io_uring, no fsync; read_many_into(8) reused buffers", true, false,
             ReadMode::kReadInto},
            {"file:// pread, no fsync; read_many_into(8) reused buffers", false, false,
             ReadMode::kReadInto},
            {"file:// pread, no fsync; get (one block) fresh buffers", false, false,
             ReadMode::kGet},
        };
        int idx = 0;
        for (const FileRow& row : rows) {
            std::string sub = dir + "/store" + std::to_string(idx++);
            FileStoreOptions o;
            o.use_io_uring = row.uring;
            o.fsync = row.fsync;
            auto store = std::move(FileBlockStore::open(sub, o)).value();
            double w = write_rate(*store, blocks);
            // Reads measure reads: no writeback of the no-fsync rows running beside them.
            int dfd = ::open(sub.c_str(), O_RDONLY | O_DIRECTORY);
            (void)::syncfs(dfd);
            ::close(dfd);
            report(row.name, w, read_rate(*store, blocks, row.mode));
            std::error_code ec;
            std::filesystem::remove_all(sub, ec);
        }
        if (!testing::have_redis_server() || std::string(shape.name) == "v3") {
            continue;  // Redis rows for the small shapes only (bench time)
        }
        if (servers == nullptr) {
            servers = std::make_unique<std::vector<std::unique_ptr<testing::RedisTestServer>>>();
            for (int i = 0; i < 6; ++i) {
                servers->push_back(std::make_unique<testing::RedisTestServer>());
            }
        }
        for (auto [k, m, n] : {std::tuple{1, 0, 1}, std::tuple{4, 2, 6}}) {
            RedisStoreOptions o;
            for (int i = 0; i < n; ++i) {
                o.servers.push_back({"127.0.0.1", (*servers)[i]->port()});
            }
            o.k = k;
            o.m = m;
            o.io_timeout_ms = 10'000;
            auto store = std::move(RedisBlockStore::open(o)).value();
            std::string name = "redis k=" + std::to_string(k) + " m=" + std::to_string(m) + " (" +
                               std::to_string(n) + " servers, loopback); get_many(8)";
            double w = write_rate(*store, blocks);
            report(name, w, read_rate(*store, blocks, ReadMode::kGetMany));
            for (const auto& b : blocks) (void)store->remove(b.info.key);
        }
    }
    return 0;
}

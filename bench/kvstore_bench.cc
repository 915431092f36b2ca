// KV store throughput (issue 8): file:// put/get (pread and io_uring; fresh buffers and
// caller-owned reused buffers) and Redis put/get (plain and erasure-coded), each against
// baselines measured in the same run:
//   - raw: a plain sequential read of one file of the same byte count in 1 MiB calls
//     into one reused buffer (the goal's reference: "store reads >= 80 % of the raw
//     device"); writes: the same bytes in 1 MiB calls + one fsync;
//   - raw into 8 buffers: the same file read one block per call into 8 reused buffers
//     of the block's size (the memory the store's read_many_into(8) fills): a plain read
//     that delivers the data where a reader needs it, without checksum or per-file cost;
//   - for Redis: bare hiredis GETs of the same encoded-block values, pipelined 8 deep,
//     each copied into one of 8 reused buffers (loopback, same server), and a plain
//     loopback TCP stream of the same bytes from a sender thread (the transport's own
//     ceiling on this machine).
//   - raw device (issue 20): the same file read with O_DIRECT in 1 MiB calls into one
//     aligned buffer: the device itself, no page cache. With CACHE = cold (the default)
//     every pass of every file row starts with the row's files evicted from the page cache
//     (syncfs, then posix_fadvise DONTNEED per file), so the stores read the device too and
//     "vs device" is the goal ratio; CACHE = warm keeps the old page-cache runs.
// Equal work: every read pass, baselines included, reads each delivered byte once after
// delivery (an XOR over 8-byte words, the consumer's first touch), so the mapped path
// (zero copy, pages faulted in) and the copying paths (pread/io_uring into buffers) do the
// same work per byte before the clock stops.
// Fairness: every read row (baselines included) runs one pass per round, rounds repeat
// kRounds times, so all rows see the same load; a row's figure is its best pass (its
// median is printed too). Block shapes: the `small` preset's (3 layers x 128 tokens x 576
// floats, f32 and bf16 rows) and a V3-shaped one (61 layers x 128 tokens x 656 B).
// Usage: kvstore_bench [DIR] [MB_PER_SHAPE] [shape,...] [ROUNDS] [CACHE]
//        (shapes: small-f32,small-bf16,v3; default ROUNDS 7; CACHE cold | warm, default cold)
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/file_store.h"
#include "kvstore/redis_store.h"
#include "kvstore/redis_test_server.h"
#include "kvstore/test_util.h"

using namespace dsi;
using namespace dsi::kvstore;

namespace {

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

// The consumer's first touch of delivered bytes (see the header): XOR of 8-byte words.
volatile uint64_t g_sink = 0;
void consume(std::span<const uint8_t> bytes) {
    uint64_t x = 0;
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
        uint64_t w;
        std::memcpy(&w, bytes.data() + i, 8);
        x ^= w;
    }
    for (; i < bytes.size(); ++i) x ^= bytes[i];
    g_sink = g_sink ^ x;
}

// CACHE = cold: drop `path` (a file, or every file under a directory) from the page cache.
bool g_cold = true;
void evict(const std::string& path) {
    if (!g_cold) return;
    auto drop = [](const std::string& file) {
        int fd = ::open(file.c_str(), O_RDONLY);
        if (fd < 0) return;
        (void)::fdatasync(fd);
        (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    };
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec)) {
        drop(path);
        return;
    }
    for (const auto& e : std::filesystem::recursive_directory_iterator(path, ec)) {
        if (e.is_regular_file(ec)) drop(e.path().string());
    }
}

// Reads until `buf` is full or EOF; returns the bytes read.
size_t read_full(int fd, uint8_t* buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = ::read(fd, buf + done, n - done);
        if (r <= 0) {
            break;
        }
        done += static_cast<size_t>(r);
    }
    return done;
}

// One row of the table: a write rate (0: none) and a read pass run once per round.
struct Row {
    std::string name;
    double write_mbps = 0;
    std::function<double()> read_pass;  // payload MB/s of one pass
    std::vector<double> reads;
    std::function<void()> cleanup;
};

// `num` reusable buffers of `bytes` each, allocated and touched once.
struct Buffers {
    Buffers(size_t num, size_t bytes) {
        for (size_t i = 0; i < num; ++i) {
            mem.push_back(BlockBuffer::allocate(bytes));
            std::memset(mem.back().data(), 0, bytes);
            spans.push_back(mem.back().span());
        }
    }
    std::vector<BlockBuffer> mem;
    std::vector<std::span<uint8_t>> spans;
};

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

// A pass reading every block back through `store` in batches of kBatch.
std::function<double()> store_pass(BlockStore* store, const std::vector<testing::TestBlock>& blocks,
                                   ReadMode mode, std::string evict_dir = "") {
    auto keys = std::make_shared<std::vector<StoreKey>>();
    auto infos = std::make_shared<std::vector<BlockInfo>>();
    size_t bytes = 0;
    for (const auto& b : blocks) {
        keys->push_back(b.info.key);
        infos->push_back(b.info);
        for (const auto& l : b.layers) bytes += l.size();
    }
    // Caller-owned buffers reused by every batch (as the engine's Fetcher pool is).
    const size_t block_bytes = header_bytes(blocks[0].info.num_layers) + bytes / blocks.size();
    auto bufs = std::make_shared<Buffers>(kBatch, block_bytes);
    return [=]() {
        size_t ok = 0;
        if (!evict_dir.empty()) evict(evict_dir);
        auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < keys->size(); i += kBatch) {
            size_t n = std::min(kBatch, keys->size() - i);
            auto k = std::span(*keys).subspan(i, n);
            auto e = std::span(*infos).subspan(i, n);
            if (mode == ReadMode::kGet) {
                for (size_t j = 0; j < n; ++j) {
                    auto b = store->get(k[j], &e[j]);
                    if (b.is_ok()) {
                        consume(b->payload());
                        ++ok;
                    }
                }
            } else {
                auto r = mode == ReadMode::kGetMany
                             ? store->get_many(k, e)
                             : store->read_many_into(k, e, std::span(bufs->spans).first(n));
                for (auto& x : r) {
                    if (x.is_ok()) {
                        consume(x->payload());
                        ++ok;
                    }
                }
            }
        }
        double rate = bytes / 1e6 / seconds_since(t0);
        if (ok != keys->size()) {
            std::fprintf(stderr, "only %zu of %zu reads hit\n", ok, keys->size());
        }
        return rate;
    };
}

// The raw rows: one file of `bytes`; 1 MiB calls into one buffer, and block-size calls
// into 8 block-size buffers.
std::vector<Row> raw_rows(const std::string& dir, size_t bytes, size_t block_payload,
                          size_t block_bytes) {
    auto path = std::make_shared<std::string>(dir + "/raw.bin");
    std::vector<uint8_t> buf(1 << 20, 0x5a);
    auto t0 = std::chrono::steady_clock::now();
    int fd = ::open(path->c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t done = 0; done < bytes; done += buf.size()) {
        (void)!::write(fd, buf.data(), std::min(buf.size(), bytes - done));
    }
    ::fsync(fd);
    ::close(fd);
    const double w = bytes / 1e6 / seconds_since(t0);
    std::vector<Row> rows(3);
    rows[0].name = "raw device: O_DIRECT sequential read, 1 MiB calls into one aligned buffer (goal reference)";
    rows[0].write_mbps = w;
    std::shared_ptr<uint8_t> aligned(static_cast<uint8_t*>(std::aligned_alloc(4096, 1 << 20)), std::free);
    rows[0].read_pass = [=]() {
        auto t = std::chrono::steady_clock::now();
        int f = ::open(path->c_str(), O_RDONLY | O_DIRECT);
        if (f < 0) {
            std::fprintf(stderr, "O_DIRECT open failed: %s\n", std::strerror(errno));
            return 0.0;
        }
        size_t got = 0;
        for (ssize_t r; (r = ::read(f, aligned.get(), 1 << 20)) > 0;) {
            consume({aligned.get(), static_cast<size_t>(r)});
            got += static_cast<size_t>(r);
        }
        ::close(f);
        return got / 1e6 / seconds_since(t);
    };
    rows[0].cleanup = [=]() { ::unlink(path->c_str()); };
    rows[1].name = "raw sequential file (page cache path), 1 MiB calls into one reused buffer";
    auto one = std::make_shared<std::vector<uint8_t>>(1 << 20);
    rows[1].read_pass = [=]() {
        evict(*path);
        auto t = std::chrono::steady_clock::now();
        int f = ::open(path->c_str(), O_RDONLY);
        for (ssize_t r; (r = ::read(f, one->data(), one->size())) > 0;) {
            consume({one->data(), static_cast<size_t>(r)});
        }
        ::close(f);
        return bytes / 1e6 / seconds_since(t);
    };
    rows[2].name = "raw sequential file, one block per call into 8 reused block buffers";
    auto bufs = std::make_shared<Buffers>(kBatch, block_bytes);
    rows[2].read_pass = [=]() {
        evict(*path);
        auto t = std::chrono::steady_clock::now();
        int f = ::open(path->c_str(), O_RDONLY);
        for (size_t i = 0;; ++i) {
            const size_t n = read_full(f, bufs->spans[i % kBatch].data(), block_payload);
            if (n == 0) break;
            consume(bufs->spans[i % kBatch].first(n));
        }
        ::close(f);
        return bytes / 1e6 / seconds_since(t);
    };
    return rows;
}

// Bare hiredis: SET the encoded blocks as plain values, then GET them pipelined kBatch
// deep, each copied into one of kBatch reused buffers (the least a Redis read costs).
Row redis_raw_row(int port, const std::vector<testing::TestBlock>& blocks, size_t bytes) {
    Row row;
    row.name = "bare hiredis GET of the encoded blocks, pipelined 8, into 8 reused buffers";
    struct timeval tv = {10, 0};
    std::shared_ptr<redisContext> ctx(redisConnectWithTimeout("127.0.0.1", port, tv), redisFree);
    std::vector<std::string> names;
    size_t block_bytes = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        auto enc = std::move(encode_block(blocks[i].info, blocks[i].spans())).value();
        block_bytes = enc.size();
        names.push_back("raw:" + std::to_string(i));
        auto* r = static_cast<redisReply*>(redisCommand(ctx.get(), "SET %b %b", names[i].data(),
                                                        names[i].size(), enc.data(), enc.size()));
        if (r != nullptr) {
            freeReplyObject(r);
        }
    }
    auto bufs = std::make_shared<Buffers>(kBatch, block_bytes);
    auto keys = std::make_shared<std::vector<std::string>>(std::move(names));
    row.read_pass = [=]() {
        auto t = std::chrono::steady_clock::now();
        size_t ok = 0;
        for (size_t i = 0; i < keys->size(); i += kBatch) {
            size_t n = std::min(kBatch, keys->size() - i);
            for (size_t j = 0; j < n; ++j) {
                const std::string& k = (*keys)[i + j];
                redisAppendCommand(ctx.get(), "GET %b", k.data(), k.size());
            }
            for (size_t j = 0; j < n; ++j) {
                void* reply = nullptr;
                if (redisGetReply(ctx.get(), &reply) != REDIS_OK || reply == nullptr) {
                    continue;
                }
                auto* r = static_cast<redisReply*>(reply);
                if (r->type == REDIS_REPLY_STRING && r->len <= bufs->spans[j].size()) {
                    std::memcpy(bufs->spans[j].data(), r->str, r->len);
                    ++ok;
                }
                freeReplyObject(r);
            }
        }
        double rate = bytes / 1e6 / seconds_since(t);
        if (ok != keys->size()) {
            std::fprintf(stderr, "bare GET: only %zu of %zu\n", ok, keys->size());
        }
        return rate;
    };
    row.cleanup = [=]() {
        for (const auto& k : *keys) {
            auto* r =
                static_cast<redisReply*>(redisCommand(ctx.get(), "DEL %b", k.data(), k.size()));
            if (r != nullptr) {
                freeReplyObject(r);
            }
        }
    };
    return row;
}

// Plain loopback TCP: a second thread sends `bytes` (block by block) over a loopback
// connection per pass; the reader receives each block into one of kBatch reused
// buffers. What any Redis client could reach here (the sender stands in for the server).
Row tcp_raw_row(size_t bytes, size_t block_bytes) {
    Row row;
    row.name = "plain loopback TCP, a sender thread, each block received into 8 reused buffers";
    auto bufs = std::make_shared<Buffers>(kBatch, block_bytes);
    row.read_pass = [=]() {
        int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = {};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        (void)::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        (void)::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
        (void)::listen(lfd, 1);
        std::thread sender([&a, bytes, block_bytes]() {
            int fd = ::socket(AF_INET, SOCK_STREAM, 0);
            if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
                std::vector<uint8_t> block(block_bytes, 0x5a);
                for (size_t sent = 0; sent < bytes;) {
                    size_t n = std::min(block_bytes, bytes - sent);
                    ssize_t w = ::send(fd, block.data(), n, MSG_NOSIGNAL);
                    if (w <= 0) break;
                    sent += static_cast<size_t>(w);
                }
            }
            ::close(fd);
        });
        int cfd = ::accept(lfd, nullptr, nullptr);
        auto t = std::chrono::steady_clock::now();
        size_t got = 0;
        for (size_t i = 0; got < bytes; ++i) {
            size_t n =
                read_full(cfd, bufs->spans[i % kBatch].data(), std::min(block_bytes, bytes - got));
            if (n == 0) break;
            got += n;
        }
        double rate = got / 1e6 / seconds_since(t);
        sender.join();
        ::close(cfd);
        ::close(lfd);
        return rate;
    };
    return row;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    testing::TempDir tmp;
    std::string dir = argc > 1 ? argv[1] : tmp.path();
    double mb_per_shape = argc > 2 ? std::atof(argv[2]) : 128;
    std::string wanted = argc > 3 ? argv[3] : "small-f32,small-bf16,v3";
    int rounds = argc > 4 ? std::max(1, std::atoi(argv[4])) : 7;
    g_cold = argc > 5 ? std::string(argv[5]) != "warm" : true;
    std::unique_ptr<std::vector<std::unique_ptr<testing::RedisTestServer>>> servers;
    for (const Shape& shape : kShapes) {
        if (("," + wanted + ",").find("," + std::string(shape.name) + ",") == std::string::npos) {
            continue;
        }
        const size_t block_payload = shape.layers * shape.layer_bytes;
        const size_t block_bytes = header_bytes(shape.layers) + block_payload;
        const int num_blocks = std::max(8, static_cast<int>(mb_per_shape * 1e6 / block_payload));
        std::vector<testing::TestBlock> blocks;
        for (int i = 0; i < num_blocks; ++i) {
            blocks.push_back(
                testing::make_block(static_cast<uint64_t>(i), shape.layers, shape.layer_bytes));
        }
        const size_t bytes = static_cast<size_t>(num_blocks) * block_payload;
        std::printf("\nshape %s: %d blocks x %.3f MB = %.0f MB; dir %s; %d rounds; page cache %s\n",
                    shape.name, num_blocks, block_payload / 1e6, bytes / 1e6, dir.c_str(), rounds,
                    g_cold ? "evicted before every file pass (cold)" : "warm");
        std::fflush(stdout);
        std::vector<Row> rows = raw_rows(dir, bytes, block_payload, block_bytes);
        struct FileRow {
            const char* name;
            bool uring;
            bool fsync;
            ReadMode mode;
            bool map = false;
            size_t fd_cache = 64;  // the default
        };
        const FileRow file_rows[] = {
            {"file:// io_uring, fsync per block; get_many(8), fresh buffers", true, true,
             ReadMode::kGetMany},
            {"file:// io_uring; read_many_into(8), reused buffers", true, false,
             ReadMode::kReadInto},
            {"file:// pread, no fd cache; read_many_into(8), reused buffers", false, false,
             ReadMode::kReadInto, false, 0},
            {"file:// pread; read_many_into(8), reused buffers (engine path)", false, false,
             ReadMode::kReadInto},
            {"file:// pread, fd cache 1024 (every block's fd stays open); read_many_into(8)", false,
             false, ReadMode::kReadInto, false, 1024},
            {"file:// pread; get (one block), fresh buffers", false, false, ReadMode::kGet},
            {"file:// io=mmap; get_many(8), zero copy (the block maps its file)", false, false,
             ReadMode::kGetMany, true},
            {"file:// io=mmap, fd cache 1024; get_many(8), zero copy", false, false,
             ReadMode::kGetMany, true, 1024},
        };
        std::vector<std::unique_ptr<BlockStore>> stores;
        int idx = 0;
        for (const FileRow& fr : file_rows) {
            std::string sub = dir + "/store" + std::to_string(idx++);
            FileStoreOptions o;
            o.use_io_uring = fr.uring;
            o.fsync = fr.fsync;
            o.map_reads = fr.map;
            o.fd_cache_entries = fr.fd_cache;
            stores.push_back(std::move(FileBlockStore::open(sub, o)).value());
            Row row;
            row.name = fr.name;
            row.write_mbps = write_rate(*stores.back(), blocks);
            // Reads measure reads: no writeback of the no-fsync rows running beside them.
            int dfd = ::open(sub.c_str(), O_RDONLY | O_DIRECTORY);
            (void)::syncfs(dfd);
            ::close(dfd);
            row.read_pass = store_pass(stores.back().get(), blocks, fr.mode, sub);
            row.cleanup = [sub]() {
                std::error_code ec;
                std::filesystem::remove_all(sub, ec);
            };
            rows.push_back(std::move(row));
        }
        if (testing::have_redis_server() && std::string(shape.name) != "v3") {
            // Redis rows for the small shapes only (bench time).
            if (servers == nullptr) {
                servers =
                    std::make_unique<std::vector<std::unique_ptr<testing::RedisTestServer>>>();
                for (int i = 0; i < 7; ++i) {
                    servers->push_back(std::make_unique<testing::RedisTestServer>());
                }
            }
            rows.push_back(tcp_raw_row(bytes, block_bytes));
            rows.push_back(redis_raw_row((*servers)[0]->port(), blocks, bytes));
            // Each store on its own servers (same block keys): k=1 on server 0, 4+2 on 1..6.
            for (auto [k, m, n, first] : {std::tuple{1, 0, 1, 0}, std::tuple{4, 2, 6, 1}}) {
                RedisStoreOptions o;
                for (int i = first; i < first + n; ++i) {
                    o.servers.push_back({"127.0.0.1", (*servers)[i]->port()});
                }
                o.k = k;
                o.m = m;
                o.io_timeout_ms = 10'000;
                stores.push_back(std::move(RedisBlockStore::open(o)).value());
                BlockStore* store = stores.back().get();
                Row row;
                row.name = "redis k=" + std::to_string(k) + " m=" + std::to_string(m) + " (" +
                           std::to_string(n) + " servers, loopback); get_many(8)";
                row.write_mbps = write_rate(*store, blocks);
                row.read_pass = store_pass(store, blocks, ReadMode::kGetMany);
                row.cleanup = [store, &blocks]() {
                    for (const auto& b : blocks) (void)store->remove(b.info.key);
                };
                rows.push_back(std::move(row));
                Row into;  // the engine's Fetcher path: its reused buffers
                into.name = "redis k=" + std::to_string(k) + " m=" + std::to_string(m) +
                            "; read_many_into(8), reused buffers";
                into.read_pass = store_pass(store, blocks, ReadMode::kReadInto);
                rows.push_back(std::move(into));
            }
        }
        for (int r = 0; r < rounds; ++r) {
            for (Row& row : rows) {
                row.reads.push_back(row.read_pass());
            }
        }
        const double raw_w = rows[0].write_mbps;
        // Ratios are of medians (issue 20: never best-of).
        const double raw_r = median(rows[0].reads);
        const double raw8_r = median(rows[2].reads);
        std::printf(
            "| store / read path | write MB/s | vs raw write | read MB/s (best) | median | median vs "
            "raw device (O_DIRECT) | median vs raw into 8 buffers |\n|---|---|---|---|---|---|---|\n");
        for (Row& row : rows) {
            double best = *std::max_element(row.reads.begin(), row.reads.end());
            std::string w = row.write_mbps > 0 ? std::to_string(static_cast<int>(row.write_mbps))
                                               : std::string("-");
            std::string wr = "-";
            if (row.write_mbps > 0) {
                char b[16];
                std::snprintf(b, sizeof(b), "%.2f", row.write_mbps / raw_w);
                wr = b;
            }
            std::printf("| %s | %s | %s | %.0f | %.0f | %.2f | %.2f |\n", row.name.c_str(),
                        w.c_str(), wr.c_str(), best, median(row.reads), median(row.reads) / raw_r,
                        median(row.reads) / raw8_r);
            if (row.cleanup) {
                row.cleanup();
            }
        }
        std::fflush(stdout);
    }
    return 0;
}

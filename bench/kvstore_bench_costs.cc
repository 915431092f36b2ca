// Where the time of a file:// block read goes (issue 8, docs/kvstore.md "Read path"):
// the pieces of FileBlockStore's read paths timed alone on the same page-cache-resident
// files, each against the raw loop (one file, 1 MiB reads into one reused buffer) in the
// same run. Rows alternate round by round; figures are the best of ROUNDS.
// Usage: kvstore_bench_costs [DIR] [BLOCK_BYTES] [NUM_BLOCKS] [ROUNDS]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvstore/block_format.h"
#include "kvstore/internal/xxh3_fast.h"
#include "kvstore/test_util.h"

using namespace dsi::kvstore;

namespace {

constexpr size_t kChunk = size_t{256} << 10;  // FileBlockStore's read chunk
constexpr size_t kBatch = 8;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void pread_all(int fd, uint8_t* dst, size_t n, size_t off) {
    for (size_t done = 0; done < n;) {
        ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
        if (r <= 0) return;
        done += static_cast<size_t>(r);
    }
}

}  // namespace

int main(int argc, char** argv) {
    testing::TempDir tmp;
    const std::string dir = argc > 1 ? argv[1] + std::string("/kvstore_bench_costs") : tmp.path();
    const size_t bsz = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 442'368;
    const size_t nb = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 289;
    const int rounds = argc > 4 ? std::max(1, std::atoi(argv[4])) : 9;
    std::filesystem::create_directories(dir);
    std::vector<uint8_t> src(bsz);
    for (size_t i = 0; i < bsz; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<std::string> paths;
    for (size_t i = 0; i < nb; ++i) {
        paths.push_back(dir + "/" + std::to_string(i));
        int fd = ::open(paths.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        (void)!::write(fd, src.data(), bsz);
        ::close(fd);
    }
    const std::string raw = dir + "/raw";
    int rfd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t i = 0; i < nb; ++i) (void)!::write(rfd, src.data(), bsz);
    ::close(rfd);
    ::sync();
    std::vector<BlockBuffer> dst;
    for (size_t i = 0; i < kBatch; ++i) {
        dst.push_back(BlockBuffer::allocate(bsz));
        std::memset(dst.back().data(), 0, bsz);
    }
    std::vector<uint8_t> one(1 << 20);
    std::vector<int> open_fds;
    for (const auto& p : paths) open_fds.push_back(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    const auto& x = internal::xxh3_ops();
    volatile uint64_t sink = 0;
    // Per block: open (or a cached fd), fstat, then `body`, then close.
    auto per_file = [&](bool cached, const std::function<void(int, uint8_t*)>& body) {
        for (size_t i = 0; i < nb; ++i) {
            int fd = cached ? open_fds[i] : ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
            struct stat st;
            ::fstat(fd, &st);
            body(fd, dst[i % kBatch].data());
            if (!cached) ::close(fd);
        }
    };
    auto chunked_hash = [&](int fd, uint8_t* d) {
        internal::Xxh3State s;
        x.reset(&s);
        for (size_t o = 0; o < bsz; o += kChunk) {
            size_t n = std::min(kChunk, bsz - o);
            pread_all(fd, d + o, n, o);
            x.update(&s, d + o, n);
        }
        sink = sink + x.digest(&s);
    };
    auto mapped = [&](bool hash, bool copy) {
        return [&, hash, copy](int fd, uint8_t* d) {
            void* m = ::mmap(nullptr, bsz, PROT_READ, MAP_SHARED, fd, 0);
            ::madvise(m, bsz, MADV_POPULATE_READ);
            const auto* p = static_cast<const uint8_t*>(m);
            internal::Xxh3State s;
            x.reset(&s);
            for (size_t o = 0; o < bsz && (hash || copy); o += kChunk) {
                size_t n = std::min(kChunk, bsz - o);
                if (copy) std::memcpy(d + o, p + o, n);
                if (hash) x.update(&s, copy ? d + o : p + o, n);
            }
            sink = sink + x.digest(&s);
            ::munmap(m, bsz);
        };
    };
    struct Row {
        const char* name;
        std::function<void()> pass;
        double best = 0;
    };
    std::vector<Row> rows = {
        {"raw: one file, 1 MiB reads into one buffer (reference)",
         [&] {
             int fd = ::open(raw.c_str(), O_RDONLY);
             while (::read(fd, one.data(), one.size()) > 0) {
             }
             ::close(fd);
         }},
        {"raw: one file, one block per read into 8 block buffers",
         [&] {
             int fd = ::open(raw.c_str(), O_RDONLY);
             for (size_t i = 0; i < nb; ++i) pread_all(fd, dst[i % kBatch].data(), bsz, i * bsz);
             ::close(fd);
         }},
        {"per file: open+fstat+pread(whole)+close, no hash",
         [&] { per_file(false, [&](int fd, uint8_t* d) { pread_all(fd, d, bsz, 0); }); }},
        {"per file: 256 KiB preads, each hashed as it lands (store's pread path)",
         [&] { per_file(false, chunked_hash); }},
        {"cached fd: 256 KiB preads + hash (no open/close)", [&] { per_file(true, chunked_hash); }},
        {"per file: pread whole, then hash (a second pass)",
         [&] {
             per_file(false, [&](int fd, uint8_t* d) {
                 pread_all(fd, d, bsz, 0);
                 sink = sink + x.hash(d, bsz);
             });
         }},
        {"mmap+POPULATE_READ, hash in place, munmap (io=mmap)",
         [&] { per_file(true, mapped(true, false)); }},
        {"mmap+POPULATE_READ+munmap only", [&] { per_file(true, mapped(false, false)); }},
        {"mmap+POPULATE_READ, memcpy+hash per 256 KiB, munmap",
         [&] { per_file(true, mapped(true, true)); }},
        {"XXH3 of a block-size L2-hot buffer only",
         [&] {
             for (size_t i = 0; i < nb; ++i) {
                 sink = sink + x.hash(one.data(), std::min(bsz, one.size()));
             }
         }},
    };
    const double total_mb = static_cast<double>(bsz) * static_cast<double>(nb) / 1e6;
    for (int r = 0; r < rounds; ++r) {
        for (Row& row : rows) {
            auto t0 = std::chrono::steady_clock::now();
            row.pass();
            row.best = std::max(row.best, total_mb / seconds_since(t0));
        }
    }
    std::printf("%zu blocks x %zu bytes, %d rounds, XXH3 %s\n", nb, bsz, rounds, x.isa);
    std::printf("| step | MB/s | vs raw | us per block |\n|---|---|---|---|\n");
    for (const Row& row : rows) {
        std::printf("| %s | %.0f | %.2f | %.1f |\n", row.name, row.best, row.best / rows[0].best,
                    static_cast<double>(bsz) / row.best);
    }
    for (int fd : open_fds) ::close(fd);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 0;
}

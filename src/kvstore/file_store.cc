// file:// backend (issue 8). Crash safety comes from publish-by-rename: a block path
// only ever names a complete, fsynced file (S-KV-1: the cache must survive a crash of
// the machine that wrote it).
#include "kvstore/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <list>
#include <unordered_map>

#include "base/mutex.h"
#include "base/env.h"

namespace dsi::kvstore {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

bool is_space_error(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

int64_t now_ns() { return Env::default_env()->now_ns(); }

int64_t stat_ns(const struct timespec& ts) { return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec; }

Status mkdir_p(const std::string& path) {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) {
        return internal_error("mkdir " + path + ": " + ec.message());
    }
    return Status::ok();
}

Status fsync_dir(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return internal_error("open dir " + dir + ": " + errno_text(errno));
    }
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    return rc == 0 ? Status::ok() : internal_error("fsync dir: " + errno_text(err));
}

// Reads exactly buf.size() bytes at `offset` (short only at EOF or on error).
bool pread_full(int fd, std::span<uint8_t> buf, uint64_t offset) {
    size_t done = 0;
    while (done < buf.size()) {
        ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done, offset + done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        done += static_cast<size_t>(n);
    }
    return true;
}

std::atomic<uint64_t> g_tmp_counter{0};

}  // namespace

struct FileBlockStore::Ring {
    struct io_uring ring;
};

// Open fds of recently read blocks, LRU. take() checks an fd out (one reader at a
// time); give() puts it back as the most recent, closing the least recent beyond the
// capacity (or the fd itself when the key is already cached).
class FileBlockStore::FdCache {
public:
    explicit FdCache(size_t capacity) : capacity_(capacity) {}
    ~FdCache() {
        for (auto& [key, fd] : lru_) ::close(fd);
    }
    int take(const StoreKey& key) {
        MutexLock lock(&mu_);
        auto it = index_.find(key);
        if (it == index_.end()) {
            return -1;
        }
        int fd = it->second->second;
        lru_.erase(it->second);
        index_.erase(it);
        return fd;
    }
    void give(const StoreKey& key, int fd) {
        int to_close = -1;
        {
            MutexLock lock(&mu_);
            if (index_.contains(key)) {
                to_close = fd;  // another reader's fd of the same file is cached
            } else {
                lru_.emplace_front(key, fd);
                index_[key] = lru_.begin();
                if (lru_.size() > capacity_) {
                    to_close = lru_.back().second;
                    index_.erase(lru_.back().first);
                    lru_.pop_back();
                }
            }
        }
        if (to_close >= 0) {
            ::close(to_close);
        }
    }
    void drop(const StoreKey& key) {
        int fd = take(key);
        if (fd >= 0) {
            ::close(fd);
        }
    }
    size_t size() const {
        MutexLock lock(&mu_);
        return lru_.size();
    }

private:
    const size_t capacity_;
    mutable Mutex mu_;
    std::list<std::pair<StoreKey, int>> lru_ DSI_GUARDED_BY(mu_);  // most recent first
    std::unordered_map<StoreKey, std::list<std::pair<StoreKey, int>>::iterator, StoreKeyHash>
        index_ DSI_GUARDED_BY(mu_);
};

FileBlockStore::FileBlockStore(std::string root, FileStoreOptions options)
    : root_(std::move(root)), options_(std::move(options)) {}

FileBlockStore::~FileBlockStore() {
    if (ring_) {
        io_uring_queue_exit(&ring_->ring);
    }
}

Result<std::unique_ptr<FileBlockStore>> FileBlockStore::open(const std::string& root,
                                                             FileStoreOptions options) {
    if (root.empty()) {
        return invalid_argument("file store: empty path");
    }
    DSI_RETURN_IF_ERROR(mkdir_p(root + "/blocks"));
    DSI_RETURN_IF_ERROR(mkdir_p(root + "/tmp"));
    std::unique_ptr<FileBlockStore> store(new FileBlockStore(root, std::move(options)));
    if (store->options_.use_io_uring) {
        // Run-time choice: containers and old kernels may refuse io_uring (ENOSYS/EPERM).
        auto ring = std::make_unique<Ring>();
        if (io_uring_queue_init(store->options_.io_uring_entries, &ring->ring, 0) == 0) {
            store->ring_ = std::move(ring);
        }
    }
    if (store->options_.map_reads) {
        // MADV_POPULATE_READ (Linux 5.14) is what turns an I/O error into a miss instead
        // of a SIGBUS; without it, reads stay on pread.
        void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            store->map_reads_ = ::madvise(p, 4096, MADV_POPULATE_READ) == 0;
            ::munmap(p, 4096);
        }
    }
    if (store->options_.fd_cache_entries > 0) {
        store->fd_cache_ = std::make_unique<FdCache>(store->options_.fd_cache_entries);
    }
    store->sweep_tmp(store->options_.stale_tmp_age_s);
    return store;
}

std::string FileBlockStore::block_path(const StoreKey& key) const {
    std::string hex = to_hex(key);
    return root_ + "/blocks/" + hex.substr(0, 2) + "/" + hex + ".blk";
}

Status FileBlockStore::put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                           int64_t /*deadline_ns*/) {
    int64_t t0 = now_ns();
    auto encoded = encode_block(info, layers);
    if (!encoded.is_ok()) {
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return encoded.status();
    }
    const std::vector<uint8_t>& bytes = *encoded;
    std::string hex = to_hex(info.key);
    std::string tmp = root_ + "/tmp/" + hex + "." + std::to_string(::getpid()) + "." +
                      std::to_string(g_tmp_counter.fetch_add(1)) + ".tmp";
    auto fail = [&](int err, const std::string& what) -> Status {
        ::unlink(tmp.c_str());
        if (is_space_error(err)) {
            metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
            return resource_exhausted("file store full: " + what + ": " + errno_text(err));
        }
        metrics_.errors.fetch_add(1, std::memory_order_relaxed);
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return internal_error("file store: " + what + ": " + errno_text(err));
    };
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        return fail(errno, "create " + tmp);
    }
    size_t done = 0;
    while (done < bytes.size()) {
        size_t chunk = std::min<size_t>(bytes.size() - done, size_t{8} << 20);
        int injected = options_.inject_write_errno ? options_.inject_write_errno(chunk) : 0;
        ssize_t n = injected != 0 ? -1 : ::write(fd, bytes.data() + done, chunk);
        int err = injected != 0 ? injected : errno;
        if (n < 0 && err == EINTR) {
            continue;
        }
        if (n <= 0) {
            ::close(fd);
            return fail(n == 0 ? ENOSPC : err, "write");
        }
        done += static_cast<size_t>(n);
    }
    if (options_.fsync && ::fsync(fd) != 0) {
        int err = errno;
        ::close(fd);
        return fail(err, "fsync");
    }
    if (::close(fd) != 0) {
        return fail(errno, "close");
    }
    std::string dir = root_ + "/blocks/" + hex.substr(0, 2);
    std::string path = dir + "/" + hex + ".blk";
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        if (err != ENOENT || !mkdir_p(dir).is_ok() || ::rename(tmp.c_str(), path.c_str()) != 0) {
            return fail(err == ENOENT ? errno : err, "rename");
        }
    }
    if (fd_cache_) {
        fd_cache_->drop(info.key);  // the cached fd is the replaced file's
    }
    if (options_.fsync) {
        // Make the rename itself durable; the block is already visible and complete.
        (void)fsync_dir(dir);
    }
    metrics_.puts.fetch_add(1, std::memory_order_relaxed);
    metrics_.bytes_written.fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
    metrics_.put_latency.record(now_ns() - t0);
    return Status::ok();
}

void FileBlockStore::read_files(std::span<ReadJob> jobs, int64_t deadline_ns) {
    const size_t chunk = kReadChunkBytes;
    std::unique_lock<std::mutex> lock(ring_mu_, std::try_to_lock);
    if (!ring_ || !lock.owns_lock()) {
        // Chunked pread; each chunk is hashed right after it lands (still in cache).
        for (ReadJob& j : jobs) {
            j.ok = j.fd >= 0;
            for (size_t off = 0; j.ok && off < j.dst.size(); off += chunk) {
                std::span<uint8_t> c = j.dst.subspan(off, std::min(chunk, j.dst.size() - off));
                j.ok = pread_full(j.fd, c, off);
                if (j.ok) {
                    j.hasher.update(c);
                }
            }
        }
        return;
    }
    // io_uring: every chunk of every block in one stream of batched submissions; a
    // block's chunks are hashed in order as the contiguous prefix completes.
    struct io_uring* ring = &ring_->ring;
    struct Pending {
        size_t job;
        size_t chunk;
    };
    std::vector<Pending> pending;  // (job, chunk) in submission order
    std::vector<std::vector<uint8_t>> done(jobs.size());
    std::vector<size_t> next_hash(jobs.size(), 0);
    for (size_t i = 0; i < jobs.size(); ++i) {
        jobs[i].ok = jobs[i].fd >= 0;
        if (!jobs[i].ok) {
            continue;
        }
        size_t n = (jobs[i].dst.size() + chunk - 1) / chunk;
        done[i].assign(n, 0);
        for (size_t c = 0; c < n; ++c) {
            pending.push_back({i, c});
        }
    }
    auto chunk_span = [&](const Pending& p) {
        std::span<uint8_t> d = jobs[p.job].dst;
        size_t off = p.chunk * chunk;
        return d.subspan(off, std::min(chunk, d.size() - off));
    };
    size_t next = 0;
    size_t in_flight = 0;
    bool timed_out = false;
    while (next < pending.size() || in_flight > 0) {
        unsigned queued = 0;
        while (next < pending.size() && !timed_out) {
            struct io_uring_sqe* sqe = io_uring_get_sqe(ring);
            if (sqe == nullptr) {
                break;
            }
            std::span<uint8_t> c = chunk_span(pending[next]);
            io_uring_prep_read(sqe, jobs[pending[next].job].fd, c.data(),
                               static_cast<unsigned>(c.size()), pending[next].chunk * chunk);
            io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(next));
            ++next;
            ++in_flight;
            ++queued;
        }
        if (in_flight == 0) {
            break;
        }
        if (queued > 0) {
            io_uring_submit(ring);
        }
        struct io_uring_cqe* cqe = nullptr;
        int rc;
        if (timed_out || deadline_ns == kNoDeadline) {
            rc = io_uring_wait_cqe(ring, &cqe);
        } else {
            int64_t left = std::max<int64_t>(deadline_ns - now_ns(), 0);
            struct __kernel_timespec ts = {left / 1'000'000'000, left % 1'000'000'000};
            rc = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
        }
        if (rc == -EINTR) {
            continue;
        }
        if (rc == -ETIME) {
            // Deadline: cancel what is in flight, then drain (file reads complete or
            // cancel promptly; the buffers must not be freed under the kernel).
            timed_out = true;
            for (size_t i = 0; i < next; ++i) {
                struct io_uring_sqe* sqe = io_uring_get_sqe(ring);
                if (sqe != nullptr) {
                    io_uring_prep_cancel(sqe, reinterpret_cast<void*>(i), 0);
                    io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(~uintptr_t{0}));
                }
            }
            io_uring_submit(ring);
            continue;
        }
        if (rc < 0) {
            break;  // the ring failed: drain below, the rest is a miss
        }
        uintptr_t idx = reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe));
        int res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        if (idx == ~uintptr_t{0}) {
            continue;  // a cancel's own completion
        }
        --in_flight;
        const Pending& p = pending[idx];
        ReadJob& j = jobs[p.job];
        std::span<uint8_t> c = chunk_span(p);
        size_t got = res > 0 ? static_cast<size_t>(res) : 0;
        // A short read finishes with pread (rare for regular files).
        bool ok = res >= 0 &&
                  (got == c.size() ||
                   (!timed_out && pread_full(j.fd, c.subspan(got), p.chunk * chunk + got)));
        if (!ok) {
            j.ok = false;
            continue;
        }
        done[p.job][p.chunk] = 1;
        while (j.ok && next_hash[p.job] < done[p.job].size() && done[p.job][next_hash[p.job]]) {
            j.hasher.update(chunk_span({p.job, next_hash[p.job]}));
            ++next_hash[p.job];
        }
    }
    while (in_flight > 0) {
        // Ring error mid-batch: drain what is in flight before touching the buffers.
        struct io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(ring, &cqe) != 0) {
            break;
        }
        in_flight -= io_uring_cqe_get_data(cqe) != reinterpret_cast<void*>(~uintptr_t{0});
        io_uring_cqe_seen(ring, cqe);
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        if (next_hash[i] < done[i].size()) {
            jobs[i].ok = false;  // not every chunk arrived (deadline or ring error)
        }
    }
}

void FileBlockStore::map_files(std::span<ReadJob> jobs, std::span<BlockBuffer> bufs) {
    for (size_t i = 0; i < jobs.size(); ++i) {
        ReadJob& j = jobs[i];
        if (j.fd < 0) {
            continue;
        }
        const size_t size = j.file_bytes;
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, j.fd, 0);
        if (p == MAP_FAILED) {
            j.ok = false;
            continue;
        }
        bufs[i] = BlockBuffer::adopt_mapping(p, size);
        j.dst = bufs[i].span();
        // Faults every page in now: an I/O error is an error here (a miss), and the
        // hash below and the caller's copies take no faults.
        j.ok = ::madvise(p, size, MADV_POPULATE_READ) == 0;
        if (j.ok) {
            j.hasher.update(j.dst);
        }
    }
}

int FileBlockStore::open_block(const StoreKey& key, struct stat* st) {
    int fd = fd_cache_ ? fd_cache_->take(key) : -1;
    if (fd >= 0) {
        if (::fstat(fd, st) == 0 && st->st_nlink > 0) {
            return fd;
        }
        // Stale: removed (GC, maybe another process) or replaced by a rename since it
        // was cached. Never read it: open the path again.
        ::close(fd);
    }
    fd = ::open(block_path(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    if (::fstat(fd, st) != 0) {
        st->st_size = 0;  // unusable: the size check fails it
    }
    return fd;
}

void FileBlockStore::release_fd(const StoreKey& key, int fd, bool keep) {
    if (keep && fd_cache_) {
        fd_cache_->give(key, fd);
    } else {
        ::close(fd);
    }
}

size_t FileBlockStore::num_cached_fds() const { return fd_cache_ ? fd_cache_->size() : 0; }

Result<Block> FileBlockStore::finish_read(const StoreKey& key, Result<Block> block,
                                          const ReadJob& job) {
    if (!block.is_ok()) {
        metrics_.corrupt.fetch_add(1, std::memory_order_relaxed);
        metrics_.misses.fetch_add(1, std::memory_order_relaxed);
        if (block.status().code() == StatusCode::kDataLoss) {
            // A damaged block is removed so the next writer can store a good one.
            ::unlink(block_path(key).c_str());
        }
        return not_found("block unusable: " + block.status().message());
    }
    // Last access for the GC worker's LRU (S-KV-3); mtime stays the write time. A
    // recent access is not rewritten (relatime-like: one inode update per granule).
    if (Env::default_env()->wall_ns() - job.last_access_ns >=
        options_.atime_granularity_s * 1'000'000'000LL) {
        struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
        (void)::futimens(job.fd, times);
    }
    metrics_.hits.fetch_add(1, std::memory_order_relaxed);
    metrics_.bytes_read.fetch_add(static_cast<int64_t>(block->size_bytes()),
                                  std::memory_order_relaxed);
    return block;
}

std::vector<Result<Block>> FileBlockStore::read_blocks(std::span<const StoreKey> keys,
                                                       std::span<const BlockInfo> expects,
                                                       std::span<const std::span<uint8_t>> dsts,
                                                       int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    DSI_CHECK(dsts.empty() || dsts.size() == keys.size());
    int64_t t0 = now_ns();
    std::vector<ReadJob> jobs(keys.size());
    std::vector<BlockBuffer> bufs(dsts.empty() ? keys.size() : 0);
    std::vector<Result<Block>> out;
    out.reserve(keys.size());
    std::vector<Status> early(keys.size());
    const bool map = dsts.empty() && map_reads_;
    for (size_t i = 0; i < keys.size(); ++i) {
        struct stat st;
        int fd = open_block(keys[i], &st);
        if (fd < 0) {
            early[i] = not_found("no block");
            if (errno != ENOENT) {
                metrics_.errors.fetch_add(1, std::memory_order_relaxed);
            }
            continue;
        }
        if (st.st_size < static_cast<off_t>(kFixedHeaderBytes) ||
            static_cast<uint64_t>(st.st_size) > kMaxBlockBytes + header_bytes(kMaxLayers)) {
            ::close(fd);
            metrics_.corrupt.fetch_add(1, std::memory_order_relaxed);
            ::unlink(block_path(keys[i]).c_str());
            early[i] = not_found("block unusable: bad file size");
            continue;
        }
        const size_t size = static_cast<size_t>(st.st_size);
        if (!dsts.empty() && dsts[i].size() < size) {
            ::close(fd);
            early[i] = invalid_argument("buffer smaller than the stored block");
            continue;
        }
        jobs[i].fd = fd;
        jobs[i].last_access_ns = std::max(stat_ns(st.st_atim), stat_ns(st.st_mtim));
        jobs[i].file_bytes = size;
        if (dsts.empty() && !map) {  // (map: map_files sets dst to the mapping)
            bufs[i] = BlockBuffer::allocate(size);  // not zero-filled: the read fills it
            jobs[i].dst = bufs[i].span();
        } else if (!map) {
            jobs[i].dst = dsts[i].first(size);
        }
    }
    if (map) {
        map_files(jobs, bufs);
    } else {
        read_files(jobs, deadline_ns);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
        ReadJob& j = jobs[i];
        if (j.fd < 0) {
            if (early[i].code() == StatusCode::kNotFound) {
                metrics_.misses.fetch_add(1, std::memory_order_relaxed);
            }
            out.emplace_back(early[i]);
            continue;
        }
        if (!j.ok) {
            metrics_.errors.fetch_add(1, std::memory_order_relaxed);
            metrics_.misses.fetch_add(1, std::memory_order_relaxed);
            bool late = deadline_ns != kNoDeadline && now_ns() >= deadline_ns;
            out.emplace_back(late ? deadline_exceeded("block read past its deadline")
                                  : not_found("block read failed"));
        } else {
            const BlockInfo* expect = expects.empty() ? nullptr : &expects[i];
            Result<Block> b = dsts.empty()
                                  ? decode_block(std::move(bufs[i]), expect, j.hasher.digest())
                                  : decode_view(j.dst, expect, j.hasher.digest());
            out.emplace_back(finish_read(keys[i], std::move(b), j));
        }
        // Only a verified file's fd is worth keeping (a damaged one was unlinked).
        release_fd(keys[i], j.fd, out.back().is_ok());
    }
    metrics_.get_latency.record(now_ns() - t0);
    return out;
}

std::vector<Result<Block>> FileBlockStore::get_many(std::span<const StoreKey> keys,
                                                    std::span<const BlockInfo> expects,
                                                    int64_t deadline_ns) {
    return read_blocks(keys, expects, {}, deadline_ns);
}

std::vector<Result<Block>> FileBlockStore::read_many_into(
    std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
    std::span<const std::span<uint8_t>> dsts, int64_t deadline_ns) {
    DSI_CHECK_EQ(dsts.size(), keys.size());
    return read_blocks(keys, expects, dsts, deadline_ns);
}

Result<Block> FileBlockStore::get(const StoreKey& key, const BlockInfo* expect,
                                  int64_t deadline_ns) {
    std::vector<BlockInfo> expects;
    if (expect != nullptr) {
        expects.push_back(*expect);
    }
    auto r = get_many(std::span<const StoreKey>(&key, 1), expects, deadline_ns);
    return std::move(r[0]);
}

Result<bool> FileBlockStore::contains(const StoreKey& key, int64_t /*deadline_ns*/) {
    struct stat st;
    std::string path = block_path(key);
    if (::stat(path.c_str(), &st) == 0) {
        return true;
    }
    if (errno == ENOENT) {
        return false;
    }
    metrics_.errors.fetch_add(1, std::memory_order_relaxed);
    return internal_error("stat " + path + ": " + errno_text(errno));
}

Status FileBlockStore::remove(const StoreKey& key) {
    std::string path = block_path(key);
    if (fd_cache_) {
        fd_cache_->drop(key);
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        metrics_.errors.fetch_add(1, std::memory_order_relaxed);
        return internal_error("unlink " + path + ": " + errno_text(errno));
    }
    metrics_.removes.fetch_add(1, std::memory_order_relaxed);
    return Status::ok();
}

int FileBlockStore::sweep_tmp(int64_t min_age_s) {
    int removed = 0;
    std::error_code ec;
    int64_t now = Env::default_env()->wall_ns();
    for (const auto& entry : fs::directory_iterator(root_ + "/tmp", ec)) {
        struct stat st;
        std::string p = entry.path().string();
        if (::stat(p.c_str(), &st) != 0) {
            continue;
        }
        if (now - stat_ns(st.st_mtim) >= min_age_s * 1'000'000'000LL && ::unlink(p.c_str()) == 0) {
            ++removed;
        }
    }
    return removed;
}

Result<std::vector<GcEntry>> FileBlockStore::list_blocks() {
    sweep_tmp(options_.stale_tmp_age_s);
    std::vector<GcEntry> out;
    std::error_code ec;
    fs::directory_iterator top(root_ + "/blocks", ec);
    if (ec) {
        return internal_error("list " + root_ + ": " + ec.message());
    }
    std::vector<uint8_t> hdr(header_bytes(kMaxLayers));
    for (const auto& sub : top) {
        std::error_code ec2;
        for (const auto& entry : fs::directory_iterator(sub.path(), ec2)) {
            std::string name = entry.path().filename().string();
            if (name.size() != 36 || !name.ends_with(".blk")) {
                continue;
            }
            auto key = key_from_hex(std::string_view(name).substr(0, 32));
            if (!key) {
                continue;
            }
            std::string p = entry.path().string();
            int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                continue;  // removed meanwhile
            }
            struct stat st;
            if (::fstat(fd, &st) != 0) {
                ::close(fd);
                continue;
            }
            GcEntry e;
            e.key = *key;
            e.size_bytes = st.st_size;
            e.last_access_ns = std::max(stat_ns(st.st_atim), stat_ns(st.st_mtim));
            ssize_t n = ::pread(fd, hdr.data(), hdr.size(), 0);
            ::close(fd);
            auto info = peek_block_info(
                std::span<const uint8_t>(hdr.data(), n > 0 ? static_cast<size_t>(n) : 0));
            if (info.is_ok()) {
                e.traffic_class = info->traffic_class;
            } else {
                e.last_access_ns = 0;  // damaged: the GC's TTL takes it at once
            }
            out.push_back(e);
        }
    }
    return out;
}

Result<int64_t> FileBlockStore::capacity_bytes() {
    if (options_.capacity_bytes > 0) {
        return options_.capacity_bytes;
    }
    struct statvfs vfs;
    if (::statvfs(root_.c_str(), &vfs) != 0) {
        return internal_error("statvfs " + root_ + ": " + errno_text(errno));
    }
    return static_cast<int64_t>(vfs.f_blocks) * static_cast<int64_t>(vfs.f_frsize);
}

}  // namespace dsi::kvstore

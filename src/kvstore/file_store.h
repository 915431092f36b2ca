// FileBlockStore: the `file://PATH` backend. One file per block on a local SSD or any
// mounted shared file system (the way 3FS is used), so every engine that mounts PATH
// hits every prefix (S-KV-1).
//
// Layout: PATH/blocks/<first 2 hex digits>/<32 hex digits>.blk, PATH/tmp/ for writes
// in flight. Policy:
//   - atomic publish: write to PATH/tmp/<unique>.tmp, fsync, rename into blocks/,
//     fsync the directory. A crash at any point leaves at most a tmp file, never a
//     partial block under blocks/; tmp files older than `stale_tmp_age_s` are swept
//     at open and by the GC worker's scan.
//   - reads: get / get_many map the file (below) by default; read_many_into, and every
//     read with `map_reads` off (URI `io=pread`), use pread; io_uring on request
//     (`use_io_uring`, URI `io=uring`)
//     when the kernel allows it (probed at open, else pread). Why pread: these are
//     buffered reads that nearly always hit the page cache, and the kernel punts a
//     buffered io_uring read it cannot serve inline to io-wq worker threads, which
//     compete with the engine for the cores; measured slower than pread on every shape
//     (bench/RESULTS.md, "KV store throughput"). io_uring pays off for O_DIRECT reads
//     from a real device (not built). Files are read in 256 KiB
//     chunks into unzeroed page-aligned buffers (get_many) or the caller's buffers
//     (read_many_into), each chunk hashed as it lands (no second checksum pass);
//     get_many submits every chunk of the batch to the ring at once. A block that
//     fails decode is a miss and its file is removed.
//   - zero-copy reads (`map_reads`, URI `io=mmap`; the default since it is the only
//     read path that reaches >= 0.8 of a raw read, bench/RESULTS.md): get / get_many map
//     the block file read-only, fault it in with MADV_POPULATE_READ (an I/O error there
//     is a miss, not a SIGBUS) and hash it in place; the Block holds the mapping, so the
//     bytes are never copied into a buffer (read_many_into still reads into the
//     caller's buffers). Safe because a block file is never modified in place (publish
//     by rename, removal by unlink: a mapped old file stays intact); a third party that
//     truncates a block file in place while it is mapped would make its reader SIGBUS —
//     use `io=pread` on a file system where that can happen (as llama.cpp's mmap of
//     model files, this trusts that nobody rewrites the files under it). Needs Linux
//     >= 5.14 (probed at open; else pread).
//   - open fds of recently read blocks are kept (`fd_cache_entries`, LRU): a hit skips
//     open + close. Every read fstats the fd; a cached fd whose file has no links left
//     (removed by GC, also from another process, or replaced by a rename over it) is
//     dropped and the path opened again, so a cached fd never serves a removed or
//     replaced block. remove() and put() drop the key's fd at once. On a network file
//     system whose link counts are not coherent across clients set it to 0 (URI
//     `fd_cache=0`).
//   - last access is the file's atime, set explicitly on a hit (works under
//     noatime/relatime) unless the block's last access (max of atime and mtime) is
//     already within `atime_granularity_s` (a metadata write per hit is ~15% of the
//     time of a 0.44 MB read; the GC's LRU and TTLs work in hours and days); the GC
//     worker (gc_worker.h) reads it with the class from the header. The store itself
//     never deletes for age or space (S-KV-3).
//   - a write that fails for space (ENOSPC, EDQUOT, EFBIG) is dropped and counted in
//     puts_dropped; reads go on.
// Thread model: thread-safe. The io_uring ring is shared under a mutex; a thread that
// finds it busy reads with pread instead of waiting. A cached fd is checked out by one
// reader at a time (under the cache's mutex); two readers of one key open two fds.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvstore/block_store.h"

namespace dsi::kvstore {

struct FileStoreOptions {
    int64_t capacity_bytes = 0;  // 0: the size of the file system holding PATH
    bool use_io_uring = false;   // true: io_uring when available (see above), else pread
    bool fsync = true;           // fsync file and directory before a block is visible
    unsigned io_uring_entries = 64;
    int64_t stale_tmp_age_s = 600;
    int64_t atime_granularity_s = 60;  // a hit refreshes an access older than this
    bool map_reads = true;             // get/get_many: map + hash in place (see above)
    size_t fd_cache_entries = 64;      // fds of recently read blocks kept open; 0: none
    // Test hook (fault injection): called before every write(2) of a put with the
    // bytes about to be written; a non-zero return is taken as that errno.
    std::function<int(size_t)> inject_write_errno;
};

class FileBlockStore : public BlockStore {
public:
    // Creates PATH/blocks and PATH/tmp if needed. kInvalidArgument for an empty path.
    static Result<std::unique_ptr<FileBlockStore>> open(const std::string& root,
                                                        FileStoreOptions options = {});
    ~FileBlockStore() override;

    Status put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
               int64_t deadline_ns = kNoDeadline) override;
    Result<Block> get(const StoreKey& key, const BlockInfo* expect,
                      int64_t deadline_ns = kNoDeadline) override;
    std::vector<Result<Block>> get_many(std::span<const StoreKey> keys,
                                        std::span<const BlockInfo> expects,
                                        int64_t deadline_ns = kNoDeadline) override;
    std::vector<Result<Block>> read_many_into(std::span<const StoreKey> keys,
                                              std::span<const BlockInfo> expects,
                                              std::span<const std::span<uint8_t>> dsts,
                                              int64_t deadline_ns = kNoDeadline) override;
    Result<bool> contains(const StoreKey& key, int64_t deadline_ns = kNoDeadline) override;
    Status remove(const StoreKey& key) override;
    std::string uri() const override { return "file://" + root_; }
    bool zero_copy_reads() const override { return map_reads_; }

    Result<std::vector<GcEntry>> list_blocks() override;
    Result<int64_t> capacity_bytes() override;
    StoreMetrics& metrics() override { return metrics_; }

    // Removes tmp files older than `min_age_s`; returns how many.
    int sweep_tmp(int64_t min_age_s);
    bool using_io_uring() const { return ring_ != nullptr; }
    // True when get/get_many map files (map_reads asked and the kernel can).
    bool using_mmap() const { return map_reads_; }
    // Open fds held by the fd cache (tests).
    size_t num_cached_fds() const;
    std::string block_path(const StoreKey& key) const;

private:
    struct Ring;
    class FdCache;
    // One whole-file read: fd into dst, hashed as it lands; ok = every byte arrived.
    struct ReadJob {
        int fd = -1;
        int64_t last_access_ns = 0;  // max(atime, mtime) at open
        size_t file_bytes = 0;
        std::span<uint8_t> dst;
        PayloadHasher hasher;
        bool ok = false;
    };
    // Reads are issued in chunks of this size: each is hashed while still in cache.
    static constexpr size_t kReadChunkBytes = size_t{256} << 10;
    FileBlockStore(std::string root, FileStoreOptions options);
    void read_files(std::span<ReadJob> jobs, int64_t deadline_ns);
    // get_many (dsts empty: fresh unzeroed buffers) and read_many_into (caller's).
    std::vector<Result<Block>> read_blocks(std::span<const StoreKey> keys,
                                           std::span<const BlockInfo> expects,
                                           std::span<const std::span<uint8_t>> dsts,
                                           int64_t deadline_ns);
    Result<Block> finish_read(const StoreKey& key, Result<Block> block, const ReadJob& job);
    // map_reads: maps each job's file into bufs[i] and hashes it in place.
    void map_files(std::span<ReadJob> jobs, std::span<BlockBuffer> bufs);
    // An open fd of `key`'s file and its stat (from the fd cache when fresh); -1 with
    // errno set when it cannot be opened.
    int open_block(const StoreKey& key, struct stat* st);
    // After a read: a hit's fd goes back to the cache, anything else is closed.
    void release_fd(const StoreKey& key, int fd, bool keep);

    const std::string root_;
    const FileStoreOptions options_;
    StoreMetrics metrics_;
    std::unique_ptr<Ring> ring_;
    std::mutex ring_mu_;  // guards *ring_
    bool map_reads_ = false;
    std::unique_ptr<FdCache> fd_cache_;  // null when fd_cache_entries == 0
};

}  // namespace dsi::kvstore

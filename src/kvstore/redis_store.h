// RedisBlockStore: the distributed backend. One or more Redis servers (Debian's
// redis-server) used as chunk stores with client-side placement, optionally k+m
// erasure-coded across servers (ISA-L; read any k), so any engine hits any prefix and
// the cache outlives compute nodes (S-KV-1, S-KV-2).
//
// Placement (policy): servers are ranked per key by rendezvous hashing
// (XXH3-64 of key and "host:port", highest first). The key's window is the first
// min(N, k + 2m + 1) ranked servers; a put places chunk i on the i-th window server
// that is not marked down, and needs k + m of them (else the write is dropped and
// counted). Chunk i is stored as `c:<hex>:<i>` = XXH3-64(chunk) || chunk bytes; a chunk
// failing its checksum counts as missing. Metadata `m:<hex>` is a Redis hash
// {size, k, m, chunk, place, atime, cls} written, after all chunks, on every server that
// holds a chunk; readers and match_prefix ask the window in parallel, metadata only.
// A get updates `atime` (the GC worker's LRU clock) and reads the data chunks, falling
// back to parity when a chunk is missing (counted in degraded_reads).
// Failure policy: every connect and command has a timeout (io_timeout_ms, capped by the
// call's deadline); a server that fails is marked down for down_backoff_ms and skipped
// without waiting. With m = 0 a dead server's blocks are misses; with m > 0 they stay
// readable with up to m servers down. Nothing in the client expires data (S-KV-3); GC
// is gc_worker.h over list_blocks(), which scans every server.
// Thread model: thread-safe. Each server has a small pool of connections; an operation
// takes one connection per server it talks to, pipelines its commands to all of them,
// then reads the replies, so servers are queried in parallel without a thread each.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/block_store.h"
#include "kvstore/erasure.h"
#include "kvstore/uri.h"

namespace dsi::kvstore {

struct RedisEndpoint {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string name() const { return host + ":" + std::to_string(port); }
};

struct RedisStoreOptions {
    std::vector<RedisEndpoint> servers;
    int k = 1;                       // data chunks per block
    int m = 0;                       // parity chunks per block (0: no erasure coding)
    int64_t io_timeout_ms = 500;     // per connect and per command
    int64_t down_backoff_ms = 1000;  // a failed server is skipped for this long
    int64_t capacity_bytes = 0;      // for GC; 0: sum of the servers' maxmemory
    // kInvalidArgument for no servers, bad ports, bad k/m, or k + m > servers.
    Status validate() const;
};

// "redis://h:p,h:p?k=4&m=2&timeout_ms=500&capacity=BYTES".
Result<RedisStoreOptions> redis_options_from_uri(const StoreUri& uri);

class RedisBlockStore : public BlockStore {
public:
    // Does not connect yet (servers may come up later); validates options.
    static Result<std::unique_ptr<RedisBlockStore>> open(RedisStoreOptions options);
    ~RedisBlockStore() override;

    Status put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
               int64_t deadline_ns = kNoDeadline) override;
    Result<Block> get(const StoreKey& key, const BlockInfo* expect,
                      int64_t deadline_ns = kNoDeadline) override;
    // Every key's metadata in one pipelined round, then every key's chunks in one more
    // (each chunk copied once, from the reply into the block's buffer).
    std::vector<Result<Block>> get_many(std::span<const StoreKey> keys,
                                        std::span<const BlockInfo> expects,
                                        int64_t deadline_ns = kNoDeadline) override;
    // The same rounds; each block's data chunks land straight in dsts[i] (no copy out of
    // a fresh buffer) when it has room for k chunks (the last one's padding included).
    std::vector<Result<Block>> read_many_into(std::span<const StoreKey> keys,
                                              std::span<const BlockInfo> expects,
                                              std::span<const std::span<uint8_t>> dsts,
                                              int64_t deadline_ns = kNoDeadline) override;
    Result<bool> contains(const StoreKey& key, int64_t deadline_ns = kNoDeadline) override;
    Result<int64_t> match_prefix(std::span<const StoreKey> chain,
                                 int64_t deadline_ns = kNoDeadline) override;
    Status remove(const StoreKey& key) override;
    std::string uri() const override;

    Result<std::vector<GcEntry>> list_blocks() override;
    Result<int64_t> capacity_bytes() override;
    StoreMetrics& metrics() override { return metrics_; }

    // The servers of `key`'s window, best first (indices into options.servers).
    std::vector<int> window(const StoreKey& key) const;

    class Impl;  // internal: connection pools (redis_store.cc)

private:
    explicit RedisBlockStore(RedisStoreOptions options);
    // get_many (dsts empty: fresh buffers) and read_many_into (the caller's).
    std::vector<Result<Block>> read_blocks(std::span<const StoreKey> keys,
                                           std::span<const BlockInfo> expects,
                                           std::span<const std::span<uint8_t>> dsts,
                                           int64_t deadline_ns);
    RedisStoreOptions options_;
    ErasureCoder coder_;
    StoreMetrics metrics_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::kvstore

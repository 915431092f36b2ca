// BlockStore: the interface of every KV block tier below the engine's block pool
// (host shared memory, local/shared file system, Redis cluster), SPEC S-KV-1.
//
// What the engine calls (docs/kvstore.md):
//   - admission (S-KV-4): match_prefix(chain) -> number of leading keys present, on
//     metadata only (no payload is read);
//   - fetch (S-KV-5): get_many(keys, expect, deadline), or a Fetcher (async_store.h) to
//     run it off the caller's thread;
//   - write-behind (S-KV-7): put(info, layers) from a WriteBehind queue (async_store.h)
//     so the step loop never waits on storage.
// Policy: a store never expires anything by itself (S-KV-3: no expiry in the client);
// GC is a separate worker (gc_worker.h) over the GcTarget view of a store. A block
// that fails any check is a miss (kNotFound), never returned. Every call that may wait
// takes or implies a deadline; a dead backend answers kUnavailable or
// kDeadlineExceeded, never hangs.
// Thread model: every implementation is thread-safe (any thread may call any method).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kvstore/block_format.h"
#include "kvstore/metrics.h"
#include "kvstore/store_key.h"

namespace dsi::kvstore {

// Absolute monotonic deadline (Env::now_ns of the default Env); kNoDeadline waits
// at most the backend's own I/O timeout.
inline constexpr int64_t kNoDeadline = INT64_MAX;
int64_t deadline_after_ms(int64_t ms);

// One stored block, for GC: its key, size, last access (wall ns) and class.
struct GcEntry {
    StoreKey key;
    int64_t size_bytes = 0;
    int64_t last_access_ns = 0;
    TrafficClass traffic_class = TrafficClass::kChatbot;
};

// The view a GC worker needs of a store node.
class GcTarget {
public:
    virtual ~GcTarget() = default;
    // Every block this node holds (metadata only).
    virtual Result<std::vector<GcEntry>> list_blocks() = 0;
    // Bytes the node may use (the watermarks are fractions of it).
    virtual Result<int64_t> capacity_bytes() = 0;
    virtual Status remove(const StoreKey& key) = 0;
    virtual StoreMetrics& metrics() = 0;
};

class BlockStore : public GcTarget {
public:
    // Encodes and stores the block (atomically: a reader sees all of it or none).
    // Storing a key that exists replaces it. kResourceExhausted when the medium is
    // full (the write is dropped and counted), kUnavailable when the backend is down.
    virtual Status put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                       int64_t deadline_ns = kNoDeadline) = 0;
    // The block, verified against `expect` (may be null: format checks only).
    // kNotFound on a miss, including a damaged or mismatched block.
    virtual Result<Block> get(const StoreKey& key, const BlockInfo* expect,
                              int64_t deadline_ns = kNoDeadline) = 0;
    // One result per key, same order. Backends overlap the reads (io_uring, pipelining).
    // REQUIRES: expects is empty or expects.size() == keys.size().
    virtual std::vector<Result<Block>> get_many(std::span<const StoreKey> keys,
                                                std::span<const BlockInfo> expects,
                                                int64_t deadline_ns = kNoDeadline);
    // Like get_many, but each block is read into dsts[i] (memory the caller owns and
    // reuses: engine host buffers, shm slots): no allocation, no zero fill. An OK result
    // is a view into dsts[i] (Block::owns_bytes() false), valid while dsts[i] is.
    // kInvalidArgument when a block is larger than its buffer. The default copies from
    // get_many. REQUIRES: dsts.size() == keys.size(); expects as for get_many.
    virtual std::vector<Result<Block>> read_many_into(std::span<const StoreKey> keys,
                                                      std::span<const BlockInfo> expects,
                                                      std::span<const std::span<uint8_t>> dsts,
                                                      int64_t deadline_ns = kNoDeadline);
    // True when get / get_many hand out blocks in the backend's own memory (file://
    // io=mmap: a read-only mapping of the block file) instead of copying them into a
    // buffer; a caller that owns reusable buffers (the Fetcher) then calls get_many.
    virtual bool zero_copy_reads() const { return false; }
    // Metadata only.
    virtual Result<bool> contains(const StoreKey& key, int64_t deadline_ns = kNoDeadline) = 0;
    // S-KV-4: the number of leading keys of `chain` present (metadata only). A chain
    // stops at the first absent key: later blocks are useless without their parents.
    virtual Result<int64_t> match_prefix(std::span<const StoreKey> chain,
                                         int64_t deadline_ns = kNoDeadline);
    // Removing an absent key is OK.
    Status remove(const StoreKey& key) override = 0;

    // "file:///path", "redis://h:p,h:p?k=4&m=2", "shm://name?slots=N&slot_bytes=B",
    // and "shm://...|file:///path" (the shm tier over a store, TieredBlockStore).
    virtual std::string uri() const = 0;
};

// Opens a store by URI (see BlockStore::uri). kInvalidArgument on a malformed URI.
Result<std::unique_ptr<BlockStore>> open_block_store(const std::string& uri);

}  // namespace dsi::kvstore

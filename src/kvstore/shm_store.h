// ShmBlockStore: the host shared-memory tier (SPEC S-KV-1, S-KV-5): a fixed pool of
// block slots in one POSIX shared-memory segment that the engine and a fetch process
// (any process that maps the same name) read and fill. `shm://NAME?slots=N&slot_bytes=B`.
//
// Segment layout (little-endian; docs/kvstore.md has the table):
//   [0, 4096)            header: magic "DSIKVSHM", version, geometry, creator pid and
//                        start time, a robust process-shared mutex
//   [4096, 4096 + 64 N)  slot table: per slot {state, seq, key, size, last_use_ns,
//                        writer_pid}
//   [data_offset, ...)   N slots of slot_bytes (page-aligned), each one encoded block
//                        (block_format.h: the block carries its own checksums).
// Policy:
//   - LRU within the pool: a put takes a free slot, else the ready slot used least
//     recently, else a slot whose writer process is gone; none -> the put is dropped
//     (kResourceExhausted, counted). A block larger than a slot is dropped the same way.
//   - writes: claim the slot under the mutex (state WRITING, seq odd), copy the bytes
//     without the lock, publish under the mutex (state READY, seq even). Readers find
//     the key under the mutex, copy without it and re-check seq (a seqlock); every read
//     is decoded and checksummed, so a torn or corrupted entry is a miss, never used.
//   - a process that dies holding the mutex: the next locker gets EOWNERDEAD, makes it
//     consistent and goes on; a writer that dies mid-copy leaves a WRITING slot that is
//     reclaimed once its pid is gone.
//   - open: attaches to an existing segment whose header and geometry match (also when
//     its creator is gone: the blocks stay valid, each is verified on read); a segment
//     whose header is damaged, of another version, or whose creator died before
//     finishing it is unlinked and created afresh; a live segment of other geometry is
//     kFailedPrecondition. The segment is reserved with posix_fallocate (a full
//     /dev/shm fails the open instead of SIGBUS later). `unlink=1`: the creator unlinks
//     the name when it closes; by default the segment outlives the process.
// Thread model: thread-safe and multi-process safe (see above).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvstore/block_store.h"

namespace dsi::kvstore {

struct ShmStoreOptions {
    std::string name;  // POSIX shm name without the leading '/': [A-Za-z0-9_.-]{1,200}
    int64_t num_slots = 0;
    int64_t slot_bytes = 0;  // rounded up to 4096
    bool unlink_on_close = false;
    // An anonymous shared mapping instead of a named segment: private to this process
    // (no other process can attach, nothing in /dev/shm, nothing left behind by a crash
    // or SIGKILL; memory is taken as slots fill). For an in-process tier such as the
    // KV hand-over inbox. `name` then only names the store in uri() and logs.
    bool anonymous = false;
};

inline constexpr int64_t kShmMaxSlots = int64_t{1} << 20;
inline constexpr int64_t kShmMaxSlotBytes = int64_t{1} << 30;
inline constexpr int64_t kShmMaxBytes = int64_t{1} << 40;

class ShmBlockStore : public BlockStore {
public:
    // kInvalidArgument for a bad name or geometry out of range; kFailedPrecondition for
    // a live segment of other geometry; kResourceExhausted when /dev/shm is full.
    static Result<std::unique_ptr<ShmBlockStore>> open(ShmStoreOptions options);
    ~ShmBlockStore() override;

    Status put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
               int64_t deadline_ns = kNoDeadline) override;
    // Stores an already encoded block (a copy from another tier). REQUIRES: `encoded`
    // came from encode_block/Block::encoded (it is checked on every read anyway).
    Status put_encoded(const StoreKey& key, std::span<const uint8_t> encoded);
    Result<Block> get(const StoreKey& key, const BlockInfo* expect,
                      int64_t deadline_ns = kNoDeadline) override;
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

    int64_t num_slots() const { return num_slots_; }
    int64_t slot_bytes() const { return slot_bytes_; }
    // True when this object created the segment (false: attached to an existing one).
    bool created() const { return created_; }
    // Test hook: the byte address of the slot holding `key` (null if absent), to
    // corrupt an entry as another process could.
    uint8_t* slot_data_for_test(const StoreKey& key);
    // Test hook: takes the segment mutex and never releases it (a process that then
    // dies leaves the mutex to the robust-mutex recovery).
    void lock_forever_for_test();
    // Removes the name (mappings stay valid until closed). OK if absent.
    static Status unlink(const std::string& name);

private:
    struct Header;
    struct Slot;
    class Lock;
    ShmBlockStore() = default;
    void init_header();
    Slot* slot(int64_t i) const;
    uint8_t* data(int64_t i) const;
    int64_t find_locked(const StoreKey& key) const;  // -1 if absent (READY only)
    // Claims a slot for `key` (state WRITING); -1 when none can be taken.
    int64_t claim_locked(const StoreKey& key);
    Status write_slot(const StoreKey& key, size_t size,
                      const std::function<void(uint8_t*)>& fill);
    // Copies slot i into dst if its seq is unchanged; the size, or 0 on a race.
    size_t copy_out(int64_t i, uint64_t seq, size_t size, std::span<uint8_t> dst);

    ShmStoreOptions options_;
    StoreMetrics metrics_;
    uint8_t* base_ = nullptr;
    size_t map_bytes_ = 0;
    int64_t num_slots_ = 0;
    int64_t slot_bytes_ = 0;
    size_t data_offset_ = 0;
    bool created_ = false;
};

// The chain engine pool -> host shm -> store as one BlockStore: reads try the shm tier
// first and fill it from the lower tier (promotion); writes go to both; match_prefix
// matches the shm tier, then the rest of the chain below (metadata only). GC and
// capacity are the lower tier's (the shm pool keeps itself by LRU).
// Thread model: thread-safe (both tiers are).
class TieredBlockStore : public BlockStore {
public:
    // REQUIRES: both non-null.
    TieredBlockStore(std::unique_ptr<ShmBlockStore> shm, std::unique_ptr<BlockStore> lower);
    // Not owning (tests, engine options with caller-owned stores). REQUIRES: they outlive this.
    TieredBlockStore(ShmBlockStore* shm, BlockStore* lower);

    Status put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
               int64_t deadline_ns = kNoDeadline) override;
    Result<Block> get(const StoreKey& key, const BlockInfo* expect,
                      int64_t deadline_ns = kNoDeadline) override;
    std::vector<Result<Block>> get_many(std::span<const StoreKey> keys,
                                        std::span<const BlockInfo> expects,
                                        int64_t deadline_ns = kNoDeadline) override;
    // Shm hits are copied from their slot straight into dsts[i] (the seqlock copy), the
    // rest read by the lower tier into theirs, then promoted.
    std::vector<Result<Block>> read_many_into(std::span<const StoreKey> keys,
                                              std::span<const BlockInfo> expects,
                                              std::span<const std::span<uint8_t>> dsts,
                                              int64_t deadline_ns = kNoDeadline) override;
    Result<bool> contains(const StoreKey& key, int64_t deadline_ns = kNoDeadline) override;
    Result<int64_t> match_prefix(std::span<const StoreKey> chain,
                                 int64_t deadline_ns = kNoDeadline) override;
    Status remove(const StoreKey& key) override;
    std::string uri() const override;
    Result<std::vector<GcEntry>> list_blocks() override { return lower_->list_blocks(); }
    Result<int64_t> capacity_bytes() override { return lower_->capacity_bytes(); }
    StoreMetrics& metrics() override { return lower_->metrics(); }

    ShmBlockStore& shm() { return *shm_; }
    BlockStore& lower() { return *lower_; }

private:
    std::unique_ptr<ShmBlockStore> owned_shm_;
    std::unique_ptr<BlockStore> owned_lower_;
    ShmBlockStore* shm_;
    BlockStore* lower_;
};

}  // namespace dsi::kvstore

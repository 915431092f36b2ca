// The KV hand-over between a prefill engine and a decode engine (issue 18,
// docs/cluster.md "KV hand-over"): the prefill side sends a finished prefill's full
// blocks (kv::KvExport) over transfer/ to the decode engine's inbox, which puts them,
// block by block, into the decode engine's KV store tier before it acknowledges; the
// continuation the router then sends to that engine finds them there as prefix hits
// (S-KV-4/5: match_prefix, fetch, swap-in), so only the partial last block and the
// first output token are computed again.
//
// On the wire (transfer/, docs/transfer.md): Begin names the model id, the tokens
// (blocks x 128), one layer per model layer of blocks x layer_block_bytes bytes
// (layer l of block 0, 1, ...), and one State section "kv_blocks":
//   u32 version (1), u32 dtype, u32 traffic class, u32 block count n,
//   then n x { u64 key lo, u64 key hi, u64 token-id hash }   (little-endian)
// The inbox refuses, before taking any memory, a transfer of another model, block size,
// layer count or layer size, a malformed block list, or one over its byte limit; after
// End it re-checks the block list and dtype, and stores. The Ack means "stored": a
// store that refuses a block (a full inbox) is the sender's Failure. Every refused or
// failed transfer releases its staging memory at once.
//
// Thread model: send_kv_export runs on the caller's thread (blocking, bounded by
// io_timeout per read or write). KvInbox runs one accept thread and `num_threads`
// receiving threads; its methods are thread-safe; the destructor stops and joins them
// (a transfer in progress ends within io_timeout).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "kv/kv_export.h"
#include "kvstore/block_store.h"
#include "transfer/session.h"
#include "transfer/transport.h"

namespace dsi::serving {

inline constexpr std::string_view kKvBlocksSection = "kv_blocks";

// Where a prefill engine sends one generation's KV: the decode engine's transfer
// address ("host:port", membership's transfer_address) and the id the router chose.
struct HandoffTarget {
    std::string address;
    transfer::TransferId id;
};

struct HandoffSendOptions {
    transfer::HelloMessage self;  // this engine: node id, role, incarnation
    transfer::Timeout io_timeout{10'000};
    // Asked between frames; true aborts the transfer (kCancelled).
    std::function<bool()> should_abort;
};

// Connects to target.address and sends `kv` under target.id; OK once the inbox has
// stored every block. kInvalidArgument for a malformed address or an empty export.
Result<transfer::SendReport> send_kv_export(transfer::Transport& transport,
                                            const kv::KvExport& kv, const HandoffTarget& target,
                                            const HandoffSendOptions& options);

struct KvInboxOptions {
    std::string host = "0.0.0.0";
    uint16_t port = 0;  // 0: the system picks one (KvInbox::port)
    transfer::HelloMessage self;
    // The decode engine's blocks: a transfer of another shape is refused.
    std::string model_id;
    uint32_t dtype = 0;
    uint32_t num_layers = 0;
    uint64_t layer_block_bytes = 0;
    uint32_t block_tokens = 128;
    uint64_t max_transfer_bytes = uint64_t{1} << 30;
    int num_threads = 2;      // transfers received at once
    int max_queued = 16;      // accepted connections waiting for a thread; more are closed
    transfer::Timeout io_timeout{10'000};
};

struct KvInboxStats {
    int64_t num_received = 0;     // transfers stored and acknowledged
    int64_t num_failed = 0;       // refused, broken, timed out or not stored
    int64_t num_rejected = 0;     // connections closed because every thread was busy
    int64_t blocks_stored = 0;
    int64_t bytes_received = 0;   // KV bytes of the stored transfers
};

class KvInbox {
public:
    // Starts listening. `store` receives the blocks (REQUIRES: outlives the inbox);
    // `transport` null: TCP. kInvalidArgument for options that describe no block.
    static Result<std::unique_ptr<KvInbox>> start(KvInboxOptions options,
                                                  kvstore::BlockStore* store,
                                                  std::unique_ptr<transfer::Transport> transport =
                                                      nullptr);
    ~KvInbox();
    KvInbox(const KvInbox&) = delete;
    KvInbox& operator=(const KvInbox&) = delete;

    uint16_t port() const { return port_; }
    KvInboxStats stats() const DSI_EXCLUDES(mu_);

private:
    KvInbox(KvInboxOptions options, kvstore::BlockStore* store,
            std::unique_ptr<transfer::Transport> transport);
    void accept_loop();
    void receive_loop();
    void receive_one(transfer::Connection& conn);
    Result<std::unique_ptr<transfer::Destination>> make_destination(
        const transfer::BeginMessage& begin) const;
    Status commit(const transfer::BeginMessage& begin, transfer::Destination& d);

    const KvInboxOptions options_;
    kvstore::BlockStore* const store_;
    std::unique_ptr<transfer::Transport> transport_;
    std::unique_ptr<transfer::Listener> listener_;
    uint16_t port_ = 0;
    transfer::PeerTable peers_;
    std::atomic<bool> stopping_{false};
    mutable Mutex mu_;
    CondVar cv_;
    std::deque<std::unique_ptr<transfer::Connection>> queue_ DSI_GUARDED_BY(mu_);
    KvInboxStats stats_ DSI_GUARDED_BY(mu_);
    std::vector<std::thread> threads_;
};

}  // namespace dsi::serving

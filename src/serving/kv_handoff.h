// The KV hand-over between a prefill engine and a decode engine (issue 18,
// docs/cluster.md "KV hand-over"): the prefill side sends a finished prefill's full
// blocks (kv::KvExport) over transfer/ to the decode engine's inbox, which puts them,
// block by block, into the decode engine's KV store tier before it acknowledges; the
// continuation the router then sends to that engine finds them there as prefix hits
// (S-KV-4/5: match_prefix, fetch, swap-in), so only the partial last block and the
// first output token are computed again.
//
// On the wire (transfer/, docs/transfer.md): Begin names the model id, the tokens
// (blocks x 128, plus t tail tokens), one layer per store layer of blocks x
// layer_block_bytes[l] bytes (layer l of block 0, 1, ...; V4: every cache group's
// layers, sizes by group), then the tail's t rows of that layer (t x
// layer_block_bytes[l] / 128 bytes; V2/V3 only), and the State section "kv_blocks":
//   u32 version (1; 2 with a tail), u32 dtype, u32 traffic class, u32 block count n,
//   then n x { u64 key lo, u64 key hi, u64 token-id hash }   (little-endian)
//   version 2: then the tail's { u64 kv::tail_key lo, hi, u64 token-id hash }
// (a sender without a tail sends version 1, which every inbox reads; an inbox before
// tails refuses a transfer with one, and the continuation recomputes.)
// V4 / V4.1 (docs/cluster.md "V4 / V4.1 hand-over") add a second State section,
// "swa_state", the SWA state at the blocks' end (position n x 128):
//   u32 version (1), u32 traffic class, u64 chain key lo, u64 chain key hi,
//   u64 position, then the stored state (the slot's words and the seal)
// The inbox refuses, before taking any memory, a transfer of another model, block size,
// layer count or layer size, a malformed block list, a missing, unexpected or wrongly
// sized state section, or one over its byte limit; after End it re-checks the block
// list, dtype and the state (position, key = the last block's chain key, seal), then
// stores the blocks and puts the state into the decode engine's SWA pool. The Ack means
// "stored": a store that refuses a block (a full inbox) or a pool that refuses the
// state is the sender's Failure. Every refused or failed transfer releases its staging
// memory at once.
// With a landing (KvInboxOptions::landing, engine/kv_landing.h: V2/V3 decode engines),
// Begin reserves blocks of the decode engine's own pool instead, every layer is
// written straight into them (the transport places a chunk's bytes there), and End
// lands them: the full blocks in the prefix index, the tail held for the continuation,
// which starts past both (only the first output token is computed). A failed transfer
// drops the reservation at once; a pool with no room takes the staging path above
// (tail rows are then dropped: only full blocks are stored).
//
// Thread model: send_kv_export runs on the caller's thread (blocking, bounded by
// io_timeout per read or write). KvInbox runs one accept thread and `num_threads`
// receiving threads (--kv-inbox-threads); one transfer holds a thread at most
// max_transfer_time (--kv-inbox-transfer-timeout-ms; a sender that trickles bytes is cut
// there and told with a Failure); its methods are thread-safe; the destructor stops and
// joins them (a transfer in progress ends within io_timeout).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "engine/kv_landing.h"
#include "kv/kv_export.h"
#include "kv/swa_pool.h"
#include "kvstore/block_store.h"
#include "transfer/session.h"
#include "transfer/transport.h"

namespace dsi::serving {

inline constexpr std::string_view kKvBlocksSection = "kv_blocks";
inline constexpr std::string_view kSwaStateSection = "swa_state";

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
    // The decode engine's blocks (engine::StoreBlockShape): a transfer of another shape
    // is refused.
    std::string model_id;
    uint32_t dtype = 0;
    std::vector<uint64_t> layer_block_bytes;  // per layer: one layer of one block
    uint32_t block_tokens = 128;
    // V4 / V4.1: the bytes of a stored SWA state (slot + seal), which every transfer
    // must carry, and the pool it goes to (the decode engine's, REQUIRES: outlives the
    // inbox). 0: none (V2/V3; a transfer with a state section is refused).
    uint64_t swa_state_bytes = 0;
    kv::SwaStatePool* swa_pool = nullptr;
    // The decode engine's pool landing (V2/V3; REQUIRES: outlives the inbox); null or
    // refused: the store-tier path. landing_wait bounds each wait for the engine thread.
    engine::KvLanding* landing = nullptr;
    std::chrono::milliseconds landing_wait{3000};
    uint64_t max_transfer_bytes = uint64_t{1} << 30;
    // Called on a receiving thread once a transfer's blocks are in the pool or the store
    // tier (before its Ack), with their chain keys (e.g. engine::DpFront::learn_local: the
    // continuation is routed to the rank that holds them).
    std::function<void(std::vector<kv::BlockKey> chain)> on_stored;
    int num_threads = 4;      // transfers received at once
    int max_queued = 16;      // accepted connections waiting for a thread; more are refused
    transfer::Timeout io_timeout{10'000};
    // One transfer, first wait to Ack (transfer::ReceiveOptions::max_duration): a sender
    // that trickles bytes (each read within io_timeout) holds a thread no longer. 1 GiB
    // (max_transfer_bytes) at 10 MB/s takes ~107 s.
    transfer::Timeout max_transfer_time{120'000};
};

struct KvInboxStats {
    int64_t num_received = 0;     // transfers stored and acknowledged
    int64_t num_failed = 0;       // refused, broken, timed out or not stored
    // Connections refused because every thread was busy and max_queued wait: told so
    // (RESOURCE_EXHAUSTED Failure, by one refusing thread), or closed without a word when
    // 16 refusals are already pending.
    int64_t num_rejected = 0;
    int64_t blocks_stored = 0;
    int64_t states_stored = 0;   // SWA states put into the pool (V4)
    int64_t bytes_received = 0;  // KV bytes (blocks and states) of the stored transfers
    // Into the decode engine's pool (landing): transfers landed, their full blocks and
    // tail tokens, and transfers that took the store path because the pool had no room.
    int64_t num_landed = 0;
    int64_t blocks_landed = 0;
    int64_t tail_tokens_landed = 0;
    int64_t num_landing_fallbacks = 0;
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
    void refuse_loop();
    void receive_one(transfer::Connection& conn);
    Result<std::unique_ptr<transfer::Destination>> make_destination(
        const transfer::BeginMessage& begin);
    Status commit(const transfer::BeginMessage& begin, transfer::Destination& d);
    // The state section's state, checked against the blocks' list (V4).
    Result<kv::SwaState> parse_state(std::span<const uint8_t> section,
                                     std::span<const uint8_t> block_list,
                                     uint64_t num_blocks) const;

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
    std::deque<std::unique_ptr<transfer::Connection>> refusals_ DSI_GUARDED_BY(mu_);
    KvInboxStats stats_ DSI_GUARDED_BY(mu_);
    std::vector<std::thread> threads_;
};

}  // namespace dsi::serving

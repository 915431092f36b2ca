// The S-KV-5 fetch process: a separate process moves KV blocks from the store into the
// host shared-memory pool, asynchronously, at the engine's request; the engine then
// swaps them in from shm (S-KV-6). Three parts:
//   - FetchService: the process's side (`dsinfer kvfetch`). Listens on a Unix
//     SOCK_SEQPACKET socket; for each request (a list of block keys with what the
//     engine expects of them) it reads the blocks absent from shm from the store and
//     publishes them into the shm pool, then answers one code per key.
//   - FetchClient: the engine's side of the socket (thread-safe, reconnects).
//   - FetchProcessStore: the chain shm -> store as one BlockStore (a TieredBlockStore)
//     whose shm misses are fetched by the process instead of in the engine; when the
//     process is down or late the engine reads the store itself (counted), so serving
//     goes on. URI: "shm://NAME?slots=N&slot_bytes=B&fetcher=/path.sock|<store uri>".
//
// Wire format (little-endian, one datagram per message; docs/kvstore.md "Fetch process"):
//   request  = RequestHeader{magic "DSFQ", version, count, timeout_ms} + count x WireKey
//   reply    = ReplyHeader{magic "DSFR", version, count, request id} + count x u8 code
// A malformed request (size, magic, version, count above kFetchMaxKeys) closes that
// connection; the service keeps serving the others.
// Thread model: FetchService runs one accept thread and one thread per connection (up
// to max_connections); FetchClient and FetchProcessStore are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "kvstore/block_store.h"
#include "kvstore/shm_store.h"

namespace dsi::kvstore {

inline constexpr uint32_t kFetchMaxKeys = 256;  // per request; the client splits larger lists

// The answer for one key.
enum class FetchCode : uint8_t {
    kInShm = 0,      // the block is in the shm pool now (read it from there)
    kMiss = 1,       // absent or damaged below
    kShmFull = 2,    // read, but the shm pool could not take it
    kError = 3,      // the store failed (unavailable, I/O)
    kDeadline = 4,   // the request's timeout passed before this key was done
};

struct FetchServiceOptions {
    std::string socket_path;  // created (an existing socket file is replaced)
    int max_connections = 64;
    int64_t max_block_bytes = int64_t{64} << 20;  // read buffer per connection
};

struct FetchServiceStats {
    int64_t requests = 0, keys = 0, fetched = 0, already_in_shm = 0, misses = 0,
            shm_full = 0, errors = 0, deadline = 0, bad_requests = 0, connections = 0;
    int64_t bytes_fetched = 0;
};

class FetchService {
public:
    // REQUIRES: shm and lower outlive the service. kInvalidArgument for a bad path;
    // kUnavailable when the socket cannot be bound.
    static Result<std::unique_ptr<FetchService>> start(ShmBlockStore* shm, BlockStore* lower,
                                                       FetchServiceOptions options);
    ~FetchService();  // stop()
    // Closes the socket and every connection, joins the threads. Idempotent.
    void stop();
    FetchServiceStats stats() const;
    const std::string& socket_path() const { return options_.socket_path; }

private:
    FetchService() = default;
    void accept_loop();
    void serve(int fd);

    ShmBlockStore* shm_ = nullptr;
    BlockStore* lower_ = nullptr;
    FetchServiceOptions options_;
    int listen_fd_ = -1;
    int wake_fd_[2] = {-1, -1};  // stop() writes here to end every poll
    std::thread acceptor_;
    mutable Mutex mu_;
    std::vector<std::thread> workers_ DSI_GUARDED_BY(mu_);
    std::vector<int> conn_fds_ DSI_GUARDED_BY(mu_);
    int live_connections_ DSI_GUARDED_BY(mu_) = 0;
    std::atomic<bool> stopping_{false};
    struct Counters;
    std::unique_ptr<Counters> counters_;
};

class FetchClient {
public:
    explicit FetchClient(std::string socket_path);
    ~FetchClient();
    // One code per key (same order). kUnavailable when the process cannot be reached
    // or hangs up; kDeadlineExceeded when the reply is late (that connection is then
    // dropped, so no late reply is ever read as the answer to another request).
    // REQUIRES: expects.empty() || expects.size() == keys.size().
    Result<std::vector<FetchCode>> fetch(std::span<const StoreKey> keys,
                                         std::span<const BlockInfo> expects,
                                         int64_t deadline_ns);
    const std::string& socket_path() const { return path_; }

private:
    Result<int> take_connection();
    void give_back(int fd);

    std::string path_;
    Mutex mu_;
    std::vector<int> idle_ DSI_GUARDED_BY(mu_);
};

// Counters of the engine side (beside the lower store's StoreMetrics).
struct FetchProcessStats {
    int64_t requests = 0;         // requests sent to the process
    int64_t fetched_by_process = 0;  // keys the process put into shm and we then read
    int64_t fallback_reads = 0;   // keys read in the engine because the process failed
};

class FetchProcessStore : public TieredBlockStore {
public:
    FetchProcessStore(std::unique_ptr<ShmBlockStore> shm, std::unique_ptr<BlockStore> lower,
                      std::string socket_path);
    // Not owning. REQUIRES: they outlive this.
    FetchProcessStore(ShmBlockStore* shm, BlockStore* lower, std::string socket_path);

    std::vector<Result<Block>> get_many(std::span<const StoreKey> keys,
                                        std::span<const BlockInfo> expects,
                                        int64_t deadline_ns = kNoDeadline) override;
    std::vector<Result<Block>> read_many_into(std::span<const StoreKey> keys,
                                              std::span<const BlockInfo> expects,
                                              std::span<const std::span<uint8_t>> dsts,
                                              int64_t deadline_ns = kNoDeadline) override;
    std::string uri() const override;
    FetchProcessStats fetch_stats() const;

private:
    // What to do with each shm miss once the process answered.
    enum class Action : uint8_t { kReadShm, kMiss, kLate, kReadBelow };
    // Asks the process for keys[missing[j]]; one action per entry of `missing`. When
    // the process fails every action is kReadBelow.
    std::vector<Action> plan(std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
                             const std::vector<size_t>& missing, int64_t deadline_ns);

    FetchClient client_;
    std::atomic<int64_t> requests_{0}, fetched_{0}, fallback_{0}, process_errors_{0};
};

}  // namespace dsi::kvstore

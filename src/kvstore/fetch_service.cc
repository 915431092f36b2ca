#include "kvstore/fetch_service.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/mutex.h"
#include "base/env.h"
#include "base/logging.h"
#include "kvstore/block_format.h"

namespace dsi::kvstore {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

namespace {

constexpr uint32_t kRequestMagic = 0x51465344;  // "DSFQ"
constexpr uint32_t kReplyMagic = 0x52465344;    // "DSFR"
constexpr uint16_t kWireVersion = 1;
constexpr size_t kRequestHeaderBytes = 24;  // magic u32, version u16, pad u16, count u32,
                                            // timeout_ms u32, request id u64
constexpr size_t kWireKeyBytes = 56;        // see put_key
constexpr size_t kReplyHeaderBytes = 24;    // magic u32, version u16, pad u16, count u32,
                                            // pad u32, request id u64
constexpr size_t kMaxRequestBytes = kRequestHeaderBytes + kFetchMaxKeys * kWireKeyBytes;
constexpr size_t kMaxReplyBytes = kReplyHeaderBytes + kFetchMaxKeys;
constexpr size_t kReadBatch = 8;  // keys read from the store at once per connection

template <typename T>
void put(uint8_t* p, size_t off, T v) {
    std::memcpy(p + off, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* p, size_t off) {
    T v;
    std::memcpy(&v, p + off, sizeof v);
    return v;
}

// WireKey: key lo/hi, model lo/hi, num_layers, dtype, num_tokens, has_expect u8,
// traffic class u8, pad u16, token_hash u64.
void put_key(uint8_t* p, const StoreKey& key, const BlockInfo* expect) {
    std::memset(p, 0, kWireKeyBytes);
    put(p, 0, key.lo);
    put(p, 8, key.hi);
    if (expect == nullptr) return;
    put(p, 16, expect->model.lo);
    put(p, 24, expect->model.hi);
    put(p, 32, expect->num_layers);
    put(p, 36, expect->dtype);
    put(p, 40, expect->num_tokens);
    p[44] = 1;
    p[45] = static_cast<uint8_t>(expect->traffic_class);
    put(p, 48, expect->token_hash);
}

// False when the key's bytes are malformed (flag or class out of range).
bool get_key(const uint8_t* p, StoreKey* key, BlockInfo* expect, bool* has_expect) {
    key->lo = get<uint64_t>(p, 0);
    key->hi = get<uint64_t>(p, 8);
    if (p[44] > 1 || p[45] >= kNumTrafficClasses || p[46] != 0 || p[47] != 0) return false;
    *has_expect = p[44] == 1;
    *expect = BlockInfo{};
    expect->key = *key;
    expect->model.lo = get<uint64_t>(p, 16);
    expect->model.hi = get<uint64_t>(p, 24);
    expect->num_layers = get<uint32_t>(p, 32);
    expect->dtype = get<uint32_t>(p, 36);
    expect->num_tokens = get<uint32_t>(p, 40);
    expect->traffic_class = static_cast<TrafficClass>(p[45]);
    expect->token_hash = get<uint64_t>(p, 48);
    return true;
}

Status bad_path(const std::string& path) {
    if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
        return invalid_argument("fetch socket path must be 1.." +
                                std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                                " bytes: '" + path + "'");
    }
    return Status::ok();
}

sockaddr_un address(const std::string& path) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    return a;
}

int64_t ms_left(int64_t deadline_ns) {
    if (deadline_ns == kNoDeadline) return -1;
    const int64_t left = deadline_ns - Env::default_env()->now_ns();
    return left <= 0 ? 0 : (left + 999'999) / 1'000'000;
}

FetchCode code_of(const Status& s) {
    switch (s.code()) {
        case StatusCode::kNotFound: return FetchCode::kMiss;
        case StatusCode::kDeadlineExceeded: return FetchCode::kDeadline;
        case StatusCode::kResourceExhausted: return FetchCode::kShmFull;
        default: return FetchCode::kError;
    }
}

}  // namespace

struct FetchService::Counters {
    std::atomic<int64_t> requests{0}, keys{0}, fetched{0}, already_in_shm{0}, misses{0},
        shm_full{0}, errors{0}, deadline{0}, bad_requests{0}, connections{0}, bytes{0};
};

Result<std::unique_ptr<FetchService>> FetchService::start(ShmBlockStore* shm, BlockStore* lower,
                                                          FetchServiceOptions options) {
    DSI_CHECK(shm != nullptr && lower != nullptr);
    DSI_RETURN_IF_ERROR(bad_path(options.socket_path));
    if (options.max_connections < 1 || options.max_block_bytes < 4096) {
        return invalid_argument("fetch service: max_connections >= 1, max_block_bytes >= 4096");
    }
    std::unique_ptr<FetchService> s(new FetchService());
    s->shm_ = shm;
    s->lower_ = lower;
    s->options_ = std::move(options);
    s->counters_ = std::make_unique<Counters>();
    if (::pipe2(s->wake_fd_, O_CLOEXEC) != 0) {
        return unavailable(std::string("fetch service: pipe: ") + std::strerror(errno));
    }
    s->listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s->listen_fd_ < 0) {
        return unavailable(std::string("fetch service: socket: ") + std::strerror(errno));
    }
    const std::string& path = s->options_.socket_path;
    ::unlink(path.c_str());  // a stale socket of a dead service
    sockaddr_un a = address(path);
    if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(s->listen_fd_, 64) != 0) {
        return unavailable("fetch service: bind/listen " + path + ": " + std::strerror(errno));
    }
    s->acceptor_ = std::thread([p = s.get()] { p->accept_loop(); });
    return s;
}

FetchService::~FetchService() {
    stop();
    for (int fd : wake_fd_) {
        if (fd >= 0) ::close(fd);
    }
}

void FetchService::stop() {
    if (stopping_.exchange(true)) return;
    if (wake_fd_[1] >= 0) {
        const char c = 1;
        (void)!::write(wake_fd_[1], &c, 1);
    }
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> workers;
    {
        MutexLock l(&mu_);
        for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);  // each worker closes its own
        workers = std::move(workers_);
    }
    for (std::thread& t : workers) t.join();
    if (listen_fd_ >= 0) {
        ::close(listen_fd_);
        ::unlink(options_.socket_path.c_str());
        listen_fd_ = -1;
    }
}

FetchServiceStats FetchService::stats() const {
    const Counters& c = *counters_;
    FetchServiceStats s;
    s.requests = c.requests.load();
    s.keys = c.keys.load();
    s.fetched = c.fetched.load();
    s.already_in_shm = c.already_in_shm.load();
    s.misses = c.misses.load();
    s.shm_full = c.shm_full.load();
    s.errors = c.errors.load();
    s.deadline = c.deadline.load();
    s.bad_requests = c.bad_requests.load();
    s.connections = c.connections.load();
    s.bytes_fetched = c.bytes.load();
    return s;
}

void FetchService::accept_loop() {
    while (!stopping_.load()) {
        pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            DSI_LOG(kError) << "fetch service: poll: " << std::strerror(errno);
            return;
        }
        if (fds[1].revents != 0 || stopping_.load()) return;
        if ((fds[0].revents & POLLIN) == 0) continue;
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        MutexLock l(&mu_);
        if (live_connections_ >= options_.max_connections) {
            ::close(fd);  // the client sees a hang-up: kUnavailable, it reads itself
            continue;
        }
        ++live_connections_;
        ++counters_->connections;
        conn_fds_.push_back(fd);
        workers_.emplace_back([this, fd] { serve(fd); });
    }
}

void FetchService::serve(int fd) {
    std::vector<uint8_t> req(kMaxRequestBytes);
    std::vector<uint8_t> reply(kMaxReplyBytes);
    std::vector<BlockBuffer> buffers;  // one per key of a read batch, reused
    Counters& c = *counters_;
    while (!stopping_.load()) {
        pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents != 0) break;
        const ssize_t n = ::recv(fd, req.data(), req.size(), MSG_TRUNC);
        if (n <= 0) break;  // hang-up or error
        const size_t len = static_cast<size_t>(n);
        const uint32_t count =
            len >= kRequestHeaderBytes ? get<uint32_t>(req.data(), 8) : 0;
        if (len > req.size() || len < kRequestHeaderBytes ||
            get<uint32_t>(req.data(), 0) != kRequestMagic ||
            get<uint16_t>(req.data(), 4) != kWireVersion || count > kFetchMaxKeys ||
            len != kRequestHeaderBytes + count * kWireKeyBytes) {
            ++c.bad_requests;
            DSI_LOG(kWarning) << "fetch service: malformed request (" << len
                              << " bytes); closing the connection";
            break;
        }
        ++c.requests;
        c.keys += count;
        const int64_t deadline =
            deadline_after_ms(static_cast<int64_t>(get<uint32_t>(req.data(), 12)));
        std::vector<StoreKey> keys(count);
        std::vector<BlockInfo> expects(count);
        std::vector<uint8_t> has(count);
        bool ok = true;
        for (uint32_t i = 0; i < count && ok; ++i) {
            bool h = false;
            ok = get_key(req.data() + kRequestHeaderBytes + i * kWireKeyBytes, &keys[i],
                         &expects[i], &h);
            has[i] = h;
        }
        if (!ok) {
            ++c.bad_requests;
            DSI_LOG(kWarning) << "fetch service: malformed key; closing the connection";
            break;
        }
        std::vector<FetchCode> codes(count, FetchCode::kError);
        std::vector<size_t> todo;
        for (uint32_t i = 0; i < count; ++i) {
            Result<bool> in = shm_->contains(keys[i]);
            if (in.is_ok() && *in) {
                codes[i] = FetchCode::kInShm;
                ++c.already_in_shm;
            } else {
                todo.push_back(i);
            }
        }
        for (size_t b = 0; b < todo.size(); b += kReadBatch) {
            const size_t m = std::min(kReadBatch, todo.size() - b);
            if (Env::default_env()->now_ns() >= deadline) {
                for (size_t j = 0; j < m; ++j) codes[todo[b + j]] = FetchCode::kDeadline;
                continue;
            }
            std::vector<StoreKey> k(m);
            std::vector<BlockInfo> e(m);
            std::vector<std::span<uint8_t>> dsts(m);
            bool all_expect = true;
            for (size_t j = 0; j < m; ++j) {
                k[j] = keys[todo[b + j]];
                e[j] = expects[todo[b + j]];
                all_expect = all_expect && has[todo[b + j]] != 0;
                if (buffers.size() <= j) {
                    buffers.push_back(
                        BlockBuffer::allocate(static_cast<size_t>(options_.max_block_bytes)));
                }
                dsts[j] = buffers[j].span();
            }
            // Either every key of the batch carries what the engine expects or none is
            // checked beyond its format (the engine sends both or neither).
            std::vector<Result<Block>> got = lower_->read_many_into(
                k, all_expect ? std::span<const BlockInfo>(e) : std::span<const BlockInfo>(),
                dsts, deadline);
            for (size_t j = 0; j < m; ++j) {
                FetchCode& code = codes[todo[b + j]];
                if (!got[j].is_ok()) {
                    code = code_of(got[j].status());
                    if (code == FetchCode::kShmFull) code = FetchCode::kError;  // below, not shm
                } else {
                    Status put_status = shm_->put_encoded(k[j], got[j]->encoded());
                    code = put_status.is_ok() ? FetchCode::kInShm : code_of(put_status);
                    if (code == FetchCode::kInShm) {
                        ++c.fetched;
                        c.bytes += static_cast<int64_t>(got[j]->size_bytes());
                    }
                }
                switch (code) {
                    case FetchCode::kMiss: ++c.misses; break;
                    case FetchCode::kShmFull: ++c.shm_full; break;
                    case FetchCode::kError: ++c.errors; break;
                    case FetchCode::kDeadline: ++c.deadline; break;
                    case FetchCode::kInShm: break;
                }
            }
        }
        put(reply.data(), 0, kReplyMagic);
        put(reply.data(), 4, kWireVersion);
        put(reply.data(), 6, uint16_t{0});
        put(reply.data(), 8, count);
        put(reply.data(), 12, uint32_t{0});
        put(reply.data(), 16, get<uint64_t>(req.data(), 16));
        for (uint32_t i = 0; i < count; ++i) {
            reply[kReplyHeaderBytes + i] = static_cast<uint8_t>(codes[i]);
        }
        if (::send(fd, reply.data(), kReplyHeaderBytes + count, MSG_NOSIGNAL) < 0) break;
    }
    MutexLock l(&mu_);
    conn_fds_.erase(std::remove(conn_fds_.begin(), conn_fds_.end(), fd), conn_fds_.end());
    ::close(fd);
    --live_connections_;
}

// ---- FetchClient ---------------------------------------------------------------------

FetchClient::FetchClient(std::string socket_path) : path_(std::move(socket_path)) {}

FetchClient::~FetchClient() {
    for (int fd : idle_) ::close(fd);
}

Result<int> FetchClient::take_connection() {
    {
        MutexLock l(&mu_);
        if (!idle_.empty()) {
            const int fd = idle_.back();
            idle_.pop_back();
            return fd;
        }
    }
    DSI_RETURN_IF_ERROR(bad_path(path_));
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return unavailable(std::string("fetch client: socket: ") + std::strerror(errno));
    sockaddr_un a = address(path_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const int e = errno;
        ::close(fd);
        return unavailable("fetch process at " + path_ + ": " + std::strerror(e));
    }
    return fd;
}

void FetchClient::give_back(int fd) {
    MutexLock l(&mu_);
    idle_.push_back(fd);
}

Result<std::vector<FetchCode>> FetchClient::fetch(std::span<const StoreKey> keys,
                                                  std::span<const BlockInfo> expects,
                                                  int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    static std::atomic<uint64_t> next_id{1};
    std::vector<FetchCode> out;
    out.reserve(keys.size());
    std::vector<uint8_t> msg(kMaxRequestBytes);
    std::vector<uint8_t> reply(kMaxReplyBytes + 1);
    for (size_t b = 0; b < keys.size(); b += kFetchMaxKeys) {
        const uint32_t count = static_cast<uint32_t>(std::min<size_t>(kFetchMaxKeys,
                                                                      keys.size() - b));
        const int64_t left = ms_left(deadline_ns);
        if (left == 0) return deadline_exceeded("fetch process: deadline passed");
        const uint64_t id = next_id.fetch_add(1);
        put(msg.data(), 0, kRequestMagic);
        put(msg.data(), 4, kWireVersion);
        put(msg.data(), 6, uint16_t{0});
        put(msg.data(), 8, count);
        put(msg.data(), 12, static_cast<uint32_t>(left < 0 ? UINT32_MAX
                                                           : std::min<int64_t>(left, UINT32_MAX)));
        put(msg.data(), 16, id);
        for (uint32_t i = 0; i < count; ++i) {
            put_key(msg.data() + kRequestHeaderBytes + i * kWireKeyBytes, keys[b + i],
                    expects.empty() ? nullptr : &expects[b + i]);
        }
        DSI_ASSIGN_OR_RETURN(int fd, take_connection());
        const size_t len = kRequestHeaderBytes + count * kWireKeyBytes;
        if (::send(fd, msg.data(), len, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) {
            const int e = errno;
            ::close(fd);
            return unavailable("fetch process: send: " + std::string(std::strerror(e)));
        }
        while (true) {
            pollfd p{fd, POLLIN, 0};
            const int64_t wait = ms_left(deadline_ns);
            const int r = ::poll(&p, 1, wait < 0 ? -1 : static_cast<int>(std::min<int64_t>(
                                                            wait, INT32_MAX)));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                ::close(fd);  // a late reply must never answer another request
                return deadline_exceeded("fetch process: no reply before the deadline");
            }
            break;
        }
        const ssize_t n = ::recv(fd, reply.data(), reply.size(), 0);
        if (n <= 0) {
            ::close(fd);
            return unavailable("fetch process hung up");
        }
        if (static_cast<size_t>(n) != kReplyHeaderBytes + count ||
            get<uint32_t>(reply.data(), 0) != kReplyMagic ||
            get<uint16_t>(reply.data(), 4) != kWireVersion ||
            get<uint32_t>(reply.data(), 8) != count || get<uint64_t>(reply.data(), 16) != id) {
            ::close(fd);
            return data_loss("fetch process: malformed reply");
        }
        for (uint32_t i = 0; i < count; ++i) {
            const uint8_t c = reply[kReplyHeaderBytes + i];
            if (c > static_cast<uint8_t>(FetchCode::kDeadline)) {
                ::close(fd);
                return data_loss("fetch process: unknown code in reply");
            }
            out.push_back(static_cast<FetchCode>(c));
        }
        give_back(fd);
    }
    return out;
}

// ---- FetchProcessStore ---------------------------------------------------------------

FetchProcessStore::FetchProcessStore(std::unique_ptr<ShmBlockStore> shm,
                                     std::unique_ptr<BlockStore> lower, std::string socket_path)
    : TieredBlockStore(std::move(shm), std::move(lower)), client_(std::move(socket_path)) {}

FetchProcessStore::FetchProcessStore(ShmBlockStore* shm, BlockStore* lower,
                                     std::string socket_path)
    : TieredBlockStore(shm, lower), client_(std::move(socket_path)) {}

std::string FetchProcessStore::uri() const {
    return TieredBlockStore::uri() + " (fetch process " + client_.socket_path() + ")";
}

FetchProcessStats FetchProcessStore::fetch_stats() const {
    return {requests_.load(), fetched_.load(), fallback_.load()};
}

std::vector<FetchProcessStore::Action> FetchProcessStore::plan(
    std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
    const std::vector<size_t>& missing, int64_t deadline_ns) {
    std::vector<StoreKey> k;
    std::vector<BlockInfo> e;
    for (size_t i : missing) {
        k.push_back(keys[i]);
        if (!expects.empty()) e.push_back(expects[i]);
    }
    ++requests_;
    Result<std::vector<FetchCode>> codes = client_.fetch(k, e, deadline_ns);
    std::vector<Action> actions(missing.size(), Action::kReadBelow);
    if (!codes.is_ok() && codes.status().code() == StatusCode::kDeadlineExceeded) {
        return std::vector<Action>(missing.size(), Action::kLate);  // the caller gave up
    }
    if (!codes.is_ok()) {
        // Down or broken: the engine reads the store itself, so serving goes on.
        if (process_errors_.fetch_add(1) % 100 == 0) {
            DSI_LOG(kWarning) << "fetch process: " << codes.status().to_string()
                              << "; reading the store in the engine";
        }
        return actions;
    }
    for (size_t j = 0; j < missing.size(); ++j) {
        switch ((*codes)[j]) {
            case FetchCode::kInShm: actions[j] = Action::kReadShm; break;
            case FetchCode::kMiss: actions[j] = Action::kMiss; break;
            case FetchCode::kDeadline: actions[j] = Action::kLate; break;
            case FetchCode::kShmFull:
            case FetchCode::kError: actions[j] = Action::kReadBelow; break;
        }
    }
    return actions;
}

namespace {

std::vector<size_t> not_found(const std::vector<Result<Block>>& results) {
    std::vector<size_t> out;
    for (size_t i = 0; i < results.size(); ++i) {
        if (!results[i].is_ok() && results[i].status().code() == StatusCode::kNotFound) {
            out.push_back(i);
        }
    }
    return out;
}

}  // namespace

std::vector<Result<Block>> FetchProcessStore::read_many_into(
    std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
    std::span<const std::span<uint8_t>> dsts, int64_t deadline_ns) {
    DSI_CHECK_EQ(dsts.size(), keys.size());
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    std::vector<Result<Block>> out = shm().read_many_into(keys, expects, dsts, deadline_ns);
    const std::vector<size_t> missing = not_found(out);
    if (missing.empty()) return out;
    // S-KV-5: the fetch process moves them store -> shm; then they are read from shm.
    const std::vector<Action> actions = plan(keys, expects, missing, deadline_ns);
    std::vector<size_t> below;
    for (size_t j = 0; j < missing.size(); ++j) {
        const size_t i = missing[j];
        if (actions[j] == Action::kLate) {
            out[i] = deadline_exceeded("fetch process: key not fetched before the deadline");
            continue;
        }
        if (actions[j] != Action::kReadShm) {
            if (actions[j] == Action::kReadBelow) below.push_back(i);
            continue;  // kMiss: stays kNotFound
        }
        std::vector<Result<Block>> r = shm().read_many_into(
            keys.subspan(i, 1),
            expects.empty() ? std::span<const BlockInfo>() : expects.subspan(i, 1),
            dsts.subspan(i, 1), deadline_ns);
        if (r[0].is_ok()) {
            out[i] = std::move(r[0]);
            ++fetched_;
        } else {
            below.push_back(i);  // evicted again before we read it
        }
    }
    if (below.empty()) return out;
    std::vector<StoreKey> k;
    std::vector<BlockInfo> e;
    std::vector<std::span<uint8_t>> d;
    for (size_t i : below) {
        k.push_back(keys[i]);
        if (!expects.empty()) e.push_back(expects[i]);
        d.push_back(dsts[i]);
    }
    fallback_ += static_cast<int64_t>(below.size());
    std::vector<Result<Block>> r = lower().read_many_into(k, e, d, deadline_ns);
    for (size_t j = 0; j < below.size(); ++j) out[below[j]] = std::move(r[j]);
    return out;
}

std::vector<Result<Block>> FetchProcessStore::get_many(std::span<const StoreKey> keys,
                                                       std::span<const BlockInfo> expects,
                                                       int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    std::vector<Result<Block>> out = shm().get_many(keys, expects, deadline_ns);
    const std::vector<size_t> missing = not_found(out);
    if (missing.empty()) return out;
    const std::vector<Action> actions = plan(keys, expects, missing, deadline_ns);
    for (size_t j = 0; j < missing.size(); ++j) {
        const size_t i = missing[j];
        const BlockInfo* e = expects.empty() ? nullptr : &expects[i];
        if (actions[j] == Action::kLate) {
            out[i] = deadline_exceeded("fetch process: key not fetched before the deadline");
            continue;
        }
        if (actions[j] == Action::kMiss) continue;
        if (actions[j] == Action::kReadShm) {
            Result<Block> r = shm().get(keys[i], e, deadline_ns);
            if (r.is_ok()) {
                out[i] = std::move(r);
                ++fetched_;
                continue;
            }
        }
        ++fallback_;
        out[i] = lower().get(keys[i], e, deadline_ns);
    }
    return out;
}

}  // namespace dsi::kvstore

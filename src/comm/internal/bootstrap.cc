#include "comm/internal/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "base/clock.h"
#include "comm/ucx_group.h"

namespace dsi::comm::internal {
namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Milliseconds left until `deadline_ns` for poll(), at least 0, at most 100 (a poll that
// ends early only loops).
int poll_ms(int64_t deadline_ns) {
    const int64_t left = (deadline_ns - steady_clock_ns()) / 1'000'000;
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 100));
}

Result<addrinfo*> resolve(const HostPort& hp, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &found);
    if (rc != 0 || found == nullptr) {
        return invalid_argument("address '" + hp.host + ":" + std::to_string(hp.port) +
                                "' does not resolve: " + ::gai_strerror(rc));
    }
    return found;
}

// Waits for `events` on fd; false at the deadline.
bool wait_fd(int fd, short events, int64_t deadline_ns) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int rc = ::poll(&p, 1, poll_ms(deadline_ns));
        if (rc > 0) {
            return true;
        }
        if (steady_clock_ns() >= deadline_ns) {
            return false;
        }
    }
}

}  // namespace

Result<HostPort> parse_host_port(const std::string& text, bool allow_zero) {
    HostPort hp;
    std::string port;
    if (!text.empty() && text[0] == '[') {
        const size_t close = text.find(']');
        if (close == std::string::npos || close == 1 || close + 1 >= text.size() ||
            text[close + 1] != ':') {
            return invalid_argument("coordinator '" + text + "': expected [v6 address]:port");
        }
        hp.host = text.substr(1, close - 1);
        port = text.substr(close + 2);
    } else {
        const size_t colon = text.rfind(':');
        if (colon == std::string::npos || colon == 0) {
            return invalid_argument("coordinator '" + text + "': expected host:port");
        }
        hp.host = text.substr(0, colon);
        port = text.substr(colon + 1);
    }
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return invalid_argument("coordinator '" + text + "': bad port");
    }
    hp.port = std::stoi(port);
    if (hp.port > 65535 || (hp.port == 0 && !allow_zero)) {
        return invalid_argument("coordinator '" + text + "': port out of range");
    }
    return hp;
}

Result<int> listen_on(const HostPort& at) {
    DSI_ASSIGN_OR_RETURN(addrinfo * found, resolve(at, true));
    Status last = unavailable("listen on " + at.host + ": no address");
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last = internal_error(errno_text("socket"));
            continue;
        }
        const int one = 1;
        (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
            ::freeaddrinfo(found);
            return fd;
        }
        const std::string what =
            "listen on " + at.host + ":" + std::to_string(at.port) + ": " + std::strerror(errno);
        last = errno == EADDRINUSE ? Status(StatusCode::kAlreadyExists, what) : unavailable(what);
        ::close(fd);
    }
    ::freeaddrinfo(found);
    return last;
}

Result<int> bound_port(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        return internal_error(errno_text("getsockname"));
    }
    if (ss.ss_family == AF_INET6) {
        return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port));
    }
    return static_cast<int>(ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
}

Result<int> connect_with_retry(const HostPort& to, int64_t deadline_ns,
                               const std::function<bool()>& abandoned) {
    DSI_ASSIGN_OR_RETURN(addrinfo * found, resolve(to, false));
    std::string last = "no answer";
    for (;;) {
        for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
            const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                    a->ai_protocol);
            if (fd < 0) {
                last = errno_text("socket");
                continue;
            }
            int err = 0;
            if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
                err = errno;
                if (err == EINPROGRESS) {
                    err = ETIMEDOUT;
                    if (wait_fd(fd, POLLOUT, deadline_ns)) {
                        socklen_t len = sizeof err;
                        (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                    }
                }
            }
            if (err == 0) {
                ::freeaddrinfo(found);
                const int one = 1;
                (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                return fd;
            }
            last = std::strerror(err);
            ::close(fd);
        }
        if (steady_clock_ns() >= deadline_ns) {
            ::freeaddrinfo(found);
            return deadline_exceeded("coordinator " + to.host + ":" + std::to_string(to.port) +
                                     " did not answer in time (" + last + ")");
        }
        if (abandoned && abandoned()) {
            ::freeaddrinfo(found);
            return unavailable("coordinator " + to.host + ":" + std::to_string(to.port) +
                               ": the group was abandoned while this rank joined");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

Status send_frame(int fd, const std::vector<uint8_t>& bytes, int64_t deadline_ns) {
    std::vector<uint8_t> frame(4 + bytes.size());
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    for (int i = 0; i < 4; ++i) {
        frame[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
    }
    std::copy(bytes.begin(), bytes.end(), frame.begin() + 4);
    size_t done = 0;
    while (done < frame.size()) {
        const ssize_t w = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
        if (w > 0) {
            done += static_cast<size_t>(w);
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            return unavailable(errno_text("bootstrap send"));
        }
        if (!wait_fd(fd, POLLOUT, deadline_ns)) {
            return deadline_exceeded("bootstrap send timed out");
        }
    }
    return Status::ok();
}

std::span<uint8_t> FrameAssembler::space() {
    if (!in_body_) {
        return std::span<uint8_t>(header_).subspan(header_done_);
    }
    return std::span<uint8_t>(body_).subspan(body_done_);
}

Status FrameAssembler::received(size_t n) {
    if (in_body_) {
        body_done_ += n;
        return Status::ok();
    }
    header_done_ += n;
    if (header_done_ < header_.size()) {
        return Status::ok();
    }
    const size_t len = header_[0] | (size_t{header_[1]} << 8) | (size_t{header_[2]} << 16) |
                       (size_t{header_[3]} << 24);
    if (len > max_bytes_) {
        header_done_ = 0;  // space() stays non-empty; the caller drops the peer
        return invalid_argument("bootstrap frame of " + std::to_string(len) + " bytes (at most " +
                                std::to_string(max_bytes_) + ")");
    }
    in_body_ = true;
    body_.assign(len, 0);
    body_done_ = 0;
    return Status::ok();
}

std::vector<uint8_t> FrameAssembler::take() {
    std::vector<uint8_t> out = std::move(body_);
    body_.clear();
    in_body_ = false;
    header_done_ = 0;
    body_done_ = 0;
    return out;
}

namespace {

// One non-blocking read into `a`. OK with nothing read when the socket has no data;
// UNAVAILABLE when the peer closed or failed; the assembler's error on a bad header.
Status read_some(int fd, FrameAssembler& a) {
    const std::span<uint8_t> space = a.space();
    const ssize_t r = ::recv(fd, space.data(), space.size(), 0);
    if (r > 0) {
        return a.received(static_cast<size_t>(r));
    }
    if (r == 0) {
        return unavailable("bootstrap peer closed the connection");
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        return Status::ok();
    }
    return unavailable(errno_text("bootstrap recv"));
}

}  // namespace

Result<std::vector<uint8_t>> recv_frame(int fd, int64_t deadline_ns, size_t max_bytes) {
    FrameAssembler a(max_bytes);
    while (!a.done()) {
        DSI_RETURN_IF_ERROR(read_some(fd, a));
        if (!a.done() && !wait_fd(fd, POLLIN, deadline_ns)) {
            return deadline_exceeded("bootstrap answer timed out");
        }
    }
    return a.take();
}

void FrameWriter::u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) {
        data_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
}

void FrameWriter::i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) {
        data_.push_back(static_cast<uint8_t>(u >> (8 * i)));
    }
}

void FrameWriter::bytes(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    const auto* b = static_cast<const uint8_t*>(p);
    data_.insert(data_.end(), b, b + n);
}

bool FrameReader::take(void* p, size_t n) {
    if (!ok_ || data_.size() - pos_ < n) {
        ok_ = false;
        return false;
    }
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
    return true;
}

bool FrameReader::u32(uint32_t& v) {
    uint8_t b[4];
    if (!take(b, 4)) {
        return false;
    }
    v = b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
    return true;
}

bool FrameReader::i64(int64_t& v) {
    uint8_t b[8];
    if (!take(b, 8)) {
        return false;
    }
    uint64_t u = 0;
    for (int i = 7; i >= 0; --i) {
        u = (u << 8) | b[i];
    }
    v = static_cast<int64_t>(u);
    return true;
}

bool FrameReader::bytes(std::vector<uint8_t>& out) {
    uint32_t n = 0;
    if (!u32(n) || data_.size() - pos_ < n) {
        ok_ = false;
        return false;
    }
    out.assign(data_.begin() + static_cast<ptrdiff_t>(pos_),
               data_.begin() + static_cast<ptrdiff_t>(pos_ + n));
    pos_ += n;
    return true;
}

namespace {

constexpr uint32_t kJoinMagic = 0x4d435855;  // "UXCM"
constexpr uint32_t kJoinVersion = 1;
// A join frame is ~100 bytes plus a worker address (UCX: a few hundred bytes).
constexpr size_t kMaxJoinFrame = 1 << 20;
// Connections rank 0 reads at once while the group forms (ranks and strays).
constexpr size_t kMaxPendingJoins = 64;
constexpr size_t kShapeFields = 6;

}  // namespace

std::vector<uint8_t> encode_join(int rank, const MoeShape& s, const std::vector<uint8_t>& address) {
    FrameWriter w;
    w.u32(kJoinMagic);
    w.u32(kJoinVersion);
    w.u32(static_cast<uint32_t>(rank));
    w.i64(s.num_ranks);
    w.i64(s.hidden);
    w.i64(s.top_k);
    w.i64(s.max_tokens_per_rank);
    w.i64(s.slots_per_rank);
    w.i64(s.recv_capacity());
    w.bytes(address.data(), address.size());
    return std::move(w.data());
}

Result<JoinMessage> decode_join(const std::vector<uint8_t>& frame) {
    FrameReader r(frame);
    JoinMessage m;
    uint32_t magic = 0;
    m.shape.resize(kShapeFields);
    bool ok = r.u32(magic) && r.u32(m.version) && r.u32(m.rank) && magic == kJoinMagic;
    if (ok && m.version != kJoinVersion) {
        return m;  // another layout may follow: the coordinator names the version
    }
    for (int64_t& v : m.shape) {
        ok = ok && r.i64(v);
    }
    ok = ok && r.bytes(m.address);
    if (!ok || !r.at_end()) {
        return invalid_argument("ucx group: not a join frame");
    }
    return m;
}

std::vector<uint8_t> encode_table(const std::vector<std::vector<uint8_t>>& addresses) {
    FrameWriter w;
    w.u32(0);
    w.bytes("", 0);
    for (const auto& a : addresses) {
        w.bytes(a.data(), a.size());
    }
    return std::move(w.data());
}

std::vector<uint8_t> encode_error(const Status& error) {
    FrameWriter w;
    w.u32(static_cast<uint32_t>(error.code()));
    w.bytes(error.message().data(), error.message().size());
    return std::move(w.data());
}

Result<std::vector<std::vector<uint8_t>>> decode_answer(const std::vector<uint8_t>& frame,
                                                        int num_ranks,
                                                        const std::string& coordinator) {
    const auto bad = [&](const char* what) {
        return internal_error("ucx group: " + std::string(what) + " from the coordinator " +
                              coordinator);
    };
    FrameReader r(frame);
    uint32_t code = 0;
    std::vector<uint8_t> message;
    if (!r.u32(code) || !r.bytes(message)) {
        return bad("bad answer");
    }
    if (code != 0) {
        // A code outside StatusCode would wrap (to OK at 256) in the cast.
        if (code > static_cast<uint32_t>(StatusCode::kDataLoss) || !r.at_end()) {
            return bad("bad error answer");
        }
        return Status(static_cast<StatusCode>(code), std::string(message.begin(), message.end()));
    }
    if (!message.empty()) {
        return bad("bad answer");  // a table's message is empty
    }
    std::vector<std::vector<uint8_t>> addresses(static_cast<size_t>(std::max(num_ranks, 0)));
    for (auto& a : addresses) {
        if (!r.bytes(a)) {
            return bad("short address table");
        }
    }
    if (!r.at_end()) {
        return bad("long address table");
    }
    return addresses;
}

namespace {

// FAILED_PRECONDITION naming the first field that differs ("hidden 32 at rank 1, 64 at
// rank 0").
Status compare_shapes(int rank, const std::vector<int64_t>& theirs, const MoeShape& s) {
    const char* names[] = {"ranks",          "hidden",          "top_k", "max tokens per rank",
                           "slots per rank", "receive capacity"};
    const int64_t ours[] = {s.num_ranks,           s.hidden,         s.top_k,
                            s.max_tokens_per_rank, s.slots_per_rank, s.recv_capacity()};
    for (size_t i = 0; i < kShapeFields; ++i) {
        if (theirs[i] != ours[i]) {
            return failed_precondition("ucx group: layout differs: " + std::string(names[i]) + " " +
                                       std::to_string(theirs[i]) + " at rank " +
                                       std::to_string(rank) + ", " + std::to_string(ours[i]) +
                                       " at rank 0");
        }
    }
    return Status::ok();
}

struct FdCloser {
    std::vector<int> fds;
    ~FdCloser() {
        for (int fd : fds) {
            ::close(fd);
        }
    }
};

// Rank 0's view of a join frame: the failure it makes the group's (OK if none), and
// whether the connection is rank `rank`'s (kept for the answer).
struct JoinVerdict {
    Status failure;
    bool joins = false;
    uint32_t rank = 0;
};

JoinVerdict judge_join(const JoinMessage& join, const std::vector<int>& fds,
                       const MoeShape& shape) {
    const int n = shape.num_ranks;
    JoinVerdict v;
    v.rank = join.rank;
    if (join.version != kJoinVersion) {
        v.failure = failed_precondition("ucx group: rank " + std::to_string(join.rank) +
                                        " speaks protocol version " + std::to_string(join.version) +
                                        ", rank 0 " + std::to_string(kJoinVersion));
    } else if (join.rank == 0 || join.rank >= static_cast<uint32_t>(n)) {
        v.failure = invalid_argument("ucx group: a process joined as rank " +
                                     std::to_string(join.rank) + " of " + std::to_string(n));
    } else if (fds[join.rank] >= 0) {
        v.failure = Status(StatusCode::kAlreadyExists,
                           "ucx group: two processes joined as rank " + std::to_string(join.rank));
    } else {
        v.failure = compare_shapes(static_cast<int>(join.rank), join.shape, shape);
    }
    v.joins = join.rank > 0 && join.rank < static_cast<uint32_t>(n) && fds[join.rank] < 0;
    return v;
}

// A connection whose join frame has not come whole yet.
struct Pending {
    int fd = -1;
    FrameAssembler frame{kMaxJoinFrame};
};

// Rank 0: accept every other rank's join frame, check its shape, answer each with the
// table of worker addresses (or the error every rank then returns). Every connection is
// read as its bytes come (poll over the listening socket and all of them), so a client
// that connects and says nothing, or dribbles, holds nobody up; at most
// kMaxPendingJoins wait at once (the oldest goes first), and a connection that sends
// something that is no join frame is dropped.
Result<std::vector<std::vector<uint8_t>>> coordinate(const UcxGroupOptions& o, const HostPort& at,
                                                     std::vector<uint8_t> own_address,
                                                     int64_t deadline) {
    DSI_ASSIGN_OR_RETURN(int listen_fd, listen_on(at));
    FdCloser closer;  // the listening socket and the joined ranks' connections
    closer.fds.push_back(listen_fd);
    std::deque<Pending> pending;
    struct PendingCloser {
        std::deque<Pending>& p;
        ~PendingCloser() {
            for (const Pending& c : p) ::close(c.fd);
        }
    } pending_closer{pending};
    const int n = o.shape.num_ranks;
    std::vector<std::vector<uint8_t>> addresses(static_cast<size_t>(n));
    std::vector<int> fds(static_cast<size_t>(n), -1);
    addresses[0] = std::move(own_address);
    Status failure;
    int joined = 1;
    std::vector<pollfd> polled;
    while (joined < n && failure.is_ok()) {
        if (o.abandoned && o.abandoned()) {
            failure =
                unavailable("ucx group " + o.coordinator + ": abandoned while ranks were joining");
            break;
        }
        if (steady_clock_ns() >= deadline) {
            std::string missing;
            for (int r = 1; r < n; ++r) {
                if (fds[static_cast<size_t>(r)] < 0) {
                    missing += (missing.empty() ? "" : ",") + std::to_string(r);
                }
            }
            failure = deadline_exceeded("ucx group " + o.coordinator + ": ranks " + missing +
                                        " did not join within " +
                                        std::to_string(o.attach_timeout_ms) + " ms");
            break;
        }
        polled.assign(1, pollfd{listen_fd, POLLIN, 0});
        for (const Pending& c : pending) polled.push_back(pollfd{c.fd, POLLIN, 0});
        if (::poll(polled.data(), polled.size(), poll_ms(deadline)) <= 0) {
            continue;
        }
        // Joining connections first (their indices are those of `pending` now).
        std::vector<size_t> done;  // indices into `pending`, ascending
        for (size_t i = 0; i < pending.size() && failure.is_ok(); ++i) {
            if (polled[i + 1].revents == 0) continue;
            Pending& c = pending[i];
            const Status read = read_some(c.fd, c.frame);
            if (!read.is_ok()) {
                done.push_back(i);  // gone, or no join frame: not one of ours
                continue;
            }
            if (!c.frame.done()) continue;
            done.push_back(i);
            Result<JoinMessage> join = decode_join(c.frame.take());
            if (!join.is_ok()) continue;
            const JoinVerdict v = judge_join(*join, fds, o.shape);
            failure = v.failure;
            if (v.joins) {
                fds[v.rank] = c.fd;
                closer.fds.push_back(c.fd);
                c.fd = -1;
                addresses[v.rank] = std::move(join->address);
                ++joined;
            } else if (!failure.is_ok()) {
                (void)send_frame(c.fd, encode_error(failure), deadline);
            }
        }
        for (auto it = done.rbegin(); it != done.rend(); ++it) {
            if (pending[*it].fd >= 0) ::close(pending[*it].fd);
            pending.erase(pending.begin() + static_cast<ptrdiff_t>(*it));
        }
        if ((polled[0].revents & POLLIN) != 0 && failure.is_ok()) {
            const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                if (pending.size() >= kMaxPendingJoins) {
                    ::close(pending.front().fd);
                    pending.pop_front();
                }
                pending.push_back(Pending{fd, FrameAssembler(kMaxJoinFrame)});
            }
        }
    }
    // Everyone who joined hears the outcome: the table or the error.
    const std::vector<uint8_t> answer =
        failure.is_ok() ? encode_table(addresses) : encode_error(failure);
    for (int r = 1; r < n; ++r) {
        if (fds[static_cast<size_t>(r)] >= 0) {
            const Status sent = send_frame(fds[static_cast<size_t>(r)], answer, deadline);
            if (failure.is_ok() && !sent.is_ok()) {
                failure = unavailable("ucx group: rank " + std::to_string(r) +
                                      " left while joining: " + sent.message());
            }
        }
    }
    DSI_RETURN_IF_ERROR(failure);
    return addresses;
}

// Ranks > 0: join at the coordinator, get the table.
Result<std::vector<std::vector<uint8_t>>> join(const UcxGroupOptions& o, const HostPort& at,
                                               const std::vector<uint8_t>& own_address,
                                               int64_t deadline) {
    DSI_ASSIGN_OR_RETURN(int fd, connect_with_retry(at, deadline, o.abandoned));
    FdCloser closer;
    closer.fds.push_back(fd);
    DSI_RETURN_IF_ERROR(send_frame(fd, encode_join(o.rank, o.shape, own_address), deadline));
    Result<std::vector<uint8_t>> frame = recv_frame(fd, deadline, 64 << 20);
    if (!frame.is_ok()) {
        const Status& s = frame.status();
        return Status(s.code(), "ucx group: no answer from the coordinator " + o.coordinator +
                                    ": " + s.message());
    }
    return decode_answer(*frame, o.shape.num_ranks, o.coordinator);
}

}  // namespace

Result<std::vector<std::vector<uint8_t>>> exchange_worker_addresses(const UcxGroupOptions& o,
                                                                    const HostPort& at,
                                                                    std::vector<uint8_t> own,
                                                                    int64_t deadline_ns) {
    if (o.rank == 0) {
        return coordinate(o, at, std::move(own), deadline_ns);
    }
    return join(o, at, own, deadline_ns);
}

}  // namespace dsi::comm::internal

namespace dsi::comm {

Status check_coordinator_address(const std::string& coordinator) {
    return internal::parse_host_port(coordinator).status();
}

Result<int> pick_free_port(const std::string& host) {
    DSI_ASSIGN_OR_RETURN(int fd, internal::listen_on(internal::HostPort{host, 0}));
    Result<int> port = internal::bound_port(fd);
    ::close(fd);
    return port;
}

}  // namespace dsi::comm

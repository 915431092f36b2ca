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
        if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
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

Result<int> connect_with_retry(const HostPort& to, int64_t deadline_ns) {
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
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

Result<int> accept_until(int listen_fd, int64_t deadline_ns) {
    if (!wait_fd(listen_fd, POLLIN, deadline_ns)) {
        return deadline_exceeded("");
    }
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        return internal_error(errno_text("accept"));
    }
    return fd;
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

Result<std::vector<uint8_t>> recv_frame(int fd, int64_t deadline_ns, size_t max_bytes) {
    std::vector<uint8_t> out(4);
    size_t want = 4, done = 0;
    bool header = true;
    for (;;) {
        while (done < want) {
            const ssize_t r = ::recv(fd, out.data() + done, want - done, 0);
            if (r > 0) {
                done += static_cast<size_t>(r);
                continue;
            }
            if (r == 0) {
                return unavailable("bootstrap peer closed the connection");
            }
            if (errno != EAGAIN && errno != EINTR) {
                return unavailable(errno_text("bootstrap recv"));
            }
            if (!wait_fd(fd, POLLIN, deadline_ns)) {
                return deadline_exceeded("bootstrap answer timed out");
            }
        }
        if (!header) {
            return out;
        }
        const size_t n =
            out[0] | (size_t{out[1]} << 8) | (size_t{out[2]} << 16) | (size_t{out[3]} << 24);
        if (n > max_bytes) {
            return invalid_argument("bootstrap frame of " + std::to_string(n) + " bytes");
        }
        header = false;
        out.assign(n, 0);
        want = n;
        done = 0;
        if (n == 0) {
            return out;
        }
    }
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

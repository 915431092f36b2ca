#include "comm/rank_pipe.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dsi::comm {
namespace {

Status sys_error(const char* what) {
    return internal_error(std::string(what) + ": " + std::strerror(errno));
}

bool set_nonblocking(int fd) {
    const int flags = ::fcntl(fd, F_GETFL);
    return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

}  // namespace

Result<RankPipe::Pair> RankPipe::create_pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        return sys_error("socketpair");
    }
    if (!set_nonblocking(fds[0])) {
        Status s = sys_error("fcntl");
        ::close(fds[0]);
        ::close(fds[1]);
        return s;
    }
    Pair p;
    p.parent.reset(new RankPipe(fds[0]));
    p.child_fd = fds[1];
    return p;
}

bool RankPipe::inherit_in_child(int fd) {
    const int flags = ::fcntl(fd, F_GETFD);
    return flags >= 0 && ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) == 0;
}

Result<std::unique_ptr<RankPipe>> RankPipe::adopt(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    if (fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
        return invalid_argument("rank pipe: fd " + std::to_string(fd) +
                                " is not an open stream socket");
    }
    // The started rank's own children (none today) must not inherit it.
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (!set_nonblocking(fd)) return sys_error("fcntl");
    return std::unique_ptr<RankPipe>(new RankPipe(fd));
}

RankPipe::~RankPipe() {
    if (fd_ >= 0) ::close(fd_);
}

Status RankPipe::send(std::string_view message) {
    if (message.size() > kMaxMessageBytes) {
        return invalid_argument("rank pipe: a message of " + std::to_string(message.size()) +
                                " bytes");
    }
    const uint32_t n = static_cast<uint32_t>(message.size());
    const unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                                  static_cast<unsigned char>(n >> 16),
                                  static_cast<unsigned char>(n >> 24)};
    if (out_pos_ == out_.size()) {
        out_.clear();
        out_pos_ = 0;
    }
    out_.append(reinterpret_cast<const char*>(len), 4);
    out_.append(message);
    return flush();
}

Status RankPipe::flush() {
    while (out_pos_ < out_.size()) {
        const ssize_t n = ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
        if (n > 0) {
            out_pos_ += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::ok();
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            out_.clear();
            out_pos_ = 0;
            return unavailable("rank pipe: the peer is gone");
        }
        return sys_error("rank pipe send");
    }
    out_.clear();
    out_pos_ = 0;
    return Status::ok();
}

Result<bool> RankPipe::receive(std::vector<std::string>& messages) {
    char buf[65536];
    while (!eof_) {
        const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
        if (n > 0) {
            in_.append(buf, static_cast<size_t>(n));
            continue;
        }
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            eof_ = true;
            break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return sys_error("rank pipe recv");
    }
    size_t pos = 0;
    while (in_.size() - pos >= 4) {
        const auto* p = reinterpret_cast<const unsigned char*>(in_.data() + pos);
        const uint32_t n =
            uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
        if (n > kMaxMessageBytes) {
            return internal_error("rank pipe: a message length of " + std::to_string(n));
        }
        if (in_.size() - pos - 4 < n) break;
        messages.emplace_back(in_, pos + 4, n);
        pos += 4 + size_t{n};
    }
    in_.erase(0, pos);
    return !eof_;
}

void RankPipe::wait_readable(int64_t timeout_ns) const {
    pollfd p{fd_, POLLIN, 0};
    const timespec t{static_cast<time_t>(timeout_ns / 1'000'000'000),
                     static_cast<long>(timeout_ns % 1'000'000'000)};
    (void)::ppoll(&p, 1, &t, nullptr);
}

void RankPipe::wait_any_readable(std::span<const std::shared_ptr<RankPipe>> pipes,
                                 int64_t timeout_ns) {
    std::vector<pollfd> p;
    p.reserve(pipes.size());
    for (const std::shared_ptr<RankPipe>& pipe : pipes) p.push_back({pipe->fd_, POLLIN, 0});
    const timespec t{static_cast<time_t>(timeout_ns / 1'000'000'000),
                     static_cast<long>(timeout_ns % 1'000'000'000)};
    (void)::ppoll(p.data(), p.size(), &t, nullptr);
}

}  // namespace dsi::comm

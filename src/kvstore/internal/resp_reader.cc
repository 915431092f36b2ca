// RESP2 reply reader into caller memory (see resp_reader.h).
#include "kvstore/internal/resp_reader.h"

#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>
#include <vector>

namespace dsi::kvstore::internal {
namespace {

constexpr size_t kStageBytes = size_t{64} << 10;
constexpr size_t kMaxLineBytes = 4096;

class SocketReader {
public:
    explicit SocketReader(int fd) : fd_(fd), buf_(kStageBytes) {}

    // The next line without its CRLF (a view into the stage, valid until the next call).
    bool line(std::string_view* out) {
        while (true) {
            const char* begin = reinterpret_cast<const char*>(buf_.data()) + pos_;
            std::string_view have(begin, len_ - pos_);
            size_t eol = have.find("\r\n");
            if (eol != std::string_view::npos) {
                *out = have.substr(0, eol);
                pos_ += eol + 2;
                return true;
            }
            if (have.size() >= kMaxLineBytes || !fill()) {
                return false;
            }
        }
    }

    // Exactly n bytes into dst (null: dropped): first from the stage, the rest straight
    // from the socket into dst.
    bool read(uint8_t* dst, size_t n) {
        size_t take = std::min(n, len_ - pos_);
        if (dst != nullptr) {
            std::memcpy(dst, buf_.data() + pos_, take);
        }
        pos_ += take;
        n -= take;
        size_t done = take;
        while (n > 0) {
            if (dst == nullptr) {
                if (!fill()) {
                    return false;
                }
                take = std::min(n, len_ - pos_);
                pos_ += take;
                n -= take;
                continue;
            }
            ssize_t r = ::recv(fd_, dst + done, n, 0);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                return false;
            }
            done += static_cast<size_t>(r);
            n -= static_cast<size_t>(r);
        }
        return true;
    }

    bool crlf() {
        uint8_t two[2];
        return read(two, 2) && two[0] == '\r' && two[1] == '\n';
    }

    bool drained() const { return pos_ == len_; }

private:
    // Appends what the socket has (at least one byte) to the stage.
    bool fill() {
        if (pos_ > 0) {
            std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
            len_ -= pos_;
            pos_ = 0;
        }
        while (true) {
            ssize_t r = ::recv(fd_, buf_.data() + len_, buf_.size() - len_, 0);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                return false;  // EOF, error, or SO_RCVTIMEO (EAGAIN)
            }
            len_ += static_cast<size_t>(r);
            return true;
        }
    }

    int fd_;
    std::vector<uint8_t> buf_;
    size_t pos_ = 0;
    size_t len_ = 0;
};

}  // namespace

bool read_resp_replies(int fd, std::span<RespTarget> targets, size_t max_bulk_bytes) {
    SocketReader in(fd);
    for (RespTarget& t : targets) {
        t.got = RespTarget::Got::kNothing;
        std::string_view l;
        if (!in.line(&l) || l.empty()) {
            return false;
        }
        const char type = l[0];
        if (type == '+' || type == '-' || type == ':') {
            continue;  // status, error, integer: nothing to deliver
        }
        if (type != '$') {
            return false;  // arrays and anything else are not expected here
        }
        int64_t n = 0;
        auto [p, ec] = std::from_chars(l.data() + 1, l.data() + l.size(), n);
        if (ec != std::errc() || p != l.data() + l.size() || n < -1) {
            return false;
        }
        if (n == -1) {
            continue;  // nil: the key is absent
        }
        const size_t len = static_cast<size_t>(n);
        if (len > max_bulk_bytes) {
            return false;
        }
        if (!t.dst.empty() && len == 8 + t.dst.size()) {
            uint8_t prefix[8];
            if (!in.read(prefix, 8) || !in.read(t.dst.data(), t.dst.size())) {
                return false;
            }
            std::memcpy(&t.prefix, prefix, 8);
            t.got = RespTarget::Got::kFilled;
        } else {
            if (!in.read(nullptr, len)) {
                return false;
            }
            t.got = RespTarget::Got::kOtherBulk;
        }
        if (!in.crlf()) {
            return false;
        }
    }
    return in.drained();
}

}  // namespace dsi::kvstore::internal

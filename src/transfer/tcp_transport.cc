// TCP transport on Boost.Asio: the only translation unit of transfer/ that includes Asio.
// Connect and accept run an io_context on the caller's thread until the operation
// completes or its timeout passes (then it is cancelled and its handler drained); reads
// and writes are blocking calls with socket timeouts (see TcpConnection). So the
// interface is blocking with deadlines and no thread is spawned. Asio calls use the
// error_code overloads (no exception leaves this file; STYLE 2, as server/http_server.cc).
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <memory>
#include <vector>

#include "transfer/transport.h"

namespace dsi::transfer {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

Status from_error(const error_code& ec, const std::string& what) {
    if (ec == asio::error::operation_aborted) {
        return deadline_exceeded(what + ": timed out");
    }
    if (ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::broken_pipe || ec == asio::error::connection_aborted ||
        ec == asio::error::not_connected || ec == asio::error::bad_descriptor) {
        return unavailable(what + ": connection closed (" + ec.message() + ")");
    }
    if (ec == asio::error::connection_refused || ec == asio::error::host_unreachable ||
        ec == asio::error::network_unreachable) {
        return unavailable(what + ": " + ec.message());
    }
    return internal_error(what + ": " + ec.message());
}

// Runs `ioc` until the started operation's handler set `*done`, at most `timeout`;
// past it, `cancel` aborts the operation and its handler is drained (it then reports
// operation_aborted, or success if it completed meanwhile).
template <typename Cancel>
void run_with_timeout(asio::io_context& ioc, const bool* done, Timeout timeout, Cancel&& cancel) {
    ioc.restart();
    ioc.run_for(timeout);
    if (!*done) {
        cancel();
        ioc.restart();
        ioc.run();
    }
}

// Data moves with blocking sendmsg/recv on the native socket, bounded by
// SO_SNDTIMEO / SO_RCVTIMEO: the kernel then moves large pieces per call, where Asio's
// reactor (non-blocking calls woken by epoll) took ~11 small sendmsg per 1 MiB frame
// and ran at a third of a raw stream's speed on loopback (bench/transfer_bench.cc).
// The timeout is therefore per call without progress (an idle timeout), not a total.
class TcpConnection : public Connection {
public:
    TcpConnection(std::unique_ptr<asio::io_context> ioc, tcp::socket socket)
        : ioc_(std::move(ioc)), socket_(std::move(socket)) {
        error_code ec;
        socket_.set_option(tcp::no_delay(true), ec);
        socket_.native_non_blocking(false, ec);
        const auto ep = socket_.remote_endpoint(ec);
        if (!ec) {
            peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
        }
    }
    ~TcpConnection() override { close(); }

    Status write(std::span<const std::span<const uint8_t>> pieces, Timeout timeout) override {
        if (!socket_.is_open()) {
            return unavailable("write: connection closed");
        }
        set_timeout(SO_SNDTIMEO, timeout, &send_timeout_);
        std::vector<iovec> iov;
        iov.reserve(pieces.size());
        for (const auto& p : pieces) {
            if (!p.empty()) {
                iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
            }
        }
        size_t first = 0;
        while (first < iov.size()) {
            msghdr msg{};
            msg.msg_iov = iov.data() + first;
            msg.msg_iovlen = iov.size() - first;
            const ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return from_errno(errno, "write to " + peer_);
            }
            // Skip what was sent.
            size_t left = static_cast<size_t>(n);
            while (first < iov.size() && left >= iov[first].iov_len) {
                left -= iov[first].iov_len;
                ++first;
            }
            if (left > 0) {
                iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
                iov[first].iov_len -= left;
            }
        }
        return Status::ok();
    }

    Result<size_t> read_some(std::span<uint8_t> buf, Timeout timeout) override {
        if (!socket_.is_open()) {
            return unavailable("read: connection closed");
        }
        DSI_CHECK(!buf.empty(), "read_some into an empty buffer (0 would read as end of stream)");
        set_timeout(SO_RCVTIMEO, timeout, &receive_timeout_);
        for (;;) {
            const ssize_t n = ::recv(socket_.native_handle(), buf.data(), buf.size(), 0);
            if (n >= 0) {
                return static_cast<size_t>(n);
            }
            if (errno != EINTR) {
                return from_errno(errno, "read from " + peer_);
            }
        }
    }

    size_t available() override {
        error_code ec;
        const size_t n = socket_.is_open() ? socket_.available(ec) : 0;
        return ec ? 0 : n;
    }

    void shutdown_write() override {
        error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
    }

    void close() override {
        error_code ec;
        if (socket_.is_open()) {
            socket_.shutdown(tcp::socket::shutdown_both, ec);
            socket_.close(ec);
        }
    }

    std::string peer_address() const override { return peer_; }

private:
    // Sets the socket option when the timeout changed (0 would mean "forever": at least
    // 1 ms).
    void set_timeout(int option, Timeout timeout, Timeout* current) {
        timeout = std::max(timeout, Timeout(1));
        if (timeout == *current) {
            return;
        }
        timeval tv{};
        tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
        tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
        ::setsockopt(socket_.native_handle(), SOL_SOCKET, option, &tv, sizeof tv);
        *current = timeout;
    }

    static Status from_errno(int err, const std::string& what) {
        if (err == EAGAIN || err == EWOULDBLOCK) {
            return deadline_exceeded(what + ": timed out");
        }
        return from_error(error_code(err, boost::system::system_category()), what);
    }

    std::unique_ptr<asio::io_context> ioc_;  // before socket_: destroyed after it
    tcp::socket socket_;
    std::string peer_ = "?";
    Timeout send_timeout_{0};
    Timeout receive_timeout_{0};
};

class TcpListener : public Listener {
public:
    TcpListener() : acceptor_(ioc_) {}
    ~TcpListener() override { close(); }

    Status open(const std::string& host, uint16_t port) {
        error_code ec;
        const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
        if (ec) {
            return invalid_argument("listen address '" + host + "': " + ec.message());
        }
        const tcp::endpoint ep(address, port);
        acceptor_.open(ep.protocol(), ec);
        if (!ec) {
            acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
        }
        if (!ec) {
            acceptor_.bind(ep, ec);
        }
        if (!ec) {
            acceptor_.listen(asio::socket_base::max_listen_connections, ec);
        }
        if (ec) {
            return unavailable("listen on " + host + ":" + std::to_string(port) + ": " +
                               ec.message());
        }
        port_ = acceptor_.local_endpoint(ec).port();
        return Status::ok();
    }

    Result<std::unique_ptr<Connection>> accept(Timeout timeout) override {
        if (!acceptor_.is_open()) {
            return unavailable("accept: listener closed");
        }
        auto conn_ioc = std::make_unique<asio::io_context>(1);
        tcp::socket socket(*conn_ioc);
        bool done = false;
        error_code result;
        acceptor_.async_accept(socket, [&](const error_code& ec) {
            done = true;
            result = ec;
        });
        run_with_timeout(ioc_, &done, timeout, [this] {
            error_code ec;
            acceptor_.cancel(ec);
        });
        if (result) {
            return from_error(result, "accept");
        }
        return std::unique_ptr<Connection>(
            std::make_unique<TcpConnection>(std::move(conn_ioc), std::move(socket)));
    }

    uint16_t port() const override { return port_; }

    void close() override {
        error_code ec;
        acceptor_.close(ec);
    }

private:
    asio::io_context ioc_{1};
    tcp::acceptor acceptor_;
    uint16_t port_ = 0;
};

class TcpTransport : public Transport {
public:
    Result<std::unique_ptr<Listener>> listen(const std::string& host, uint16_t port) override {
        auto l = std::make_unique<TcpListener>();
        DSI_RETURN_IF_ERROR(l->open(host, port));
        return std::unique_ptr<Listener>(std::move(l));
    }

    Result<std::unique_ptr<Connection>> connect(const std::string& host, uint16_t port,
                                                Timeout timeout) override {
        auto ioc = std::make_unique<asio::io_context>(1);
        error_code ec;
        tcp::resolver resolver(*ioc);
        const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
        if (ec) {
            return unavailable("resolve " + host + ": " + ec.message());
        }
        tcp::socket socket(*ioc);
        bool done = false;
        error_code result;
        asio::async_connect(socket, endpoints, [&](const error_code& e, const tcp::endpoint&) {
            done = true;
            result = e;
        });
        run_with_timeout(*ioc, &done, timeout, [&socket] {
            error_code ignored;
            socket.close(ignored);
        });
        if (result) {
            return from_error(result, "connect to " + host + ":" + std::to_string(port));
        }
        return std::unique_ptr<Connection>(
            std::make_unique<TcpConnection>(std::move(ioc), std::move(socket)));
    }
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport() { return std::make_unique<TcpTransport>(); }

}  // namespace dsi::transfer

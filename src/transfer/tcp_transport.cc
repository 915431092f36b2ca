// TCP transport on Boost.Asio: the only translation unit of transfer/ that includes Asio.
// Every call runs the connection's own io_context on the caller's thread until the
// operation completes or its timeout passes (then the operation is cancelled and its
// handler drained), so the interface is blocking with deadlines and no thread is
// spawned. Asio calls use the error_code overloads (no exception leaves this file;
// STYLE 2, as server/http_server.cc).
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
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

class TcpConnection : public Connection {
public:
    TcpConnection(std::unique_ptr<asio::io_context> ioc, tcp::socket socket)
        : ioc_(std::move(ioc)), socket_(std::move(socket)) {
        error_code ec;
        socket_.set_option(tcp::no_delay(true), ec);
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
        std::vector<asio::const_buffer> buffers;
        buffers.reserve(pieces.size());
        for (const auto& p : pieces) {
            buffers.emplace_back(p.data(), p.size());
        }
        bool done = false;
        error_code result;
        asio::async_write(socket_, buffers, [&](const error_code& ec, size_t) {
            done = true;
            result = ec;
        });
        run_with_timeout(*ioc_, &done, timeout, [this] { cancel(); });
        if (result) {
            return from_error(result, "write to " + peer_);
        }
        return Status::ok();
    }

    Result<size_t> read_some(std::span<uint8_t> buf, Timeout timeout) override {
        if (!socket_.is_open()) {
            return unavailable("read: connection closed");
        }
        bool done = false;
        error_code result;
        size_t got = 0;
        socket_.async_read_some(asio::buffer(buf.data(), buf.size()),
                                [&](const error_code& ec, size_t n) {
                                    done = true;
                                    result = ec;
                                    got = n;
                                });
        run_with_timeout(*ioc_, &done, timeout, [this] { cancel(); });
        if (result == asio::error::eof) {
            return size_t{0};
        }
        if (result) {
            return from_error(result, "read from " + peer_);
        }
        return got;
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
    void cancel() {
        error_code ec;
        socket_.cancel(ec);
    }

    std::unique_ptr<asio::io_context> ioc_;  // before socket_: destroyed after it
    tcp::socket socket_;
    std::string peer_ = "?";
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

// UCX transport (issue 18): the only translation unit of transfer/ that includes UCX.
// Built when CMake finds Debian's libucx-dev (DSI_HAVE_UCX); docs/transfer.md
// "Transport" says why it is shaped this way.
//
// - One ucp context per transport (shared: listeners and connections hold it, so they
//   may outlive the transport); one ucp worker per connection and per listener. A
//   connection is one thread's at a time (transport.h), and a worker progressed only
//   by its connection's caller needs no lock; the handoff service runs connections on
//   several threads at once, which one shared worker would serialise behind a mutex.
// - No thread is spawned here: every call progresses its worker on the caller's thread
//   until done or its deadline, sleeping in poll() on the worker's event fd between
//   events (UCP_FEATURE_WAKEUP), not spinning.
// - Bytes move on the stream API (ucp_stream_send_nbx with an iov of the pieces;
//   ucp_stream_recv_data_nb, which never leaves a receive posted, so a read that times
//   out has nothing to cancel). UCX streams cannot half-close, and a peer's disconnect
//   arrives on the connection manager's socket, not in order with the data; so each
//   write is a segment [u64 little-endian length][bytes] and shutdown_write sends a
//   segment of length 0 (end of stream, in order after the data). A peer that fails
//   without one (killed, reset) is an error (kUnavailable), not end of stream.
// - Defaults when the user has not set them: UCX_TLS=tcp (no RDMA or shared-memory
//   transport is assumed: containers, network namespaces), UCX_LOG_LEVEL=error.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "transfer/transport.h"

namespace dsi::transfer {

namespace {

using Clock = std::chrono::steady_clock;

Status from_ucs(ucs_status_t status, const std::string& what) {
    const std::string msg = what + ": " + ucs_status_string(status);
    switch (status) {
        case UCS_ERR_CONNECTION_RESET:
        case UCS_ERR_UNREACHABLE:
        case UCS_ERR_REJECTED:
        case UCS_ERR_ENDPOINT_TIMEOUT:
        case UCS_ERR_NOT_CONNECTED:
        case UCS_ERR_CANCELED:
        case UCS_ERR_IO_ERROR:
        case UCS_ERR_TIMED_OUT:
            return unavailable(msg);
        case UCS_ERR_INVALID_ADDR:
            return invalid_argument(msg);
        case UCS_ERR_BUSY:
            return unavailable(msg);
        default:
            return internal_error(msg);
    }
}

std::string address_string(const sockaddr_storage& ss) {
    char host[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    if (ss.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    return std::string(host) + ":" + std::to_string(port);
}

// `host` (a name for connect; a numeric address for listen, as the TCP transport) and
// `port` as a socket address.
Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, bool numeric) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = numeric ? AI_NUMERICHOST : 0;
    addrinfo* found = nullptr;
    const std::string name = host == "localhost" ? "127.0.0.1" : host;
    const int rc = getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0 || found == nullptr) {
        return numeric ? invalid_argument("address '" + host + "': " + gai_strerror(rc))
                       : unavailable("resolve " + host + ": " + gai_strerror(rc));
    }
    sockaddr_storage ss{};
    std::memcpy(&ss, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    return ss;
}

// The ucp context: one per transport, shared by its listeners and connections (they
// may outlive the transport object, so shared_ptr).
class UcxContext {
public:
    static Result<std::shared_ptr<UcxContext>> create() {
        set_global_defaults();
        ucp_config_t* config = nullptr;
        ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
        if (st != UCS_OK) {
            return from_ucs(st, "ucp_config_read");
        }
        if (std::getenv("UCX_TLS") == nullptr) {
            // TCP only: works in a container and across network namespaces; a user with
            // RDMA or shared memory sets UCX_TLS themselves.
            (void)ucp_config_modify(config, "TLS", "tcp");
        }
        if (std::getenv("UCX_CM_REUSEADDR") == nullptr) {
            // As the TCP transport's listener: a restarted engine binds its port again
            // while the old connections are in TIME_WAIT.
            (void)ucp_config_modify(config, "CM_REUSEADDR", "y");
        }
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
        params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
        params.mt_workers_shared = 1;  // workers of one context live on different threads
        auto ctx = std::make_shared<UcxContext>();
        st = ucp_init(&params, config, &ctx->context_);
        ucp_config_release(config);
        if (st != UCS_OK) {
            ctx->context_ = nullptr;
            return from_ucs(st, "ucp_init");
        }
        return ctx;
    }
    UcxContext() = default;
    UcxContext(const UcxContext&) = delete;
    UcxContext& operator=(const UcxContext&) = delete;
    ~UcxContext() {
        if (context_ != nullptr) {
            ucp_cleanup(context_);
        }
    }
    ucp_context_h get() const { return context_; }

private:
    // UCX's log level is a process-wide option read when the library loads; lowered
    // once, unless the user set it. Warnings about transports that a host lacks would
    // otherwise reach stderr on every context.
    static void set_global_defaults() {
        static std::once_flag once;
        std::call_once(once, [] {
            if (std::getenv("UCX_LOG_LEVEL") == nullptr) {
                (void)ucs_global_opts_set_value("LOG_LEVEL", "error");
            }
        });
    }

    ucp_context_h context_ = nullptr;
};

// A ucp worker and its event fd; progressed on the calling thread only.
class Worker {
public:
    static Result<std::unique_ptr<Worker>> create(std::shared_ptr<UcxContext> context) {
        ucp_worker_params_t params{};
        params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        // One thread at a time, not always the one that made it (accept hands the
        // connection to another thread).
        params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        auto w = std::unique_ptr<Worker>(new Worker(std::move(context)));
        ucs_status_t st = ucp_worker_create(w->context_->get(), &params, &w->worker_);
        if (st != UCS_OK) {
            w->worker_ = nullptr;
            return from_ucs(st, "ucp_worker_create");
        }
        st = ucp_worker_get_efd(w->worker_, &w->efd_);
        if (st != UCS_OK) {
            return from_ucs(st, "ucp_worker_get_efd");
        }
        return w;
    }
    ~Worker() {
        if (worker_ != nullptr) {
            ucp_worker_destroy(worker_);
        }
    }
    ucp_worker_h get() const { return worker_; }

    void progress() {
        while (ucp_worker_progress(worker_) != 0) {
        }
    }

    // Progresses until `done()` or `deadline`; false at the deadline. Sleeps on the
    // event fd when there is nothing to do (at most 50 ms at a time: a missed wake-up
    // costs a little latency, never a hang).
    template <typename Done>
    bool progress_until(Done&& done, Clock::time_point deadline) {
        for (;;) {
            progress();
            if (done()) {
                return true;
            }
            const auto now = Clock::now();
            if (now >= deadline) {
                return false;
            }
            const ucs_status_t st = ucp_worker_arm(worker_);
            if (st == UCS_ERR_BUSY) {
                continue;  // events arrived meanwhile: progress again
            }
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
            pollfd p{efd_, POLLIN, 0};
            (void)::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
        }
    }

private:
    explicit Worker(std::shared_ptr<UcxContext> context) : context_(std::move(context)) {}

    std::shared_ptr<UcxContext> context_;  // outlives the worker
    ucp_worker_h worker_ = nullptr;
    int efd_ = -1;
};

Clock::time_point deadline_after(Timeout timeout) {
    return Clock::now() + std::max(timeout, Timeout(1));
}

constexpr size_t kSegmentHeaderBytes = 8;
// Control segments: headers with these lengths carry no data.
constexpr uint64_t kEndOfStreamSegment = 0;                // shutdown_write
constexpr uint64_t kEndOfStreamAckSegment = ~uint64_t{1};  // the reader saw it (close)
constexpr uint64_t kConnectedSegment = ~uint64_t{0};       // client_handshake
constexpr uint64_t kAcceptedSegment = ~uint64_t{2};        // server_handshake
// The least time accept gives a client that has come to finish the handshake.
constexpr Timeout kHandshakeTimeout{2000};
// How long close() waits for the peer's ack of its end of stream before it drops the
// endpoint (and a forced close for its requests to finish).
constexpr Timeout kCloseTimeout{1000};

class UcxConnection : public Connection {
public:
    UcxConnection(std::unique_ptr<Worker> worker, std::string peer)
        : worker_(std::move(worker)), peer_(std::move(peer)) {}
    ~UcxConnection() override { close(); }

    // Creates the endpoint from `params` (a client address or a connection request),
    // with this connection as its error handler.
    Status start(ucp_ep_params_t params) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler.cb = &UcxConnection::on_error;
        params.err_handler.arg = this;
        const ucs_status_t st = ucp_ep_create(worker_->get(), &params, &ep_);
        if (st != UCS_OK) {
            ep_ = nullptr;
            return from_ucs(st, "connect to " + peer_);
        }
        return Status::ok();
    }

    // Connection set-up needs both workers progressed, and a side that returned from
    // connect or accept may not call in for a while (TCP's kernel finishes a handshake
    // alone). So connect and accept return only once each has heard from the other: the
    // client waits for a flush (the server accepted and the lanes are wired up; or the
    // refusal arrives), sends "connected" and waits for "accepted"; the server waits
    // for "connected", sends "accepted" and flushes.
    Status client_handshake(Timeout timeout) {
        const auto deadline = deadline_after(timeout);
        const std::string what = "connect to " + peer_;
        ucp_request_param_t param{};
        DSI_RETURN_IF_ERROR(wait(ucp_ep_flush_nbx(ep_, &param), deadline, what));
        send_control(kConnectedSegment);
        return wait_for_control(&accepted_, deadline, what);
    }
    Status server_handshake(Timeout timeout) {
        const auto deadline = deadline_after(timeout);
        const std::string what = "accept from " + peer_;
        DSI_RETURN_IF_ERROR(wait_for_control(&connected_, deadline, what));
        send_control(kAcceptedSegment);
        return flush(deadline, what);
    }

    Status write(std::span<const std::span<const uint8_t>> pieces, Timeout timeout) override {
        if (ep_ == nullptr) {
            return unavailable("write: connection closed");
        }
        if (failed_) {
            return from_ucs(fail_status_, "write to " + peer_);
        }
        if (write_shut_) {
            return unavailable("write to " + peer_ + " after shutdown_write");
        }
        uint64_t total = 0;
        std::vector<ucp_dt_iov_t> iov;
        iov.reserve(pieces.size() + 1);
        iov.push_back({out_header_, kSegmentHeaderBytes});
        for (const auto& p : pieces) {
            if (!p.empty()) {
                iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
                total += p.size();
            }
        }
        if (total == 0) {
            return Status::ok();  // a segment of length 0 would read as end of stream
        }
        encode_length(total, out_header_);
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
        param.datatype = ucp_dt_make_iov();
        void* req = ucp_stream_send_nbx(ep_, iov.data(), iov.size(), &param);
        // `iov` and the pieces stay alive until the request is done (or dropped with the
        // endpoint on a timeout).
        const auto deadline = deadline_after(timeout);
        DSI_RETURN_IF_ERROR(wait(req, deadline, "write to " + peer_));
        return flush(deadline, "write to " + peer_);
    }

    Result<size_t> read_some(std::span<uint8_t> buf, Timeout timeout) override {
        DSI_CHECK(!buf.empty(), "read_some into an empty buffer (0 would read as end of stream)");
        const auto deadline = deadline_after(timeout);
        for (;;) {
            size_t n = 0;
            while (n < buf.size() && next_data()) {
                const size_t k = std::min<uint64_t>({buf.size() - n, chunk_left_, segment_left_});
                std::memcpy(buf.data() + n, chunk_, k);
                consume(k);
                segment_left_ -= k;
                n += k;
            }
            if (n > 0) {
                return n;
            }
            if (end_of_stream_) {
                return size_t{0};
            }
            if (failed_) {
                return from_ucs(fail_status_, "read from " + peer_);
            }
            if (ep_ == nullptr) {
                return unavailable("read: connection closed");
            }
            const bool ready = worker_->progress_until(
                [this] { return next_data() || end_of_stream_ || failed_; }, deadline);
            if (!ready) {
                return deadline_exceeded("read from " + peer_ + ": timed out");
            }
        }
    }

    size_t available() override {
        if (ep_ == nullptr) {
            return 0;
        }
        worker_->progress();
        return next_data() ? std::min<uint64_t>(chunk_left_, segment_left_) : 0;
    }

    void shutdown_write() override {
        if (ep_ == nullptr || failed_ || write_shut_) {
            return;
        }
        write_shut_ = true;
        send_control(kEndOfStreamSegment);
    }

    // Ends the stream (shutdown_write), drops unread input, and waits (at most
    // kCloseTimeout) for the peer's ack of the end of stream before dropping the
    // endpoint: a disconnect travels on the connection manager's socket and may overtake
    // data still in flight, which UCX then discards; after the ack nothing is in flight.
    // The peer acks while it reads, writes or closes.
    void close() override {
        if (ep_ == nullptr) {
            return;
        }
        if (!failed_) {
            shutdown_write();
            discarding_ = true;
            (void)worker_->progress_until(
                [this] {
                    (void)next_data();
                    return end_of_stream_acked_ || failed_;
                },
                deadline_after(kCloseTimeout));
        }
        force_close();
        // The worker goes too: UCX keeps a force-closed endpoint's sockets while their
        // worker lives, and the peer would learn of the close only at its next timeout.
        worker_.reset();
    }

    std::string peer_address() const override { return peer_; }

private:
    static void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
        auto* self = static_cast<UcxConnection*>(arg);
        if (!self->failed_) {
            self->failed_ = true;
            self->fail_status_ = status;
        }
    }

    static void encode_length(uint64_t n, uint8_t* out) {
        for (size_t i = 0; i < kSegmentHeaderBytes; ++i) {
            out[i] = static_cast<uint8_t>(n >> (8 * i));
        }
    }

    // Waits for a request (null: done at once) until `deadline`; past it the endpoint is
    // dropped (its requests complete as cancelled) and the connection is unusable.
    Status wait(void* req, Clock::time_point deadline, const std::string& what) {
        if (req == nullptr) {
            return Status::ok();
        }
        if (UCS_PTR_IS_ERR(req)) {
            return from_ucs(UCS_PTR_STATUS(req), what);
        }
        const bool done = worker_->progress_until(
            [req] { return ucp_request_check_status(req) != UCS_INPROGRESS; }, deadline);
        if (!done) {
            force_close();
            worker_->progress_until(
                [req] { return ucp_request_check_status(req) != UCS_INPROGRESS; },
                deadline_after(kCloseTimeout));
            ucp_request_free(req);
            return deadline_exceeded(what + ": timed out");
        }
        const ucs_status_t st = ucp_request_check_status(req);
        ucp_request_free(req);
        if (st != UCS_OK) {
            if (!failed_) {
                failed_ = true;
                fail_status_ = st;
            }
            return from_ucs(st, what);
        }
        return Status::ok();
    }

    // Progresses until `*flag` (set by a control segment) or the deadline.
    Status wait_for_control(const bool* flag, Clock::time_point deadline, const std::string& what) {
        const bool done = worker_->progress_until(
            [this, flag] {
                (void)next_data();
                return *flag || failed_ || end_of_stream_;
            },
            deadline);
        if (*flag) {
            return Status::ok();
        }
        force_close();
        return done ? unavailable(what + ": the peer closed during the handshake")
                    : deadline_exceeded(what + ": timed out");
    }

    // A completed send may still sit in UCX's buffers (the TCP transport copies small
    // messages into its own): until they are on the wire, the peer depends on this side
    // progressing. Flushed before write returns, as a socket write is in the kernel.
    Status flush(Clock::time_point deadline, const std::string& what) {
        ucp_request_param_t param{};
        return wait(ucp_ep_flush_nbx(ep_, &param), deadline, what);
    }

    void force_close() {
        if (ep_ == nullptr) {
            return;
        }
        release_chunk();
        if (!failed_) {
            failed_ = true;
            fail_status_ = UCS_ERR_CANCELED;
        }
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* req = ucp_ep_close_nbx(ep_, &param);
        if (UCS_PTR_IS_PTR(req)) {
            worker_->progress_until(
                [req] { return ucp_request_check_status(req) != UCS_INPROGRESS; },
                deadline_after(kCloseTimeout));
            ucp_request_free(req);
        }
        ep_ = nullptr;
    }

    // True when data of a segment is at chunk_ (chunk_left_ > 0, segment_left_ > 0);
    // takes received chunks and segment headers as needed, never waiting. Control
    // segments (connected, end of stream, its ack) are taken as they come, also after
    // the end of stream; the first end of stream is acked.
    bool next_data() {
        for (;;) {
            if (chunk_left_ == 0 && !take_chunk()) {
                return false;
            }
            if (segment_left_ > 0) {
                if (!end_of_stream_ && !discarding_) {
                    return true;
                }
                const size_t k = std::min<uint64_t>(chunk_left_, segment_left_);
                consume(k);  // no data follows an end of stream; close() drops unread data
                segment_left_ -= k;
                continue;
            }
            // A (possibly split) segment header.
            const size_t k = std::min(kSegmentHeaderBytes - in_header_bytes_, chunk_left_);
            std::memcpy(in_header_ + in_header_bytes_, chunk_, k);
            in_header_bytes_ += k;
            consume(k);
            if (in_header_bytes_ < kSegmentHeaderBytes) {
                continue;
            }
            in_header_bytes_ = 0;
            uint64_t n = 0;
            for (size_t i = 0; i < kSegmentHeaderBytes; ++i) {
                n |= uint64_t{in_header_[i]} << (8 * i);
            }
            if (n == kConnectedSegment) {
                connected_ = true;
            } else if (n == kAcceptedSegment) {
                accepted_ = true;
            } else if (n == kEndOfStreamAckSegment) {
                end_of_stream_acked_ = true;
            } else if (n == kEndOfStreamSegment) {
                if (!end_of_stream_) {
                    end_of_stream_ = true;
                    send_control(kEndOfStreamAckSegment);
                }
            } else {
                segment_left_ = n;
            }
        }
    }

    // Sends a control segment without waiting (it goes out as the worker is
    // progressed by later calls).
    void send_control(uint64_t value) {
        if (ep_ == nullptr || failed_) {
            return;
        }
        static const std::array<uint8_t, kSegmentHeaderBytes> kAck =
            encoded(kEndOfStreamAckSegment);
        static const std::array<uint8_t, kSegmentHeaderBytes> kEnd = encoded(kEndOfStreamSegment);
        static const std::array<uint8_t, kSegmentHeaderBytes> kConn = encoded(kConnectedSegment);
        static const std::array<uint8_t, kSegmentHeaderBytes> kAcc = encoded(kAcceptedSegment);
        const uint8_t* bytes = value == kEndOfStreamAckSegment ? kAck.data()
                               : value == kEndOfStreamSegment  ? kEnd.data()
                               : value == kConnectedSegment    ? kConn.data()
                                                               : kAcc.data();
        ucp_request_param_t param{};
        void* req = ucp_stream_send_nbx(ep_, bytes, kSegmentHeaderBytes, &param);
        if (UCS_PTR_IS_PTR(req)) {
            ucp_request_free(req);  // released when done; its bytes are static
        }
    }

    static std::array<uint8_t, kSegmentHeaderBytes> encoded(uint64_t n) {
        std::array<uint8_t, kSegmentHeaderBytes> out{};
        encode_length(n, out.data());
        return out;
    }

    bool take_chunk() {
        if (ep_ == nullptr) {
            return false;
        }
        size_t length = 0;
        void* data = ucp_stream_recv_data_nb(ep_, &length);
        if (data == nullptr || UCS_PTR_IS_ERR(data)) {
            return false;  // nothing now (an error arrives through on_error)
        }
        chunk_base_ = data;
        chunk_ = static_cast<const uint8_t*>(data);
        chunk_left_ = length;
        if (length == 0) {
            release_chunk();
            return false;
        }
        return true;
    }

    void consume(size_t n) {
        chunk_ += n;
        chunk_left_ -= n;
        if (chunk_left_ == 0) {
            release_chunk();
        }
    }

    void release_chunk() {
        if (chunk_base_ != nullptr) {
            ucp_stream_data_release(ep_, chunk_base_);
            chunk_base_ = nullptr;
        }
        chunk_ = nullptr;
        chunk_left_ = 0;
    }

    std::unique_ptr<Worker> worker_;  // outlives ep_; null once closed
    ucp_ep_h ep_ = nullptr;
    std::string peer_;
    bool failed_ = false;  // the peer failed or reset (on_error), or a call timed out
    ucs_status_t fail_status_ = UCS_OK;
    bool write_shut_ = false;
    uint8_t out_header_[kSegmentHeaderBytes] = {};
    // Receiving: the chunk UCX handed out (released when consumed), the segment's
    // bytes still to come, a header split across chunks.
    void* chunk_base_ = nullptr;
    const uint8_t* chunk_ = nullptr;
    size_t chunk_left_ = 0;
    uint64_t segment_left_ = 0;
    uint8_t in_header_[kSegmentHeaderBytes] = {};
    size_t in_header_bytes_ = 0;
    bool end_of_stream_ = false;
    bool connected_ = false;  // the server saw the client's "connected" segment
    bool accepted_ = false;   // the client saw the server's "accepted" segment
    bool end_of_stream_acked_ = false;
    bool discarding_ = false;  // closing: unread data is dropped
};

class UcxListener : public Listener {
public:
    UcxListener(std::shared_ptr<UcxContext> context, std::unique_ptr<Worker> worker)
        : context_(std::move(context)), worker_(std::move(worker)) {}
    ~UcxListener() override { close(); }

    Status open(const sockaddr_storage& address, const std::string& name) {
        ucp_listener_params_t params{};
        params.field_mask =
            UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
        params.sockaddr.addrlen =
            address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
        params.conn_handler.cb = &UcxListener::on_connection;
        params.conn_handler.arg = this;
        ucs_status_t st = ucp_listener_create(worker_->get(), &params, &listener_);
        if (st != UCS_OK) {
            listener_ = nullptr;
            return from_ucs(st, "listen on " + name);
        }
        ucp_listener_attr_t attr{};
        attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        st = ucp_listener_query(listener_, &attr);
        if (st != UCS_OK) {
            return from_ucs(st, "listen on " + name);
        }
        port_ = attr.sockaddr.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port)
                    : ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
        return Status::ok();
    }

    Result<std::unique_ptr<Connection>> accept(Timeout timeout) override {
        if (listener_ == nullptr) {
            return unavailable("accept: listener closed");
        }
        if (!worker_->progress_until([this] { return !pending_.empty(); },
                                     deadline_after(timeout))) {
            return deadline_exceeded("accept: timed out");
        }
        ucp_conn_request_h request = pending_.front();
        pending_.pop_front();
        ucp_conn_request_attr_t attr{};
        attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        std::string peer = "?";
        if (ucp_conn_request_query(request, &attr) == UCS_OK) {
            peer = address_string(attr.client_address);
        }
        // The connection gets a worker of its own (the thread that uses it progresses
        // it); the request may be accepted on any worker of the context.
        auto worker = Worker::create(context_);
        if (!worker.is_ok()) {
            ucp_listener_reject(listener_, request);
            return worker.status();
        }
        auto conn = std::make_unique<UcxConnection>(std::move(worker).value(), peer);
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
        params.conn_request = request;
        DSI_RETURN_IF_ERROR(conn->start(params));
        // `timeout` bounds the wait for a client; a client that has come gets at least
        // kHandshakeTimeout to finish (a poll-style accept loop uses short timeouts). A
        // failed handshake is kUnavailable, not "nobody came" (kDeadlineExceeded).
        const Status handshake = conn->server_handshake(std::max(timeout, kHandshakeTimeout));
        if (!handshake.is_ok()) {
            return unavailable(handshake.message());
        }
        return std::unique_ptr<Connection>(std::move(conn));
    }

    uint16_t port() const override { return port_; }

    void close() override {
        if (listener_ == nullptr) {
            return;
        }
        for (ucp_conn_request_h r : pending_) {
            ucp_listener_reject(listener_, r);
        }
        pending_.clear();
        ucp_listener_destroy(listener_);
        listener_ = nullptr;
        worker_->progress();
    }

private:
    static void on_connection(ucp_conn_request_h request, void* arg) {
        static_cast<UcxListener*>(arg)->pending_.push_back(request);
    }

    std::shared_ptr<UcxContext> context_;
    std::unique_ptr<Worker> worker_;
    ucp_listener_h listener_ = nullptr;
    std::deque<ucp_conn_request_h> pending_;  // requests not yet accepted
    uint16_t port_ = 0;
};

class UcxTransport : public Transport {
public:
    explicit UcxTransport(std::shared_ptr<UcxContext> context) : context_(std::move(context)) {}

    Result<std::unique_ptr<Listener>> listen(const std::string& host, uint16_t port) override {
        DSI_ASSIGN_OR_RETURN(const auto address, resolve(host, port, /*numeric=*/true));
        DSI_ASSIGN_OR_RETURN(auto worker, Worker::create(context_));
        auto l = std::make_unique<UcxListener>(context_, std::move(worker));
        DSI_RETURN_IF_ERROR(l->open(address, host + ":" + std::to_string(port)));
        return std::unique_ptr<Listener>(std::move(l));
    }

    Result<std::unique_ptr<Connection>> connect(const std::string& host, uint16_t port,
                                                Timeout timeout) override {
        DSI_ASSIGN_OR_RETURN(const auto address, resolve(host, port, /*numeric=*/false));
        DSI_ASSIGN_OR_RETURN(auto worker, Worker::create(context_));
        auto conn = std::make_unique<UcxConnection>(std::move(worker), address_string(address));
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
        params.sockaddr.addrlen =
            address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
        DSI_RETURN_IF_ERROR(conn->start(params));
        DSI_RETURN_IF_ERROR(conn->client_handshake(timeout));
        return std::unique_ptr<Connection>(std::move(conn));
    }

private:
    std::shared_ptr<UcxContext> context_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport() {
    DSI_ASSIGN_OR_RETURN(auto context, UcxContext::create());
    return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(std::move(context)));
}

}  // namespace dsi::transfer

#include "serving/swa_fetch.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/logging.h"
#include "kv/tiered_cache.h"
#include "serving/internal/wire.h"
#include "serving/kv_handoff.h"
#include "transfer/frame.h"

namespace dsi::serving {
namespace {

// The answer's frame: the state chunk's prefix, the state header and the state.
constexpr uint64_t kMaxAnswerPrefixBytes = 1024;

transfer::FrameFields fields(transfer::MessageType type, uint64_t incarnation) {
    transfer::FrameFields f;
    f.type = type;
    f.incarnation = incarnation;
    return f;
}

std::vector<uint8_t> with_prefix(std::string_view name, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> p = transfer::encode_state_chunk_prefix(name, 0);
    p.insert(p.end(), data.begin(), data.end());
    return p;
}

}  // namespace

Result<kv::SwaState> fetch_swa_state(transfer::Transport& transport, const SwaPullTarget& target,
                                     const SwaFetchOptions& options) {
    if (options.state_bytes <= kv::kSwaSealBytes) {
        return invalid_argument("SWA fetch: no state size for this model");
    }
    DSI_ASSIGN_OR_RETURN(auto hp, internal::split_address(target.address));
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<transfer::Connection> conn,
                         transport.connect(hp.first, hp.second, options.timeout));
    const transfer::EncodedFrame frame =
        transfer::encode_frame(fields(transfer::MessageType::kState, options.incarnation),
                               encode_swa_fetch_request(target.key));
    DSI_RETURN_IF_ERROR(transfer::write_frame(*conn, frame, options.timeout));
    const uint64_t max_payload =
        kMaxAnswerPrefixBytes + internal::kSwaStateHeaderBytes + options.state_bytes;
    transfer::FrameReader reader(conn.get(), max_payload);
    DSI_ASSIGN_OR_RETURN(transfer::FrameView got, reader.read(options.timeout));
    DSI_ASSIGN_OR_RETURN(
        kv::SwaState st,
        decode_swa_fetch_answer(got, target.key, options.state_bytes, target.address));
    if (!kv::swa_sealed_ok(st, options.state_bytes - kv::kSwaSealBytes)) {
        return data_loss("SWA fetch: the state fails its seal");
    }
    conn->close();
    return st;
}

Result<std::unique_ptr<SwaFetchServer>> SwaFetchServer::start(
    SwaFetchServerOptions options, std::unique_ptr<transfer::Transport> transport) {
    DSI_CHECK(options.pool != nullptr, "SwaFetchServer needs a pool");
    if (options.max_connections < 1 || options.max_waiting < 0) {
        return invalid_argument("SWA fetch server: max_connections must be >= 1, max_waiting >= 0");
    }
    std::unique_ptr<SwaFetchServer> s(new SwaFetchServer());
    s->options_ = std::move(options);
    s->transport_ = transport ? std::move(transport) : transfer::make_tcp_transport();
    DSI_ASSIGN_OR_RETURN(s->listener_, s->transport_->listen(s->options_.host, s->options_.port));
    s->port_ = s->listener_->port();
    for (int i = 0; i < s->options_.max_connections; ++i) {
        s->workers_.emplace_back([p = s.get()] { p->worker_loop(); });
    }
    s->accept_thread_ = std::thread([p = s.get()] { p->accept_loop(); });
    return s;
}

SwaFetchServer::~SwaFetchServer() {
    stopping_.store(true);
    // No new connection first, then the workers: they close what still waits.
    if (accept_thread_.joinable()) accept_thread_.join();
    {
        MutexLock l(&mu_);
        work_cv_.notify_all();
    }
    for (std::thread& t : workers_) t.join();
    if (listener_) listener_->close();
}

SwaFetchServerStats SwaFetchServer::stats() const {
    MutexLock l(&mu_);
    return stats_;
}

void SwaFetchServer::count(const Status& s) {
    if (s.is_ok()) {
        ++stats_.num_served;
    } else if (s.code() == StatusCode::kNotFound) {
        ++stats_.num_not_found;
    } else {
        ++stats_.num_failed;
        DSI_LOG(kInfo) << "SWA fetch failed: " << s.to_string();
    }
}

void SwaFetchServer::accept_loop() {
    while (!stopping_.load()) {
        Result<std::unique_ptr<transfer::Connection>> conn =
            listener_->accept(transfer::Timeout(100));
        if (!conn.is_ok()) continue;  // the timeout (or a failed accept): look again
        {
            MutexLock l(&mu_);
            // In flight (answered or waiting) at most max_connections + max_waiting.
            if (stats_.num_active + static_cast<int64_t>(waiting_.size()) <
                options_.max_connections + options_.max_waiting) {
                waiting_.push_back(std::move(conn).value());
                stats_.num_waiting = static_cast<int64_t>(waiting_.size());
                work_cv_.notify_one();
                continue;
            }
            ++stats_.num_refused;
        }
        refuse(**conn);
    }
}

void SwaFetchServer::refuse(transfer::Connection& conn) {
    // Short bounds: this runs on the accept thread.
    const transfer::Timeout t(100);
    const transfer::FailureMessage f{StatusCode::kResourceExhausted,
                                     "SWA fetch: every worker is busy and " +
                                         std::to_string(options_.max_waiting) +
                                         " connections wait; try again or replay"};
    if (transfer::write_frame(
            conn,
            transfer::encode_frame(fields(transfer::MessageType::kFailure, options_.incarnation),
                                   transfer::encode_payload(f)),
            t)
            .is_ok()) {
        // Take the puller's request before closing: closing with it unread would reset
        // the connection, and the puller could lose the answer. A puller ends once it
        // read the answer; a silent one costs at most a few of these short reads.
        conn.shutdown_write();
        uint8_t buf[kMaxSwaFetchRequestBytes + transfer::kFrameHeaderBytes];
        for (int i = 0; i < 4; ++i) {
            Result<size_t> n = conn.read_some(buf, t);
            if (!n.is_ok() || *n == 0) break;
        }
    }
    conn.close();
}

void SwaFetchServer::worker_loop() {
    for (;;) {
        std::unique_ptr<transfer::Connection> conn;
        {
            MutexLock l(&mu_);
            while (waiting_.empty() && !stopping_.load()) {
                work_cv_.wait_for(&mu_, std::chrono::milliseconds(100));
            }
            if (stopping_.load()) {
                // Shutdown: what still waits is closed unanswered (the puller replays).
                for (auto& c : waiting_) {
                    c->close();
                    ++stats_.num_failed;
                }
                waiting_.clear();
                stats_.num_waiting = 0;
                return;
            }
            conn = std::move(waiting_.front());
            waiting_.pop_front();
            stats_.num_waiting = static_cast<int64_t>(waiting_.size());
            ++stats_.num_active;
        }
        const Status s = serve_one(*conn);
        conn->close();
        MutexLock l(&mu_);
        --stats_.num_active;
        count(s);
    }
}

Status SwaFetchServer::serve_one(transfer::Connection& conn) {
    const transfer::Timeout t = options_.io_timeout;
    transfer::FrameReader reader(&conn, kMaxSwaFetchRequestBytes);
    // The request, waited for in slices of at most 100 ms (up to io_timeout in all), so
    // shutdown does not wait out a silent puller. A timed-out read keeps what it read.
    const transfer::Timeout slice = std::min(t, transfer::Timeout(100));
    Result<transfer::FrameView> read = reader.read(slice);  // digest-checked
    for (transfer::Timeout waited = slice;
         !read.is_ok() && read.status().code() == StatusCode::kDeadlineExceeded && waited < t;
         waited += slice) {
        if (stopping_.load()) return cancelled("SWA fetch: the server is stopping");
        read = reader.read(slice);
    }
    DSI_ASSIGN_OR_RETURN(transfer::FrameView got, std::move(read));
    DSI_ASSIGN_OR_RETURN(const kv::SwaStateKey key, decode_swa_fetch_request(got));
    Result<std::shared_ptr<const kv::SwaState>> st = options_.pool->get(key);
    if (!st.is_ok()) {
        transfer::FailureMessage f{StatusCode::kNotFound,
                                   "no SWA state at position " + std::to_string(key.position)};
        (void)transfer::write_frame(
            conn,
            transfer::encode_frame(fields(transfer::MessageType::kFailure, options_.incarnation),
                                   transfer::encode_payload(f)),
            t);
        return not_found(f.message);
    }
    // The pinned entry's bytes go out as the frame's body (no copy).
    const transfer::EncodedFrame frame = transfer::encode_frame(
        fields(transfer::MessageType::kState, options_.incarnation),
        with_prefix(kSwaStateSection, internal::encode_state_header(**st)), (*st)->bytes);
    return transfer::write_frame(conn, frame, t);
}

}  // namespace dsi::serving

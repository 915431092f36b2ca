#include "serving/swa_fetch.h"

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

using internal::get_u32;
using internal::get_u64;
using internal::kSwaStateHeaderBytes;
using internal::put_u32;
using internal::put_u64;

constexpr uint32_t kFetchVersion = 1;
constexpr size_t kFetchRequestBytes = 32;
// A fetch request's frame: the state chunk's prefix and 32 bytes.
constexpr uint64_t kMaxRequestPayloadBytes = 1024;

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
    std::vector<uint8_t> req;
    put_u32(req, kFetchVersion);
    put_u32(req, 0);
    put_u64(req, target.key.chain.lo);
    put_u64(req, target.key.chain.hi);
    put_u64(req, static_cast<uint64_t>(target.key.position));
    const transfer::EncodedFrame frame =
        transfer::encode_frame(fields(transfer::MessageType::kState, options.incarnation),
                               with_prefix(kSwaFetchSection, req));
    DSI_RETURN_IF_ERROR(transfer::write_frame(*conn, frame, options.timeout));
    const uint64_t max_payload =
        kMaxRequestPayloadBytes + kSwaStateHeaderBytes + options.state_bytes;
    transfer::FrameReader reader(conn.get(), max_payload);
    DSI_ASSIGN_OR_RETURN(transfer::FrameView got, reader.read(options.timeout));
    if (got.header.type == transfer::MessageType::kFailure) {
        DSI_ASSIGN_OR_RETURN(transfer::FailureMessage f, transfer::decode_failure(got.payload));
        return Status(f.code, "SWA fetch from " + target.address + ": " + f.message);
    }
    if (got.header.type != transfer::MessageType::kState) {
        return invalid_argument("SWA fetch: a " +
                                std::string(transfer::message_type_name(got.header.type)) +
                                " frame instead of the state");
    }
    DSI_ASSIGN_OR_RETURN(transfer::StateChunkView chunk, transfer::decode_state_chunk(got.payload));
    if (chunk.name != kSwaStateSection || chunk.offset_bytes != 0 ||
        chunk.data.size() != kSwaStateHeaderBytes + options.state_bytes) {
        return invalid_argument("SWA fetch: an answer '" + chunk.name + "' of " +
                                std::to_string(chunk.data.size()) + " bytes, expected " +
                                std::to_string(kSwaStateHeaderBytes + options.state_bytes));
    }
    const uint8_t* p = chunk.data.data();
    kv::SwaState st;
    if (get_u32(p) != internal::kSwaStateVersion ||
        !internal::valid_traffic_class(get_u32(p + 4))) {
        return invalid_argument("SWA fetch: state version or traffic class");
    }
    st.traffic_class = static_cast<kvstore::TrafficClass>(get_u32(p + 4));
    st.key.chain = kv::BlockKey{get_u64(p + 8), get_u64(p + 16)};
    st.key.position = static_cast<int64_t>(get_u64(p + 24));
    if (!(st.key == target.key))
        return invalid_argument("SWA fetch: the answer names another state");
    st.bytes.assign(chunk.data.begin() + kSwaStateHeaderBytes, chunk.data.end());
    if (!kv::swa_sealed_ok(st, options.state_bytes - kv::kSwaSealBytes)) {
        return data_loss("SWA fetch: the state fails its seal");
    }
    conn->close();
    return st;
}

Result<std::unique_ptr<SwaFetchServer>> SwaFetchServer::start(
    SwaFetchServerOptions options, std::unique_ptr<transfer::Transport> transport) {
    DSI_CHECK(options.pool != nullptr, "SwaFetchServer needs a pool");
    std::unique_ptr<SwaFetchServer> s(new SwaFetchServer());
    s->options_ = std::move(options);
    s->transport_ = transport ? std::move(transport) : transfer::make_tcp_transport();
    DSI_ASSIGN_OR_RETURN(s->listener_, s->transport_->listen(s->options_.host, s->options_.port));
    s->port_ = s->listener_->port();
    s->thread_ = std::thread([p = s.get()] { p->loop(); });
    return s;
}

SwaFetchServer::~SwaFetchServer() {
    stopping_.store(true);
    if (thread_.joinable()) thread_.join();
    if (listener_) listener_->close();
}

SwaFetchServerStats SwaFetchServer::stats() const {
    MutexLock l(&mu_);
    return stats_;
}

void SwaFetchServer::loop() {
    while (!stopping_.load()) {
        Result<std::unique_ptr<transfer::Connection>> conn =
            listener_->accept(transfer::Timeout(100));
        if (!conn.is_ok()) continue;  // the timeout (or a failed accept): look again
        Status s = serve_one(**conn);
        (*conn)->close();
        MutexLock l(&mu_);
        if (s.is_ok()) {
            ++stats_.num_served;
        } else if (s.code() == StatusCode::kNotFound) {
            ++stats_.num_not_found;
        } else {
            ++stats_.num_failed;
            DSI_LOG(kInfo) << "SWA fetch failed: " << s.to_string();
        }
    }
}

Status SwaFetchServer::serve_one(transfer::Connection& conn) {
    const transfer::Timeout t = options_.io_timeout;
    transfer::FrameReader reader(&conn, kMaxRequestPayloadBytes);
    DSI_ASSIGN_OR_RETURN(transfer::FrameView got, reader.read(t));  // digest-checked
    if (got.header.type != transfer::MessageType::kState) {
        return invalid_argument("SWA fetch request: not a State frame");
    }
    DSI_ASSIGN_OR_RETURN(transfer::StateChunkView chunk, transfer::decode_state_chunk(got.payload));
    if (chunk.name != kSwaFetchSection || chunk.data.size() != kFetchRequestBytes ||
        get_u32(chunk.data.data()) != kFetchVersion) {
        return invalid_argument("SWA fetch request: malformed");
    }
    const uint8_t* p = chunk.data.data();
    const kv::SwaStateKey key{kv::BlockKey{get_u64(p + 8), get_u64(p + 16)},
                              static_cast<int64_t>(get_u64(p + 24))};
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

#include "transfer/frame.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
// Debian's libxxhash is built for baseline x86-64; its *_dispatch entry points pick the
// AVX2 / AVX-512 kernels at run time (3x faster on a server CPU; hashing was a fifth of
// a transfer's CPU time without them).
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

namespace dsi::transfer {

namespace {

// Little-endian field writer / reader (the wire format is little-endian on every host).
class Writer {
public:
    explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
    template <typename T>
    void put(T v) {
        static_assert(std::is_unsigned_v<T>);
        for (size_t i = 0; i < sizeof(T); ++i) {
            out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
        }
    }
    // u32 length + bytes.
    void put_string(std::string_view s) {
        put(static_cast<uint32_t>(s.size()));
        out_->insert(out_->end(), s.begin(), s.end());
    }

private:
    std::vector<uint8_t>* out_;
};

class Reader {
public:
    explicit Reader(std::span<const uint8_t> in) : in_(in) {}
    template <typename T>
    bool get(T* v) {
        static_assert(std::is_unsigned_v<T>);
        if (in_.size() - pos_ < sizeof(T)) {
            return false;
        }
        T r = 0;
        for (size_t i = 0; i < sizeof(T); ++i) {
            r |= static_cast<T>(static_cast<T>(in_[pos_ + i]) << (8 * i));
        }
        pos_ += sizeof(T);
        *v = r;
        return true;
    }
    bool get_string(std::string* s, size_t max_bytes = 4096) {
        uint32_t n = 0;
        if (!get(&n) || n > max_bytes || in_.size() - pos_ < n) {
            return false;
        }
        s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
        pos_ += n;
        return true;
    }
    std::span<const uint8_t> rest() const { return in_.subspan(pos_); }
    bool done() const { return pos_ == in_.size(); }

private:
    std::span<const uint8_t> in_;
    size_t pos_ = 0;
};

template <typename T>
T load_le(const uint8_t* p) {
    T r = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
        r |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
    }
    return r;
}

Status bad_payload(MessageType type) {
    return invalid_argument(std::string("malformed ") + std::string(message_type_name(type)) +
                            " payload");
}

// Decodes a fixed-layout payload: every field read and nothing left over.
template <typename F>
Status read_exact(std::span<const uint8_t> payload, MessageType type, F&& read_fields) {
    Reader r(payload);
    if (!read_fields(r) || !r.done()) {
        return bad_payload(type);
    }
    return Status::ok();
}

}  // namespace

std::string_view message_type_name(MessageType type) {
    switch (type) {
        case MessageType::kHello:
            return "Hello";
        case MessageType::kBegin:
            return "Begin";
        case MessageType::kLayerChunk:
            return "LayerChunk";
        case MessageType::kState:
            return "State";
        case MessageType::kEnd:
            return "End";
        case MessageType::kAck:
            return "Ack";
        case MessageType::kAbort:
            return "Abort";
        case MessageType::kFailure:
            return "Failure";
    }
    return "unknown";
}

std::string_view frame_error_name(FrameError e) {
    switch (e) {
        case FrameError::kBadMagic:
            return "bad magic";
        case FrameError::kUnknownVersion:
            return "unknown version";
        case FrameError::kUnknownType:
            return "unknown message type";
        case FrameError::kPayloadTooLong:
            return "payload over the limit";
        case FrameError::kDigestMismatch:
            return "digest mismatch";
        case FrameError::kTruncated:
            return "truncated frame";
    }
    return "unknown";
}

std::string TransferId::to_string() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    return buf;
}

uint64_t BeginMessage::total_bytes() const {
    uint64_t n = 0;
    for (uint64_t b : layer_bytes) {
        n += b;
    }
    for (const auto& s : state_sections) {
        n += s.bytes;
    }
    return n;
}

// ---- Payloads ----

std::vector<uint8_t> encode_payload(const HelloMessage& m) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put_string(m.peer_id);
    w.put(static_cast<uint8_t>(m.role));
    w.put(m.incarnation);
    return out;
}

Result<HelloMessage> decode_hello(std::span<const uint8_t> payload) {
    HelloMessage m;
    uint8_t role = 0;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kHello, [&](Reader& r) {
        return r.get_string(&m.peer_id) && r.get(&role) && r.get(&m.incarnation);
    }));
    if (role < 1 || role > 3) {
        return bad_payload(MessageType::kHello);
    }
    m.role = static_cast<PeerRole>(role);
    return m;
}

// The layer and section counts are bounded so a corrupt count cannot make the decoder
// allocate without limit (the frame's digest already passed, so this is a buggy peer).
constexpr uint32_t kMaxLayers = 4096;
constexpr uint32_t kMaxStateSections = 1024;

std::vector<uint8_t> encode_payload(const BeginMessage& m) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put_string(m.model_id);
    w.put(m.num_tokens);
    w.put(m.block_size_tokens);
    w.put(static_cast<uint32_t>(m.layer_bytes.size()));
    for (uint64_t b : m.layer_bytes) {
        w.put(b);
    }
    w.put(static_cast<uint32_t>(m.state_sections.size()));
    for (const auto& s : m.state_sections) {
        w.put_string(s.name);
        w.put(s.bytes);
    }
    return out;
}

Result<BeginMessage> decode_begin(std::span<const uint8_t> payload) {
    BeginMessage m;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kBegin, [&](Reader& r) {
        uint32_t num_layers = 0;
        if (!r.get_string(&m.model_id) || !r.get(&m.num_tokens) || !r.get(&m.block_size_tokens) ||
            !r.get(&num_layers) || num_layers > kMaxLayers) {
            return false;
        }
        m.layer_bytes.resize(num_layers);
        for (uint64_t& b : m.layer_bytes) {
            if (!r.get(&b)) {
                return false;
            }
        }
        uint32_t num_sections = 0;
        if (!r.get(&num_sections) || num_sections > kMaxStateSections) {
            return false;
        }
        m.state_sections.resize(num_sections);
        for (auto& s : m.state_sections) {
            if (!r.get_string(&s.name) || !r.get(&s.bytes)) {
                return false;
            }
        }
        return true;
    }));
    return m;
}

std::vector<uint8_t> encode_layer_chunk_prefix(uint32_t layer, uint64_t offset_bytes) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put(layer);
    w.put(offset_bytes);
    return out;
}

Result<LayerChunkView> decode_layer_chunk(std::span<const uint8_t> payload) {
    LayerChunkView v;
    Reader r(payload);
    if (!r.get(&v.layer) || !r.get(&v.offset_bytes)) {
        return bad_payload(MessageType::kLayerChunk);
    }
    v.data = r.rest();
    return v;
}

std::vector<uint8_t> encode_state_chunk_prefix(std::string_view name, uint64_t offset_bytes) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put_string(name);
    w.put(offset_bytes);
    return out;
}

Result<StateChunkView> decode_state_chunk(std::span<const uint8_t> payload) {
    StateChunkView v;
    Reader r(payload);
    if (!r.get_string(&v.name) || !r.get(&v.offset_bytes)) {
        return bad_payload(MessageType::kState);
    }
    v.data = r.rest();
    return v;
}

std::vector<uint8_t> encode_payload(const EndMessage& m) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put(m.total_bytes);
    w.put(m.total_digest);
    return out;
}

Result<EndMessage> decode_end(std::span<const uint8_t> payload) {
    EndMessage m;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kEnd, [&](Reader& r) {
        return r.get(&m.total_bytes) && r.get(&m.total_digest);
    }));
    return m;
}

std::vector<uint8_t> encode_payload(const AckMessage& m) {
    std::vector<uint8_t> out;
    Writer(&out).put(m.acked_sequence);
    return out;
}

Result<AckMessage> decode_ack(std::span<const uint8_t> payload) {
    AckMessage m;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kAck,
                                   [&](Reader& r) { return r.get(&m.acked_sequence); }));
    return m;
}

std::vector<uint8_t> encode_payload(const AbortMessage& m) {
    std::vector<uint8_t> out;
    Writer(&out).put_string(m.reason);
    return out;
}

Result<AbortMessage> decode_abort(std::span<const uint8_t> payload) {
    AbortMessage m;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kAbort,
                                   [&](Reader& r) { return r.get_string(&m.reason); }));
    return m;
}

std::vector<uint8_t> encode_payload(const FailureMessage& m) {
    std::vector<uint8_t> out;
    Writer w(&out);
    w.put(static_cast<uint16_t>(m.code));
    w.put_string(m.message);
    return out;
}

Result<FailureMessage> decode_failure(std::span<const uint8_t> payload) {
    FailureMessage m;
    uint16_t code = 0;
    DSI_RETURN_IF_ERROR(read_exact(payload, MessageType::kFailure, [&](Reader& r) {
        return r.get(&code) && r.get_string(&m.message);
    }));
    if (code == 0 || code > static_cast<uint16_t>(StatusCode::kDataLoss)) {
        return bad_payload(MessageType::kFailure);
    }
    m.code = static_cast<StatusCode>(code);
    return m;
}

// ---- Frames ----

std::vector<uint8_t> EncodedFrame::flatten() const {
    std::vector<uint8_t> out = head;
    out.insert(out.end(), body.begin(), body.end());
    return out;
}

uint64_t frame_digest(std::span<const uint8_t> header48, std::span<const uint8_t> prefix,
                      std::span<const uint8_t> body) {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    XXH3_64bits_update(&state, header48.data(), header48.size());
    XXH3_64bits_update(&state, prefix.data(), prefix.size());
    XXH3_64bits_update(&state, body.data(), body.size());
    return XXH3_64bits_digest(&state);
}

struct FrameDigester::State {
    XXH3_state_t xxh;
};

FrameDigester::FrameDigester() : state_(std::make_unique<State>()) {
    XXH3_INITSTATE(&state_->xxh);
    reset();
}

FrameDigester::~FrameDigester() = default;

void FrameDigester::reset() { XXH3_64bits_reset(&state_->xxh); }

void FrameDigester::update(std::span<const uint8_t> bytes) {
    XXH3_64bits_update(&state_->xxh, bytes.data(), bytes.size());
}

uint64_t FrameDigester::digest() const { return XXH3_64bits_digest(&state_->xxh); }

uint64_t chain_digest(uint64_t chain, uint64_t frame_digest) {
    uint8_t le[8];
    for (size_t i = 0; i < 8; ++i) {
        le[i] = static_cast<uint8_t>(frame_digest >> (8 * i));
    }
    return XXH3_64bits_withSeed(le, sizeof le, chain);
}

EncodedFrame encode_frame(const FrameFields& fields, std::vector<uint8_t> payload_prefix,
                          std::span<const uint8_t> body) {
    const auto type = static_cast<uint16_t>(fields.type);
    DSI_CHECK(type >= 1 && type <= kMaxMessageType, "unknown message type ", type);
    EncodedFrame f;
    f.head.reserve(kFrameHeaderBytes + payload_prefix.size());
    Writer w(&f.head);
    w.put(kFrameMagic);
    w.put(kFrameVersion);
    w.put(type);
    w.put(fields.transfer_id.hi);
    w.put(fields.transfer_id.lo);
    w.put(fields.incarnation);
    w.put(fields.sequence);
    w.put(static_cast<uint64_t>(payload_prefix.size() + body.size()));
    DSI_CHECK_EQ(f.head.size(), kDigestedHeaderBytes);
    f.digest = frame_digest(f.head, payload_prefix, body);
    w.put(f.digest);
    f.head.insert(f.head.end(), payload_prefix.begin(), payload_prefix.end());
    f.body = body;
    return f;
}

FrameDecoder::FrameDecoder(uint64_t max_payload_bytes) : max_payload_bytes_(max_payload_bytes) {}

Status FrameDecoder::fail(FrameError e, std::string message) {
    error_ = e;
    StatusCode code = StatusCode::kInvalidArgument;
    if (e == FrameError::kDigestMismatch || e == FrameError::kTruncated) {
        code = StatusCode::kDataLoss;
    } else if (e == FrameError::kPayloadTooLong) {
        code = StatusCode::kResourceExhausted;
    }
    error_status_ = Status(code, std::string(frame_error_name(e)) + ": " + message);
    return error_status_;
}

void FrameDecoder::reserve_tail(size_t want) {
    if (capacity_ - end_ >= want) {
        return;
    }
    const size_t live = end_ - begin_;
    if (capacity_ - live >= want && begin_ > 0) {
        std::memmove(buf_.get(), buf_.get() + begin_, live);
    } else {
        // Room for about four frames: the partial frame at the end of a read is moved to
        // the front once per few frames instead of after every frame.
        const size_t cap = std::max({4 * (live + want), 2 * capacity_, size_t{64} << 10});
        auto grown = std::make_unique_for_overwrite<uint8_t[]>(cap);
        if (live > 0) {
            std::memcpy(grown.get(), buf_.get() + begin_, live);
        }
        buf_ = std::move(grown);
        capacity_ = cap;
    }
    begin_ = 0;
    end_ = live;
}

void FrameDecoder::feed(std::span<const uint8_t> bytes) {
    if (bytes.empty()) {
        return;
    }
    reserve_tail(bytes.size());
    std::memcpy(buf_.get() + end_, bytes.data(), bytes.size());
    end_ += bytes.size();
}

std::span<uint8_t> FrameDecoder::writable(size_t min_bytes) {
    size_t want = std::max<size_t>(min_bytes, 1);
    // A frame whose header is buffered: room for all of it, so it arrives in one piece.
    const size_t live = end_ - begin_;
    if (!error_ && live >= kFrameHeaderBytes) {
        const uint64_t payload = load_le<uint64_t>(buf_.get() + begin_ + 40);
        if (payload <= max_payload_bytes_ && kFrameHeaderBytes + payload > live) {
            want = std::max<size_t>(want, kFrameHeaderBytes + payload - live);
        }
    }
    reserve_tail(want);
    return {buf_.get() + end_, capacity_ - end_};
}

void FrameDecoder::commit(size_t n) {
    DSI_CHECK_LE(end_ + n, capacity_);
    end_ += n;
}

Result<std::optional<PartialFrame>> FrameDecoder::peek() {
    if (error_) {
        return error_status_;
    }
    const size_t live = end_ - begin_;
    if (live == 0) {
        begin_ = end_ = 0;
        return std::optional<PartialFrame>();
    }
    const uint8_t* p = buf_.get() + begin_;
    // Each header field is checked as soon as its bytes are here (a peer speaking another
    // protocol is told so at once, not after it sends 56 bytes).
    const size_t magic_have = std::min<size_t>(live, 4);
    uint8_t magic[4];
    for (size_t i = 0; i < 4; ++i) {
        magic[i] = static_cast<uint8_t>(kFrameMagic >> (8 * i));
    }
    if (std::memcmp(p, magic, magic_have) != 0) {
        return fail(FrameError::kBadMagic, "the stream is not dsinfer transfer frames");
    }
    if (live >= 6 && load_le<uint16_t>(p + 4) != kFrameVersion) {
        return fail(FrameError::kUnknownVersion,
                    "version " + std::to_string(load_le<uint16_t>(p + 4)) + ", this build speaks " +
                        std::to_string(kFrameVersion));
    }
    if (live >= 8) {
        const uint16_t type = load_le<uint16_t>(p + 6);
        if (type < 1 || type > kMaxMessageType) {
            return fail(FrameError::kUnknownType, "type " + std::to_string(type));
        }
    }
    if (live < kFrameHeaderBytes) {
        return std::optional<PartialFrame>();
    }
    PartialFrame f;
    FrameHeader& h = f.header;
    h.type = static_cast<MessageType>(load_le<uint16_t>(p + 6));
    h.transfer_id.hi = load_le<uint64_t>(p + 8);
    h.transfer_id.lo = load_le<uint64_t>(p + 16);
    h.incarnation = load_le<uint64_t>(p + 24);
    h.sequence = load_le<uint64_t>(p + 32);
    h.payload_bytes = load_le<uint64_t>(p + 40);
    h.digest = load_le<uint64_t>(p + 48);
    if (h.payload_bytes > max_payload_bytes_) {
        return fail(FrameError::kPayloadTooLong, std::to_string(h.payload_bytes) +
                                                     " bytes, limit " +
                                                     std::to_string(max_payload_bytes_));
    }
    f.digested_header = {p, kDigestedHeaderBytes};
    f.payload = {p + kFrameHeaderBytes,
                 std::min<size_t>(live - kFrameHeaderBytes, h.payload_bytes)};
    return std::optional<PartialFrame>(f);
}

void FrameDecoder::skip_peeked(const PartialFrame& frame) {
    DSI_CHECK(!error_ && frame.digested_header.data() == buf_.get() + begin_,
              "skip_peeked: not the frame peek() returned");
    begin_ += kFrameHeaderBytes + frame.payload.size();
}

Status FrameDecoder::digest_mismatch(const FrameHeader& h) {
    return fail(FrameError::kDigestMismatch, std::string(message_type_name(h.type)) +
                                                 " frame, sequence " + std::to_string(h.sequence));
}

Result<std::optional<FrameView>> FrameDecoder::next() {
    DSI_ASSIGN_OR_RETURN(const auto peeked, peek());
    if (!peeked || peeked->payload.size() < peeked->header.payload_bytes) {
        return std::optional<FrameView>();
    }
    const FrameHeader& h = peeked->header;
    if (frame_digest(peeked->digested_header, peeked->payload, {}) != h.digest) {
        return digest_mismatch(h);
    }
    begin_ += kFrameHeaderBytes + h.payload_bytes;
    return std::optional<FrameView>(FrameView{h, peeked->payload});
}

Status FrameDecoder::finish() {
    if (error_) {
        return error_status_;
    }
    if (end_ != begin_) {
        return fail(FrameError::kTruncated,
                    "the stream ended " + std::to_string(end_ - begin_) + " bytes into a frame");
    }
    return Status::ok();
}

}  // namespace dsi::transfer

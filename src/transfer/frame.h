// The transfer frame format and its codec (issue 18; docs/transfer.md has the table).
//
// Every message between two engines is one frame: a fixed 56-byte little-endian header
// (magic, version, type, transfer id, sender incarnation, sequence number, payload
// length, digest) followed by the payload. The digest is XXH3-64 over the header's first
// 48 bytes and the payload, so a flipped bit anywhere in a frame is caught on arrival.
// Payloads are plain length-prefixed fields; LayerChunk and State frames carry their
// data bytes after a small prefix, and the encoder leaves those bytes where they are
// (EncodedFrame::body is a view), so a sender never copies KV to frame it.
//
// FrameDecoder is incremental: bytes go in in arbitrary pieces (feed, or writable() +
// commit() to read a socket straight into its buffer) and whole frames come out, or a
// precise, sticky error (bad magic, unknown version or type, payload over the limit,
// digest mismatch, truncated at end of stream). Nothing here does I/O.
// Thread model: value types and free functions; a FrameDecoder is one thread's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::transfer {

inline constexpr uint32_t kFrameMagic = 0x46585344;  // "DSXF" in little-endian bytes
inline constexpr uint16_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 56;
// The digest covers the header up to (not including) the digest field.
inline constexpr size_t kDigestedHeaderBytes = 48;
inline constexpr uint64_t kDefaultMaxPayloadBytes = uint64_t{64} << 20;
// A LayerChunk payload's fields before its data: layer (u32), byte offset (u64).
inline constexpr size_t kLayerChunkPrefixBytes = 12;

enum class MessageType : uint16_t {
    kHello = 1,
    kBegin = 2,
    kLayerChunk = 3,
    kState = 4,
    kEnd = 5,
    kAck = 6,
    kAbort = 7,
    kFailure = 8,
};
inline constexpr uint16_t kMaxMessageType = 8;
std::string_view message_type_name(MessageType type);

// 128 bits, chosen by the router for one prefill -> decode handoff.
struct TransferId {
    uint64_t hi = 0;
    uint64_t lo = 0;
    bool operator==(const TransferId&) const = default;
    std::string to_string() const;  // 32 hex digits
};

struct FrameHeader {
    MessageType type = MessageType::kHello;
    TransferId transfer_id;
    uint64_t incarnation = 0;  // the sender process's incarnation (a restart gets a new one)
    uint64_t sequence = 0;     // per sender and transfer, from 0, one per frame
    uint64_t payload_bytes = 0;
    uint64_t digest = 0;
};

// ---- Message payloads ----

enum class PeerRole : uint8_t { kPrefill = 1, kDecode = 2, kBoth = 3 };

struct HelloMessage {
    std::string peer_id;
    PeerRole role = PeerRole::kPrefill;
    uint64_t incarnation = 0;
    bool operator==(const HelloMessage&) const = default;
};

// A named piece of per-sequence state that is not paged KV (a V4 sequence's SWA ring,
// the compressors' partial-window accumulators, ...).
struct StateSectionInfo {
    std::string name;
    uint64_t bytes = 0;
    bool operator==(const StateSectionInfo&) const = default;
};

struct BeginMessage {
    std::string model_id;
    uint64_t num_tokens = 0;
    uint32_t block_size_tokens = 0;
    std::vector<uint64_t> layer_bytes;  // one entry per layer (the layer count is its size)
    std::vector<StateSectionInfo> state_sections;  // empty for a V2/V3 sequence
    bool operator==(const BeginMessage&) const = default;

    uint32_t num_layers() const { return static_cast<uint32_t>(layer_bytes.size()); }
    uint64_t total_bytes() const;  // layers + state sections
};

// LayerChunk and State frames: the prefix fields, then `data` (a view into the payload).
struct LayerChunkView {
    uint32_t layer = 0;
    uint64_t offset_bytes = 0;
    std::span<const uint8_t> data;
};
struct StateChunkView {
    std::string name;
    uint64_t offset_bytes = 0;
    std::span<const uint8_t> data;
};

struct EndMessage {
    uint64_t total_bytes = 0;  // data bytes of every LayerChunk and State frame
    // chain_digest over those frames' digests in frame order (each frame's digest covers
    // its header and payload, so this covers every data byte and where it went).
    uint64_t total_digest = 0;
    bool operator==(const EndMessage&) const = default;
};
struct AckMessage {
    uint64_t acked_sequence = 0;  // the End frame's sequence number
    bool operator==(const AckMessage&) const = default;
};
struct AbortMessage {
    std::string reason;
    bool operator==(const AbortMessage&) const = default;
};
struct FailureMessage {
    StatusCode code = StatusCode::kInternal;
    std::string message;
    bool operator==(const FailureMessage&) const = default;
};

// Payload encoders (the whole payload, or a chunk's prefix without its data).
std::vector<uint8_t> encode_payload(const HelloMessage& m);
std::vector<uint8_t> encode_payload(const BeginMessage& m);
std::vector<uint8_t> encode_layer_chunk_prefix(uint32_t layer, uint64_t offset_bytes);
std::vector<uint8_t> encode_state_chunk_prefix(std::string_view name, uint64_t offset_bytes);
std::vector<uint8_t> encode_payload(const EndMessage& m);
std::vector<uint8_t> encode_payload(const AckMessage& m);
std::vector<uint8_t> encode_payload(const AbortMessage& m);
std::vector<uint8_t> encode_payload(const FailureMessage& m);

// Payload decoders: kInvalidArgument for a payload that does not parse (short, long,
// bad enum, inconsistent counts). Views point into `payload`.
Result<HelloMessage> decode_hello(std::span<const uint8_t> payload);
Result<BeginMessage> decode_begin(std::span<const uint8_t> payload);
Result<LayerChunkView> decode_layer_chunk(std::span<const uint8_t> payload);
Result<StateChunkView> decode_state_chunk(std::span<const uint8_t> payload);
Result<EndMessage> decode_end(std::span<const uint8_t> payload);
Result<AckMessage> decode_ack(std::span<const uint8_t> payload);
Result<AbortMessage> decode_abort(std::span<const uint8_t> payload);
Result<FailureMessage> decode_failure(std::span<const uint8_t> payload);

// ---- Frames ----

// One encoded frame: `head` = header + the payload's leading bytes; `body` = the rest of
// the payload, a view of the caller's memory (empty for most types) that must live until
// the frame is written. The wire bytes are head then body.
struct EncodedFrame {
    std::vector<uint8_t> head;
    std::span<const uint8_t> body;
    uint64_t digest = 0;  // the header's digest field

    size_t size() const { return head.size() + body.size(); }
    std::vector<uint8_t> flatten() const;  // head + body in one buffer (tests)
};

// The frame fields a sender chooses (length and digest are computed).
struct FrameFields {
    MessageType type = MessageType::kHello;
    TransferId transfer_id;
    uint64_t incarnation = 0;
    uint64_t sequence = 0;
};

// REQUIRES: fields.type is a known type.
EncodedFrame encode_frame(const FrameFields& fields, std::vector<uint8_t> payload_prefix,
                          std::span<const uint8_t> body = {});

// XXH3-64 of the header's digested bytes followed by the payload pieces.
uint64_t frame_digest(std::span<const uint8_t> header48, std::span<const uint8_t> prefix,
                      std::span<const uint8_t> body);

// frame_digest, fed in pieces (a receiver hashes each piece of a payload as it lands,
// while it is still in cache).
class FrameDigester {
public:
    FrameDigester();
    ~FrameDigester();
    FrameDigester(const FrameDigester&) = delete;
    FrameDigester& operator=(const FrameDigester&) = delete;

    void reset();
    void update(std::span<const uint8_t> bytes);
    uint64_t digest() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

// The End digest, one frame at a time: start from 0, then
// chain = XXH3-64(frame_digest as 8 little-endian bytes, seed = chain). Hashing 8 bytes
// per frame instead of every data byte again halves the hashing of a transfer.
uint64_t chain_digest(uint64_t chain, uint64_t frame_digest);

// A decoded frame; `payload` lives until the decoder's next feed/writable/commit.
struct FrameView {
    FrameHeader header;
    std::span<const uint8_t> payload;
};

// The start of a frame whose header is buffered: views into the decoder's buffer that
// live until its next feed/writable/commit/skip_peeked.
struct PartialFrame {
    FrameHeader header;
    std::span<const uint8_t> digested_header;  // the header's first 48 bytes
    std::span<const uint8_t> payload;          // the buffered start of the payload
};

enum class FrameError : uint8_t {
    kBadMagic,
    kUnknownVersion,
    kUnknownType,
    kPayloadTooLong,
    kDigestMismatch,
    kTruncated,
};
std::string_view frame_error_name(FrameError e);

class FrameDecoder {
public:
    explicit FrameDecoder(uint64_t max_payload_bytes = kDefaultMaxPayloadBytes);
    FrameDecoder(const FrameDecoder&) = delete;
    FrameDecoder& operator=(const FrameDecoder&) = delete;

    // Appends bytes (copied).
    void feed(std::span<const uint8_t> bytes);
    // Zero-copy input: a buffer of at least `min_bytes` (more when the frame being
    // assembled needs it) to fill, then commit(n) with the number of bytes written.
    std::span<uint8_t> writable(size_t min_bytes);
    void commit(size_t n);

    // The next whole frame; nullopt when more bytes are needed; an error (sticky: a byte
    // stream cannot resynchronise) when the buffered bytes are not a valid frame. Header
    // errors are reported as soon as the bytes that show them arrive.
    // Error codes: kDataLoss (digest, truncated), kInvalidArgument (magic, version, type),
    // kResourceExhausted (payload over the limit). error() names the class.
    Result<std::optional<FrameView>> next();

    // The next frame's checked header and whatever of its payload is buffered (its digest
    // is not checked: the payload may be incomplete); nullopt until the header is in.
    // Errors as next().
    Result<std::optional<PartialFrame>> peek();
    // Zero-copy receive of a large payload: drops the frame peek() just returned from the
    // buffer (header and buffered payload); the caller reads the rest of its payload from
    // the stream itself and checks frame_digest against header.digest.
    // REQUIRES: `frame` is what peek() returned, with nothing fed since.
    void skip_peeked(const PartialFrame& frame);
    // Records a digest mismatch found by a caller that read the payload itself (sticky,
    // like the decoder's own); returns the error.
    Status digest_mismatch(const FrameHeader& header);

    // End of stream: OK when no partial frame is buffered, else kDataLoss (truncated).
    Status finish();

    std::optional<FrameError> error() const { return error_; }
    size_t buffered_bytes() const { return end_ - begin_; }

private:
    Status fail(FrameError e, std::string message);
    void reserve_tail(size_t want);

    uint64_t max_payload_bytes_;
    std::unique_ptr<uint8_t[]> buf_;
    size_t capacity_ = 0;
    size_t begin_ = 0;  // first unconsumed byte
    size_t end_ = 0;    // one past the last buffered byte
    std::optional<FrameError> error_;
    Status error_status_;
};

}  // namespace dsi::transfer

// The two ends of one KV + state transfer as pure state machines (issue 18; no I/O:
// session.h drives them over a Connection).
//
// TransferSender turns a sequence into frames: Hello, Begin (the sequence description),
// the State sections (a V4 sequence's SWA ring, compressor accumulators, ...), then each
// layer in order, cut into LayerChunk frames of at most `chunk_bytes`, then End with the
// byte count and the chain of the data frames' digests (frame.h). Layer order lets decode
// start on layer 0 while later layers are still on the wire (num_layers_ready).
//
// TransferReceiver reassembles into caller-provided memory (a Destination made by the
// caller's factory when Begin arrives, e.g. blocks decode reserved) and checks, in this
// order, for every frame (each already passed its own digest in the decoder):
//   1. the transfer already ended (complete, aborted, failed): late -> counted, ignored;
//   2. another transfer id: the transfer fails;
//   3. incarnation older than the sender's (from Hello): stale -> counted, ignored;
//      newer: the sender restarted mid-transfer -> fails; also fails once the shared
//      PeerTable has seen a newer incarnation of that peer on any connection;
//   4. sequence already seen: duplicate -> counted, ignored; a gap: fails (a frame was
//      lost);
//   5. the message: Begin sizes, layer index, offsets (in order within a layer, inside
//      the layer's size), section names, End's byte count and digest.
// A failed or aborted transfer drops its Destination at once (the caller's buffers are
// released by its destructor); a complete one hands it over (take_destination).
// LayerChunk data may also be read straight into the destination's memory: the same
// checks come first (place_layer_chunk), the accounting after (commit_placed_layer_chunk).
//
// Incarnation rule: PeerTable keeps the highest incarnation seen per peer id; a Hello
// with a lower one is stale and the transfer fails (a restarted peer is never confused
// with its predecessor, and the predecessor's leftovers are refused).
// Thread model: a sender or receiver is one thread's; PeerTable is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "transfer/frame.h"

namespace dsi::transfer {

// Where the sender reads a sequence from. Pieces may be shorter than asked (e.g. a
// paged layer ends a piece at a block boundary) but not empty while bytes remain.
class SequenceSource {
public:
    virtual ~SequenceSource() = default;
    // REQUIRES: offset < the layer's size. The view lives as long as the source.
    virtual std::span<const uint8_t> layer_piece(uint32_t layer, uint64_t offset,
                                                 uint64_t max_bytes) = 0;
    // REQUIRES: offset < the section's size (section: index in Begin's state_sections).
    virtual std::span<const uint8_t> state_piece(size_t section, uint64_t offset,
                                                 uint64_t max_bytes) = 0;
};

// Where the receiver writes. The receiver checks every range against Begin first.
class Destination {
public:
    virtual ~Destination() = default;
    virtual void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) = 0;
    virtual void write_state(size_t section, uint64_t offset, std::span<const uint8_t> bytes) = 0;
    // Optional zero-copy path: the memory that holds bytes [offset, offset + n) of `layer`
    // when they are contiguous, so the transport can read a chunk's data straight into
    // place; empty (the default) means write_layer is used. Lives as long as the
    // destination.
    virtual std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) {
        (void)layer;
        (void)offset;
        (void)n;
        return {};
    }
};

// Called once, on Begin: the memory for that sequence (e.g. the blocks decode reserved
// under this transfer id), or an error that fails the transfer.
using DestinationFactory = std::function<Result<std::unique_ptr<Destination>>(
    const TransferId& id, const BeginMessage& begin)>;

// Contiguous memory per layer and per section (tests, benchmarks, a host staging copy).
class SpanSource : public SequenceSource {
public:
    SpanSource(std::vector<std::span<const uint8_t>> layers,
               std::vector<std::span<const uint8_t>> states)
        : layers_(std::move(layers)), states_(std::move(states)) {}
    std::span<const uint8_t> layer_piece(uint32_t layer, uint64_t offset,
                                         uint64_t max_bytes) override;
    std::span<const uint8_t> state_piece(size_t section, uint64_t offset,
                                         uint64_t max_bytes) override;

private:
    std::vector<std::span<const uint8_t>> layers_;
    std::vector<std::span<const uint8_t>> states_;
};

class VectorDestination : public Destination {
public:
    explicit VectorDestination(const BeginMessage& begin);
    void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) override;
    void write_state(size_t section, uint64_t offset, std::span<const uint8_t> bytes) override;
    std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) override;

    const std::vector<std::vector<uint8_t>>& layers() const { return layers_; }
    const std::vector<std::vector<uint8_t>>& states() const { return states_; }

private:
    std::vector<std::vector<uint8_t>> layers_;
    std::vector<std::vector<uint8_t>> states_;
};

// Highest incarnation seen per peer id (shared by all receivers of one process).
class PeerTable {
public:
    // OK and records it when `incarnation` >= the highest seen for `peer_id`;
    // kFailedPrecondition (stale) when lower.
    Status observe(const std::string& peer_id, uint64_t incarnation) DSI_EXCLUDES(mu_);
    // 0 when the peer was never seen.
    uint64_t current(const std::string& peer_id) const DSI_EXCLUDES(mu_);

private:
    mutable Mutex mu_;
    std::map<std::string, uint64_t> incarnations_ DSI_GUARDED_BY(mu_);
};

// Stamps outgoing frames: one sender's transfer id, incarnation and next sequence.
class FrameStamper {
public:
    FrameStamper(TransferId id, uint64_t incarnation) : id_(id), incarnation_(incarnation) {}
    EncodedFrame stamp(MessageType type, std::vector<uint8_t> prefix,
                       std::span<const uint8_t> body = {});
    uint64_t next_sequence() const { return next_sequence_; }

private:
    TransferId id_;
    uint64_t incarnation_;
    uint64_t next_sequence_ = 0;
};

class TransferSender {
public:
    enum class State : uint8_t { kSending, kAwaitAck, kDone, kFailed, kAborted };

    // REQUIRES: chunk_bytes > 0; `source` outlives the sender and holds every byte that
    // `begin` describes.
    TransferSender(TransferId id, HelloMessage self, BeginMessage begin, SequenceSource* source,
                   uint64_t chunk_bytes);
    ~TransferSender();

    // The next frame to write (Hello first), or nullopt once End was produced.
    // Its body is a view into the source.
    std::optional<EncodedFrame> next_frame();
    // An Abort frame; the sender is then aborted (no more frames).
    EncodedFrame abort(std::string reason);

    // A frame from the receiver: Hello (its identity), Ack (done), Failure (failed with
    // the receiver's code and message). Anything after the end is counted as late.
    // Returns the sender's status after the frame.
    Status on_frame(const FrameView& frame);
    // The connection failed (cut, timeout, undecodable reply).
    void on_error(Status status);

    State state() const { return state_; }
    const Status& status() const { return status_; }
    const std::optional<HelloMessage>& peer() const { return peer_; }
    uint64_t num_late_frames() const { return num_late_; }
    uint64_t data_bytes_sent() const { return data_bytes_; }

private:
    void fail(Status s);

    TransferId id_;
    HelloMessage self_;
    BeginMessage begin_;
    SequenceSource* source_;
    uint64_t chunk_bytes_;
    FrameStamper stamper_;
    State state_ = State::kSending;
    Status status_;
    std::optional<HelloMessage> peer_;
    // Progress: -2 Hello next, -1 Begin next, then sections, then layers, then End.
    int phase_ = -2;
    size_t section_ = 0;
    uint32_t layer_ = 0;
    uint64_t offset_ = 0;
    uint64_t end_sequence_ = 0;
    uint64_t data_bytes_ = 0;
    uint64_t num_late_ = 0;
    uint64_t end_digest_ = 0;  // chain_digest of the data frames so far
};

struct ReceiverCounters {
    uint64_t num_accepted = 0;
    uint64_t num_duplicates = 0;  // sequence already seen (ignored)
    uint64_t num_late = 0;        // after the transfer ended (ignored)
    uint64_t num_stale = 0;       // from an older incarnation of the sender (ignored)
    uint64_t data_bytes = 0;
    uint64_t num_placed = 0;  // LayerChunk frames whose data was read straight into place
};

struct ReceiverLimits {
    uint64_t max_transfer_bytes = uint64_t{64} << 30;
    // When set, Begin must name this model.
    std::optional<std::string> expected_model_id;
};

class TransferReceiver {
public:
    enum class State : uint8_t {
        kAwaitHello,
        kAwaitBegin,
        kReceiving,
        kComplete,
        kAborted,
        kFailed
    };
    enum class Verdict : uint8_t {
        kAccepted,  // applied; keep reading
        kComplete,  // End verified: reply Ack (ack_sequence())
        kIgnored,   // duplicate, late or stale (see counters)
        kAborted,   // the sender aborted (status() says why)
        kFailed,    // the transfer failed: reply Failure (status())
    };

    // `peers` must outlive the receiver.
    TransferReceiver(TransferId id, PeerTable* peers, DestinationFactory factory,
                     ReceiverLimits limits = {});
    ~TransferReceiver();

    Verdict on_frame(const FrameView& frame);

    // Zero-copy LayerChunk (session.cc): given a LayerChunk frame's header and its
    // payload's prefix (layer, offset) before its data arrived, the destination memory its
    // data may be read into -- only when on_frame would accept the frame (same transfer
    // and incarnation, the next sequence number, receiving, the range inside the layer and
    // continuing it) and the destination exposes that memory; else empty, and the frame
    // must take on_frame. Changes nothing.
    std::span<uint8_t> place_layer_chunk(const FrameHeader& header,
                                         std::span<const uint8_t> prefix);
    // The data of a frame place_layer_chunk placed is in the destination and its digest
    // was checked: account for it as on_frame would have.
    Verdict commit_placed_layer_chunk(const FrameHeader& header, std::span<const uint8_t> prefix);
    // The connection failed or the decoder reported an error: the transfer fails
    // (unless it already ended).
    void on_error(Status status);
    // A local decision to stop (e.g. the decode request was cancelled).
    void abort(std::string reason);

    State state() const { return state_; }
    bool ended() const { return state_ >= State::kComplete; }
    const Status& status() const { return status_; }
    const ReceiverCounters& counters() const { return counters_; }
    const std::optional<HelloMessage>& peer() const { return peer_; }
    const std::optional<BeginMessage>& begin() const { return begin_; }
    // Layers 0 .. n-1 are wholly written (decode may start on them).
    uint32_t num_layers_ready() const { return num_layers_ready_; }
    uint64_t ack_sequence() const { return last_sequence_; }
    bool holds_destination() const { return destination_ != nullptr; }
    // REQUIRES: state() == kComplete. Hands the filled destination to the caller.
    std::unique_ptr<Destination> take_destination();

private:
    Verdict fail(Status s);
    Verdict on_hello(const FrameView& frame);
    Verdict on_begin(const FrameView& frame);
    Verdict on_layer_chunk(const FrameView& frame);
    Verdict on_state_chunk(const FrameView& frame);
    Verdict on_end(const FrameView& frame);
    void add_layer_data(const FrameHeader& header, uint32_t layer, uint64_t n);
    void add_data(const FrameHeader& header, uint64_t n);

    TransferId id_;
    PeerTable* peers_;
    DestinationFactory factory_;
    ReceiverLimits limits_;
    State state_ = State::kAwaitHello;
    Status status_;
    ReceiverCounters counters_;
    std::optional<HelloMessage> peer_;
    std::optional<BeginMessage> begin_;
    std::unique_ptr<Destination> destination_;
    std::optional<uint64_t> last_sequence_seen_;
    uint64_t last_sequence_ = 0;
    std::vector<uint64_t> layer_received_;
    std::vector<uint64_t> state_received_;
    uint32_t num_layers_ready_ = 0;
    uint64_t end_digest_ = 0;  // chain_digest of the data frames so far
};

}  // namespace dsi::transfer

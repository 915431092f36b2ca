// One transfer over one Connection: the sender's and the receiver's side, each a
// blocking call that drives the state machines of transfer_state.h (issue 18).
//
// Conversation (docs/transfer.md):
//   sender:   Hello, Begin, State..., LayerChunk..., End          then waits for Ack
//   receiver: Hello (at once), then Ack after a verified End, or Failure at the first
//             error, or nothing after the sender's Abort
// The sender looks for replies between frames (without waiting), so a receiver's
// Failure stops it early. After sending Failure or Abort a side half-closes and reads and
// drops what still arrives for at most `linger`, so its message reaches the peer instead
// of being lost in a connection reset; then it closes.
// Errors: the receiver's Failure comes back to the sender with the receiver's code
// (kDataLoss for digests, kOutOfRange for offsets, ...); a connection that breaks is
// kUnavailable, a silent peer kDeadlineExceeded (every read and write waits at most
// io_timeout); an Abort is kCancelled on both sides.
// Thread model: each call runs on the caller's thread and owns the connection until
// it returns; the connection is closed on every path that fails.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "transfer/frame.h"
#include "transfer/transfer_state.h"
#include "transfer/transport.h"

namespace dsi::transfer {

struct SendOptions {
    TransferId transfer_id;
    HelloMessage self;
    uint64_t chunk_bytes = uint64_t{1} << 20;
    Timeout io_timeout{10'000};
    Timeout linger{2'000};  // after sending Abort, as ReceiveOptions::linger
    uint64_t max_payload_bytes = kDefaultMaxPayloadBytes;
    // Asked before each frame; true: an Abort is sent and the send ends kCancelled.
    std::function<bool()> should_abort;
};

struct SendReport {
    uint64_t frames_sent = 0;
    uint64_t data_bytes = 0;
    HelloMessage receiver;
};

// REQUIRES: `source` holds every byte `begin` describes.
Result<SendReport> send_sequence(Connection& conn, const SendOptions& options,
                                 const BeginMessage& begin, SequenceSource& source);

struct ReceiveOptions {
    // nullopt: the transfer id of the first frame (a listener serving many transfers).
    std::optional<TransferId> transfer_id;
    HelloMessage self;
    Timeout io_timeout{10'000};
    Timeout linger{2'000};
    // The whole receive, from the first wait to the Ack, ends by then (0: no limit):
    // every read is cut to what is left, so a sender that trickles a byte now and then
    // (each read within io_timeout) cannot hold the receiver for longer.
    // kDeadlineExceeded, told to the sender as Failure.
    Timeout max_duration{0};
    uint64_t max_payload_bytes = kDefaultMaxPayloadBytes;
    ReceiverLimits limits;
    // Called when more layers became wholly written (decode may start on them).
    std::function<void(uint32_t num_layers_ready)> on_layers_ready;
    // Called before each frame is applied; true: the transfer is aborted here.
    std::function<bool()> should_abort;
    // Called once the End is verified and before the Ack is sent, with the whole
    // destination: the Ack then means "committed" (e.g. the blocks are in the decode
    // engine's store tier), so a sender that has its Ack can hand the sequence on. A
    // non-OK status is sent to the sender as Failure and returned; the destination is
    // dropped.
    std::function<Status(const TransferId& id, const BeginMessage& begin,
                         const HelloMessage& sender, Destination& destination)>
        commit;
};

// Refuses a transfer before it starts (a receiver with no room for it now): waits at most
// `wait` for the sender's first frame (to learn the transfer id its reply must carry),
// sends `why` as Failure, reads and drops what still arrives for at most `linger`, and
// closes. A sender that says nothing in time, or not in frames, is closed without a word.
// The sender's send then fails with why's code ("receiver failed the transfer: ...").
void refuse_transfer(Connection& conn, const HelloMessage& self, const Status& why, Timeout wait,
                     Timeout linger, uint64_t max_payload_bytes = kDefaultMaxPayloadBytes);

struct ReceivedSequence {
    TransferId transfer_id;
    std::unique_ptr<Destination> destination;
    BeginMessage begin;
    HelloMessage sender;
    ReceiverCounters counters;
};

// On failure the destination made by `factory` is already destroyed when this returns.
// With ReceiveOptions::commit, the Ack is sent only after it returned OK.
Result<ReceivedSequence> receive_sequence(Connection& conn, const ReceiveOptions& options,
                                          PeerTable& peers, const DestinationFactory& factory);

}  // namespace dsi::transfer

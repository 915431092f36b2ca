#include "transfer/session.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace dsi::transfer {

namespace {

using Clock = std::chrono::steady_clock;

// After a failure: half-close, read and drop raw bytes until the peer closes or
// `linger` passes (so the Failure just written is read by the peer, not discarded by a
// connection reset when unread bytes meet close()), then close.
void linger_and_close(Connection& conn, Timeout linger) {
    conn.shutdown_write();
    std::vector<uint8_t> scratch(64 << 10);
    const auto deadline = Clock::now() + linger;
    for (;;) {
        const auto left = std::chrono::duration_cast<Timeout>(deadline - Clock::now());
        if (left.count() <= 0) {
            break;
        }
        auto n = conn.read_some(scratch, left);
        if (!n.is_ok() || *n == 0) {
            break;
        }
    }
    conn.close();
}

Result<SendReport> sender_result(TransferSender& sender, uint64_t frames_sent) {
    if (sender.state() != TransferSender::State::kDone) {
        return sender.status();
    }
    SendReport r;
    r.frames_sent = frames_sent;
    r.data_bytes = sender.data_bytes_sent();
    if (sender.peer()) {
        r.receiver = *sender.peer();
    }
    return r;
}

bool sender_ended(const TransferSender& s) {
    return s.state() == TransferSender::State::kDone ||
           s.state() == TransferSender::State::kFailed ||
           s.state() == TransferSender::State::kAborted;
}

}  // namespace

Result<SendReport> send_sequence(Connection& conn, const SendOptions& options,
                                 const BeginMessage& begin, SequenceSource& source) {
    TransferSender sender(options.transfer_id, options.self, begin, &source, options.chunk_bytes);
    FrameReader reader(&conn, options.max_payload_bytes);
    uint64_t frames_sent = 0;
    // Applies what the receiver has sent so far, without waiting for more.
    auto drain_replies = [&]() {
        while (!sender_ended(sender) && reader.has_input()) {
            auto frame = reader.read(options.io_timeout);
            if (!frame.is_ok()) {
                sender.on_error(frame.status());
                return;
            }
            (void)sender.on_frame(*frame);
        }
    };
    for (;;) {
        drain_replies();
        if (sender_ended(sender)) {
            conn.close();
            return sender_result(sender, frames_sent);  // an Ack can come before next_frame ends
        }
        if (options.should_abort && options.should_abort()) {
            (void)write_frame(conn, sender.abort("the sender gave up"), options.io_timeout);
            linger_and_close(conn, options.linger);
            return sender.status();
        }
        std::optional<EncodedFrame> frame = sender.next_frame();
        if (!frame) {
            break;
        }
        Status s = write_frame(conn, *frame, options.io_timeout);
        if (!s.is_ok()) {
            // The receiver may have said why before it closed: prefer its Failure.
            drain_replies();
            sender.on_error(s);
            conn.close();
            return sender.status();
        }
        ++frames_sent;
    }
    while (!sender_ended(sender)) {
        auto reply = reader.read(options.io_timeout);
        if (!reply.is_ok()) {
            sender.on_error(reply.status().with_context("waiting for the Ack"));
            break;
        }
        (void)sender.on_frame(*reply);
    }
    conn.close();
    return sender_result(sender, frames_sent);
}

void refuse_transfer(Connection& conn, const HelloMessage& self, const Status& why, Timeout wait,
                     Timeout linger, uint64_t max_payload_bytes) {
    FrameReader reader(&conn, max_payload_bytes);
    reader.set_deadline(Clock::now() + wait);
    const Result<FrameView> first = reader.read(wait);
    if (!first.is_ok()) {
        conn.close();
        return;
    }
    FrameStamper stamper(first->header.transfer_id, self.incarnation);
    (void)write_frame(conn,
                      stamper.stamp(MessageType::kFailure,
                                    encode_payload(FailureMessage{why.code(), why.message()})),
                      wait);
    linger_and_close(conn, linger);
}

// How often a receiver waiting for a sender's first frame checks should_abort.
constexpr Timeout kAbortPollSlice{200};

Result<ReceivedSequence> receive_sequence(Connection& conn, const ReceiveOptions& options,
                                          PeerTable& peers, const DestinationFactory& factory) {
    FrameReader reader(&conn, options.max_payload_bytes);
    const auto deadline = std::chrono::steady_clock::now() + options.max_duration;
    const bool limited = options.max_duration > Timeout(0);
    if (limited) {
        reader.set_deadline(deadline);
    }
    // The first frame names the transfer when the caller did not. Read like the others
    // (never past a frame's end), so no KV is buffered before it can be placed.
    const PlaceFn no_place = [](const FrameHeader&, std::span<const uint8_t>) {
        return std::span<uint8_t>();
    };
    // Waited for in slices, so a receiver shutting down (should_abort) leaves a connection
    // that opened and never sent within a slice instead of after io_timeout. A slice that
    // ends mid-frame loses nothing: without placement every byte stays in the decoder.
    Result<ReadFrame> first_read = deadline_exceeded("no Hello");
    for (Timeout waited{0};;) {
        const Timeout slice = std::min(kAbortPollSlice, options.io_timeout - waited);
        first_read = reader.read_placing(slice, no_place);
        waited += slice;
        if (first_read.is_ok() || first_read.status().code() != StatusCode::kDeadlineExceeded ||
            waited >= options.io_timeout ||
            (limited && std::chrono::steady_clock::now() >= deadline)) {
            break;
        }
        if (options.should_abort && options.should_abort()) {
            first_read = cancelled("the receiver is shutting down");
            break;
        }
    }
    auto first = first_read.is_ok() ? Result<FrameView>(first_read->frame)
                                    : Result<FrameView>(first_read.status());
    if (!first.is_ok()) {
        conn.close();
        return first.status().with_context("waiting for the sender's Hello");
    }
    const TransferId id = options.transfer_id.value_or(first->header.transfer_id);
    FrameStamper stamper(id, options.self.incarnation);
    TransferReceiver receiver(id, &peers, factory, options.limits);
    Status wrote = write_frame(
        conn, stamper.stamp(MessageType::kHello, encode_payload(options.self)), options.io_timeout);
    if (!wrote.is_ok()) {
        receiver.on_error(wrote);
        conn.close();
        return receiver.status();
    }
    ReadFrame frame{*first, false};
    // KV data goes straight from the socket into the destination when it exposes memory.
    const PlaceFn place = [&receiver](const FrameHeader& h, std::span<const uint8_t> prefix) {
        return receiver.place_layer_chunk(h, prefix);
    };
    uint32_t layers_ready = 0;
    for (;;) {
        if (options.should_abort && options.should_abort()) {
            receiver.abort("the receiver gave up");
            (void)write_frame(conn,
                              stamper.stamp(MessageType::kAbort,
                                            encode_payload(AbortMessage{"the receiver gave up"})),
                              options.io_timeout);
            linger_and_close(conn, options.linger);
            return receiver.status();
        }
        const auto verdict = frame.placed ? receiver.commit_placed_layer_chunk(frame.frame.header,
                                                                               frame.frame.payload)
                                          : receiver.on_frame(frame.frame);
        if (options.on_layers_ready && receiver.num_layers_ready() != layers_ready) {
            layers_ready = receiver.num_layers_ready();
            options.on_layers_ready(layers_ready);
        }
        if (verdict == TransferReceiver::Verdict::kComplete) {
            ReceivedSequence r;
            r.transfer_id = id;
            r.destination = receiver.take_destination();
            r.begin = *receiver.begin();
            r.sender = *receiver.peer();
            r.counters = receiver.counters();
            if (options.commit) {
                Status committed = options.commit(id, r.begin, r.sender, *r.destination);
                if (!committed.is_ok()) {
                    r.destination.reset();
                    (void)write_frame(
                        conn,
                        stamper.stamp(MessageType::kFailure,
                                      encode_payload(FailureMessage{committed.code(),
                                                                    committed.message()})),
                        options.io_timeout);
                    linger_and_close(conn, options.linger);
                    return committed.with_context("committing the transfer");
                }
            }
            Status s =
                write_frame(conn,
                            stamper.stamp(MessageType::kAck,
                                          encode_payload(AckMessage{receiver.ack_sequence()})),
                            options.io_timeout);
            conn.close();
            if (!s.is_ok()) {
                // The data is whole and verified; the sender will report the missing Ack.
                (void)s;
            }
            return r;
        }
        if (verdict == TransferReceiver::Verdict::kAborted) {
            conn.close();
            return receiver.status();
        }
        if (verdict == TransferReceiver::Verdict::kFailed) {
            break;
        }
        auto next = reader.read_placing(options.io_timeout, place);
        if (!next.is_ok()) {
            receiver.on_error(next.status());
            break;
        }
        frame = *next;
    }
    // Failed: tell the sender why (best effort: the connection may be gone).
    const Status& why = receiver.status();
    (void)write_frame(conn,
                      stamper.stamp(MessageType::kFailure,
                                    encode_payload(FailureMessage{why.code(), why.message()})),
                      options.io_timeout);
    linger_and_close(conn, options.linger);
    return why;
}

}  // namespace dsi::transfer

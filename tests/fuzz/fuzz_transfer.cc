// libFuzzer entry for transfer/'s receiving side (issue 18): the bytes a decode engine
// reads from a peer. Input byte 0 picks the mode:
//   even: the rest is a raw byte stream, fed to a FrameDecoder in pieces (byte 1 sets the
//         piece size); every frame that passes its digest goes to a TransferReceiver;
//   odd:  the rest is records that this harness encodes as frames with valid digests
//         (random digests would stop everything at the decoder): raw payloads of any type,
//         or a synthesized Begin / LayerChunk / State / End, with the sequence number and
//         incarnation chosen by the input, so the state machine's checks (sequence gaps,
//         duplicates, stale and newer incarnations, ranges, End) are what is fuzzed;
//         half the LayerChunks go through the zero-copy path (place, then commit).
// Checks: no crash or sanitizer report; a receiver holds a destination only while
// receiving or complete; every destination is gone once the receiver is.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "transfer/internal/test_sequence.h"
#include "transfer/transfer_state.h"

using namespace dsi::transfer;

namespace {

const TransferId kId{7, 7};

void check_receiver(const TransferReceiver& r) {
    using S = TransferReceiver::State;
    const bool may_hold = r.state() == S::kReceiving || r.state() == S::kComplete;
    DSI_CHECK(may_hold || !r.holds_destination(), "a destination outlived its transfer");
    DSI_CHECK(testing::live_destinations().load() <= 1);
    if (r.state() == S::kFailed || r.state() == S::kAborted) {
        DSI_CHECK(!r.status().is_ok());
    }
}

void apply(TransferReceiver& r, const FrameView& f) {
    (void)r.on_frame(f);
    check_receiver(r);
    // The payload decoders see every payload whatever its type.
    (void)decode_hello(f.payload);
    (void)decode_begin(f.payload);
    (void)decode_layer_chunk(f.payload);
    (void)decode_state_chunk(f.payload);
    (void)decode_end(f.payload);
    (void)decode_failure(f.payload);
}

ReceiverLimits small_limits() {
    ReceiverLimits l;
    l.max_transfer_bytes = 1 << 20;  // a fuzzing process's memory, not a protocol limit
    return l;
}

void raw_mode(std::span<const uint8_t> in, PeerTable* peers) {
    if (in.empty()) {
        return;
    }
    const size_t piece = in[0] % 64 + 1;
    in = in.subspan(1);
    FrameDecoder decoder(1 << 16);
    TransferReceiver r(kId, peers, testing::counting_factory(), small_limits());
    for (size_t pos = 0; pos < in.size(); pos += piece) {
        decoder.feed(in.subspan(pos, std::min(piece, in.size() - pos)));
        for (;;) {
            auto f = decoder.next();
            if (!f.is_ok()) {
                DSI_CHECK(decoder.error().has_value());
                r.on_error(f.status());
                check_receiver(r);
                return;
            }
            if (!*f) {
                break;
            }
            apply(r, **f);
        }
    }
    (void)decoder.finish();
}

struct Cursor {
    std::span<const uint8_t> in;
    size_t pos = 0;
    bool done() const { return pos >= in.size(); }
    uint8_t u8() { return done() ? 0 : in[pos++]; }
    uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
    std::vector<uint8_t> bytes(size_t n) {
        n = std::min(n, in.size() - std::min(pos, in.size()));
        std::vector<uint8_t> v(in.begin() + pos, in.begin() + pos + n);
        pos += n;
        return v;
    }
};

void record_mode(std::span<const uint8_t> in, PeerTable* peers) {
    Cursor c{in};
    TransferReceiver r(kId, peers, testing::counting_factory(), small_limits());
    uint64_t seq = 0;
    static const char* kNames[] = {"swa_ring", "compressor_partial", "indexer"};
    std::vector<uint8_t> data(4096, 0x5a);
    for (int n = 0; n < 256 && !c.done(); ++n) {
        const uint8_t kind = c.u8();
        const uint8_t seq_op = c.u8();
        const uint8_t inc_op = c.u8();
        // Mostly the next sequence number; sometimes a repeat or a jump.
        seq = seq_op < 200 ? seq + (n > 0) : (seq_op < 230 ? seq : seq + seq_op % 5);
        const uint64_t incarnation = 5 + (inc_op < 220 ? 0 : inc_op % 3) - (inc_op >= 250);
        MessageType type = static_cast<MessageType>(kind % 8 + 1);
        std::vector<uint8_t> prefix;
        std::span<const uint8_t> body;
        switch (kind / 8 % 5) {
            case 0:  // raw payload of any type
                prefix = c.bytes(c.u8());
                break;
            case 1: {  // a well-formed Begin
                type = MessageType::kBegin;
                BeginMessage b;
                b.model_id = "m";
                const int layers = c.u8() % 4 + 1;
                for (int l = 0; l < layers; ++l) {
                    b.layer_bytes.push_back(c.u8() % 64);
                }
                if (c.u8() % 2) {
                    b.state_sections.push_back({kNames[c.u8() % 3], uint64_t{c.u8()} % 32});
                }
                prefix = encode_payload(b);
                break;
            }
            case 2:  // a LayerChunk
                type = MessageType::kLayerChunk;
                prefix = encode_layer_chunk_prefix(c.u8() % 5, c.u8() % 80);
                body = std::span<const uint8_t>(data).first(c.u8() % 70);
                break;
            case 3:  // a State chunk
                type = MessageType::kState;
                prefix = encode_state_chunk_prefix(kNames[c.u8() % 3], c.u8() % 40);
                body = std::span<const uint8_t>(data).first(c.u8() % 40);
                break;
            case 4:  // Hello or End
                if (kind % 2) {
                    type = MessageType::kHello;
                    prefix = encode_payload(HelloMessage{"p", PeerRole::kPrefill, incarnation});
                } else {
                    type = MessageType::kEnd;
                    prefix = encode_payload(EndMessage{c.u16(), c.u16()});
                }
                break;
        }
        const EncodedFrame frame = encode_frame({type, kId, incarnation, seq}, prefix, body);
        FrameDecoder d;
        d.feed(frame.flatten());
        auto f = d.next();
        DSI_CHECK(f.is_ok() && f->has_value(), "an encoded frame did not decode");
        const FrameView& v = **f;
        // Half the LayerChunks try the zero-copy path first (session.cc's order).
        if (v.header.type == MessageType::kLayerChunk && kind % 2 &&
            v.payload.size() >= kLayerChunkPrefixBytes) {
            const auto head = v.payload.first(kLayerChunkPrefixBytes);
            const auto memory = r.place_layer_chunk(v.header, head);
            if (!memory.empty()) {
                const auto rest = v.payload.subspan(kLayerChunkPrefixBytes);
                DSI_CHECK(memory.size() == rest.size(), "placed memory of the wrong size");
                std::copy(rest.begin(), rest.end(), memory.begin());
                (void)r.commit_placed_layer_chunk(v.header, head);
                check_receiver(r);
                continue;
            }
        }
        apply(r, v);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    {
        PeerTable peers;
        const std::span<const uint8_t> in(data + 1, size - 1);
        if (data[0] % 2 == 0) {
            raw_mode(in, &peers);
        } else {
            record_mode(in, &peers);
        }
    }
    DSI_CHECK(testing::live_destinations().load() == 0, "a destination leaked");
    return 0;
}

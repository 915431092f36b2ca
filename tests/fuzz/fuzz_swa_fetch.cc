// libFuzzer entry for the remote SWA-state pull's messages (issue 18, S-KV-8;
// serving/swa_fetch_wire.h): what a holder reads from a puller and what a puller reads
// from a holder. The frame codec below them (digests, headers) is fuzz_transfer's; here
// the harness builds the frame (a valid header of the type the input picks) around the
// input's payload, so the fetch's own checks are what is fuzzed. Input:
//   byte 0: bit 0 clear: a request (decode_swa_fetch_request); set: an answer
//           (decode_swa_fetch_answer) to a request for kWant
//   byte 1: the frame's message type (1 + byte % 8: every type a decoder passes on)
//   byte 2: answers only: the model's state size (9 + byte: more than its seal)
//   the rest: the frame's payload
// Checks: no crash or sanitizer report; a decoded request re-encodes to a request for
// the same key; a decoded answer is the state asked for, of the model's size, with a
// traffic class the store knows.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "serving/swa_fetch_wire.h"

using namespace dsi;

namespace {

const kv::SwaStateKey kWant{kv::BlockKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL}, 256};

// The type an input byte picks: one of those the frame decoder lets through.
transfer::MessageType type_of(uint8_t b) {
    return static_cast<transfer::MessageType>(1 + b % transfer::kMaxMessageType);
}

transfer::FrameView frame(transfer::MessageType type, std::span<const uint8_t> payload) {
    transfer::FrameView f;
    f.header.type = type;
    f.header.payload_bytes = payload.size();
    f.payload = payload;
    return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) {
        return 0;
    }
    if ((data[0] & 1) == 0) {
        const std::span<const uint8_t> payload(data + 2, size - 2);
        Result<kv::SwaStateKey> key =
            serving::decode_swa_fetch_request(frame(type_of(data[1]), payload));
        if (key.is_ok()) {
            const std::vector<uint8_t> again = serving::encode_swa_fetch_request(*key);
            DSI_CHECK(again.size() == payload.size(), "a request of another size decoded");
            Result<kv::SwaStateKey> back =
                serving::decode_swa_fetch_request(frame(transfer::MessageType::kState, again));
            DSI_CHECK(back.is_ok() && *back == *key, "a request does not round-trip");
        }
        return 0;
    }
    const uint64_t state_bytes = 9 + data[2];  // more than the 8-byte seal
    const std::span<const uint8_t> payload(data + 3, size - 3);
    Result<kv::SwaState> st = serving::decode_swa_fetch_answer(frame(type_of(data[1]), payload),
                                                               kWant, state_bytes, "fuzz");
    if (st.is_ok()) {
        DSI_CHECK(st->key == kWant, "an answer for another state passed");
        DSI_CHECK(st->bytes.size() == state_bytes, "an answer of another size passed");
        const auto c = static_cast<uint32_t>(st->traffic_class);
        DSI_CHECK(c == static_cast<uint32_t>(kvstore::TrafficClass::kChatbot) ||
                      c == static_cast<uint32_t>(kvstore::TrafficClass::kAgent),
                  "an unknown traffic class passed");
    }
    return 0;
}

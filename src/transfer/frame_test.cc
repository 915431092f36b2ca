#include "transfer/frame.h"

#include <gtest/gtest.h>

#include "base/env.h"

namespace dsi::transfer {
namespace {

const TransferId kId{0x0123456789abcdefULL, 0xfedcba9876543210ULL};

FrameFields fields(MessageType type, uint64_t seq = 3) { return {type, kId, 42, seq}; }

// Decodes exactly one frame from `bytes` fed in pieces of `piece` bytes.
FrameHeader decode_one(const std::vector<uint8_t>& bytes, std::vector<uint8_t>* payload,
                       size_t piece = 1) {
    FrameDecoder d;
    std::optional<FrameView> got;
    for (size_t i = 0; i < bytes.size(); i += piece) {
        EXPECT_FALSE(got.has_value()) << "frame before its last byte";
        d.feed(std::span(bytes).subspan(i, std::min(piece, bytes.size() - i)));
        auto r = d.next();
        EXPECT_TRUE(r.is_ok()) << r.status().to_string();
        if (r.is_ok() && *r) {
            got = **r;
            payload->assign(got->payload.begin(), got->payload.end());
        }
    }
    EXPECT_TRUE(got.has_value());
    EXPECT_TRUE(d.finish().is_ok());
    return got ? got->header : FrameHeader{};
}

TEST(FrameCodec, EveryMessageRoundTripsByteByByte) {
    const HelloMessage hello{"prefill-3", PeerRole::kPrefill, 77};
    BeginMessage begin;
    begin.model_id = "deepseek-v4-small";
    begin.num_tokens = 4099;
    begin.block_size_tokens = 128;
    begin.layer_bytes = {100, 200, 0, 300};
    begin.state_sections = {{"swa_ring", 4096}, {"compressor_partial", 12}};
    const EndMessage end{123456, 0xdeadbeef};
    const AckMessage ack{99};
    const AbortMessage abort{"request cancelled"};
    const FailureMessage failure{StatusCode::kDataLoss, "digest mismatch"};

    std::vector<uint8_t> payload;
    auto check = [&](MessageType type, std::vector<uint8_t> p) {
        const auto bytes = encode_frame(fields(type), p).flatten();
        const FrameHeader h = decode_one(bytes, &payload);
        EXPECT_EQ(h.type, type);
        EXPECT_EQ(h.transfer_id, kId);
        EXPECT_EQ(h.incarnation, 42u);
        EXPECT_EQ(h.sequence, 3u);
        EXPECT_EQ(payload, p);
        return payload;
    };
    EXPECT_EQ(*decode_hello(check(MessageType::kHello, encode_payload(hello))), hello);
    EXPECT_EQ(*decode_begin(check(MessageType::kBegin, encode_payload(begin))), begin);
    EXPECT_EQ(*decode_end(check(MessageType::kEnd, encode_payload(end))), end);
    EXPECT_EQ(*decode_ack(check(MessageType::kAck, encode_payload(ack))), ack);
    EXPECT_EQ(*decode_abort(check(MessageType::kAbort, encode_payload(abort))), abort);
    EXPECT_EQ(*decode_failure(check(MessageType::kFailure, encode_payload(failure))), failure);
    EXPECT_EQ(begin.total_bytes(), 600u + 4096 + 12);

    const std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6, 7};
    const auto chunk =
        encode_frame(fields(MessageType::kLayerChunk), encode_layer_chunk_prefix(9, 4096), data);
    EXPECT_EQ(chunk.body.data(), data.data()) << "the data is not copied";
    decode_one(chunk.flatten(), &payload, 5);
    auto lc = decode_layer_chunk(payload);
    ASSERT_TRUE(lc.is_ok());
    EXPECT_EQ(lc->layer, 9u);
    EXPECT_EQ(lc->offset_bytes, 4096u);
    EXPECT_EQ(std::vector<uint8_t>(lc->data.begin(), lc->data.end()), data);

    const auto state =
        encode_frame(fields(MessageType::kState), encode_state_chunk_prefix("swa_ring", 64), data);
    decode_one(state.flatten(), &payload, 3);
    auto sc = decode_state_chunk(payload);
    ASSERT_TRUE(sc.is_ok());
    EXPECT_EQ(sc->name, "swa_ring");
    EXPECT_EQ(sc->offset_bytes, 64u);
    EXPECT_EQ(std::vector<uint8_t>(sc->data.begin(), sc->data.end()), data);
}

TEST(FrameCodec, ManyFramesInRandomPiecesAndZeroCopyInput) {
    SplitMix64 rng(7);
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<uint8_t> stream;
    for (int i = 0; i < 200; ++i) {
        std::vector<uint8_t> p(rng.next() % 5000);
        for (auto& b : p) {
            b = static_cast<uint8_t>(rng.next());
        }
        const auto f = encode_frame(fields(MessageType::kLayerChunk, i), {}, p).flatten();
        stream.insert(stream.end(), f.begin(), f.end());
        payloads.push_back(std::move(p));
    }
    for (const bool zero_copy : {false, true}) {
        FrameDecoder d;
        size_t pos = 0;
        size_t got = 0;
        while (pos < stream.size()) {
            const size_t n = std::min<size_t>(1 + rng.next() % 9000, stream.size() - pos);
            if (zero_copy) {
                auto w = d.writable(n);
                ASSERT_GE(w.size(), n);
                std::copy_n(stream.begin() + pos, n, w.begin());
                d.commit(n);
            } else {
                d.feed(std::span(stream).subspan(pos, n));
            }
            pos += n;
            for (;;) {
                auto r = d.next();
                ASSERT_TRUE(r.is_ok()) << r.status().to_string();
                if (!*r) {
                    break;
                }
                ASSERT_LT(got, payloads.size());
                EXPECT_EQ((*r)->header.sequence, got);
                EXPECT_TRUE(std::equal((*r)->payload.begin(), (*r)->payload.end(),
                                       payloads[got].begin(), payloads[got].end()));
                ++got;
            }
        }
        EXPECT_EQ(got, payloads.size());
        EXPECT_TRUE(d.finish().is_ok());
    }
}

// Feeds `bytes` one at a time and returns the first error (or OK), plus how many bytes
// had been fed when it came.
std::pair<Status, size_t> first_error(const std::vector<uint8_t>& bytes, FrameDecoder* d,
                                      bool finish = false) {
    for (size_t i = 0; i < bytes.size(); ++i) {
        d->feed(std::span(bytes).subspan(i, 1));
        for (;;) {
            auto r = d->next();
            if (!r.is_ok()) {
                return {r.status(), i + 1};
            }
            if (!*r) {
                break;
            }
        }
    }
    return {finish ? d->finish() : Status::ok(), bytes.size()};
}

std::vector<uint8_t> good_frame(size_t payload_bytes = 100) {
    std::vector<uint8_t> p(payload_bytes, 0xab);
    return encode_frame(fields(MessageType::kLayerChunk), {}, p).flatten();
}

TEST(FrameCodec, BadMagicIsReportedAtTheFirstByte) {
    auto bytes = good_frame();
    bytes[0] = 'G';  // e.g. an HTTP client: "GET ..."
    FrameDecoder d;
    auto [s, at] = first_error(bytes, &d);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.error(), FrameError::kBadMagic);
    EXPECT_EQ(at, 1u);
    // Sticky: the stream cannot resynchronise.
    d.feed(good_frame());
    EXPECT_FALSE(d.next().is_ok());
    EXPECT_FALSE(d.finish().is_ok());
}

TEST(FrameCodec, UnknownVersionAndType) {
    auto v = good_frame();
    v[4] = 2;
    FrameDecoder d1;
    auto [s1, at1] = first_error(v, &d1);
    EXPECT_EQ(d1.error(), FrameError::kUnknownVersion);
    EXPECT_EQ(s1.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(at1, 6u);
    for (uint8_t type : {uint8_t{0}, uint8_t{9}, uint8_t{200}}) {
        auto t = good_frame();
        t[6] = type;
        FrameDecoder d2;
        auto [s2, at2] = first_error(t, &d2);
        EXPECT_EQ(d2.error(), FrameError::kUnknownType) << int(type);
        EXPECT_EQ(at2, 8u);
    }
}

TEST(FrameCodec, PayloadOverTheLimitIsRefusedFromTheHeader) {
    FrameDecoder d(/*max_payload_bytes=*/1000);
    EXPECT_TRUE(first_error(good_frame(1000), &d).first.is_ok());
    FrameDecoder d2(1000);
    auto [s, at] = first_error(good_frame(1001), &d2);
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(d2.error(), FrameError::kPayloadTooLong);
    EXPECT_EQ(at, kFrameHeaderBytes) << "refused before the payload is buffered";
}

TEST(FrameCodec, AnyFlippedByteOutsideTheCheckedFieldsIsADigestMismatch) {
    const auto good = good_frame(300);
    // Every byte after the type field: ids, incarnation, sequence, digest and payload
    // (the length field changes the frame's extent: tested below).
    for (size_t i = 8; i < good.size(); ++i) {
        if (i >= 40 && i < 48) {
            continue;
        }
        auto bad = good;
        bad[i] ^= 0x01;
        FrameDecoder d;
        auto [s, at] = first_error(bad, &d);
        ASSERT_EQ(d.error(), FrameError::kDigestMismatch) << "byte " << i;
        EXPECT_EQ(s.code(), StatusCode::kDataLoss);
        EXPECT_EQ(at, good.size());
    }
    // A shorter length: the frame ends early and its digest fails.
    auto shorter = good;
    shorter[40] = static_cast<uint8_t>(good[40] - 10);  // 300 -> 290 bytes
    FrameDecoder d;
    EXPECT_EQ(first_error(shorter, &d).first.code(), StatusCode::kDataLoss);
    EXPECT_EQ(d.error(), FrameError::kDigestMismatch);
}

TEST(FrameCodec, TruncatedStreamIsReportedAtFinish) {
    const auto good = good_frame(300);
    for (size_t cut : {size_t{1}, size_t{30}, kFrameHeaderBytes, good.size() - 1}) {
        FrameDecoder d;
        auto [s, at] = first_error({good.begin(), good.begin() + cut}, &d, /*finish=*/true);
        EXPECT_EQ(s.code(), StatusCode::kDataLoss) << cut;
        EXPECT_EQ(d.error(), FrameError::kTruncated) << cut;
    }
    FrameDecoder whole;
    EXPECT_TRUE(first_error(good, &whole, true).first.is_ok());
}

TEST(FrameCodec, MalformedPayloadsAreRejected) {
    auto hello = encode_payload(HelloMessage{"p", PeerRole::kDecode, 1});
    EXPECT_TRUE(decode_hello(hello).is_ok());
    auto extra = hello;
    extra.push_back(0);
    EXPECT_EQ(decode_hello(extra).status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(decode_hello(std::span(hello).first(hello.size() - 1)).is_ok());
    auto bad_role = hello;
    bad_role[5] = 9;  // after the u32 length and one byte of id
    EXPECT_FALSE(decode_hello(bad_role).is_ok());

    BeginMessage b;
    b.layer_bytes = {1, 2};
    auto begin = encode_payload(b);
    EXPECT_TRUE(decode_begin(begin).is_ok());
    auto huge = begin;
    // The layer count (after model id length 0, u64 tokens, u32 block size) -> 2^31.
    huge[4 + 8 + 4 + 3] = 0x80;
    EXPECT_FALSE(decode_begin(huge).is_ok());
    EXPECT_FALSE(decode_begin(std::span(begin).first(begin.size() - 1)).is_ok());

    EXPECT_FALSE(decode_layer_chunk(std::vector<uint8_t>(11)).is_ok());
    EXPECT_TRUE(decode_layer_chunk(std::vector<uint8_t>(12)).is_ok());
    EXPECT_FALSE(decode_state_chunk(std::vector<uint8_t>{5, 0, 0, 0, 'a'}).is_ok());
    EXPECT_FALSE(decode_end(std::vector<uint8_t>(15)).is_ok());
    EXPECT_FALSE(decode_ack(std::vector<uint8_t>(9)).is_ok());
    auto failure = encode_payload(FailureMessage{StatusCode::kInternal, "x"});
    failure[0] = 0;  // code OK is not a failure
    EXPECT_FALSE(decode_failure(failure).is_ok());
    failure[0] = 200;
    EXPECT_FALSE(decode_failure(failure).is_ok());
}

}  // namespace
}  // namespace dsi::transfer

#include "transfer/transfer_state.h"

#include <gtest/gtest.h>

#include <deque>

#include "transfer/internal/test_sequence.h"

namespace dsi::transfer {
namespace {

using testing::counting_factory;
using testing::holds;
using testing::live_destinations;
using testing::TestSequence;
using Verdict = TransferReceiver::Verdict;

const TransferId kId{1, 2};
const HelloMessage kPrefill{"prefill-0", PeerRole::kPrefill, 5};

class TransferStateTest : public ::testing::Test {
protected:
    void SetUp() override { ASSERT_EQ(live_destinations().load(), 0); }
    void TearDown() override { EXPECT_EQ(live_destinations().load(), 0) << "a destination leaked"; }

    // Every frame a sender produces for `seq`, as wire bytes.
    static std::vector<std::vector<uint8_t>> frames_of(const TestSequence& seq,
                                                       uint64_t chunk_bytes,
                                                       HelloMessage self = kPrefill) {
        auto source = seq.source();
        TransferSender sender(kId, std::move(self), seq.begin, &source, chunk_bytes);
        std::vector<std::vector<uint8_t>> out;
        while (auto f = sender.next_frame()) {
            out.push_back(f->flatten());
        }
        return out;
    }

    // The frame in `bytes` (the view lives as long as the fixture).
    FrameView view(const std::vector<uint8_t>& bytes) {
        decoders_.push_back(std::make_unique<FrameDecoder>());
        decoders_.back()->feed(bytes);
        auto r = decoders_.back()->next();
        DSI_CHECK(r.is_ok() && r->has_value(), "not one frame");
        return **r;
    }

    // A frame stamped by hand (bad payloads, odd sequence numbers or incarnations).
    FrameView forged(MessageType type, std::vector<uint8_t> payload, uint64_t seq,
                     uint64_t incarnation = 5, TransferId id = kId) {
        wire_.push_back(encode_frame({type, id, incarnation, seq}, std::move(payload)).flatten());
        return view(wire_.back());
    }

    PeerTable peers_;
    std::deque<std::unique_ptr<FrameDecoder>> decoders_;
    std::deque<std::vector<uint8_t>> wire_;
};

TEST_F(TransferStateTest, CompleteTransferIsBitExactAndLayersBecomeReadyInOrder) {
    const auto seq = TestSequence::make(6, 10'000, /*v4=*/true, 1);
    const auto frames = frames_of(seq, 4096);
    TransferReceiver r(kId, &peers_, counting_factory());
    std::vector<uint32_t> ready;
    for (size_t i = 0; i < frames.size(); ++i) {
        const Verdict v = r.on_frame(view(frames[i]));
        ready.push_back(r.num_layers_ready());
        ASSERT_EQ(v, i + 1 == frames.size() ? Verdict::kComplete : Verdict::kAccepted)
            << i << ": " << r.status().to_string();
    }
    EXPECT_EQ(r.state(), TransferReceiver::State::kComplete);
    EXPECT_EQ(*r.peer(), kPrefill);
    EXPECT_EQ(*r.begin(), seq.begin);
    EXPECT_EQ(r.counters().data_bytes, seq.begin.total_bytes());
    EXPECT_EQ(r.ack_sequence(), frames.size() - 1);
    // Layer 0 is ready long before the last frame (3 chunks per layer of ~10 KB).
    EXPECT_TRUE(std::is_sorted(ready.begin(), ready.end()));
    const auto first_ready = std::find(ready.begin(), ready.end(), 1u) - ready.begin();
    EXPECT_LT(first_ready, static_cast<long>(frames.size()) / 3);
    auto dest = r.take_destination();
    EXPECT_TRUE(holds(*dest, seq));
}

TEST_F(TransferStateTest, PlacedLayerChunksAreCheckedFirstAndAccountedLikeOthers) {
    const auto seq = TestSequence::make(4, 3000, /*v4=*/true, 11);
    const auto frames = frames_of(seq, 1000);
    TransferReceiver r(kId, &peers_, counting_factory());
    auto prefix_of = [](const FrameView& f) { return f.payload.first(kLayerChunkPrefixBytes); };
    for (const auto& bytes : frames) {
        const FrameView f = view(bytes);
        if (f.header.type != MessageType::kLayerChunk) {
            ASSERT_NE(r.on_frame(f), Verdict::kFailed) << r.status().to_string();
            continue;
        }
        // Not the next sequence number, another incarnation, another transfer: not placed.
        FrameHeader skip = f.header;
        ++skip.sequence;
        EXPECT_TRUE(r.place_layer_chunk(skip, prefix_of(f)).empty());
        FrameHeader old = f.header;
        --old.incarnation;
        EXPECT_TRUE(r.place_layer_chunk(old, prefix_of(f)).empty());
        FrameHeader other = f.header;
        other.transfer_id.lo ^= 1;
        EXPECT_TRUE(r.place_layer_chunk(other, prefix_of(f)).empty());
        // A range past the layer's end: not placed.
        FrameHeader longer = f.header;
        longer.payload_bytes += 5000;
        EXPECT_TRUE(r.place_layer_chunk(longer, prefix_of(f)).empty());
        const auto memory = r.place_layer_chunk(f.header, prefix_of(f));
        const auto data = f.payload.subspan(kLayerChunkPrefixBytes);
        ASSERT_EQ(memory.size(), data.size());
        std::copy(data.begin(), data.end(), memory.begin());
        ASSERT_EQ(r.commit_placed_layer_chunk(f.header, prefix_of(f)), Verdict::kAccepted);
        // The same frame again is a duplicate, not placed twice.
        EXPECT_TRUE(r.place_layer_chunk(f.header, prefix_of(f)).empty());
        EXPECT_EQ(r.on_frame(f), Verdict::kIgnored);
    }
    ASSERT_EQ(r.state(), TransferReceiver::State::kComplete) << r.status().to_string();
    EXPECT_EQ(r.counters().num_placed, 3u + 3u * 4u);  // 3000 + 7 l bytes in 1000-byte chunks
    EXPECT_EQ(r.num_layers_ready(), 4u);
    EXPECT_TRUE(holds(*r.take_destination(), seq));
}

TEST_F(TransferStateTest, SenderOrderIsHelloBeginStateLayersEnd) {
    const auto seq = TestSequence::make(2, 100, true, 2);
    std::vector<MessageType> types;
    for (const auto& f : frames_of(seq, 64)) {
        types.push_back(view(f).header.type);
    }
    using M = MessageType;
    // 3077 + 1024 state bytes in 64-byte chunks, then two layers of 100 and 107 bytes.
    size_t n_state = 0, n_layer = 0;
    for (auto t : types) {
        n_state += t == M::kState;
        n_layer += t == M::kLayerChunk;
    }
    EXPECT_EQ(types.front(), M::kHello);
    EXPECT_EQ(types[1], M::kBegin);
    EXPECT_EQ(types.back(), M::kEnd);
    EXPECT_EQ(n_state, (3077 + 63) / 64 + 1024 / 64);
    EXPECT_EQ(n_layer, 2u + 2u);
    // All state frames come before the first layer frame.
    const auto first_layer = std::find(types.begin(), types.end(), M::kLayerChunk);
    EXPECT_EQ(std::find(first_layer, types.end(), M::kState), types.end());
}

TEST_F(TransferStateTest, DuplicateFramesAreCountedAndIgnored) {
    const auto seq = TestSequence::make(3, 5000, true, 3);
    const auto frames = frames_of(seq, 2000);
    TransferReceiver r(kId, &peers_, counting_factory());
    for (size_t i = 0; i + 1 < frames.size(); ++i) {
        ASSERT_EQ(r.on_frame(view(frames[i])), Verdict::kAccepted) << r.status().to_string();
        // Every frame again, and an older one.
        EXPECT_EQ(r.on_frame(view(frames[i])), Verdict::kIgnored);
        EXPECT_EQ(r.on_frame(view(frames[i / 2])), Verdict::kIgnored);
    }
    ASSERT_EQ(r.on_frame(view(frames.back())), Verdict::kComplete) << r.status().to_string();
    EXPECT_EQ(r.counters().num_duplicates, 2 * (frames.size() - 1));
    EXPECT_TRUE(holds(*r.take_destination(), seq));
}

TEST_F(TransferStateTest, LateFramesAfterEndOrAbortAreCountedAndIgnored) {
    const auto seq = TestSequence::make(2, 3000, false, 4);
    const auto frames = frames_of(seq, 1000);
    TransferReceiver done(kId, &peers_, counting_factory());
    for (const auto& f : frames) {
        (void)done.on_frame(view(f));
    }
    ASSERT_EQ(done.state(), TransferReceiver::State::kComplete);
    EXPECT_EQ(done.on_frame(view(frames[3])), Verdict::kIgnored);
    EXPECT_EQ(done.on_frame(forged(MessageType::kAbort, encode_payload(AbortMessage{"x"}), 99)),
              Verdict::kIgnored);
    EXPECT_EQ(done.counters().num_late, 2u);
    EXPECT_EQ(done.state(), TransferReceiver::State::kComplete);
    auto dest = done.take_destination();
    EXPECT_TRUE(holds(*dest, seq));

    TransferReceiver aborted(kId, &peers_, counting_factory());
    for (size_t i = 0; i < 4; ++i) {
        ASSERT_EQ(aborted.on_frame(view(frames[i])), Verdict::kAccepted);
    }
    EXPECT_TRUE(aborted.holds_destination());
    EXPECT_EQ(aborted.on_frame(forged(MessageType::kAbort, encode_payload(AbortMessage{"bye"}), 4)),
              Verdict::kAborted);
    EXPECT_EQ(aborted.status().code(), StatusCode::kCancelled);
    EXPECT_FALSE(aborted.holds_destination()) << "released at the abort";
    for (size_t i = 4; i < frames.size(); ++i) {
        EXPECT_EQ(aborted.on_frame(view(frames[i])), Verdict::kIgnored);
    }
    EXPECT_EQ(aborted.counters().num_late, frames.size() - 4);
}

TEST_F(TransferStateTest, StaleIncarnationsAreRefused) {
    const auto seq = TestSequence::make(2, 1000, false, 5);
    // The peer table has seen incarnation 5 of prefill-0; its predecessor (4) calls.
    ASSERT_TRUE(peers_.observe("prefill-0", 5).is_ok());
    HelloMessage old = kPrefill;
    old.incarnation = 4;
    const auto old_frames = frames_of(seq, 500, old);
    TransferReceiver r(kId, &peers_, counting_factory());
    EXPECT_EQ(r.on_frame(view(old_frames[0])), Verdict::kFailed);
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("stale incarnation 4"), std::string::npos);
    EXPECT_EQ(peers_.current("prefill-0"), 5u);

    // Bound to incarnation 5: frames of incarnation 4 in the stream are ignored.
    const auto frames = frames_of(seq, 500);
    TransferReceiver r2(kId, &peers_, counting_factory());
    for (size_t i = 0; i < frames.size(); ++i) {
        if (i > 0 && i < old_frames.size()) {
            EXPECT_EQ(r2.on_frame(view(old_frames[i])), Verdict::kIgnored);
        }
        ASSERT_NE(r2.on_frame(view(frames[i])), Verdict::kFailed) << r2.status().to_string();
    }
    EXPECT_EQ(r2.state(), TransferReceiver::State::kComplete);
    EXPECT_EQ(r2.counters().num_stale, old_frames.size() - 1);
    auto dest = r2.take_destination();
    EXPECT_TRUE(holds(*dest, seq));
}

TEST_F(TransferStateTest, APeerThatRestartsMidTransferFailsItAndReleasesTheBuffers) {
    const auto seq = TestSequence::make(3, 1000, false, 6);
    const auto frames = frames_of(seq, 500);
    {
        // The restarted process's frame (incarnation 6) arrives on this connection.
        TransferReceiver r(kId, &peers_, counting_factory());
        for (size_t i = 0; i < 4; ++i) {
            ASSERT_EQ(r.on_frame(view(frames[i])), Verdict::kAccepted);
        }
        EXPECT_EQ(live_destinations().load(), 1);
        EXPECT_EQ(r.on_frame(forged(MessageType::kLayerChunk, encode_layer_chunk_prefix(0, 0), 4,
                                    /*incarnation=*/6)),
                  Verdict::kFailed);
        EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(live_destinations().load(), 0);
    }
    {
        // Another connection saw incarnation 7 (the peer table is shared).
        TransferReceiver r(kId, &peers_, counting_factory());
        for (size_t i = 0; i < 4; ++i) {
            ASSERT_EQ(r.on_frame(view(frames[i])), Verdict::kAccepted) << r.status().to_string();
        }
        ASSERT_TRUE(peers_.observe("prefill-0", 7).is_ok());
        EXPECT_EQ(r.on_frame(view(frames[4])), Verdict::kFailed);
        EXPECT_NE(r.status().message().find("restarted"), std::string::npos);
        EXPECT_FALSE(r.holds_destination());
    }
}

// Receives frames[0 .. n) then `bad`; the transfer must fail with `code` and release.
void expect_fails(PeerTable* peers, const std::vector<std::vector<uint8_t>>& frames, size_t n,
                  FrameView bad, StatusCode code, const std::string& words,
                  std::function<FrameView(const std::vector<uint8_t>&)> view) {
    TransferReceiver r(kId, peers, counting_factory());
    for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(r.on_frame(view(frames[i])), Verdict::kAccepted) << r.status().to_string();
    }
    EXPECT_EQ(r.on_frame(bad), Verdict::kFailed);
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().to_string();
    EXPECT_FALSE(r.holds_destination());
    EXPECT_EQ(live_destinations().load(), 0);
}

TEST_F(TransferStateTest, ProtocolViolationsFailTheTransfer) {
    const auto seq = TestSequence::make(3, 1000, true, 7);
    const auto frames = frames_of(seq, 700);
    auto v = [this](const std::vector<uint8_t>& b) { return view(b); };
    using M = MessageType;
    // A frame lost in between (sequence gap).
    expect_fails(&peers_, frames, 3, view(frames[4]), StatusCode::kDataLoss, "lost", v);
    // Layer index past Begin's count.
    expect_fails(&peers_, frames, 2, forged(M::kLayerChunk, encode_layer_chunk_prefix(3, 0), 2),
                 StatusCode::kOutOfRange, "layer 3 of 3", v);
    // Bytes beyond the layer's size.
    {
        auto p = encode_layer_chunk_prefix(0, 990);
        p.resize(p.size() + 20);
        expect_fails(&peers_, frames, 2, forged(M::kLayerChunk, p, 2), StatusCode::kOutOfRange,
                     "outside", v);
    }
    // A chunk that skips ahead within a layer.
    {
        auto p = encode_layer_chunk_prefix(0, 100);
        p.resize(p.size() + 20);
        expect_fails(&peers_, frames, 2, forged(M::kLayerChunk, p, 2), StatusCode::kInvalidArgument,
                     "expected 0", v);
    }
    // A state section Begin did not announce.
    {
        auto p = encode_state_chunk_prefix("indexer_cache", 0);
        p.resize(p.size() + 8);
        expect_fails(&peers_, frames, 2, forged(M::kState, p, 2), StatusCode::kInvalidArgument,
                     "not in Begin", v);
    }
    // End before every byte arrived (sizes not matching Begin).
    expect_fails(&peers_, frames, 5, forged(M::kEnd, encode_payload(EndMessage{0, 0}), 5),
                 StatusCode::kDataLoss, "End with", v);
    // End with a wrong digest over all the right bytes.
    {
        const auto last = view(frames.back());
        const auto end = *decode_end(last.payload);
        expect_fails(
            &peers_, frames, frames.size() - 1,
            forged(M::kEnd, encode_payload(EndMessage{end.total_bytes, end.total_digest ^ 1}),
                   frames.size() - 1),
            StatusCode::kDataLoss, "end-to-end digest", v);
    }
    // Another transfer's frame on this one.
    expect_fails(&peers_, frames, 2,
                 forged(M::kLayerChunk, encode_layer_chunk_prefix(0, 0), 2, 5, TransferId{9, 9}),
                 StatusCode::kInvalidArgument, "frame of transfer", v);
    // Begin before Hello, a second Begin, an Ack from the sender, a bad payload.
    expect_fails(&peers_, frames, 0, view(frames[1]), StatusCode::kDataLoss, "expected 0", v);
    expect_fails(&peers_, frames, 2, forged(M::kBegin, encode_payload(seq.begin), 2),
                 StatusCode::kInvalidArgument, "second Begin", v);
    expect_fails(&peers_, frames, 2, forged(M::kAck, encode_payload(AckMessage{1}), 2),
                 StatusCode::kInvalidArgument, "Ack", v);
    expect_fails(&peers_, frames, 2, forged(M::kLayerChunk, {1, 2, 3}, 2),
                 StatusCode::kInvalidArgument, "malformed LayerChunk", v);
}

TEST_F(TransferStateTest, BeginIsCheckedBeforeAnyBufferIsMade) {
    auto seq = TestSequence::make(2, 1000, true, 8);
    auto v = [this](const std::vector<uint8_t>& b) { return view(b); };
    const auto frames = frames_of(seq, 700);
    const auto hello_only = std::vector<std::vector<uint8_t>>{frames[0]};
    auto begin_with = [&](BeginMessage b) {
        return forged(MessageType::kBegin, encode_payload(b), 1);
    };
    BeginMessage dup = seq.begin;
    dup.state_sections[1].name = dup.state_sections[0].name;
    expect_fails(&peers_, hello_only, 1, begin_with(dup), StatusCode::kInvalidArgument,
                 "named twice", v);
    BeginMessage none = seq.begin;
    none.layer_bytes.clear();
    expect_fails(&peers_, hello_only, 1, begin_with(none), StatusCode::kInvalidArgument,
                 "no layers", v);
    BeginMessage huge = seq.begin;
    huge.layer_bytes[1] = uint64_t{1} << 62;
    expect_fails(&peers_, hello_only, 1, begin_with(huge), StatusCode::kResourceExhausted,
                 "over the limit", v);

    // The caller's factory refuses (e.g. no blocks reserved for this transfer id).
    TransferReceiver r(
        kId, &peers_,
        [](const TransferId& id, const BeginMessage&) -> Result<std::unique_ptr<Destination>> {
            return not_found("no reservation for " + id.to_string());
        });
    ASSERT_EQ(r.on_frame(view(frames[0])), Verdict::kAccepted);
    EXPECT_EQ(r.on_frame(view(frames[1])), Verdict::kFailed);
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);

    ReceiverLimits want_model;
    want_model.expected_model_id = "other-model";
    TransferReceiver r2(kId, &peers_, counting_factory(), want_model);
    ASSERT_EQ(r2.on_frame(view(frames[0])), Verdict::kAccepted);
    EXPECT_EQ(r2.on_frame(view(frames[1])), Verdict::kFailed);
    EXPECT_EQ(r2.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(TransferStateTest, LocalAbortAndConnectionErrorsReleaseTheBuffers) {
    const auto seq = TestSequence::make(2, 1000, false, 9);
    const auto frames = frames_of(seq, 300);
    TransferReceiver a(kId, &peers_, counting_factory());
    for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(a.on_frame(view(frames[i])), Verdict::kAccepted);
    }
    EXPECT_EQ(live_destinations().load(), 1);
    a.abort("decode request cancelled");
    EXPECT_EQ(a.state(), TransferReceiver::State::kAborted);
    EXPECT_EQ(live_destinations().load(), 0);

    TransferReceiver e(kId, &peers_, counting_factory());
    for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(e.on_frame(view(frames[i])), Verdict::kAccepted);
    }
    e.on_error(unavailable("connection reset"));
    EXPECT_EQ(e.state(), TransferReceiver::State::kFailed);
    EXPECT_EQ(e.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(live_destinations().load(), 0);
}

TEST_F(TransferStateTest, SenderEndsOnAckOrFailure) {
    const auto seq = TestSequence::make(2, 1000, false, 10);
    auto source = seq.source();
    const HelloMessage decode{"decode-1", PeerRole::kDecode, 3};
    auto reply = [&](MessageType type, std::vector<uint8_t> payload, uint64_t seq_no) {
        wire_.push_back(encode_frame({type, kId, 3, seq_no}, std::move(payload)).flatten());
        return view(wire_.back());
    };
    {
        TransferSender s(kId, kPrefill, seq.begin, &source, 400);
        uint64_t n = 0;
        while (s.next_frame()) {
            ++n;
        }
        EXPECT_EQ(s.state(), TransferSender::State::kAwaitAck);
        EXPECT_TRUE(s.on_frame(reply(MessageType::kHello, encode_payload(decode), 0)).is_ok());
        EXPECT_TRUE(
            s.on_frame(reply(MessageType::kAck, encode_payload(AckMessage{n - 1}), 1)).is_ok());
        EXPECT_EQ(s.state(), TransferSender::State::kDone);
        EXPECT_EQ(*s.peer(), decode);
        EXPECT_EQ(s.data_bytes_sent(), seq.begin.total_bytes());
        (void)s.on_frame(reply(MessageType::kAck, encode_payload(AckMessage{n - 1}), 2));
        EXPECT_EQ(s.num_late_frames(), 1u);
    }
    {
        TransferSender s(kId, kPrefill, seq.begin, &source, 400);
        ASSERT_TRUE(s.next_frame().has_value());
        const Status st =
            s.on_frame(reply(MessageType::kFailure,
                             encode_payload(FailureMessage{StatusCode::kDataLoss, "digest"}), 0));
        EXPECT_EQ(st.code(), StatusCode::kDataLoss);
        EXPECT_EQ(s.state(), TransferSender::State::kFailed);
        EXPECT_FALSE(s.next_frame().has_value());
    }
    {
        TransferSender s(kId, kPrefill, seq.begin, &source, 400);
        ASSERT_TRUE(s.next_frame().has_value());
        const auto abort = s.abort("prefill cancelled");
        EXPECT_EQ(view(abort.flatten()).header.type, MessageType::kAbort);
        EXPECT_EQ(s.status().code(), StatusCode::kCancelled);
        EXPECT_FALSE(s.next_frame().has_value());
    }
}

}  // namespace
}  // namespace dsi::transfer

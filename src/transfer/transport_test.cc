// FrameReader over an in-memory connection whose reads return scripted amounts: the
// ordinary and the zero-copy (placed) paths, deterministic, no sockets.
#include "transfer/transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "base/env.h"
#include "transfer/internal/test_sequence.h"
#include "transfer/transfer_state.h"

namespace dsi::transfer {
namespace {

using testing::TestSequence;

// Reads hand out the stored bytes, each read at most a random 1 .. max_read bytes;
// then end of stream.
class ScriptedConnection : public Connection {
public:
    ScriptedConnection(std::vector<uint8_t> bytes, size_t max_read, uint64_t seed)
        : bytes_(std::move(bytes)), max_read_(max_read), rng_(seed) {}
    Status write(std::span<const std::span<const uint8_t>>, Timeout) override {
        return Status::ok();
    }
    Result<size_t> read_some(std::span<uint8_t> buf, Timeout) override {
        DSI_CHECK(!buf.empty());
        const size_t n = std::min(
            {buf.size(), bytes_.size() - pos_, static_cast<size_t>(1 + rng_.next() % max_read_)});
        std::copy_n(bytes_.begin() + pos_, n, buf.begin());
        pos_ += n;
        return n;
    }
    size_t available() override { return bytes_.size() - pos_; }
    void shutdown_write() override {}
    void close() override {}
    std::string peer_address() const override { return "script"; }

private:
    std::vector<uint8_t> bytes_;
    size_t pos_ = 0;
    size_t max_read_;
    SplitMix64 rng_;
};

std::vector<uint8_t> wire_of(const TestSequence& seq, uint64_t chunk_bytes) {
    auto source = seq.source();
    TransferSender sender(TransferId{1, 1}, {"p", PeerRole::kPrefill, 1}, seq.begin, &source,
                          chunk_bytes);
    std::vector<uint8_t> wire;
    while (auto f = sender.next_frame()) {
        const auto bytes = f->flatten();
        wire.insert(wire.end(), bytes.begin(), bytes.end());
    }
    return wire;
}

// Zeroed memory for every layer of `seq`.
std::vector<std::vector<uint8_t>> zeroed_layers(const TestSequence& seq) {
    std::vector<std::vector<uint8_t>> layers;
    for (uint64_t b : seq.begin.layer_bytes) {
        layers.emplace_back(b, 0);
    }
    return layers;
}

// Reads every frame with read_placing into `layers` (sized like the sequence); with
// `greedy_first` the first with read(), which may buffer the start of the next frames (so
// a placed frame also finds data that came early). Counts the frames and the placed ones,
// or returns the first error.
struct Outcome {
    Status status;
    size_t num_frames = 0;
    size_t num_placed = 0;
};

Outcome read_all(Connection* conn, std::vector<std::vector<uint8_t>>* layers,
                 bool greedy_first = false) {
    FrameReader reader(conn);
    Outcome out;
    if (greedy_first) {
        auto first = reader.read(Timeout(1000));
        if (!first.is_ok()) {
            out.status = first.status();
            return out;
        }
        ++out.num_frames;
    }
    const PlaceFn place = [layers](const FrameHeader& h, std::span<const uint8_t> prefix) {
        auto chunk = decode_layer_chunk(prefix);
        DSI_CHECK(chunk.is_ok());
        auto& l = (*layers)[chunk->layer];
        const uint64_t n = h.payload_bytes - prefix.size();
        return std::span<uint8_t>(l.data() + chunk->offset_bytes, n);
    };
    for (;;) {
        auto f = reader.read_placing(Timeout(1000), place);
        if (!f.is_ok()) {
            out.status = f.status();
            return out;
        }
        ++out.num_frames;
        if (f->placed) {
            ++out.num_placed;
            EXPECT_EQ(f->frame.payload.size(), kLayerChunkPrefixBytes);
        } else if (f->frame.header.type == MessageType::kLayerChunk) {
            auto chunk = decode_layer_chunk(f->frame.payload);
            std::copy(chunk->data.begin(), chunk->data.end(),
                      (*layers)[chunk->layer].begin() + static_cast<long>(chunk->offset_bytes));
        }
        if (f->frame.header.type == MessageType::kEnd) {
            return out;
        }
    }
}

TEST(FrameReaderTest, PlacedAndBufferedFramesArriveWholeWhateverTheReadSizes) {
    const auto seq = TestSequence::make(5, 40'000, /*v4=*/true, 21);
    const auto wire = wire_of(seq, 16'384);
    for (const size_t max_read :
         {size_t{1}, size_t{7}, size_t{100}, size_t{5000}, size_t{70'000}, size_t{1} << 20}) {
        ScriptedConnection conn(wire, max_read, max_read);
        auto layers = zeroed_layers(seq);
        const Outcome out = read_all(&conn, &layers);
        ASSERT_TRUE(out.status.is_ok()) << max_read << ": " << out.status.to_string();
        EXPECT_EQ(layers, seq.layers) << max_read;
        // Hello, Begin, 2 State, 5 x 3 LayerChunk, End.
        EXPECT_EQ(out.num_frames, 2u + 2u + 15u + 1u) << max_read;
        // Reads stop at each chunk's prefix: every chunk is placed.
        EXPECT_EQ(out.num_placed, 15u) << max_read;
    }
}

TEST(FrameReaderTest, DataBufferedBeforeAChunkIsPlacedIsCopiedIntoPlace) {
    const auto seq = TestSequence::make(5, 40'000, /*v4=*/true, 25);
    const auto wire = wire_of(seq, 16'384);
    // The greedy first read takes 20,000 bytes: Hello, Begin, both State frames and the
    // start of the first chunk's data.
    for (const size_t max_read : {size_t{20'000}, size_t{30'000}}) {
        ScriptedConnection conn(wire, max_read, 0);
        auto layers = zeroed_layers(seq);
        const Outcome out = read_all(&conn, &layers, /*greedy_first=*/true);
        ASSERT_TRUE(out.status.is_ok()) << out.status.to_string();
        EXPECT_EQ(layers, seq.layers);
        EXPECT_EQ(out.num_frames, 20u);
        EXPECT_GE(out.num_placed, 14u);
    }
}

// The wire of a 3-layer sequence damaged by `damage`, read with placement: the error.
Outcome read_damaged(uint64_t seed, const std::function<void(std::vector<uint8_t>*)>& damage) {
    const auto seq = TestSequence::make(3, 40'000, false, seed);
    auto wire = wire_of(seq, 16'384);
    damage(&wire);
    ScriptedConnection conn(wire, 3000, seed);
    auto layers = zeroed_layers(seq);
    return read_all(&conn, &layers);
}

TEST(FrameReaderTest, ACorruptedPlacedByteIsADigestMismatch) {
    // A byte in the middle of the stream: inside some LayerChunk's data.
    const Outcome out = read_damaged(22, [](auto* wire) { (*wire)[wire->size() / 2] ^= 0x10; });
    EXPECT_EQ(out.status.code(), StatusCode::kDataLoss) << out.status.to_string();
    EXPECT_NE(out.status.message().find("digest mismatch"), std::string::npos);
    EXPECT_GE(out.num_placed, 1u);
}

TEST(FrameReaderTest, AStreamEndingInPlacedDataIsTruncated) {
    const Outcome out = read_damaged(23, [](auto* wire) { wire->resize(wire->size() / 2); });
    EXPECT_EQ(out.status.code(), StatusCode::kDataLoss) << out.status.to_string();
    EXPECT_NE(out.status.message().find("truncated"), std::string::npos);
}

TEST(FrameReaderTest, EndOfStreamBetweenFramesIsUnavailable) {
    const auto seq = TestSequence::make(2, 1000, false, 24);
    ScriptedConnection conn(wire_of(seq, 512), 100, 3);
    FrameReader reader(&conn);
    Status last;
    for (int i = 0; i < 100 && last.is_ok(); ++i) {
        auto f = reader.read(Timeout(1000));
        last = f.status();
    }
    EXPECT_EQ(last.code(), StatusCode::kUnavailable);
    EXPECT_NE(last.message().find("end of stream"), std::string::npos);
}

}  // namespace
}  // namespace dsi::transfer

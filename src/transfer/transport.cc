#include "transfer/transport.h"

#include <algorithm>
#include <array>

namespace dsi::transfer {

#ifndef DSI_HAVE_UCX
Result<std::unique_ptr<Transport>> make_ucx_transport() {
    return failed_precondition(
        "the UCX transport is not available: built without UCX (install libucx-dev and "
        "configure again)");
}
#endif

Result<std::unique_ptr<Transport>> make_transport(std::string_view name) {
    if (name == "tcp") {
        return make_tcp_transport();
    }
    if (name == "ucx") {
        return make_ucx_transport();
    }
    return invalid_argument("unknown transport '" + std::string(name) + "' (expected tcp or ucx)");
}

Status write_frame(Connection& conn, const EncodedFrame& frame, Timeout timeout) {
    const std::array<std::span<const uint8_t>, 2> pieces{std::span<const uint8_t>(frame.head),
                                                         frame.body};
    return conn.write(pieces, timeout);
}

FrameReader::FrameReader(Connection* conn, uint64_t max_payload_bytes)
    : conn_(conn), decoder_(max_payload_bytes) {}

Result<Timeout> FrameReader::bounded(Timeout timeout) const {
    if (!deadline_) {
        return timeout;
    }
    const auto left = std::chrono::ceil<Timeout>(*deadline_ - std::chrono::steady_clock::now());
    if (left <= Timeout(0)) {
        return deadline_exceeded("the transfer ran past its time limit");
    }
    return std::min(timeout, left);
}

bool FrameReader::has_input() { return decoder_.buffered_bytes() > 0 || conn_->available() > 0; }

Result<FrameView> FrameReader::read(Timeout timeout) {
    for (;;) {
        DSI_ASSIGN_OR_RETURN(auto frame, decoder_.next());
        if (frame) {
            return *frame;
        }
        const std::span<uint8_t> buf = decoder_.writable(kMinReadBytes);
        DSI_ASSIGN_OR_RETURN(const Timeout t, bounded(timeout));
        DSI_ASSIGN_OR_RETURN(const size_t n, conn_->read_some(buf, t));
        if (n == 0) {
            DSI_RETURN_IF_ERROR(decoder_.finish());
            return unavailable("end of stream: the peer closed the connection");
        }
        decoder_.commit(n);
    }
}

Result<ReadFrame> FrameReader::read_placing(Timeout timeout, const PlaceFn& place) {
    constexpr size_t kHeadAndPrefix = kFrameHeaderBytes + kLayerChunkPrefixBytes;
    for (;;) {
        DSI_ASSIGN_OR_RETURN(auto frame, decoder_.next());
        if (frame) {
            return ReadFrame{*frame, false};
        }
        DSI_ASSIGN_OR_RETURN(const auto peeked, decoder_.peek());
        const size_t buffered = decoder_.buffered_bytes();
        // What the next read may take: up to the end of a LayerChunk's prefix (then the
        // data may go straight into place), else to the end of this frame.
        size_t want = kHeadAndPrefix - std::min(buffered, kHeadAndPrefix);
        if (peeked) {
            const PartialFrame& p = *peeked;
            const size_t total = kFrameHeaderBytes + p.header.payload_bytes;
            if (p.header.type == MessageType::kLayerChunk &&
                p.payload.size() >= kLayerChunkPrefixBytes) {
                const auto memory = place(p.header, p.payload.first(kLayerChunkPrefixBytes));
                if (!memory.empty() &&
                    memory.size() == p.header.payload_bytes - kLayerChunkPrefixBytes) {
                    return read_placed(p, memory, timeout);
                }
                want = total - buffered;
            } else if (p.header.type != MessageType::kLayerChunk) {
                want = total - buffered;
            }
        }
        const std::span<uint8_t> buf = decoder_.writable(want).first(want);
        DSI_ASSIGN_OR_RETURN(const Timeout t, bounded(timeout));
        DSI_ASSIGN_OR_RETURN(const size_t n, conn_->read_some(buf, t));
        if (n == 0) {
            DSI_RETURN_IF_ERROR(decoder_.finish());
            return unavailable("end of stream: the peer closed the connection");
        }
        decoder_.commit(n);
    }
}

Result<ReadFrame> FrameReader::read_placed(const PartialFrame& peeked, std::span<uint8_t> memory,
                                           Timeout timeout) {
    const FrameHeader header = peeked.header;
    placed_prefix_.assign(peeked.payload.begin(), peeked.payload.begin() + kLayerChunkPrefixBytes);
    digester_.reset();
    digester_.update(peeked.digested_header);
    digester_.update(placed_prefix_);
    // Data bytes that came with the prefix (when the reads before ran past it).
    const auto early = peeked.payload.subspan(kLayerChunkPrefixBytes);
    std::copy(early.begin(), early.end(), memory.begin());
    size_t have = early.size();
    decoder_.skip_peeked(peeked);
    digester_.update(memory.first(have));
    while (have < memory.size()) {
        DSI_ASSIGN_OR_RETURN(const Timeout t, bounded(timeout));
        DSI_ASSIGN_OR_RETURN(const size_t n, conn_->read_some(memory.subspan(have), t));
        if (n == 0) {
            return data_loss("truncated frame: the stream ended " + std::to_string(have) +
                             " bytes into a LayerChunk's data");
        }
        // Hashed as it lands, while it is in cache (a second pass over the whole chunk
        // afterwards read it back from memory).
        digester_.update(memory.subspan(have, n));
        have += n;
    }
    if (digester_.digest() != header.digest) {
        return decoder_.digest_mismatch(header);
    }
    return ReadFrame{FrameView{header, placed_prefix_}, true};
}

}  // namespace dsi::transfer

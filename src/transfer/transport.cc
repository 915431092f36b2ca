#include "transfer/transport.h"

#include <array>

namespace dsi::transfer {

Status write_frame(Connection& conn, const EncodedFrame& frame, Timeout timeout) {
    const std::array<std::span<const uint8_t>, 2> pieces{std::span<const uint8_t>(frame.head),
                                                         frame.body};
    return conn.write(pieces, timeout);
}

FrameReader::FrameReader(Connection* conn, uint64_t max_payload_bytes)
    : conn_(conn), decoder_(max_payload_bytes) {}

bool FrameReader::has_input() { return decoder_.buffered_bytes() > 0 || conn_->available() > 0; }

Result<FrameView> FrameReader::read(Timeout timeout) {
    for (;;) {
        DSI_ASSIGN_OR_RETURN(auto frame, decoder_.next());
        if (frame) {
            return *frame;
        }
        const std::span<uint8_t> buf = decoder_.writable(kMinReadBytes);
        DSI_ASSIGN_OR_RETURN(const size_t n, conn_->read_some(buf, timeout));
        if (n == 0) {
            DSI_RETURN_IF_ERROR(decoder_.finish());
            return unavailable("end of stream: the peer closed the connection");
        }
        decoder_.commit(n);
    }
}

}  // namespace dsi::transfer

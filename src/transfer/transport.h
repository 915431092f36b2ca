// The byte transport under transfers, behind one interface (issue 18).
//
// Transport makes Listeners and Connections; a Connection moves bytes in order, with a
// timeout on every call, and is closed explicitly (or by its destructor). The default
// is framed TCP on Boost.Asio (make_tcp_transport, tcp_transport.cc); UCX's stream API
// is the option (make_ucx_transport, ucx_transport.cc, built where libucx is present);
// the fault-injecting decorator for tests is in fault_transport.h. make_transport picks
// one by name (the --kv-transport flag).
//
// FrameReader / write_frame put frames (frame.h) on a Connection: one write() per
// frame (header + payload prefix + the body view, gathered, never copied), and reads
// straight into the decoder's buffer.
// Thread model: a Connection, Listener or FrameReader is used by one thread at a time;
// a Transport may be shared.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "transfer/frame.h"

namespace dsi::transfer {

using Timeout = std::chrono::milliseconds;

class Connection {
public:
    virtual ~Connection() = default;
    // Writes every piece, in order. On an error or timeout the connection is unusable
    // (kUnavailable: closed or reset by the peer; kDeadlineExceeded).
    virtual Status write(std::span<const std::span<const uint8_t>> pieces, Timeout timeout) = 0;
    // Reads 1 .. buf.size() bytes; 0 when the peer closed its side (end of stream).
    // kDeadlineExceeded when nothing arrived in time. REQUIRES: !buf.empty().
    virtual Result<size_t> read_some(std::span<uint8_t> buf, Timeout timeout) = 0;
    // Bytes that can be read now without waiting.
    virtual size_t available() = 0;
    // No more writes: the peer reads end of stream after what was written.
    virtual void shutdown_write() = 0;
    virtual void close() = 0;
    virtual std::string peer_address() const = 0;
};

class Listener {
public:
    virtual ~Listener() = default;
    virtual Result<std::unique_ptr<Connection>> accept(Timeout timeout) = 0;
    virtual uint16_t port() const = 0;
    virtual void close() = 0;
};

class Transport {
public:
    virtual ~Transport() = default;
    // port 0: the system picks one (Listener::port says which).
    virtual Result<std::unique_ptr<Listener>> listen(const std::string& host, uint16_t port) = 0;
    virtual Result<std::unique_ptr<Connection>> connect(const std::string& host, uint16_t port,
                                                        Timeout timeout) = 0;
};

// TCP on Boost.Asio (TCP_NODELAY; one io_context per connection, run on the caller's
// thread for the duration of each call).
std::unique_ptr<Transport> make_tcp_transport();

// UCX (ucp stream API; one context per transport, one worker per connection, progressed
// on the caller's thread inside each call; UCX_TLS defaults to "tcp"). kFailedPrecondition
// when built without UCX (DSI_HAVE_UCX), UCX's error when it cannot start. Unlike TCP,
// a connect completes only while the server is in accept (no kernel backlog), and close
// waits up to 1 s for the peer to take the end of stream (docs/transfer.md).
Result<std::unique_ptr<Transport>> make_ucx_transport();

// "tcp" or "ucx"; kInvalidArgument for any other name.
Result<std::unique_ptr<Transport>> make_transport(std::string_view name);

// Writes one encoded frame (head, then body).
Status write_frame(Connection& conn, const EncodedFrame& frame, Timeout timeout);

// Where a LayerChunk's data may be read to: given the frame's header and its payload's
// prefix (kLayerChunkPrefixBytes), memory for exactly the rest of its payload, or empty.
using PlaceFn =
    std::function<std::span<uint8_t>(const FrameHeader& header, std::span<const uint8_t> prefix)>;

struct ReadFrame {
    FrameView frame;      // a placed frame's payload is its prefix only
    bool placed = false;  // its data is in the memory PlaceFn gave, the digest checked
};

// Reads frames from a connection.
class FrameReader {
public:
    FrameReader(Connection* conn, uint64_t max_payload_bytes = kDefaultMaxPayloadBytes);

    // The next frame (its payload lives until the next call); kUnavailable with "end of
    // stream" when the peer closed cleanly between frames; the decoder's error (digest,
    // malformed header, truncated) or the connection's otherwise.
    Result<FrameView> read(Timeout timeout);
    // As read(), with a zero-copy path for KV: a LayerChunk frame that `place` finds
    // memory for has its data read from the connection straight into that memory (reads
    // then stop at each frame's end, so no data is buffered ahead of the decision); the
    // frame's digest is checked over the placed bytes, and a mismatch is the decoder's
    // digest error. On an error the placed memory may hold partial or corrupt data.
    Result<ReadFrame> read_placing(Timeout timeout, const PlaceFn& place);
    // True when bytes of a next frame are buffered or readable now (read() may still
    // wait for the rest of that frame). Never blocks.
    bool has_input();
    // From now on every wait ends by `deadline` too (each read's timeout is cut to what
    // is left), and a read that starts or waits past it is kDeadlineExceeded: a peer
    // that sends a byte now and then cannot hold the reader beyond it.
    void set_deadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

private:
    // `timeout` cut to the deadline, or kDeadlineExceeded once it passed.
    Result<Timeout> bounded(Timeout timeout) const;
    Result<ReadFrame> read_placed(const PartialFrame& peeked, std::span<uint8_t> memory,
                                  Timeout timeout);

    Connection* conn_;
    FrameDecoder decoder_;
    FrameDigester digester_;  // a placed frame's digest, piece by piece
    std::vector<uint8_t> placed_prefix_;
    std::optional<std::chrono::steady_clock::time_point> deadline_;
};

// FrameReader reads into the decoder's buffer whenever it has at least this much room.
inline constexpr size_t kMinReadBytes = size_t{64} << 10;

}  // namespace dsi::transfer

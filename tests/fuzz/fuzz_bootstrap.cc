// libFuzzer entry for the UCX EP group's bootstrap messages (comm/internal/bootstrap.h):
// the join frame rank 0 reads from each rank, the answer (worker address table or error)
// each rank reads from rank 0, and the coordinator address. Input byte 0 picks:
//   0: the rest is a join frame (decode_join)
//   1: byte 1 is the group's size (byte % 9), the rest an answer (decode_answer)
//   2: byte 1 bit 0 allows port 0, the rest is a "host:port" (parse_host_port)
//   3: the rest is a byte stream read in pieces of (byte 1 % 16) + 1 bytes into a
//      FrameAssembler of at most 64 bytes a frame (the coordinator's reads)
// Checks: no crash or sanitizer report; a decoded frame re-encodes to the same bytes (a
// join of this version, a table), an error answer carries a real non-OK code, a parsed
// address has a host and a port in range; the frames assembled from a stream, re-framed,
// are the stream's bytes up to where it stopped (a whole frame or a refused header).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/internal/bootstrap.h"

using namespace dsi;
using namespace dsi::comm::internal;

namespace {

void join_mode(const std::vector<uint8_t>& in) {
    Result<JoinMessage> m = decode_join(in);
    if (!m.is_ok() || m->version != 1) {
        return;
    }
    DSI_CHECK(m->shape.size() == 6);
    FrameWriter w;  // encode_join's layout, from the decoded fields
    w.u32(0x4d435855);
    w.u32(m->version);
    w.u32(m->rank);
    for (int64_t v : m->shape) {
        w.i64(v);
    }
    w.bytes(m->address.data(), m->address.size());
    DSI_CHECK(w.data() == in, "a join frame does not re-encode to its bytes");
}

void answer_mode(int num_ranks, const std::vector<uint8_t>& in) {
    Result<std::vector<std::vector<uint8_t>>> table = decode_answer(in, num_ranks, "fuzz:1");
    if (table.is_ok()) {
        DSI_CHECK(table->size() == static_cast<size_t>(num_ranks));
        DSI_CHECK(encode_table(*table) == in, "a table does not re-encode to its bytes");
        return;
    }
    const StatusCode c = table.status().code();
    DSI_CHECK(c != StatusCode::kOk && c <= StatusCode::kDataLoss);
    (void)table.status().to_string();
}

void address_mode(bool allow_zero, const std::string& text) {
    Result<HostPort> hp = parse_host_port(text, allow_zero);
    if (hp.is_ok()) {
        DSI_CHECK(!hp->host.empty(), "an address without a host parsed");
        DSI_CHECK(hp->port >= (allow_zero ? 0 : 1) && hp->port <= 65535, "a port out of range");
    }
}

void stream_mode(size_t piece, const std::vector<uint8_t>& in) {
    FrameAssembler a(64);
    std::vector<uint8_t> framed;  // the frames, re-framed
    size_t pos = 0;
    while (pos < in.size()) {
        const std::span<uint8_t> space = a.space();
        DSI_CHECK(!space.empty(), "an assembler with no room before its frame is done");
        const size_t n = std::min({piece, space.size(), in.size() - pos});
        std::copy(in.begin() + static_cast<ptrdiff_t>(pos),
                  in.begin() + static_cast<ptrdiff_t>(pos + n), space.begin());
        pos += n;
        if (!a.received(n).is_ok()) {
            // A refused header: the last 4 bytes read announced more than 64.
            const size_t len = in[pos - 4] | (size_t{in[pos - 3]} << 8) |
                               (size_t{in[pos - 2]} << 16) | (size_t{in[pos - 1]} << 24);
            DSI_CHECK(len > 64, "a header within the bound was refused");
            pos -= 4;
            break;
        }
        if (a.done()) {
            const std::vector<uint8_t> f = a.take();
            DSI_CHECK(f.size() <= 64);
            for (int i = 0; i < 4; ++i) framed.push_back(static_cast<uint8_t>(f.size() >> (8 * i)));
            framed.insert(framed.end(), f.begin(), f.end());
        }
    }
    DSI_CHECK(framed.size() <= pos && std::equal(framed.begin(), framed.end(), in.begin()),
              "assembled frames differ from the stream");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) {
        return 0;
    }
    switch (data[0] % 4) {
        case 0:
            join_mode(std::vector<uint8_t>(data + 1, data + size));
            break;
        case 1:
            answer_mode(data[1] % 9, std::vector<uint8_t>(data + 2, data + size));
            break;
        case 3:
            stream_mode(data[1] % 16 + 1, std::vector<uint8_t>(data + 2, data + size));
            break;
        default:
            address_mode((data[1] & 1) != 0,
                         std::string(reinterpret_cast<const char*>(data + 2), size - 2));
            break;
    }
    return 0;
}

#include "serving/swa_fetch_wire.h"

#include "serving/internal/wire.h"
#include "serving/kv_handoff.h"  // kSwaStateSection

namespace dsi::serving {
namespace {

using internal::get_u32;
using internal::get_u64;
using internal::kSwaStateHeaderBytes;

constexpr uint32_t kFetchVersion = 1;
constexpr size_t kFetchRequestBytes = 32;

}  // namespace

std::vector<uint8_t> encode_swa_fetch_request(const kv::SwaStateKey& key) {
    std::vector<uint8_t> p = transfer::encode_state_chunk_prefix(kSwaFetchSection, 0);
    internal::put_u32(p, kFetchVersion);
    internal::put_u32(p, 0);
    internal::put_u64(p, key.chain.lo);
    internal::put_u64(p, key.chain.hi);
    internal::put_u64(p, static_cast<uint64_t>(key.position));
    return p;
}

Result<kv::SwaStateKey> decode_swa_fetch_request(const transfer::FrameView& frame) {
    if (frame.header.type != transfer::MessageType::kState) {
        return invalid_argument("SWA fetch request: not a State frame");
    }
    DSI_ASSIGN_OR_RETURN(transfer::StateChunkView chunk,
                         transfer::decode_state_chunk(frame.payload));
    if (chunk.name != kSwaFetchSection || chunk.offset_bytes != 0 ||
        chunk.data.size() != kFetchRequestBytes || get_u32(chunk.data.data()) != kFetchVersion) {
        return invalid_argument("SWA fetch request: malformed");
    }
    const uint8_t* p = chunk.data.data();
    return kv::SwaStateKey{kv::BlockKey{get_u64(p + 8), get_u64(p + 16)},
                           static_cast<int64_t>(get_u64(p + 24))};
}

Result<kv::SwaState> decode_swa_fetch_answer(const transfer::FrameView& frame,
                                             const kv::SwaStateKey& want, uint64_t state_bytes,
                                             std::string_view from) {
    if (frame.header.type == transfer::MessageType::kFailure) {
        DSI_ASSIGN_OR_RETURN(transfer::FailureMessage f, transfer::decode_failure(frame.payload));
        return Status(f.code, "SWA fetch from " + std::string(from) + ": " + f.message);
    }
    if (frame.header.type != transfer::MessageType::kState) {
        return invalid_argument("SWA fetch: a " +
                                std::string(transfer::message_type_name(frame.header.type)) +
                                " frame instead of the state");
    }
    DSI_ASSIGN_OR_RETURN(transfer::StateChunkView chunk,
                         transfer::decode_state_chunk(frame.payload));
    const uint64_t want_bytes = kSwaStateHeaderBytes + state_bytes;
    if (chunk.name != kSwaStateSection || chunk.offset_bytes != 0 ||
        chunk.data.size() != want_bytes) {
        return invalid_argument("SWA fetch: an answer '" + chunk.name + "' of " +
                                std::to_string(chunk.data.size()) + " bytes, expected " +
                                std::to_string(want_bytes));
    }
    const uint8_t* p = chunk.data.data();
    if (get_u32(p) != internal::kSwaStateVersion ||
        !internal::valid_traffic_class(get_u32(p + 4))) {
        return invalid_argument("SWA fetch: state version or traffic class");
    }
    kv::SwaState st;
    st.traffic_class = static_cast<kvstore::TrafficClass>(get_u32(p + 4));
    st.key.chain = kv::BlockKey{get_u64(p + 8), get_u64(p + 16)};
    st.key.position = static_cast<int64_t>(get_u64(p + 24));
    if (!(st.key == want)) return invalid_argument("SWA fetch: the answer names another state");
    st.bytes.assign(chunk.data.begin() + kSwaStateHeaderBytes, chunk.data.end());
    return st;
}

}  // namespace dsi::serving

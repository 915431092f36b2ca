// The engine RPC: how a router hands a generation to an engine in another process and
// reads its token events back (issue 18). HTTP/1.1 on the engine's API port:
//
//   POST /internal/v1/generate   body: one JSON object (encode_generation)
//   200, Content-Type: application/x-ndjson, chunked: one JSON line per Update
//   (encode_update), the last with "finished": true. Errors before the first line
//   are a JSON error reply with the HTTP status of the Status code.
//
// The route exists only on an engine started for a cluster (`serve --role ...`) and
// takes the server's API keys like /v1/. The request carries token ids, sampling
// (with the seed the router assigned: a re-routed request samples the same tokens),
// the cache salt, the time left of the deadline, the grammar source with its options
// (the whole grammar::GrammarSpec: the engine compiles it; compiles are cached) -- never
// a compiled mask -- and, for a failover, the output tokens the client already has
// ("resume", GenerateRequest::resume_output). A client that closes the connection
// aborts the generation (as for /v1/).
//
// Thread model: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "server/api.h"
#include "server/generation_service.h"

namespace dsi::server {

inline constexpr std::string_view kEngineRpcPath = "/internal/v1/generate";
// GET: the engine's SWA-state announcements (swa_announce.h).
inline constexpr std::string_view kSwaStatesPath = "/internal/v1/swa_states";
// GET on a router: holders of SWA states in its part of the directory (swa_announce.h).
inline constexpr std::string_view kSwaLookupPath = "/internal/v1/swa_lookup";

// `timeout_ms` is the time left of the request's deadline (0: none).
std::string encode_generation(const Generation& g, int64_t timeout_ms);

// The engine's side: INVALID_ARGUMENT naming the field for a malformed body, the
// server's limits as for /v1/ (prompt tokens, max_tokens, vocabulary), and the grammar
// compiled through ctx.structured_output (UNIMPLEMENTED without one). The deadline is
// set on ctx's clock.
Result<Generation> decode_generation(const ApiContext& ctx, std::string_view body);

// A chain key as 32 hex digits, hi first (as a TransferId prints), and back (false
// unless exactly 32 hex digits). The SWA fields of the RPC and of swa_announce.h.
std::string chain_key_hex(const kv::BlockKey& key);
bool parse_chain_key_hex(std::string_view s, kv::BlockKey* key);

// One Update as one line (with its '\n').
std::string encode_update(const Update& u);
// INVALID_ARGUMENT for a malformed line (the caller treats the stream as broken).
Result<Update> decode_update(std::string_view line);

}  // namespace dsi::server

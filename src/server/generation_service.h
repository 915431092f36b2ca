// GenerationService: what the HTTP layer submits generations to. Two implementations:
// EngineService (engine_service.h, the engine in this process) and the router's
// RemoteService (router/, engines in other processes over the engine RPC,
// engine_rpc.h). The HTTP server, the protocol adapters and the renderers are the same
// for both, so `dsinfer router` answers the four APIs exactly as `serve` does.
//
// Each generation carries a Sink that receives Updates: one per engine TokenEvent
// (plus a final one for a rejected submission). Sinks run on the service's thread and
// must only hand the update to their owner (post to an executor, push to a queue);
// never block. A ticket (chosen by the caller) names the generation in abort(), so an
// abort can be queued before the service has started it.
//
// Thread model: every method is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "protocol/renderer.h"
#include "protocol/structured_output.h"
#include "serving/kv_handoff.h"
#include "serving/swa_fetch.h"

namespace dsi::server {

using Ticket = uint64_t;

using TokenOut = protocol::OutputToken;

// One engine event of a generation (protocol::Renderer reads it) for the ticket's
// sink; `error` non-OK: the engine refused the request (finished is true).
// The prefill engine's hand-over of a generation's KV to a decode engine (issue 18).
struct HandoffResult {
    bool ok = false;     // the decode engine stored every block (or there was none)
    int64_t blocks = 0;  // blocks sent
    int64_t bytes = 0;   // KV bytes sent
    int64_t micros = 0;  // from the export to the decode engine's Ack
    std::string error;   // why not, when !ok
};

struct Update : protocol::OutputUpdate {
    Ticket ticket = 0;
    Status error;
    // The engine's copy of a finished prefill's blocks (GenerateRequest::export_kv), for
    // HandoffService; never on the wire.
    std::shared_ptr<const kv::KvExport> kv_export;
    // Set on the final update of a generation started with Generation::handoff when
    // the prefill part is done and the rest belongs to the decode engine (the router
    // continues it there); finished is true, reason kLength.
    std::optional<HandoffResult> handoff;
};
using Sink = std::function<void(Update)>;

// What the HTTP layer shows on /metrics; refreshed by the service.
struct ServiceStats {
    engine::EngineStats engine;
    int64_t queue_depth = 0;  // commands waiting for the engine thread
    int64_t num_running = 0;  // generations admitted and not finished
    int64_t num_step_errors = 0;
    // Figures a service adds to /metrics beyond the engine's: (name, help, value), the
    // name without the dsinfer_ prefix (the router's routing and failover counts); a name
    // ending in _total is exported as a counter, any other as a gauge (a level).
    struct Counter {
        std::string name;
        std::string help;
        int64_t value = 0;
    };
    std::vector<Counter> extra_counters;
};

// A generation as the HTTP layer hands it over: the engine request (grammar compiled
// into request.mask) and the grammar it was compiled from, which a remote service
// ships instead of the compiled mask.
struct Generation {
    engine::GenerateRequest request;
    std::optional<protocol::StructuredRequest> structured;
    // Disaggregated prefill (issue 18): run only to the first token, then send the
    // prompt's KV to this decode engine and end with Update::handoff (HandoffService).
    std::optional<serving::HandoffTarget> handoff;
    // S-KV-8 (issue 18): the router's directory says another engine holds the SWA state
    // this prompt's hit starts from; pull it before the prefill (SwaPullService).
    std::optional<serving::SwaPullTarget> swa_pull;
};

class GenerationService {
public:
    virtual ~GenerationService() = default;
    virtual void start(Ticket ticket, Generation generation, Sink sink) = 0;
    virtual void abort(Ticket ticket) = 0;
    // Aborts every running generation (their sinks see kAbort).
    virtual void abort_all() = 0;
    virtual ServiceStats stats_snapshot() const = 0;
};

}  // namespace dsi::server

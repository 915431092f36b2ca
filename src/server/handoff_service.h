// HandoffService: the prefill engine's side of the KV hand-over (issue 18,
// docs/cluster.md "KV hand-over"), a GenerationService in front of the engine's.
//
// A generation that arrives with Generation::handoff (the router chose a decode engine
// for it) runs on the engine to its first token only (max_tokens 1, export_kv); that
// token goes to the caller at once, as an ordinary update. When the engine finished it
// by length, its export (the prompt's full blocks) is sent to the decode engine's inbox
// on one of this service's sender threads (serving::send_kv_export), and the final
// update follows with Update::handoff: ok once the decode engine stored every block,
// or the error (the router continues on the decode engine either way; without the
// blocks it computes the prompt again). A first token that ends the generation (a stop)
// is the final update as usual, with no hand-over; so is a generation with max_tokens 1.
// Generations without `handoff` pass through unchanged.
//
// Aborting a generation whose KV is being sent aborts the send (kCancelled on the
// wire); its final update is kAbort. Nothing is queued without bound: at most
// `max_queued` sends wait for a thread; more end at once with a failed hand-over.
//
// Thread model: thread-safe. Sinks are called on the inner service's thread (the first
// token, pass-through updates) or on a sender thread (the final update of a hand-over),
// one update at a time per generation.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "server/generation_service.h"
#include "serving/kv_handoff.h"

namespace dsi::server {

struct HandoffServiceOptions {
    transfer::HelloMessage self;  // this engine (node id, role, incarnation)
    transfer::Timeout io_timeout{10'000};
    int num_threads = 2;   // sends at once
    int max_queued = 64;   // sends waiting for a thread
    // More counters for /metrics (e.g. the decode side's KvInbox); may be null.
    std::function<std::vector<ServiceStats::Counter>()> extra_counters;
};

struct HandoffStats {
    int64_t num_sent = 0;       // hand-overs the decode engine acknowledged
    int64_t num_failed = 0;     // sends that failed (refused, broken, timed out, queue full)
    int64_t num_empty = 0;      // hand-overs with no full block to send
    int64_t num_aborted = 0;    // aborted while waiting or sending
    int64_t blocks_sent = 0;
    int64_t bytes_sent = 0;
    int64_t sent_micros = 0;  // export -> Ack of the acknowledged hand-overs, summed
};

class HandoffService final : public GenerationService {
public:
    // REQUIRES: `inner` outlives this service and has stopped calling its sinks before
    // this service goes (EngineService::stop first). `transport` null: TCP.
    HandoffService(GenerationService* inner, HandoffServiceOptions options,
                   std::unique_ptr<transfer::Transport> transport = nullptr);
    ~HandoffService() override;  // aborts the sends in progress and joins the threads

    void start(Ticket ticket, Generation generation, Sink sink) override;
    void abort(Ticket ticket) override;
    void abort_all() override;
    // The inner service's, plus the hand-over counters (extra_counters).
    ServiceStats stats_snapshot() const override;
    HandoffStats handoff_stats() const DSI_EXCLUDES(mu_);

private:
    struct Job {
        Ticket ticket = 0;
        std::shared_ptr<const kv::KvExport> kv;
        serving::HandoffTarget target;
        Sink sink;
        Update last;  // the engine's final update (tokens already delivered)
        int64_t start_ns = 0;
        std::shared_ptr<std::atomic<bool>> aborted;
    };
    void on_first_finish(Ticket ticket, serving::HandoffTarget target, const Sink& sink,
                         Update u);
    void sender_loop();
    void finish(Job& job, HandoffResult result);

    GenerationService* const inner_;
    const HandoffServiceOptions options_;
    std::unique_ptr<transfer::Transport> transport_;
    mutable Mutex mu_;
    CondVar cv_;
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    std::deque<Job> queue_ DSI_GUARDED_BY(mu_);
    // Hand-overs queued or sending, by ticket: their abort flag.
    std::map<Ticket, std::shared_ptr<std::atomic<bool>>> active_ DSI_GUARDED_BY(mu_);
    HandoffStats stats_ DSI_GUARDED_BY(mu_);
    std::vector<std::thread> threads_;
};

}  // namespace dsi::server

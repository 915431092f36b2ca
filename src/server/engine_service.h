// EngineService: the one thread that owns an engine (an engine::Engine, or the DpFront of
// an --ep group with attention data parallelism: engine::StepEngine) and serves it to the
// HTTP layer (as its GenerationService, generation_service.h) through a typed command
// queue (submit / abort / stop), so no lock is held around the engine and no HTTP
// thread ever touches it (STYLE 7).
//
// Each submitted generation carries a Sink that receives Updates: one per engine
// TokenEvent (plus a final one for a rejected submission). Sinks run on the engine
// thread and must only hand the update to their owner (post to an executor, push to
// a queue); never block. A ticket (chosen by the caller) names the generation in
// abort(), so an abort can be queued before the engine has assigned a RequestId;
// commands are applied in FIFO order, so an abort after a submit always finds it.
//
// Thread model: submit / abort / stats_snapshot / stop are thread-safe; the engine
// itself and every Sink call live on the service's own thread. The loop waits for
// commands with a deadline (kIdleWait) when the engine has no work.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "engine/engine.h"
#include "server/generation_service.h"

namespace dsi::server {

class EngineService final : public GenerationService {
public:
    // REQUIRES: `engine` was created on any thread but is used by nobody else.
    explicit EngineService(std::unique_ptr<engine::Engine> engine);
    // Borrows the engine (serving::Replica owns it, or the caller its DpFront). REQUIRES:
    // as above, and `engine` outlives the service.
    explicit EngineService(engine::StepEngine* engine);
    ~EngineService() override;  // stop() + join

    void submit(Ticket ticket, engine::GenerateRequest request, Sink sink);
    // GenerationService: the local engine runs the compiled mask; `structured` is not
    // needed here.
    void start(Ticket ticket, Generation generation, Sink sink) override {
        submit(ticket, std::move(generation.request), std::move(sink));
    }
    void abort(Ticket ticket) override;
    // Aborts every running generation (their sinks see kAbort).
    void abort_all() override;
    ServiceStats stats_snapshot() const override;
    // Ends the thread after the commands queued so far; running generations are
    // aborted. Idempotent.
    void stop();
    // Wakes the engine thread now if it waits for work (e.g. a hand-over's ask queued
    // on the engine's engine::KvLanding). Thread-safe.
    void wake();

private:
    struct Command {
        enum class Kind { kSubmit, kAbort, kAbortAll } kind = Kind::kSubmit;
        Ticket ticket = 0;
        engine::GenerateRequest request;
        Sink sink;
    };
    void loop();
    void apply(Command& c);
    void publish_stats();

    std::unique_ptr<engine::Engine> owned_engine_;  // null when borrowed
    engine::StepEngine* engine_ = nullptr;
    mutable Mutex mu_;
    CondVar cv_;
    std::deque<Command> queue_ DSI_GUARDED_BY(mu_);
    bool stopping_ DSI_GUARDED_BY(mu_) = false;
    ServiceStats stats_ DSI_GUARDED_BY(mu_);
    // Engine thread only.
    std::unordered_map<Ticket, engine::RequestId> running_;
    std::unordered_map<engine::RequestId, Ticket> tickets_;
    int64_t num_step_errors_ = 0;
    std::thread thread_;
};

}  // namespace dsi::server

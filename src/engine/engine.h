// Engine: the offline serving core of one model replica. Requests come in with a
// streaming callback; each step mixes prefill chunks and decode tokens of many
// sequences in one forward_batch, with KV in 128-token blocks shared through the
// prefix cache.
//
// Request lifecycle (per completion; a request with n > 1 has n sequences):
//   waiting -> prefilling (one or more chunks) -> decoding -> finished
//   any state -> finished(abort | deadline)  (abort frees all blocks at once)
//   prefilling/decoding -> waiting on preemption (blocks released; recomputed later
//   from prompt + tokens generated so far, giving the same tokens: S-ENG-6/7)
// Completions 1..n-1 of a request wait until completion 0 has finished its prefill,
// then reuse its full prompt blocks through the prefix index.
//
// Step loop (S-ASYNC), on the thread that calls step()/run():
//   schedule(N+1) -> submit(N+1) -> wait(N) -> post-process(N)
// With async on (the default), a worker thread runs forward + sampling of step N
// while the host schedules N+1: the host assumes N succeeds (its decode tokens
// exist), and step N+1's decode inputs are the tokens sampled in N, which the worker
// resolves itself, so they never wait for the host. A token found to end a sequence
// in post-processing cancels the already-scheduled next token of that sequence (its
// result is dropped). With async off, the host waits for each step before
// scheduling the next (for comparison). Block data hazards are ordered by steps: a
// block freed while step N is in flight is only handed out to step N+2 or later,
// and a block enters the prefix index only after the step that completed it.
//
// Sampling runs on the worker: penalties see the sequence's own tokens only and
// randomness is keyed by (seed, position), so a request's tokens do not depend on
// its neighbours (with the model's batch-invariant kernels, S-ENG-6).
//
// Thread model: add_request / abort / step / run / stats are called from one thread
// (the owner); callbacks run on that thread inside step(). TokenMaskProvider::fill
// runs on the worker thread. The model must not be used by anyone else meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "model/deepseek.h"
#include "sampling/sampler.h"

namespace dsi {
class Tokenizer;
}

namespace dsi::engine {

using RequestId = int64_t;

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kDeadline, kError };
const char* finish_reason_name(FinishReason r);

struct EngineOptions {
    bool async = true;  // S-ENG-5: overlap host work with the forward pass
    bool prefix_cache = true;
    int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
    int64_t kv_cache_bytes = int64_t{2} << 30;
    int64_t max_model_len = 0;       // 0: the model's max_position_embeddings
    std::string model_id = "model";  // part of the prefix-cache salt
    SchedulerConfig scheduler;
    bool record_logits = false;            // pass each sampled row's logits to the callback (tests)
    const Tokenizer* tokenizer = nullptr;  // needed for text and stop strings
};

struct GenerateRequest {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    std::string cache_salt;   // tenants with different salts never share prefix blocks
    int64_t deadline_ns = 0;  // on the engine's Env clock; 0: none
    // Structured output; shared by the request's completions (reason: the caller
    // keeps it to inspect, the worker thread uses it until the request ends).
    std::shared_ptr<TokenMaskProvider> mask;
};

struct TokenEvent {
    RequestId request_id = 0;
    int32_t index = 0;   // completion index (n > 1)
    int32_t token = -1;  // -1: no token (finish-only event)
    std::string text;    // new text (with a tokenizer; stop strings cut here)
    float logprob = 0.0f;
    std::span<const std::pair<int32_t, float>> top_logprobs;
    std::span<const float> logits;  // record_logits only; valid during the callback
    bool finished = false;
    FinishReason reason = FinishReason::kNone;
};
using StreamCallback = std::function<void(const TokenEvent&)>;

struct EngineStats {
    int64_t num_requests = 0;
    int64_t num_finished = 0;
    int64_t prompt_tokens = 0;            // admitted prompt tokens (per completion)
    int64_t cached_prompt_tokens = 0;     // of which taken from the prefix cache
    int64_t computed_prefill_tokens = 0;  // prefill tokens run through the model
    int64_t output_tokens = 0;
    int64_t steps = 0;
    int64_t preemptions = 0;
    int64_t forward_ns = 0;   // worker busy time
    int64_t host_gap_ns = 0;  // worker idle between consecutive steps while work existed
    kv::BlockPoolStats pool;
};

class Engine {
public:
    // REQUIRES: model and env outlive the engine.
    static Result<std::unique_ptr<Engine>> create(DeepseekModel* model, EngineOptions options,
                                                  Env* env);
    ~Engine();

    // INVALID_ARGUMENT (bad sampling, empty prompt, ids outside the vocabulary),
    // OUT_OF_RANGE (prompt + max_tokens over max_model_len), RESOURCE_EXHAUSTED (the
    // request could never fit in the KV pool).
    Result<RequestId> add_request(GenerateRequest request, StreamCallback callback);
    // Finishes the request now (callback gets a finish event with kAbort) and frees
    // its blocks. NOT_FOUND if unknown or already finished.
    Status abort(RequestId id);
    // One iteration of the step loop. Errors from the model are fatal for the engine.
    Status step();
    // Steps until no request is left.
    Status run();
    bool has_work() const;
    EngineStats stats() const;
    // The pool's invariants plus: every block's refcount equals the references the
    // sequences hold. Call between steps.
    Status check_invariants() const;

    struct Impl;

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsi::engine

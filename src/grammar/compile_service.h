// CompileService: grammar compilation decoupled from inference (SPEC S-SO). Requests
// submit a grammar (JSON Schema, json_object, regex, GBNF EBNF) for a vocabulary and
// get a CompileHandle; a pool of worker threads compiles it into a CompiledGrammar
// while the request waits outside the engine, so the step loop never blocks on a
// compile.
//
//   - Cache: an LRU of compiled grammars keyed by (kind, the spec's JSON options,
//     canonical text, vocabulary fingerprint). Canonical text: JSON Schema is parsed and
//     re-serialised compactly (member order kept: it is the output order); regex / EBNF text as
//     given. The full key is compared, so a hash collision can never return a wrong grammar. A hit
//     completes the handle inside submit(). Errors are not cached.
//   - De-duplication: a submit whose key is queued or compiling joins that compile
//     (one compile, every waiter gets the same CompiledGrammar).
//   - Cancellation: dropping (or cancel()ing) a handle withdraws its waiter; a queued
//     compile with no waiter left is removed from the queue and never runs. A compile
//     already running finishes and is cached (its work is done), nobody is notified.
//   - Deadlines (on the Env clock, 0 = none): a waiter whose deadline has passed gets
//     DEADLINE_EXCEEDED (when a worker picks the job up, or when the holder polls /
//     waits); a job whose waiters have all expired is not compiled. A compile that
//     has started is bounded by the grammar Limits, not interrupted.
//   - Bounded queue: submit() fails RESOURCE_EXHAUSTED when max_queue jobs wait.
//
// Thread model: every method of CompileService and CompileHandle is thread-safe.
// Callbacks run on a worker thread (or inside submit() on a cache hit, or inside a
// poll / wait that notices an expired deadline) with no lock held; they must not block
// for long. A callback already handed out may still run if cancel() races with it. The destructor
// cancels queued jobs (their waiters get CANCELLED), waits for running compiles and joins the
// workers. REQUIRES: the Env outlives the service; a handle may outlive the service.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/table_warmup.h"
#include "grammar/vocabulary.h"

namespace dsi::grammar {

enum class GrammarKind : uint8_t { kJsonSchema, kJsonObject, kRegex, kEbnf };
const char* grammar_kind_name(GrammarKind kind);

struct GrammarSpec {
    GrammarKind kind = GrammarKind::kJsonSchema;
    std::string text;  // schema JSON / regex (full match) / GBNF; ignored for json_object
    // Per request, JSON Schema and json_object only (JsonSchemaOptions): set on top of
    // the service's options; part of the cache key.
    bool flexible_whitespace = false;
    bool any_property_order = false;
};

// Compiles `spec` on the calling thread (the service's default compile function);
// the spec's flexible_whitespace / any_property_order turn those options on.
Result<Grammar> compile_grammar(const GrammarSpec& spec, const JsonSchemaOptions& options = {});

struct CompileServiceOptions {
    int num_workers = 2;
    size_t max_queue = 256;        // queued (not yet running) jobs
    size_t cache_entries = 256;    // compiled grammars kept (LRU)
    JsonSchemaOptions json;        // limits for every front end (json.limits)
    MatcherOptions matcher;        // for the CompiledGrammars made
    // Injected compile function (tests); default compile_grammar(spec, json).
    std::function<Result<Grammar>(const GrammarSpec&)> compile;
};

struct CompileServiceStats {
    int64_t submitted = 0;
    int64_t cache_hits = 0;
    int64_t joined = 0;     // de-duplicated onto a queued / running compile
    int64_t compiled = 0;   // compiles run (ok or not)
    int64_t failed = 0;     // compiles that returned an error
    int64_t cancelled = 0;  // jobs dropped before running (no waiter left)
    int64_t expired = 0;    // waiters that got DEADLINE_EXCEEDED
    int64_t rejected = 0;   // RESOURCE_EXHAUSTED at submit
    int64_t cache_entries = 0;
    int64_t queued = 0;
    int64_t compile_ns_total = 0;
};

using CompileResult = Result<std::shared_ptr<const CompiledGrammar>>;
using CompileCallback = std::function<void(const CompileResult&)>;

class CompileService;

// One request's wait for a compiled grammar. Dropping it cancels the wait.
class CompileHandle {
public:
    ~CompileHandle();
    CompileHandle(const CompileHandle&) = delete;
    CompileHandle& operator=(const CompileHandle&) = delete;

    bool ready();
    // The result when ready (or DEADLINE_EXCEEDED once the deadline passed), else
    // UNAVAILABLE.
    CompileResult poll();
    // Blocks up to `timeout_ns` of real time; UNAVAILABLE if still not ready.
    CompileResult wait_for(int64_t timeout_ns);
    // Withdraws this waiter (idempotent). A pending result is never delivered.
    void cancel();

    struct Waiter;  // internal

private:
    friend class CompileService;
    explicit CompileHandle(std::shared_ptr<Waiter> w) : w_(std::move(w)) {}
    std::shared_ptr<Waiter> w_;
};

class CompileService {
public:
    explicit CompileService(CompileServiceOptions options = {}, Env* env = Env::default_env());
    ~CompileService();
    CompileService(const CompileService&) = delete;
    CompileService& operator=(const CompileService&) = delete;

    // Builds the shared position tables most schemas meet (table_warmup.h) into this
    // service's table cache, on the calling thread (~0.25 s at the V3 vocabulary); the
    // server calls it once at start. Safe while requests compile.
    WarmupStats warm_table_cache(const std::shared_ptr<const Vocabulary>& vocab);

    // Starts (or joins, or finds cached) the compile of `spec` for `vocab`.
    // `deadline_ns` is on the Env clock (0: none). `callback` (optional) gets the
    // result once, unless the handle is cancelled / dropped first.
    // RESOURCE_EXHAUSTED when the queue is full; INVALID_ARGUMENT for a JSON Schema
    // that is not JSON; REQUIRES: vocab != nullptr.
    Result<std::unique_ptr<CompileHandle>> submit(const GrammarSpec& spec,
                                                  std::shared_ptr<const Vocabulary> vocab,
                                                  int64_t deadline_ns = 0,
                                                  CompileCallback callback = nullptr);
    CompileServiceStats stats() const;

    struct Core;  // internal, shared with handles

private:
    std::shared_ptr<Core> core_;
};

}  // namespace dsi::grammar

// The engine's step loop: schedule -> forward -> sample -> post-process (S-ASYNC),
// with the host scheduling step N+1 while a worker runs step N.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "base/logging.h"
#include "kv/paged_kv_cache.h"
#include "sampling/stop.h"
#include "tokenizer/tokenizer.h"

namespace dsi::engine {
namespace {

int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Immutable after add_request; shared by the host and the worker (hence shared_ptr).
struct RequestShared {
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    std::shared_ptr<TokenMaskProvider> mask;
};

// One sequence's part of a planned step.
struct StepItem {
    int64_t seq_id = 0;
    uint32_t epoch = 0;
    std::vector<int32_t> tokens;  // empty: decode; the input is the worker's last sample
    int64_t start_pos = 0;
    kv::PagedKvCache cache;  // a copy of the block table: the host may grow its own
    bool sample = false;
    // The first item of an epoch (re)creates the worker's state of the sequence.
    bool init = false;
    std::shared_ptr<const RequestShared> req;
    uint64_t seed = 0;
    std::vector<int32_t> output;  // tokens generated before this epoch
};

struct StepPlan {
    std::vector<StepItem> items;
    std::vector<int64_t> release;  // worker state to drop (finished sequences)
};

struct ItemResult {
    int64_t seq_id = 0;
    uint32_t epoch = 0;
    int64_t num_tokens = 0;
    bool sampled = false;
    SampledToken token;
    std::vector<float> logits;
};

struct StepResult {
    Status status;
    std::vector<ItemResult> items;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
};

// The device side: runs forward + sampling, owns per-sequence sampling state. Runs
// inline (async off) or on its own thread fed by a queue (async on).
class Worker {
public:
    Worker(DeepseekModel* model, bool record_logits)
        : model_(model),
          record_logits_(record_logits),
          vocab_(model->config().vocab_size),
          eos_(static_cast<int32_t>(model->config().eos_token_id)) {}
    ~Worker() { stop(); }

    void start() {
        thread_ = std::thread([this] { loop(); });
    }
    void stop() {
        if (!thread_.joinable()) return;
        {
            std::lock_guard<std::mutex> l(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void submit(StepPlan plan) {
        if (!thread_.joinable()) {
            done_.push_back(execute(plan));
            return;
        }
        {
            std::lock_guard<std::mutex> l(mu_);
            todo_.push_back(std::move(plan));
        }
        cv_.notify_all();
    }
    StepResult wait() {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return !done_.empty(); });
        StepResult r = std::move(done_.front());
        done_.pop_front();
        return r;
    }

private:
    struct WorkerSeq {
        std::shared_ptr<const RequestShared> req;
        SamplingParams params;  // with this completion's seed
        std::vector<int32_t> output;
        int32_t last = 0;
        uint32_t epoch = 0;
    };

    void loop() {
        std::unique_lock<std::mutex> l(mu_);
        while (true) {
            cv_.wait(l, [this] { return stop_ || !todo_.empty(); });
            if (todo_.empty()) return;  // stop_ and drained
            StepPlan plan = std::move(todo_.front());
            todo_.pop_front();
            l.unlock();
            StepResult r = execute(plan);
            l.lock();
            done_.push_back(std::move(r));
            cv_.notify_all();
        }
    }

    StepResult execute(StepPlan& plan) {
        StepResult r;
        r.start_ns = steady_ns();
        for (int64_t id : plan.release) seqs_.erase(id);
        steps_.clear();
        inputs_.assign(plan.items.size(), 0);
        for (size_t i = 0; i < plan.items.size(); ++i) {
            StepItem& it = plan.items[i];
            if (it.init) {
                WorkerSeq ws;
                ws.req = it.req;
                ws.params = it.req->sampling;
                ws.params.seed = it.seed;
                ws.output = std::move(it.output);
                ws.epoch = it.epoch;
                seqs_[it.seq_id] = std::move(ws);
            }
            WorkerSeq& ws = seqs_.at(it.seq_id);
            DSI_CHECK_EQ(ws.epoch, it.epoch);
            std::span<const int32_t> toks = it.tokens;
            if (toks.empty()) {
                // S-ASYNC: the decode input is the token this worker sampled last; it
                // never goes through the host. (A token of -1 ended the sequence; the
                // host drops this result.)
                inputs_[i] = std::max(ws.last, 0);
                toks = std::span<const int32_t>(&inputs_[i], 1);
            }
            steps_.push_back({toks, it.start_pos, &it.cache, false});
        }
        r.status = model_->forward_batch(steps_, out_);
        if (r.status.is_ok()) {
            for (size_t i = 0; i < plan.items.size(); ++i) {
                const StepItem& it = plan.items[i];
                ItemResult ir;
                ir.seq_id = it.seq_id;
                ir.epoch = it.epoch;
                ir.num_tokens = static_cast<int64_t>(steps_[i].tokens.size());
                if (it.sample) {
                    WorkerSeq& ws = seqs_.at(it.seq_id);
                    std::span<const float> row(out_.logits.data() + out_.logit_row[i] * vocab_,
                                               static_cast<size_t>(vocab_));
                    SampleContext ctx{ws.req->prompt, ws.output, eos_, ws.req->mask.get()};
                    const uint64_t position = static_cast<uint64_t>(it.start_pos + ir.num_tokens);
                    ir.sampled = true;
                    ir.token = sampler_.sample(row, ws.params, ctx, position);
                    ws.last = ir.token.token;
                    if (ir.token.token >= 0) ws.output.push_back(ir.token.token);
                    if (record_logits_) ir.logits.assign(row.begin(), row.end());
                }
                r.items.push_back(std::move(ir));
            }
        }
        r.end_ns = steady_ns();
        return r;
    }

    DeepseekModel* model_;
    bool record_logits_;
    int64_t vocab_;
    int32_t eos_;
    std::unordered_map<int64_t, WorkerSeq> seqs_;
    Sampler sampler_;
    BatchOutput out_;
    std::vector<SequenceStep> steps_;
    std::vector<int32_t> inputs_;

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<StepPlan> todo_;    // GUARDED_BY(mu_)
    std::deque<StepResult> done_;  // GUARDED_BY(mu_) (inline mode: owner only)
    bool stop_ = false;            // GUARDED_BY(mu_)
    std::thread thread_;
};

struct Sequence {
    int64_t id = 0;  // also the arrival order
    RequestId request_id = 0;
    int32_t index = 0;
    uint64_t seed = 0;
    std::shared_ptr<const RequestShared> req;
    kv::BlockKey salt;
    int64_t deadline_ns = 0;
    std::vector<int32_t> tokens;  // prompt + generated tokens the host knows
    int64_t num_prompt = 0;
    std::vector<kv::BlockKey> keys;  // chain keys of the full blocks of `tokens`
    std::vector<kv::BlockId> blocks;
    int64_t prefill_target = 0;  // tokens to compute before decoding, this epoch
    int64_t num_computed = 0;    // KV rows computed or in flight
    int64_t num_confirmed = 0;   // KV rows whose step has completed
    int64_t num_published = 0;   // blocks put in the prefix index
    int64_t num_sampled = 0;     // output tokens known or in flight
    uint32_t epoch = 0;
    bool running = false;
    bool init_sent = false;
    bool gated = false;  // completion > 0 waiting for completion 0's prefill
    std::unique_ptr<IncrementalDecoder> decoder;
    std::unique_ptr<StopMatcher> stop;

    int64_t num_output() const { return static_cast<int64_t>(tokens.size()) - num_prompt; }
};

struct RequestState {
    std::shared_ptr<const RequestShared> req;
    StreamCallback callback;
    std::vector<int64_t> seq_ids;
    int32_t num_live = 0;
};

}  // namespace

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kAbort:
            return "abort";
        case FinishReason::kDeadline:
            return "deadline";
        case FinishReason::kError:
            return "error";
    }
    return "?";
}

struct Engine::Impl {
    DeepseekModel* model;
    EngineOptions options;
    Env* env;
    Scheduler scheduler;
    std::unique_ptr<kv::BlockPool> pool;
    Worker worker;
    int64_t vocab = 0;
    int32_t eos = -1;
    int64_t max_model_len = 0;

    std::map<int64_t, Sequence> seqs;  // by id = arrival order
    std::vector<int64_t> running;      // admission order
    std::unordered_map<RequestId, RequestState> requests;
    std::vector<int64_t> pending_release;
    RequestId next_request = 1;
    int64_t next_seq = 1;
    int in_flight = 0;
    int64_t prev_end_ns = 0;
    Status fatal;
    EngineStats stats;

    Impl(DeepseekModel* m, EngineOptions o, Env* e, std::unique_ptr<kv::BlockPool> p)
        : model(m),
          options(std::move(o)),
          env(e),
          scheduler(options.scheduler, e),
          pool(std::move(p)),
          worker(m, options.record_logits) {
        vocab = model->config().vocab_size;
        eos = static_cast<int32_t>(model->config().eos_token_id);
        max_model_len = options.max_model_len > 0 ? options.max_model_len
                                                  : model->config().max_position_embeddings;
        if (options.async) worker.start();
    }

    // Keys of the first n full blocks of seq.tokens.
    void ensure_keys(Sequence& s, int64_t n) {
        while (static_cast<int64_t>(s.keys.size()) < n) {
            const size_t b = s.keys.size();
            const kv::BlockKey parent = b == 0 ? kv::BlockKey{} : s.keys[b - 1];
            s.keys.push_back(kv::chain_key(
                parent,
                std::span<const int32_t>(s.tokens).subspan(b * kv::kBlockTokens, kv::kBlockTokens),
                s.salt));
        }
    }

    // S-KV-9: a hit keeps at least one token back (its logits start the output).
    int64_t max_hit_blocks(const Sequence& s) const {
        if (!options.prefix_cache) return 0;
        return (static_cast<int64_t>(s.tokens.size()) - 1) / kv::kBlockTokens;
    }

    int64_t exclusive_blocks(const Sequence& s) const {
        int64_t n = 0;
        for (kv::BlockId b : s.blocks) n += pool->ref_count(b) == 1;
        return n;
    }

    void emit(Sequence& s, TokenEvent& ev) {
        auto it = requests.find(s.request_id);
        if (it != requests.end() && it->second.callback) it->second.callback(ev);
    }

    // Ends a sequence: frees its blocks now; its worker state goes with the next plan.
    void finish(Sequence& s, FinishReason reason, bool send_event) {
        if (send_event) {
            TokenEvent ev;
            ev.request_id = s.request_id;
            ev.index = s.index;
            ev.finished = true;
            ev.reason = reason;
            emit(s, ev);
        }
        pool->release_all(s.blocks);
        s.blocks.clear();
        if (s.running) std::erase(running, s.id);
        if (s.init_sent) pending_release.push_back(s.id);
        auto rit = requests.find(s.request_id);
        if (rit != requests.end() && --rit->second.num_live == 0) {
            requests.erase(rit);
            ++stats.num_finished;
        }
        seqs.erase(s.id);
    }

    void preempt(Sequence& s) {
        pool->release_all(s.blocks);
        s.blocks.clear();
        std::erase(running, s.id);
        s.running = false;
        s.num_computed = s.num_confirmed = s.num_published = 0;
        s.num_sampled = s.num_output();  // in-flight samples are recomputed
        s.init_sent = false;
        ++s.epoch;
        ++stats.preemptions;
    }

    SeqView view(const Sequence& s) const {
        SeqView v;
        v.id = s.id;
        v.num_tokens = s.prefill_target;
        v.num_computed = s.num_computed;
        v.num_blocks = static_cast<int64_t>(s.blocks.size());
        v.num_exclusive_blocks = exclusive_blocks(s);
        v.decoding = s.num_computed >= s.prefill_target;
        v.can_run = !v.decoding || s.num_sampled < s.req->sampling.max_tokens;
        v.deadline_ns = s.deadline_ns;
        return v;
    }

    // Schedules one step; false if there is nothing to run.
    Result<bool> schedule_and_submit() {
        std::vector<SeqView> run_views, wait_views;
        for (int64_t id : running) run_views.push_back(view(seqs.at(id)));
        // FIFO admission stops at max_running_seqs, so only the head of the queue needs
        // a prefix lookup; deeper sequences are only checked for their deadline.
        const size_t max_views = static_cast<size_t>(options.scheduler.max_running_seqs) + 1;
        const int64_t now = env->now_ns();
        std::vector<int64_t> expired_deep;
        for (auto& [id, s] : seqs) {
            if (s.running || s.gated) continue;
            if (wait_views.size() >= max_views) {
                if (s.deadline_ns > 0 && now >= s.deadline_ns) expired_deep.push_back(id);
                continue;
            }
            SeqView v;
            v.id = id;
            v.num_tokens = static_cast<int64_t>(s.tokens.size());
            v.deadline_ns = s.deadline_ns;
            const int64_t max_hit = max_hit_blocks(s);
            if (max_hit > 0) {
                ensure_keys(s, max_hit);
                kv::PrefixPeek p = pool->peek(
                    std::span<const kv::BlockKey>(s.keys).first(static_cast<size_t>(max_hit)));
                v.num_cached_tokens = p.num_hit_blocks * kv::kBlockTokens;
                v.num_cached_unreferenced_blocks = p.num_unreferenced;
            }
            wait_views.push_back(v);
        }
        ScheduleDecision d = scheduler.schedule(run_views, wait_views, pool->num_available());
        d.expired.insert(d.expired.end(), expired_deep.begin(), expired_deep.end());
        for (int64_t id : d.expired) finish(seqs.at(id), FinishReason::kDeadline, true);
        for (int64_t id : d.preempted) preempt(seqs.at(id));
        // Pin every admitted hit before allocating, so allocation cannot evict them.
        for (const ScheduledSeq& sc : d.scheduled) {
            if (!sc.admit) continue;
            Sequence& s = seqs.at(sc.id);
            const SeqView* wv = nullptr;
            for (const SeqView& v : wait_views) {
                if (v.id == sc.id) wv = &v;
            }
            const int64_t hit = wv->num_cached_tokens / kv::kBlockTokens;
            s.blocks = pool->match_and_pin(
                std::span<const kv::BlockKey>(s.keys).first(static_cast<size_t>(hit)));
            DSI_CHECK_EQ(static_cast<int64_t>(s.blocks.size()), hit);
            s.num_computed = s.num_confirmed = hit * kv::kBlockTokens;
            s.num_published = hit;
            s.prefill_target = static_cast<int64_t>(s.tokens.size());
            s.num_sampled = s.num_output();
            s.running = true;
            running.push_back(s.id);
            stats.prompt_tokens += s.prefill_target;
            stats.cached_prompt_tokens += s.num_computed;
        }
        if (d.scheduled.empty()) return false;
        StepPlan plan;
        plan.release = std::move(pending_release);
        pending_release.clear();
        for (const ScheduledSeq& sc : d.scheduled) {
            Sequence& s = seqs.at(sc.id);
            if (sc.num_new_blocks > 0) {
                Result<std::vector<kv::BlockId>> nb = pool->allocate(sc.num_new_blocks);
                if (!nb.is_ok())
                    return internal_error("scheduler over-committed blocks: " +
                                          nb.status().to_string());
                s.blocks.insert(s.blocks.end(), nb->begin(), nb->end());
            }
            StepItem it;
            it.seq_id = s.id;
            it.epoch = s.epoch;
            it.start_pos = s.num_computed;
            if (s.num_computed >= s.prefill_target) {
                it.sample = true;  // decode
            } else {
                it.tokens.assign(s.tokens.begin() + s.num_computed,
                                 s.tokens.begin() + s.num_computed + sc.num_new_tokens);
                it.sample = s.num_computed + sc.num_new_tokens == s.prefill_target;
                stats.computed_prefill_tokens += sc.num_new_tokens;
            }
            if (it.sample) ++s.num_sampled;
            s.num_computed += sc.num_new_tokens;
            DSI_CHECK_LE(s.num_computed, static_cast<int64_t>(s.blocks.size()) * kv::kBlockTokens);
            it.cache = kv::PagedKvCache(pool.get(), 0, s.blocks);
            if (!s.init_sent) {
                it.init = true;
                it.req = s.req;
                it.seed = s.seed;
                it.output.assign(s.tokens.begin() + s.num_prompt, s.tokens.end());
                s.init_sent = true;
            }
            plan.items.push_back(std::move(it));
        }
        worker.submit(std::move(plan));
        ++in_flight;
        return true;
    }

    void post_process(StepResult& r) {
        ++stats.steps;
        stats.forward_ns += r.end_ns - r.start_ns;
        if (prev_end_ns > 0) stats.host_gap_ns += std::max<int64_t>(0, r.start_ns - prev_end_ns);
        prev_end_ns = r.end_ns;
        if (!r.status.is_ok()) {
            fatal = r.status.with_context("forward pass");
            return;
        }
        for (ItemResult& ir : r.items) {
            auto sit = seqs.find(ir.seq_id);
            if (sit == seqs.end() || sit->second.epoch != ir.epoch) continue;  // ended/preempted
            Sequence& s = sit->second;
            s.num_confirmed += ir.num_tokens;
            if (options.prefix_cache) {
                // Publish blocks whose rows are all computed and whose tokens are known.
                const int64_t full =
                    std::min<int64_t>(s.num_confirmed, static_cast<int64_t>(s.tokens.size())) /
                    kv::kBlockTokens;
                if (full > s.num_published) {
                    ensure_keys(s, full);
                    for (int64_t b = s.num_published; b < full; ++b)
                        pool->publish(s.blocks[b], s.keys[b]);
                    s.num_published = full;
                }
            }
            if (!ir.sampled) continue;
            handle_token(s, ir);
        }
    }

    void handle_token(Sequence& s, ItemResult& ir) {
        const int32_t tok = ir.token.token;
        const SamplingParams& p = s.req->sampling;
        TokenEvent ev;
        ev.request_id = s.request_id;
        ev.index = s.index;
        ev.token = tok;
        ev.logprob = ir.token.logprob;
        ev.top_logprobs = ir.token.top_logprobs;
        ev.logits = ir.logits;
        FinishReason reason = FinishReason::kNone;
        if (tok < 0) {
            reason = FinishReason::kError;  // the mask allowed nothing
        } else {
            s.tokens.push_back(tok);
            ++stats.output_tokens;
            if (s.decoder) {
                std::string piece = s.decoder->push(tok);
                if (s.stop) {
                    StopMatcher::Piece sp = s.stop->push(piece);
                    ev.text = std::move(sp.text);
                    if (sp.stopped) reason = FinishReason::kStop;
                } else {
                    ev.text = std::move(piece);
                }
            }
            if (reason == FinishReason::kNone) {
                const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(),
                                                  tok) != p.stop_token_ids.end();
                if ((tok == eos && !p.ignore_eos) || is_stop_id) {
                    reason = FinishReason::kStop;
                } else if (s.num_output() >= p.max_tokens) {
                    reason = FinishReason::kLength;
                }
            }
            if (reason != FinishReason::kNone && reason != FinishReason::kStop && s.decoder) {
                std::string rest = s.decoder->flush();
                if (s.stop) rest = s.stop->push(rest).text + s.stop->flush();
                ev.text += rest;
            } else if (reason == FinishReason::kStop && s.decoder && !s.stop) {
                ev.text += s.decoder->flush();
            }
        }
        // Completion 0's prefill is done: its prompt blocks are published, let the
        // siblings in (they hit them in the prefix index).
        if (s.index == 0) {
            auto rit = requests.find(s.request_id);
            if (rit != requests.end()) {
                for (int64_t sid : rit->second.seq_ids) {
                    auto it = seqs.find(sid);
                    if (it != seqs.end()) it->second.gated = false;
                }
            }
        }
        ev.finished = reason != FinishReason::kNone;
        ev.reason = reason;
        emit(s, ev);
        if (ev.finished) finish(s, reason, false);
    }
};

Result<std::unique_ptr<Engine>> Engine::create(DeepseekModel* model, EngineOptions options,
                                               Env* env) {
    DSI_CHECK(model != nullptr && env != nullptr);
    DSI_RETURN_IF_ERROR(options.scheduler.validate());
    std::vector<kv::CacheGroupSpec> groups = {
        kv::CacheGroupSpec{"mla", model->kv_num_layers(), 1, model->kv_row_floats()}};
    int64_t num_blocks = options.num_kv_blocks;
    if (num_blocks <= 0) {
        const int64_t per_block = groups[0].block_floats() * static_cast<int64_t>(sizeof(float));
        num_blocks = options.kv_cache_bytes / per_block;
        if (num_blocks < 1) {
            return invalid_argument("kv cache of " + std::to_string(options.kv_cache_bytes) +
                                    " bytes holds no block of " + std::to_string(per_block) +
                                    " bytes");
        }
    }
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<kv::BlockPool> pool,
                         kv::BlockPool::create(std::move(groups), num_blocks));
    auto impl = std::make_unique<Impl>(model, std::move(options), env, std::move(pool));
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<RequestId> Engine::add_request(GenerateRequest request, StreamCallback callback) {
    Impl& m = *impl_;
    if (request.prompt.empty()) return invalid_argument("prompt is empty");
    for (int32_t t : request.prompt) {
        if (t < 0 || t >= m.vocab) {
            return invalid_argument("prompt token id " + std::to_string(t) +
                                    " outside the vocabulary");
        }
    }
    DSI_RETURN_IF_ERROR(validate_sampling(request.sampling, m.vocab));
    if (!request.sampling.stop.empty() && m.options.tokenizer == nullptr) {
        return invalid_argument("stop strings need the engine to have a tokenizer");
    }
    if (request.deadline_ns < 0) return invalid_argument("deadline must be >= 0");
    const int64_t len = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_tokens;
    if (len > m.max_model_len) {
        return out_of_range("prompt (" + std::to_string(request.prompt.size()) +
                            " tokens) + max_tokens (" +
                            std::to_string(request.sampling.max_tokens) +
                            ") exceeds the model length " + std::to_string(m.max_model_len));
    }
    if (blocks_for_tokens(len) > m.pool->num_blocks()) {
        return resource_exhausted("request needs " + std::to_string(blocks_for_tokens(len)) +
                                  " KV blocks; the pool has " +
                                  std::to_string(m.pool->num_blocks()));
    }
    const RequestId rid = m.next_request++;
    auto shared = std::make_shared<RequestShared>();
    shared->prompt = std::move(request.prompt);
    shared->sampling = std::move(request.sampling);
    shared->mask = std::move(request.mask);
    RequestState rs;
    rs.req = shared;
    rs.callback = std::move(callback);
    const kv::BlockKey salt = kv::make_salt(m.options.model_id, request.cache_salt);
    for (int32_t i = 0; i < shared->sampling.n; ++i) {
        Sequence s;
        s.id = m.next_seq++;
        s.request_id = rid;
        s.index = i;
        s.seed = derive_seed(shared->sampling.seed, i);
        s.req = shared;
        s.salt = salt;
        s.deadline_ns = request.deadline_ns;
        s.tokens = shared->prompt;
        s.num_prompt = static_cast<int64_t>(s.tokens.size());
        s.gated = i > 0 && m.options.prefix_cache;
        if (m.options.tokenizer) {
            s.decoder = std::make_unique<IncrementalDecoder>(*m.options.tokenizer);
            if (!shared->sampling.stop.empty())
                s.stop = std::make_unique<StopMatcher>(shared->sampling.stop);
        }
        rs.seq_ids.push_back(s.id);
        m.seqs.emplace(s.id, std::move(s));
    }
    rs.num_live = shared->sampling.n;
    m.requests.emplace(rid, std::move(rs));
    ++m.stats.num_requests;
    return rid;
}

Status Engine::abort(RequestId id) {
    Impl& m = *impl_;
    auto it = m.requests.find(id);
    if (it == m.requests.end()) return not_found("request " + std::to_string(id) + " is not live");
    const std::vector<int64_t> ids = it->second.seq_ids;
    for (int64_t sid : ids) {
        auto sit = m.seqs.find(sid);
        if (sit != m.seqs.end()) m.finish(sit->second, FinishReason::kAbort, true);
    }
    return Status::ok();
}

Status Engine::step() {
    Impl& m = *impl_;
    DSI_RETURN_IF_ERROR(m.fatal);
    const int max_in_flight = m.options.async ? 2 : 1;
    bool submitted = false;
    if (m.in_flight < max_in_flight) {
        DSI_ASSIGN_OR_RETURN(submitted, m.schedule_and_submit());
    }
    if (m.in_flight > 0 && (m.in_flight == max_in_flight || !submitted)) {
        StepResult r = m.worker.wait();
        --m.in_flight;
        m.post_process(r);
    }
    if (!has_work()) m.prev_end_ns = 0;  // idle: the next gap is not the host's
    return m.fatal;
}

Status Engine::run() {
    while (has_work()) {
        const int64_t before_steps = impl_->stats.steps;
        const size_t before_seqs = impl_->seqs.size();
        const int before_in_flight = impl_->in_flight;
        DSI_RETURN_IF_ERROR(step());
        if (impl_->stats.steps == before_steps && impl_->seqs.size() == before_seqs &&
            impl_->in_flight == before_in_flight) {
            return internal_error("engine made no progress with " + std::to_string(before_seqs) +
                                  " sequences left");
        }
    }
    return Status::ok();
}

bool Engine::has_work() const { return !impl_->seqs.empty() || impl_->in_flight > 0; }

EngineStats Engine::stats() const {
    EngineStats s = impl_->stats;
    s.pool = impl_->pool->stats();
    return s;
}

Status Engine::check_invariants() const {
    const Impl& m = *impl_;
    std::vector<int32_t> refs(static_cast<size_t>(m.pool->num_blocks()), 0);
    for (const auto& [id, s] : m.seqs) {
        for (kv::BlockId b : s.blocks) ++refs[static_cast<size_t>(b)];
        if (!s.running && !s.blocks.empty()) {
            return internal_error("waiting sequence " + std::to_string(id) + " holds blocks");
        }
    }
    return m.pool->check_invariants(refs);
}

}  // namespace dsi::engine

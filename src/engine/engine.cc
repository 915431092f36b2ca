// The engine's step loop: schedule -> forward -> sample -> post-process (S-ASYNC),
// with the host scheduling step N+1 while a worker runs step N; KV store tiers
// (write-behind, admission fetch, layer-wise swap-in: S-KV-4..7).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "base/check.h"
#include "base/logging.h"
#include "engine/calibrate.h"
#include "engine/swap.h"
#include "kv/paged_kv_cache.h"
#include "kvstore/async_store.h"
#include "kvstore/block_store.h"
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

// Dtype code of the engine's KV rows in the store's block header (f32 rows).
constexpr uint32_t kStoreDtypeF32 = 1;

// A fetched block to copy into pool block `block` before its rows are read (S-KV-6).
struct SwapIn {
    kv::BlockId block = 0;
    std::shared_ptr<const kvstore::Block> data;
};

// Preemption by swapping (engine/swap.h): one block copied between the pool and a
// host swap slot by the worker.
struct HostCopy {
    kv::BlockId block = 0;
    float* host = nullptr;
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
    // Fetched blocks at positions [swap_begin_pos, swap_begin_pos + 128 * size).
    std::vector<SwapIn> swap_in;
    int64_t swap_begin_pos = 0;
    // Rows swapped out to host memory, copied back into its new blocks before the step.
    std::vector<HostCopy> restore;
};

struct StepPlan {
    std::vector<StepItem> items;
    // Victims swapped out when this step was scheduled: copied to host before the step
    // (their blocks may be reused by it).
    std::vector<HostCopy> save;
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
    // Swap-in (S-KV-6) of this step, if any.
    int64_t swap_in_blocks = 0;
    int64_t swap_in_bytes = 0;
    int64_t swap_in_ns = 0;        // copy thread: start to last layer
    int64_t swap_in_wait_ns = 0;   // attention waiting on layers
    int64_t swap_in_overlapped = 0;  // items whose forward started before the last layer
};

// The device side: runs forward + sampling, owns per-sequence sampling state. Runs
// inline (async off) or on its own thread fed by a queue (async on).
class Worker {
public:
    // REQUIRES: pool outlives the worker (swap-in writes fetched blocks into it).
    Worker(DeepseekModel* model, kv::BlockPool* pool, bool record_logits,
           int64_t swap_in_layer_delay_us)
        : model_(model),
          pool_(pool),
          layer_floats_(kv::kBlockTokens * model->kv_row_floats()),
          record_logits_(record_logits),
          swap_in_layer_delay_us_(swap_in_layer_delay_us),
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
        // Preemption by swapping: save the victims' rows before anything in this step
        // can overwrite their blocks, then restore the resumed sequences' rows.
        for (const HostCopy& c : plan.save) copy_block(c, true);
        for (const StepItem& it : plan.items) {
            for (const HostCopy& c : it.restore) copy_block(c, false);
        }
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
        // S-KV-6: copy fetched blocks layer by layer on a swap-in thread while the
        // forward pass runs; attention on those rows waits for its layer.
        kv::LayerGate gate;
        std::thread swapper;
        int64_t swap_start_ns = 0;
        std::atomic<int64_t> swap_end_ns{0};
        bool any_swap = false;
        for (StepItem& it : plan.items) {
            if (it.swap_in.empty()) continue;
            any_swap = true;
            it.cache.set_gate(&gate, it.swap_begin_pos,
                              it.swap_begin_pos +
                                  static_cast<int64_t>(it.swap_in.size()) * kv::kBlockTokens);
            r.swap_in_blocks += static_cast<int64_t>(it.swap_in.size());
        }
        if (any_swap) {
            swap_start_ns = steady_ns();
            swapper = std::thread([&] {
                swap_in_layers(plan, gate);
                swap_end_ns.store(steady_ns(), std::memory_order_release);
            });
            // Counted: this forward pass starts before the last layer has arrived.
            if (gate.ready() < model_->kv_num_layers()) {
                for (const StepItem& it : plan.items) r.swap_in_overlapped += !it.swap_in.empty();
            }
        }
        r.status = model_->forward_batch(steps_, out_);
        if (any_swap) {
            swapper.join();
            r.swap_in_ns = swap_end_ns.load(std::memory_order_acquire) - swap_start_ns;
            r.swap_in_wait_ns = gate.wait_ns();
            for (const StepItem& it : plan.items) {
                for (const SwapIn& sw : it.swap_in)
                    r.swap_in_bytes += static_cast<int64_t>(sw.data->payload().size());
            }
        }
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

    // A block's slices of every cache group <-> one host swap slot (groups back to back).
    void copy_block(const HostCopy& c, bool to_host) {
        float* host = c.host;
        for (size_t g = 0; g < pool_->groups().size(); ++g) {
            const size_t n = static_cast<size_t>(pool_->groups()[g].block_floats());
            float* dev = pool_->data(g, c.block);
            if (to_host) {
                std::memcpy(host, dev, n * sizeof(float));
            } else {
                std::memcpy(dev, host, n * sizeof(float));
            }
            host += n;
        }
    }

    // Layer-major copy of every fetched block of the plan into its pool block.
    void swap_in_layers(StepPlan& plan, kv::LayerGate& gate) {
        const int64_t num_layers = model_->kv_num_layers();
        for (int64_t l = 0; l < num_layers; ++l) {
            if (swap_in_layer_delay_us_ > 0)
                std::this_thread::sleep_for(std::chrono::microseconds(swap_in_layer_delay_us_));
            for (StepItem& it : plan.items) {
                for (const SwapIn& sw : it.swap_in) {
                    std::span<const uint8_t> src = sw.data->layer(static_cast<uint32_t>(l));
                    // The host checked the layer sizes; a block is [layer][entry][floats].
                    std::memcpy(pool_->data(0, sw.block) + l * layer_floats_, src.data(),
                                src.size());
                }
            }
            gate.set_ready(l + 1);
        }
    }

    DeepseekModel* model_;
    kv::BlockPool* pool_;
    int64_t layer_floats_;
    bool record_logits_;
    int64_t swap_in_layer_delay_us_;
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
    int64_t num_cached_prompt = -1;  // prefix-cache hit tokens at first admission
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
    // KV store (S-KV-4/5): asked once per epoch; while a fetch is in flight the
    // sequence waits outside the admission queue (others are scheduled meanwhile).
    bool store_checked = false;
    std::shared_ptr<kvstore::FetchTicket> fetch;
    int64_t fetch_first_block = 0;  // chain index of the first fetched key
    int64_t fetch_num_blocks = 0;
    int64_t fetch_submit_ns = 0;    // kvstore clock
    int64_t fetch_deadline_ns = 0;  // kvstore clock
    // A resolved fetch: the prefix blocks the waiting sequence holds (local hits pinned,
    // then fetched blocks to swap in from staged_first on). Moved to `blocks` on admission.
    std::vector<kv::BlockId> staged;
    std::vector<std::shared_ptr<const kvstore::Block>> staged_data;
    int64_t staged_first = 0;
    int64_t num_store_blocks = 0;  // blocks [0, n) need no write-behind (came from a tier)
    kvstore::TrafficClass traffic_class = kvstore::TrafficClass::kChatbot;
    std::unique_ptr<IncrementalDecoder> decoder;
    std::unique_ptr<StopMatcher> stop;
    // Swapped out (waiting): host slots holding rows [0, swapped_rows) (engine/swap.h).
    std::vector<int32_t> swap_slots;
    int64_t swapped_rows = 0;

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
    // KV store tiers (null: none). Declared after the pool/worker users they serve;
    // destroyed first (their threads stop before the store goes).
    std::unique_ptr<kvstore::BlockStore> owned_store;
    kvstore::BlockStore* store = nullptr;
    std::unique_ptr<kvstore::WriteBehind> write_behind;
    std::unique_ptr<kvstore::Fetcher> fetcher;
    kvstore::StoreKey model_identity;
    int64_t num_fetching = 0;
    // Preemption by swapping: host slots, and saves for the next submitted plan.
    std::unique_ptr<HostSwapSpace> swap;
    std::vector<HostCopy> pending_saves;

    Impl(DeepseekModel* m, EngineOptions o, Env* e, std::unique_ptr<kv::BlockPool> p)
        : model(m),
          options(std::move(o)),
          env(e),
          scheduler(options.scheduler, e),
          pool(std::move(p)),
          worker(m, pool.get(), options.record_logits, options.swap_in_layer_delay_us) {
        vocab = model->config().vocab_size;
        eos = static_cast<int32_t>(model->config().eos_token_id);
        max_model_len = options.max_model_len > 0 ? options.max_model_len
                                                  : model->config().max_position_embeddings;
        int64_t block_floats = 0;  // every cache group's slice of one block
        for (const kv::CacheGroupSpec& g : pool->groups()) block_floats += g.block_floats();
        swap = std::make_unique<HostSwapSpace>(options.swap_space_bytes, block_floats);
        if (options.async) worker.start();
        open_store();
    }

    ~Impl() {
        // Stop the tier threads before the store they use goes (members die in reverse).
        fetcher.reset();
        // Shutdown drains the write-behind queue, bounded (a dead store cannot hold us).
        if (write_behind != nullptr) (void)write_behind->flush(kvstore::deadline_after_ms(5000));
        write_behind.reset();
    }

    // A store that cannot be opened is logged and left out: serving goes on.
    void open_store() {
        if (options.kv_store != nullptr) {
            store = options.kv_store;
        } else if (!options.kv_store_uri.empty()) {
            Result<std::unique_ptr<kvstore::BlockStore>> st =
                kvstore::open_block_store(options.kv_store_uri);
            if (!st.is_ok()) {
                DSI_LOG(kWarning) << "kv store " << options.kv_store_uri
                                 << " unavailable, serving without it: "
                                 << st.status().to_string();
                return;
            }
            owned_store = std::move(st).value();
            store = owned_store.get();
        }
        if (store == nullptr || !options.prefix_cache) {
            store = nullptr;
            return;
        }
        model_identity = kvstore::model_identity(options.model_id);
        if (options.kv_store_write) {
            kvstore::WriteBehind::Options wo;
            wo.max_queued_bytes = options.kv_store_write_queue_bytes;
            write_behind = std::make_unique<kvstore::WriteBehind>(store, wo);
        }
        // S-KV-5: blocks are read straight into reused host buffers (read_many_into),
        // each sized for one encoded block of this model; the swap-in copies from them.
        kvstore::Fetcher::Options fo;
        fo.buffer_bytes = kvstore::header_bytes(static_cast<uint32_t>(model->kv_num_layers())) +
                          static_cast<size_t>(layer_bytes() * model->kv_num_layers());
        fo.max_buffers = std::max<int64_t>(
            1, options.kv_store_fetch_buffer_bytes / static_cast<int64_t>(fo.buffer_bytes));
        fetcher = std::make_unique<kvstore::Fetcher>(store, fo);
    }

    kvstore::BlockInfo store_info(const Sequence& s, int64_t b) const {
        kvstore::BlockInfo info;
        info.key = kvstore::StoreKey{s.keys[b].lo, s.keys[b].hi};
        info.model = model_identity;
        info.num_layers = static_cast<uint32_t>(model->kv_num_layers());
        // The cache dtype (kernels::KvDtype): 1 f32, 2 bf16, 3 e4m3; a block written
        // under another dtype is a mismatch on fetch.
        info.dtype = kStoreDtypeF32 + static_cast<uint32_t>(model->kv_dtype());
        info.num_tokens = static_cast<uint32_t>(kv::kBlockTokens);
        info.token_hash = kvstore::token_ids_hash(
            std::span<const int32_t>(s.tokens).subspan(b * kv::kBlockTokens, kv::kBlockTokens));
        info.traffic_class = s.traffic_class;
        return info;
    }

    int64_t layer_bytes() const {
        return kv::kBlockTokens * model->kv_row_floats() * static_cast<int64_t>(sizeof(float));
    }

    // S-KV-7: a block just published (prefill or decode) is offered to the store. One
    // bounded copy here (WriteBehind::offer copies and never blocks; a full queue drops).
    void offer_block(const Sequence& s, int64_t b) {
        if (write_behind == nullptr) return;
        const float* base = pool->data(0, s.blocks[b]);
        const int64_t floats = kv::kBlockTokens * model->kv_row_floats();
        std::vector<std::span<const uint8_t>> layers;
        for (int64_t l = 0; l < model->kv_num_layers(); ++l) {
            layers.emplace_back(reinterpret_cast<const uint8_t*>(base + l * floats),
                                static_cast<size_t>(layer_bytes()));
        }
        if (write_behind->offer(store_info(s, b), layers)) {
            ++stats.store_blocks_offered;
            stats.store_bytes_offered += layer_bytes() * model->kv_num_layers();
        } else {
            ++stats.store_blocks_dropped;
        }
    }

    void release_staged(Sequence& s) {
        pool->release_all(s.staged);
        s.staged.clear();
        s.staged_data.clear();
        s.staged_first = 0;
    }

    void drop_fetch(Sequence& s) {
        if (s.fetch == nullptr) return;
        s.fetch.reset();
        --num_fetching;
    }

    // S-KV-4/5: after the local match, ask the store for the rest of the chain
    // (metadata only) and fetch the hits off-thread. True if a fetch is now in flight.
    bool start_fetch(Sequence& s, int64_t max_hit) {
        s.store_checked = true;
        const kv::PrefixPeek p =
            pool->peek(std::span<const kv::BlockKey>(s.keys).first(static_cast<size_t>(max_hit)));
        const int64_t first = p.num_hit_blocks;
        if (first >= max_hit) return false;
        std::vector<kvstore::StoreKey> chain;
        for (int64_t b = first; b < max_hit; ++b) chain.push_back({s.keys[b].lo, s.keys[b].hi});
        ++stats.store_lookups;
        Result<int64_t> n = store->match_prefix(
            chain, kvstore::deadline_after_ms(options.kv_store_match_timeout_ms));
        if (!n.is_ok() || *n <= 0) return false;  // a dead store is a miss
        chain.resize(static_cast<size_t>(*n));
        std::vector<kvstore::BlockInfo> expects;
        for (int64_t b = first; b < first + *n; ++b) expects.push_back(store_info(s, b));
        s.fetch_first_block = first;
        s.fetch_num_blocks = *n;
        s.fetch_submit_ns = kvstore::deadline_after_ms(0);
        s.fetch_deadline_ns = kvstore::deadline_after_ms(options.kv_store_fetch_timeout_ms);
        s.fetch = fetcher->submit(std::move(chain), std::move(expects), s.fetch_deadline_ns);
        ++num_fetching;
        return true;
    }

    // A finished (or late) fetch: pin the local prefix, take the leading verified
    // blocks into new pool blocks the sequence holds (staged). Anything unusable is a
    // miss: the sequence computes those tokens.
    void resolve_fetch(Sequence& s) {
        std::shared_ptr<kvstore::FetchTicket> t = s.fetch;
        const int64_t now = kvstore::deadline_after_ms(0);
        drop_fetch(s);
        if (!t->done()) {  // late: the fetch goes on, its result is dropped
            stats.store_miss_blocks += s.fetch_num_blocks;
            return;
        }
        const int64_t lat = now - s.fetch_submit_ns;
        ++stats.fetch_count;
        stats.fetch_sum_ns += lat;
        stats.fetch_max_ns = std::max(stats.fetch_max_ns, lat);
        // Each fetched block holds a Fetcher host buffer until the swap-in has copied
        // it (the step plan drops it) or the sequence ends.
        std::vector<Result<kvstore::FetchedBlock>>& res = t->results();
        std::vector<std::shared_ptr<const kvstore::Block>> got;
        for (Result<kvstore::FetchedBlock>& r : res) {
            if (!r.is_ok()) break;  // the chain stops at the first miss
            const kvstore::Block& b = **r;
            bool ok = b.num_layers() == static_cast<uint32_t>(model->kv_num_layers());
            for (uint32_t l = 0; ok && l < b.num_layers(); ++l)
                ok = static_cast<int64_t>(b.layer(l).size()) == layer_bytes();
            if (!ok) break;
            got.push_back(std::move(r).value());
        }
        stats.store_miss_blocks += static_cast<int64_t>(res.size() - got.size());
        if (got.empty()) return;
        const int64_t first = s.fetch_first_block;
        const int64_t end = first + static_cast<int64_t>(got.size());
        // The local prefix may have changed while fetching: pin what is there now.
        std::vector<kv::BlockId> pinned =
            pool->match_and_pin(std::span<const kv::BlockKey>(s.keys).first(static_cast<size_t>(end)));
        const int64_t m = static_cast<int64_t>(pinned.size());
        if (m < first) {  // a parent was evicted meanwhile: the chain is broken
            pool->release_all(pinned);
            stats.store_miss_blocks += static_cast<int64_t>(got.size());
            return;
        }
        const int64_t need = end - m;
        if (need > 0) {
            Result<std::vector<kv::BlockId>> nb = pool->allocate(need);
            if (!nb.is_ok()) {  // pool short: compute instead
                pool->release_all(pinned);
                stats.store_miss_blocks += static_cast<int64_t>(got.size());
                return;
            }
            pinned.insert(pinned.end(), nb->begin(), nb->end());
            s.staged_data.assign(got.begin() + (m - first), got.end());
        }
        s.staged = std::move(pinned);
        s.staged_first = m;
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
        ev.cached_prompt_tokens = std::max<int64_t>(s.num_cached_prompt, 0);
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
        release_staged(s);
        drop_fetch(s);
        swap->release(s.swap_slots);  // abort of a swapped-out sequence frees its host space
        s.swap_slots.clear();
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
        // Swap when the host space allows, else recompute (docs/engine.md). Rows
        // [0, num_computed) are complete once the steps already submitted have run and
        // belong to tokens the host knows; one token is kept back (its logits start
        // the output again, as for a prefix hit).
        const int64_t rows = std::min<int64_t>(s.num_computed,
                                               static_cast<int64_t>(s.tokens.size()) - 1);
        if (rows > 0) {
            const int64_t n = blocks_for_tokens(rows);
            if (std::optional<std::vector<int32_t>> slots = swap->allocate(n)) {
                for (int64_t i = 0; i < n; ++i)
                    pending_saves.push_back({s.blocks[static_cast<size_t>(i)], swap->slot((*slots)[i])});
                s.swap_slots = std::move(*slots);
                s.swapped_rows = rows;
                ++stats.preemptions_swapped;
                stats.swapped_out_blocks += n;
            }
        }
        pool->release_all(s.blocks);
        s.blocks.clear();
        std::erase(running, s.id);
        s.running = false;
        s.num_computed = s.num_confirmed = s.num_published = 0;
        s.num_sampled = s.num_output();  // in-flight samples are recomputed
        s.init_sent = false;
        s.store_checked = false;
        s.num_store_blocks = 0;
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
            if (s.fetch != nullptr) {
                // S-KV-5: waiting on the store; not in the queue meanwhile.
                if (s.deadline_ns > 0 && now >= s.deadline_ns) {
                    expired_deep.push_back(id);
                    continue;
                }
                if (!s.fetch->done() && kvstore::deadline_after_ms(0) < s.fetch_deadline_ns)
                    continue;
                resolve_fetch(s);
            }
            if (wait_views.size() >= max_views) {
                if (s.deadline_ns > 0 && now >= s.deadline_ns) expired_deep.push_back(id);
                continue;
            }
            SeqView v;
            v.id = id;
            v.num_tokens = static_cast<int64_t>(s.tokens.size());
            v.deadline_ns = s.deadline_ns;
            if (!s.swap_slots.empty()) {
                // Swapped out: its rows come back from host memory, no prefix lookup.
                v.num_cached_tokens = s.swapped_rows;
                v.num_swapped_blocks = static_cast<int64_t>(s.swap_slots.size());
                wait_views.push_back(v);
                continue;
            }
            const int64_t max_hit = max_hit_blocks(s);
            if (max_hit > 0 && store != nullptr && !s.store_checked && s.staged.empty()) {
                ensure_keys(s, max_hit);
                if (start_fetch(s, max_hit)) continue;
            }
            if (!s.staged.empty()) {
                // Prefix blocks already held (local pins + fetched): nothing to pin.
                v.num_cached_tokens = static_cast<int64_t>(s.staged.size()) * kv::kBlockTokens;
            } else if (max_hit > 0) {
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
            if (!s.swap_slots.empty()) {
                // Blocks for the swapped rows are allocated below, after every pin.
                s.num_computed = s.num_confirmed = s.swapped_rows;
                s.num_store_blocks = s.swapped_rows / kv::kBlockTokens;  // written before
                s.prefill_target = static_cast<int64_t>(s.tokens.size());
                s.num_sampled = s.num_output();
                s.running = true;
                running.push_back(s.id);
                continue;
            }
            const int64_t hit = wv->num_cached_tokens / kv::kBlockTokens;
            if (!s.staged.empty()) {
                // S-KV-6: the fetched blocks go to the worker with this step's item;
                // they are published after the step that copied them.
                s.blocks = std::move(s.staged);
                s.staged.clear();
                s.num_published = s.staged_first;
                s.num_store_blocks = static_cast<int64_t>(s.blocks.size());
                const int64_t fetched = static_cast<int64_t>(s.staged_data.size());
                stats.store_hit_blocks += fetched;
                stats.store_hit_tokens += fetched * kv::kBlockTokens;
            } else {
                s.blocks = pool->match_and_pin(
                    std::span<const kv::BlockKey>(s.keys).first(static_cast<size_t>(hit)));
                s.num_published = hit;
                s.num_store_blocks = hit;
            }
            DSI_CHECK_EQ(static_cast<int64_t>(s.blocks.size()), hit);
            s.num_computed = s.num_confirmed = hit * kv::kBlockTokens;
            s.prefill_target = static_cast<int64_t>(s.tokens.size());
            s.num_sampled = s.num_output();
            s.running = true;
            running.push_back(s.id);
            stats.prompt_tokens += s.prefill_target;
            stats.cached_prompt_tokens += s.num_computed;
            if (s.num_cached_prompt < 0) s.num_cached_prompt = s.num_computed;
        }
        if (d.scheduled.empty()) return false;
        StepPlan plan;
        plan.release = std::move(pending_release);
        pending_release.clear();
        plan.save = std::move(pending_saves);
        pending_saves.clear();
        for (const ScheduledSeq& sc : d.scheduled) {
            Sequence& s = seqs.at(sc.id);
            std::vector<HostCopy> restore;
            if (sc.admit && !s.swap_slots.empty()) {
                Result<std::vector<kv::BlockId>> rb =
                    pool->allocate(static_cast<int64_t>(s.swap_slots.size()));
                if (!rb.is_ok())
                    return internal_error("scheduler over-committed blocks for a swap-in: " +
                                          rb.status().to_string());
                for (size_t i = 0; i < rb->size(); ++i)
                    restore.push_back({(*rb)[i], swap->slot(s.swap_slots[i])});
                s.blocks = std::move(rb).value();
                stats.swapped_in_blocks += static_cast<int64_t>(s.swap_slots.size());
                swap->release(s.swap_slots);  // reusable from the next plan on
                s.swap_slots.clear();
                s.swapped_rows = 0;
            }
            if (sc.num_new_blocks > 0) {
                Result<std::vector<kv::BlockId>> nb = pool->allocate(sc.num_new_blocks);
                if (!nb.is_ok())
                    return internal_error("scheduler over-committed blocks: " +
                                          nb.status().to_string());
                s.blocks.insert(s.blocks.end(), nb->begin(), nb->end());
            }
            StepItem it;
            it.restore = std::move(restore);
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
            if (!s.staged_data.empty()) {
                it.swap_begin_pos = s.staged_first * kv::kBlockTokens;
                for (size_t j = 0; j < s.staged_data.size(); ++j) {
                    it.swap_in.push_back(
                        {s.blocks[static_cast<size_t>(s.staged_first) + j], s.staged_data[j]});
                }
                s.staged_data.clear();
            }
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
        swap->end_plan();
        ++in_flight;
        return true;
    }

    void post_process(StepResult& r) {
        ++stats.steps;
        if (r.swap_in_blocks > 0) {
            ++stats.swap_in_count;
            stats.swap_in_sum_ns += r.swap_in_ns;
            stats.swap_in_wait_ns += r.swap_in_wait_ns;
            stats.swap_in_overlapped += r.swap_in_overlapped;
            stats.store_bytes_read += r.swap_in_bytes;
        }
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
                    for (int64_t b = s.num_published; b < full; ++b) {
                        // S-KV-7: new blocks (prefill and decode) are written behind;
                        // blocks that came from a tier are not written back.
                        if (pool->publish(s.blocks[b], s.keys[b]) && b >= s.num_store_blocks)
                            offer_block(s, b);
                    }
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
    if (!options.cost_model_path.empty()) {
        // S-LB: the fit of `dsinfer calibrate`, when there is one (engine/calibrate.h).
        DSI_ASSIGN_OR_RETURN(std::optional<PrefillCostModel> fitted,
                             load_cost_model(env, options.cost_model_path));
        if (fitted) options.scheduler.cost = *fitted;
    }
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
        s.traffic_class = request.agent_traffic ? kvstore::TrafficClass::kAgent
                                                : kvstore::TrafficClass::kChatbot;
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
    } else if (!submitted && m.in_flight == 0 && m.num_fetching > 0) {
        // Only store fetches are pending: wait (briefly, with a deadline) for one.
        for (auto& [id, s] : m.seqs) {
            if (s.fetch == nullptr) continue;
            (void)s.fetch->wait(std::min(s.fetch_deadline_ns, kvstore::deadline_after_ms(2)));
            break;
        }
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
        // A pending store fetch always ends (done or past its deadline): not a stall.
        if (impl_->stats.steps == before_steps && impl_->seqs.size() == before_seqs &&
            impl_->in_flight == before_in_flight && impl_->num_fetching == 0) {
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
    s.swap_slots_held = impl_->swap->num_held();
    if (impl_->write_behind != nullptr) {
        s.store_blocks_written = impl_->write_behind->num_written();
        s.store_blocks_dropped = impl_->write_behind->num_dropped();
    }
    if (impl_->store != nullptr) s.store_puts_dropped = impl_->store->metrics().puts_dropped;
    if (impl_->fetcher != nullptr) {
        const kvstore::FetchBufferStats fb = impl_->fetcher->buffer_stats();
        s.fetch_buffers_allocated = fb.allocated;
        s.fetch_buffers_in_use = fb.in_use;
        s.fetch_buffer_leases = fb.leases;
    }
    return s;
}

Status Engine::check_invariants() const {
    const Impl& m = *impl_;
    std::vector<int32_t> refs(static_cast<size_t>(m.pool->num_blocks()), 0);
    std::vector<int32_t> held_slots;
    for (const auto& [id, s] : m.seqs) {
        held_slots.insert(held_slots.end(), s.swap_slots.begin(), s.swap_slots.end());
        if (!s.swap_slots.empty() && (s.running || s.swapped_rows <= 0 ||
                                      blocks_for_tokens(s.swapped_rows) !=
                                          static_cast<int64_t>(s.swap_slots.size()))) {
            return internal_error("sequence " + std::to_string(id) +
                                  " has inconsistent swap state");
        }
        for (kv::BlockId b : s.blocks) ++refs[static_cast<size_t>(b)];
        for (kv::BlockId b : s.staged) ++refs[static_cast<size_t>(b)];
        if (!s.running && !s.blocks.empty()) {
            return internal_error("waiting sequence " + std::to_string(id) + " holds blocks");
        }
    }
    DSI_RETURN_IF_ERROR(m.swap->check_invariants(held_slots));
    return m.pool->check_invariants(refs);
}

}  // namespace dsi::engine

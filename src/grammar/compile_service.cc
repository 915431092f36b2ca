#include "grammar/compile_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <nlohmann/json.hpp>

#include "grammar/ebnf.h"
#include "grammar/regex.h"

namespace dsi::grammar {

const char* grammar_kind_name(GrammarKind kind) {
    switch (kind) {
        case GrammarKind::kJsonSchema: return "json_schema";
        case GrammarKind::kJsonObject: return "json_object";
        case GrammarKind::kRegex: return "regex";
        case GrammarKind::kEbnf: return "ebnf";
    }
    return "?";
}

Result<Grammar> compile_grammar(const GrammarSpec& spec, const JsonSchemaOptions& options) {
    JsonSchemaOptions json = options;
    json.flexible_whitespace = json.flexible_whitespace || spec.flexible_whitespace;
    json.any_property_order = json.any_property_order || spec.any_property_order;
    switch (spec.kind) {
        case GrammarKind::kJsonSchema:
            return compile_json_schema(std::string_view(spec.text), json);
        case GrammarKind::kJsonObject:
            return compile_json_schema(nlohmann::ordered_json{{"type", "object"}}, json);
        case GrammarKind::kRegex: {
            auto e = compile_regex(spec.text, RegexMatch::kFull, CharEncoding::kUtf8,
                                   options.limits);
            if (!e.is_ok()) return e.status();
            GrammarBuilder b(options.limits);
            uint32_t root = b.declare("root");
            b.define(root, *e);
            return b.build(root);
        }
        case GrammarKind::kEbnf: return compile_ebnf(spec.text, options.limits);
    }
    return invalid_argument("unknown grammar kind");
}

namespace {

struct Job {
    std::string key;
    GrammarSpec spec;
    std::shared_ptr<const Vocabulary> vocab;
    // Live waiters (raw pointer for identity, weak_ptr to reach it).
    std::vector<std::pair<CompileHandle::Waiter*, std::weak_ptr<CompileHandle::Waiter>>> waiters;
    bool running = false;
};

}  // namespace

struct CompileHandle::Waiter {
    std::shared_ptr<CompileService::Core> core;
    int64_t deadline_ns = 0;
    CompileCallback callback;
    // GUARDED_BY(core->mu):
    std::shared_ptr<Job> job;  // null once done
    bool done = false;
    CompileResult result = unavailable("not ready");
};

struct CompileService::Core {
    CompileServiceOptions options;
    Env* env = nullptr;
    std::mutex mu;
    std::condition_variable work_cv;  // workers: queue non-empty or stop
    std::condition_variable done_cv;  // waiters: some waiter completed
    std::deque<std::shared_ptr<Job>> queue;                          // GUARDED_BY(mu)
    std::unordered_map<std::string, std::shared_ptr<Job>> inflight;  // GUARDED_BY(mu)
    using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
    std::list<Entry> lru;                                                // front = newest
    std::unordered_map<std::string, std::list<Entry>::iterator> cache;  // GUARDED_BY(mu)
    CompileServiceStats stats;                                           // GUARDED_BY(mu)
    bool stop = false;
    std::vector<std::thread> workers;

    // A completion to hand out once the lock is released.
    struct Delivery {
        CompileCallback callback;
        CompileResult result;
    };

    // REQUIRES: mu held, !w->done. Marks `w` done with `r`, detaches it from its job.
    static void finish_locked(const std::shared_ptr<CompileHandle::Waiter>& w, CompileResult r,
                              std::vector<Delivery>* out) {
        w->done = true;
        w->job.reset();
        w->result = r;
        if (w->callback) out->push_back({std::move(w->callback), std::move(r)});
        w->callback = nullptr;
    }

    static void deliver(std::vector<Delivery>* ds) {
        for (Delivery& d : *ds) d.callback(d.result);
        ds->clear();
    }

    // REQUIRES: mu held. Removes a job nobody waits for from the queue.
    void drop_if_orphan_locked(const std::shared_ptr<Job>& job) {
        if (!job->waiters.empty() || job->running) return;
        auto it = std::find(queue.begin(), queue.end(), job);
        if (it != queue.end()) queue.erase(it);
        inflight.erase(job->key);
        ++stats.cancelled;
    }

    // REQUIRES: mu held. Expires waiter `w` if its deadline passed.
    bool expire_if_due_locked(const std::shared_ptr<CompileHandle::Waiter>& w, int64_t now,
                              std::vector<Delivery>* out) {
        if (w->done || w->deadline_ns == 0 || now <= w->deadline_ns) return false;
        std::shared_ptr<Job> job = w->job;
        std::erase_if(job->waiters, [&](const auto& p) { return p.first == w.get(); });
        finish_locked(w, deadline_exceeded("grammar compile deadline passed"), out);
        ++stats.expired;
        drop_if_orphan_locked(job);
        return true;
    }

    void cache_put_locked(const std::string& key, std::shared_ptr<const CompiledGrammar> g) {
        auto it = cache.find(key);
        if (it != cache.end()) lru.erase(it->second);
        lru.emplace_front(key, std::move(g));
        cache[key] = lru.begin();
        while (lru.size() > std::max<size_t>(options.cache_entries, 1)) {
            cache.erase(lru.back().first);
            lru.pop_back();
        }
    }

    void worker_loop() {
        std::vector<Delivery> ds;
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lock(mu);
                work_cv.wait(lock, [&] { return stop || !queue.empty(); });
                if (stop) return;
                job = queue.front();
                queue.pop_front();
                const int64_t now = env->now_ns();
                std::vector<std::shared_ptr<CompileHandle::Waiter>> live;
                for (const auto& p : job->waiters) {
                    if (auto w = p.second.lock()) live.push_back(std::move(w));
                }
                for (const auto& w : live) {
                    if (w->deadline_ns != 0 && now > w->deadline_ns) {
                        w->job.reset();
                        std::erase_if(job->waiters,
                                      [&](const auto& p) { return p.first == w.get(); });
                        finish_locked(w, deadline_exceeded("grammar compile deadline passed"),
                                      &ds);
                        ++stats.expired;
                    }
                }
                if (job->waiters.empty()) {
                    inflight.erase(job->key);
                    ++stats.cancelled;
                    job.reset();
                } else {
                    job->running = true;
                }
            }
            if (!ds.empty()) {
                deliver(&ds);
                done_cv.notify_all();
            }
            if (!job) continue;

            const int64_t t0 = env->now_ns();
            Result<Grammar> g = options.compile ? options.compile(job->spec)
                                                : compile_grammar(job->spec, options.json);
            CompileResult result = unavailable("unset");
            if (g.is_ok()) {
                auto cg = std::make_shared<CompiledGrammar>(std::move(g).value(), job->vocab,
                                                            options.matcher);
                if (options.matcher.precompute) GrammarMatcher(cg).precompute();
                result = std::shared_ptr<const CompiledGrammar>(std::move(cg));
            } else {
                result = g.status();
            }
            const int64_t t1 = env->now_ns();
            {
                std::lock_guard<std::mutex> lock(mu);
                ++stats.compiled;
                stats.compile_ns_total += t1 - t0;
                if (result.is_ok()) {
                    cache_put_locked(job->key, result.value());
                } else {
                    ++stats.failed;
                }
                inflight.erase(job->key);
                for (const auto& p : job->waiters) {
                    if (auto w = p.second.lock(); w && !w->done) finish_locked(w, result, &ds);
                }
                job->waiters.clear();
            }
            deliver(&ds);
            done_cv.notify_all();
        }
    }
};

CompileService::CompileService(CompileServiceOptions options, Env* env)
    : core_(std::make_shared<Core>()) {
    core_->options = std::move(options);
    // One table cache for every grammar this service compiles: positions with the
    // same structure (JSON strings, numbers) share their token tables (matcher.h).
    if (!core_->options.matcher.table_cache) {
        core_->options.matcher.table_cache = std::make_shared<PositionTableCache>();
    }
    core_->env = env;
    const int n = std::max(1, core_->options.num_workers);
    Core* c = core_.get();
    for (int i = 0; i < n; ++i) {
        core_->workers.push_back(env->start_thread([c] { c->worker_loop(); }));
    }
}

CompileService::~CompileService() {
    std::vector<Core::Delivery> ds;
    {
        std::lock_guard<std::mutex> lock(core_->mu);
        core_->stop = true;
        for (const auto& job : core_->queue) {
            for (const auto& p : job->waiters) {
                if (auto w = p.second.lock(); w && !w->done) {
                    Core::finish_locked(w, cancelled("compile service shut down"), &ds);
                }
            }
            job->waiters.clear();
            core_->inflight.erase(job->key);
        }
        core_->queue.clear();
    }
    core_->work_cv.notify_all();
    Core::deliver(&ds);
    core_->done_cv.notify_all();
    for (std::thread& t : core_->workers) t.join();
}

WarmupStats CompileService::warm_table_cache(const std::shared_ptr<const Vocabulary>& vocab) {
    return grammar::warm_table_cache(vocab, core_->options.matcher);
}

Result<std::unique_ptr<CompileHandle>> CompileService::submit(
    const GrammarSpec& spec, std::shared_ptr<const Vocabulary> vocab, int64_t deadline_ns,
    CompileCallback callback) {
    GrammarSpec canon = spec;
    if (spec.kind == GrammarKind::kJsonSchema) {
        auto j = nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) return invalid_argument("json_schema: not valid JSON");
        canon.text = j.dump();
    } else if (spec.kind == GrammarKind::kJsonObject) {
        canon.text.clear();
        canon.any_property_order = false;  // no declared properties
    } else {
        canon.flexible_whitespace = canon.any_property_order = false;  // JSON only
    }
    std::string key;
    key.push_back(static_cast<char>(spec.kind));
    key.push_back(
        static_cast<char>(int{canon.flexible_whitespace} | int{canon.any_property_order} << 1));
    const uint64_t fp = vocab->fingerprint();
    key.append(reinterpret_cast<const char*>(&fp), sizeof(fp));
    key += canon.text;

    auto w = std::make_shared<CompileHandle::Waiter>();
    w->core = core_;
    w->deadline_ns = deadline_ns;
    w->callback = std::move(callback);
    std::vector<Core::Delivery> ds;
    {
        std::lock_guard<std::mutex> lock(core_->mu);
        CompileServiceStats& st = core_->stats;
        ++st.submitted;
        if (core_->stop) return unavailable("compile service shut down");
        if (auto it = core_->cache.find(key); it != core_->cache.end()) {
            core_->lru.splice(core_->lru.begin(), core_->lru, it->second);
            ++st.cache_hits;
            Core::finish_locked(w, it->second->second, &ds);
        } else if (auto jt = core_->inflight.find(key); jt != core_->inflight.end()) {
            ++st.joined;
            w->job = jt->second;
            jt->second->waiters.emplace_back(w.get(), w);
        } else {
            if (core_->queue.size() >= core_->options.max_queue) {
                ++st.rejected;
                return resource_exhausted("grammar compile queue full (" +
                                          std::to_string(core_->options.max_queue) + " waiting)");
            }
            auto job = std::make_shared<Job>();
            job->key = key;
            job->spec = std::move(canon);
            job->vocab = std::move(vocab);
            job->waiters.emplace_back(w.get(), w);
            w->job = job;
            core_->inflight[key] = job;
            core_->queue.push_back(std::move(job));
            core_->work_cv.notify_one();
        }
    }
    Core::deliver(&ds);
    return std::unique_ptr<CompileHandle>(new CompileHandle(std::move(w)));
}

CompileServiceStats CompileService::stats() const {
    std::lock_guard<std::mutex> lock(core_->mu);
    CompileServiceStats s = core_->stats;
    s.cache_entries = static_cast<int64_t>(core_->lru.size());
    s.queued = static_cast<int64_t>(core_->queue.size());
    return s;
}

CompileHandle::~CompileHandle() { cancel(); }

void CompileHandle::cancel() {
    CompileService::Core* c = w_->core.get();
    std::lock_guard<std::mutex> lock(c->mu);
    if (w_->done) {
        w_->callback = nullptr;
        return;
    }
    std::shared_ptr<Job> job = w_->job;
    std::erase_if(job->waiters, [&](const auto& p) { return p.first == w_.get(); });
    w_->done = true;
    w_->job.reset();
    w_->callback = nullptr;
    w_->result = cancelled("grammar compile cancelled");
    c->drop_if_orphan_locked(job);
}

CompileResult CompileHandle::poll() {
    CompileService::Core* c = w_->core.get();
    std::vector<CompileService::Core::Delivery> ds;
    CompileResult r = unavailable("grammar compile not finished");
    {
        std::lock_guard<std::mutex> lock(c->mu);
        c->expire_if_due_locked(w_, c->env->now_ns(), &ds);
        if (w_->done) r = w_->result;
    }
    CompileService::Core::deliver(&ds);
    return r;
}

bool CompileHandle::ready() {
    (void)poll();
    std::lock_guard<std::mutex> lock(w_->core->mu);
    return w_->done;
}

CompileResult CompileHandle::wait_for(int64_t timeout_ns) {
    CompileService::Core* c = w_->core.get();
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    std::vector<CompileService::Core::Delivery> ds;
    CompileResult r = unavailable("grammar compile not finished");
    {
        std::unique_lock<std::mutex> lock(c->mu);
        for (;;) {
            c->expire_if_due_locked(w_, c->env->now_ns(), &ds);
            if (w_->done) {
                r = w_->result;
                break;
            }
            // Wake at least every millisecond to see an (injected) clock pass the deadline.
            auto next = std::min(until, std::chrono::steady_clock::now() +
                                            std::chrono::milliseconds(1));
            if (std::chrono::steady_clock::now() >= until) break;
            c->done_cv.wait_until(lock, next);
        }
    }
    CompileService::Core::deliver(&ds);
    return r;
}

}  // namespace dsi::grammar

#include "router/remote_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <utility>

#include "base/clock.h"
#include "base/logging.h"
#include "server/engine_rpc.h"

namespace dsi::router {

using server::Generation;
using server::Sink;
using server::Ticket;
using server::Update;

struct RemoteService::Call {
    Ticket ticket = 0;
    Generation generation;  // kept to send again (the mask is not sent)
    Sink sink;

    // Sink calls: one at a time, nothing after the final update.
    Mutex deliver_mu;
    bool final_sent DSI_GUARDED_BY(deliver_mu) = false;

    // The rest under RemoteService::mu_.
    std::string engine_id;  // "" between attempts
    // Weak: the client's I/O thread owns the handlers that own this Call; a strong
    // reference here would let the last one go on that thread, which cannot join itself.
    std::weak_ptr<net::HttpClient> client;
    uint64_t http_id = 0;
    uint64_t attempt = 0;  // callbacks of an earlier attempt are ignored
    int num_attempts = 0;
    std::set<std::string> tried;
    int64_t delivered_tokens = 0;        // tokens the client has
    std::vector<int32_t> delivered_ids;  // their ids (a continuation resumes after them)
    int64_t seen_tokens = 0;             // tokens of the current attempt's stream
    int64_t kv_charged = 0;              // counted into the engine's kv_tokens
    bool aborted = false;
    bool finished = false;
    bool broken = false;  // the current stream sent something unreadable
    // The current engine gave the generation up on purpose (a drain's grace ran out):
    // moving it is a planned migration and does not use up one of its attempts.
    bool given_up = false;
    // dispatch_locked found no engine for it (rather than running out of attempts or
    // time); while it waits for one, the wait's end (steady ns; 0: not waiting).
    bool no_engine = false;
    int64_t wait_until_ns = 0;
    // Disaggregated: the current attempt runs on a prefill engine and hands over to a
    // decode engine after its first token.
    bool on_prefill = false;
    bool handing_over = false;  // the prefill stream is being closed for the hand-over
    // KV hand-over: the decode engine the prefill engine sends the prompt's KV to (its
    // inbox); the continuation goes there. Empty: none (the decode engine computes the
    // prompt again, or takes it from the shared store).
    std::string handoff_engine;
    int64_t prefix_hit_tokens = -1;  // S-KV-4, before routing; -1: unknown
    // S-KV-10 with the SWA directory: the state the hit starts from and its holders.
    SwaRoutePlan swa;
    // The first engine's prefix-cache hit (usage.cached_tokens): what a later engine
    // takes from a hand-over or its own cache was computed for this request, not cached.
    int64_t cached_prompt_tokens = -1;
    // S-LB prefill queue: the work id while the call waits for a pull (0: not waiting),
    // the engine that pulled it (dispatch sends it there), and the prefill cost it holds
    // on its prefill engine until that stream ends.
    uint64_t prefill_work = 0;
    std::string pulled_by;
    double prefill_cost_ns = 0;
    int http_status = 0;
    std::string line_buffer;
    std::string error_body;
    std::string last_error;

    void deliver(Update u) {
        MutexLock l(&deliver_mu);
        if (final_sent) return;
        final_sent = u.finished;
        u.ticket = ticket;
        sink(std::move(u));
    }
};

namespace {

uint64_t next_attempt() {
    static std::atomic<uint64_t> n{1};
    return n.fetch_add(1);
}

// Unique per router process and hand-over: a random process part, then a counter.
transfer::TransferId next_transfer_id() {
    static const uint64_t process = [] {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(steady_clock_ns());
    }();
    static std::atomic<uint64_t> n{1};
    return transfer::TransferId{process, n.fetch_add(1)};
}

Update final_error(Status s) {
    Update u;
    u.finished = true;
    u.reason = engine::FinishReason::kError;
    u.error = std::move(s);
    return u;
}

// The engine's JSON error reply as a Status with the code its HTTP status stands for.
Status status_from_reply(int http, const std::string& body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    std::string message = "engine answered HTTP " + std::to_string(http);
    if (j.is_object() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message") && j["error"]["message"].is_string()) {
        message = j["error"]["message"].get<std::string>();
    }
    switch (http) {
        case 400:
            return invalid_argument(message);
        case 401:
            return Status(StatusCode::kUnauthenticated, message);
        case 403:
            return Status(StatusCode::kPermissionDenied, message);
        case 404:
            return not_found(message);
        case 413:
            return invalid_argument(message);
        case 501:
            return unimplemented(message);
        case 504:
            return deadline_exceeded(message);
        default:
            return unavailable(message);
    }
}

// 4xx but 429, 501 and 504 are the request's own fault or final: no failover.
bool is_final_http_error(int http) {
    return (http >= 400 && http < 500 && http != 429 && http != 408) || http == 501 || http == 504;
}

bool routable(const membership::Member& m) { return m.role != membership::Role::kRouter; }

}  // namespace

RemoteService::RemoteService(RemoteServiceOptions options)
    : options_(std::move(options)), lb_(options_.lb) {
    DSI_CHECK(options_.prefill_lb.validate().is_ok(), options_.prefill_lb.validate().to_string());
    if (options_.swa_chain_keys) {
        SwaDirectoryServiceOptions so = options_.swa_directory;
        if (so.engine_api_key.empty()) so.engine_api_key = options_.engine_api_key;
        swa_ = std::make_unique<SwaDirectoryService>(std::move(so));
    }
    pump_thread_ = std::thread([this] { pump_loop(); });
}

RemoteService::~RemoteService() {
    {
        MutexLock l(&mu_);
        stopping_ = true;
    }
    pump_cv_.notify_all();
    pump_thread_.join();
    abort_all();
    swa_.reset();
    // The clients end (and join their threads) while every member is alive: their last
    // callbacks run into this object.
    std::vector<std::shared_ptr<net::HttpClient>> clients;
    {
        MutexLock l(&mu_);
        for (auto& [id, e] : engines_) clients.push_back(std::move(e.client));
        engines_.clear();
        for (auto& c : retired_) clients.push_back(std::move(c));
        retired_.clear();
    }
    clients.clear();
}

void RemoteService::add_engine_locked(const membership::Member& m) {
    if (!routable(m) || m.address.empty()) return;
    if (auto it = engines_.find(m.id); it != engines_.end()) {
        if (it->second.member.incarnation == m.incarnation &&
            it->second.member.address == m.address) {
            it->second.member = m;  // known already (a snapshot and a join overlap)
            return;
        }
        remove_engine_locked(m.id, /*cut_streams=*/true);  // another process now
    }
    const size_t colon = m.address.rfind(':');
    Engine e;
    e.member = m;
    e.client = std::make_shared<net::HttpClient>(
        net::HttpTarget{m.address.substr(0, colon), m.address.substr(colon + 1), ""});
    // Generations still on an engine of this id (it left -- a lease gap, a drain -- and
    // is back, or their streams were cut and will fail over) count on the new record:
    // their ends release what they hold from it, so it must hold it.
    for (const auto& [ticket, call] : calls_) {
        if (call->engine_id != m.id) continue;
        ++e.num_requests;
        e.kv_tokens += call->kv_charged;
        if (call->prefill_cost_ns != 0) {
            e.prefill_held_ns += call->prefill_cost_ns;
            ++e.prefill_held_calls;
        }
    }
    DSI_LOG(kInfo) << "engine " << m.id << " (" << membership::role_name(m.role) << ", "
                   << m.address << ", incarnation " << m.incarnation << ") joined";
    engines_[m.id] = std::move(e);
}

namespace {
// A stream with no bytes for this long from an engine the directory dropped is cut.
constexpr int64_t kStalledStreamNs = int64_t{1000} * 1000000;
}  // namespace

void RemoteService::remove_engine_locked(const std::string& id, bool cut_streams) {
    auto it = engines_.find(id);
    if (it == engines_.end()) return;
    const bool quiet = steady_clock_ns() - it->second.last_bytes_ns > kStalledStreamNs;
    DSI_LOG(kInfo) << "engine " << id << " left"
                   << (cut_streams || quiet ? "; its streams are cut" : "");
    if (cut_streams || quiet) {
        // Its streams are cut: each call fails over in on_done.
        for (auto& [ticket, call] : calls_) {
            if (call->engine_id == id) it->second.client->cancel(call->http_id);
        }
    }
    retired_.push_back(std::move(it->second.client));
    engines_.erase(it);
}

void RemoteService::set_engines(const std::vector<membership::Member>& members) {
    if (swa_) swa_->set_members(members);
    Failures failed;
    {
        MutexLock l(&mu_);
        std::set<std::string> keep;
        for (const auto& m : members) {
            if (!routable(m)) continue;
            keep.insert(m.id);
            auto it = engines_.find(m.id);
            if (it != engines_.end() && it->second.member.incarnation == m.incarnation &&
                it->second.member.address == m.address) {
                it->second.member = m;
                continue;
            }
            remove_engine_locked(m.id, /*cut_streams=*/true);
            add_engine_locked(m);
        }
        std::vector<std::string> gone;
        for (const auto& [id, e] : engines_) {
            if (keep.count(id) == 0) gone.push_back(id);
        }
        for (const auto& id : gone) remove_engine_locked(id, /*cut_streams=*/false);
        pump_prefill_locked(failed);
    }
    deliver_failures(failed);
}

void RemoteService::apply(const membership::MemberChange& change) {
    if (swa_) swa_->apply(change);
    Failures failed;
    {
        MutexLock l(&mu_);
        apply_locked(change);
        pump_prefill_locked(failed);
    }
    deliver_failures(failed);
}

void RemoteService::apply_locked(const membership::MemberChange& change) {
    const membership::Member& m = change.member;
    switch (change.kind) {
        case membership::ChangeKind::kJoined:
            add_engine_locked(m);
            break;
        case membership::ChangeKind::kUpdated: {
            auto it = engines_.find(m.id);
            if (it != engines_.end() && it->second.member.address == m.address) {
                it->second.member = m;  // capacity changed
            } else {
                remove_engine_locked(m.id, /*cut_streams=*/true);
                add_engine_locked(m);
            }
            break;
        }
        case membership::ChangeKind::kRestarted:
            // S-DEPLOY: whatever ran on the old incarnation is lost; its calls fail over.
            remove_engine_locked(m.id, /*cut_streams=*/true);
            add_engine_locked(m);
            break;
        case membership::ChangeKind::kLeft:
            // A draining engine left on purpose and finishes what it runs; a dead one's
            // streams have broken already or gone quiet.
            remove_engine_locked(m.id, /*cut_streams=*/false);
            break;
    }
}

bool RemoteService::has_role_locked(bool prefill) const {
    for (const auto& [id, e] : engines_) {
        if ((e.member.role == membership::Role::kPrefill) == prefill) return true;
    }
    return false;
}

std::string RemoteService::choose_engine_locked(const Call& call, bool prefill) {
    const int64_t now = steady_clock_ns();
    const auto& r = call.generation.request;
    const int64_t context = static_cast<int64_t>(r.prompt.size()) + call.delivered_tokens;
    const int64_t reserve = static_cast<int64_t>(r.prompt.size()) + r.sampling.max_tokens;
    // First the engines not recently broken; when all are, those too (they may be back).
    for (bool include_avoided : {false, true}) {
        std::vector<cluster::DecodeRankState> ranks;
        std::vector<const std::string*> ids;
        for (const auto& [id, e] : engines_) {
            if ((e.member.role == membership::Role::kPrefill) != prefill) continue;
            if (call.tried.count(id) != 0) continue;
            if (!include_avoided && e.avoid_until_ns > now) continue;
            cluster::DecodeRankState s;
            s.num_requests = e.num_requests;
            s.kv_tokens = e.kv_tokens;
            s.max_requests = e.member.capacity > 0 ? static_cast<int>(e.member.capacity) : 128;
            ranks.push_back(s);
            ids.push_back(&id);
        }
        if (ranks.empty()) continue;
        Result<int> pick = lb_.choose(ranks, context, reserve);
        if (pick.is_ok()) return *ids[static_cast<size_t>(*pick)];
    }
    return {};
}

bool RemoteService::dispatch_locked(const std::shared_ptr<Call>& call) {
    call->no_engine = false;
    if (call->num_attempts >= options_.max_attempts) return false;
    const int64_t deadline = call->generation.request.deadline_ns;
    int64_t timeout_ms = 0;
    if (deadline > 0) {
        timeout_ms = (deadline - steady_clock_ns()) / 1000000;
        if (timeout_ms <= 0) {
            call->last_error = "deadline passed";
            return false;
        }
    }
    // Disaggregated: a generation without output yet goes to a prefill engine when
    // there are both kinds; the rest (or all of it without prefill engines) to a
    // decode / both engine. Without decode engines a prefill engine runs it all.
    const int64_t miss = static_cast<int64_t>(call->generation.request.prompt.size()) -
                         std::max<int64_t>(call->prefix_hit_tokens, 0);
    const bool disaggregated = has_role_locked(true) && has_role_locked(false);
    const bool want_prefill =
        call->delivered_tokens == 0 && disaggregated &&
        (call->prefix_hit_tokens < 0 || miss > options_.direct_decode_max_miss_tokens);
    if (call->delivered_tokens == 0 && disaggregated && !want_prefill && call->num_attempts == 0) {
        ++stats_.num_direct_decode;
    }
    // The other kind when none of the wanted one can take it: a decode engine runs the
    // whole generation, or a prefill engine does (no hand-over either way). A
    // continuation after a KV hand-over goes to the engine that received the KV.
    std::string id;
    if (!call->pulled_by.empty()) {
        // A prefill engine pulled it (pump_prefill_locked).
        if (engines_.count(call->pulled_by) != 0) id = call->pulled_by;
        call->pulled_by.clear();
    } else if (want_prefill && call->num_attempts == 0) {
        // S-LB: the generation waits until a prefill engine pulls it.
        enqueue_prefill_locked(call);
        return true;
    }
    if (id.empty() && !want_prefill && !call->handoff_engine.empty()) {
        auto it = engines_.find(call->handoff_engine);
        if (it != engines_.end() && call->tried.count(it->first) == 0 &&
            it->second.avoid_until_ns <= steady_clock_ns()) {
            id = it->first;
        }
    }
    call->handoff_engine.clear();
    if (id.empty()) id = choose_engine_locked(*call, want_prefill);
    const bool on_prefill = want_prefill && !id.empty();
    if (id.empty()) id = choose_engine_locked(*call, !want_prefill);
    if (id.empty()) {
        call->no_engine = true;
        return false;
    }
    call->on_prefill = on_prefill;
    call->handing_over = false;
    call->generation.handoff.reset();
    if (on_prefill && call->generation.request.sampling.max_tokens > 1 &&
        call->generation.request.sampling.n == 1) {
        // Where the continuation will run, chosen now: the prefill engine sends the
        // prompt's KV to its inbox while the client reads the first token.
        const std::string decode = choose_engine_locked(*call, /*prefill=*/false);
        if (!decode.empty() && !engines_.at(decode).member.transfer_address.empty()) {
            call->handoff_engine = decode;
            call->generation.handoff = serving::HandoffTarget{
                engines_.at(decode).member.transfer_address, next_transfer_id()};
        }
    }
    set_swa_pull_locked(*call, id);
    Engine& e = engines_.at(id);
    if (on_prefill) {
        call->prefill_cost_ns = prefill_cost_locked(*call);
        if (call->prefill_cost_ns != 0) {
            e.prefill_held_ns += call->prefill_cost_ns;
            ++e.prefill_held_calls;
        }
    }
    call->engine_id = id;
    call->client = e.client;
    call->tried.insert(id);
    ++call->num_attempts;
    call->attempt = next_attempt();
    // A re-sent generation continues after the tokens the client has (n = 1: the
    // engine prefills them as output); otherwise it runs again and they are dropped.
    const bool resume = call->generation.request.sampling.n == 1;
    if (resume) call->generation.request.resume_output = call->delivered_ids;
    call->seen_tokens = resume ? call->delivered_tokens : 0;
    call->broken = false;
    call->given_up = false;
    call->http_status = 0;
    call->line_buffer.clear();
    call->error_body.clear();
    call->kv_charged =
        static_cast<int64_t>(call->generation.request.prompt.size()) + call->delivered_tokens;
    ++e.num_requests;
    e.kv_tokens += call->kv_charged;

    net::HttpRequest req;
    req.method = "POST";
    req.path = std::string(server::kEngineRpcPath);
    req.body = server::encode_generation(call->generation, timeout_ms);
    req.headers = {{"Content-Type", "application/json"}};
    if (!options_.engine_api_key.empty()) {
        req.headers.emplace_back("Authorization", "Bearer " + options_.engine_api_key);
    }
    const uint64_t attempt = call->attempt;
    net::HttpHandlers h;
    h.on_status = [this, call, attempt](int status) {
        MutexLock l(&mu_);
        if (call->attempt == attempt) call->http_status = status;
    };
    h.on_body = [this, call, attempt](std::string_view bytes) {
        on_body(call, attempt, bytes);
        MutexLock l(&mu_);
        return call->attempt == attempt && !call->finished && !call->aborted && !call->broken &&
               !call->handing_over;
    };
    h.on_done = [this, call, attempt](Status s) { on_done(call, attempt, std::move(s)); };
    call->http_id = e.client->start(std::move(req), std::move(h));
    return true;
}

bool RemoteService::dispatch_or_wait_locked(const std::shared_ptr<Call>& call) {
    if (dispatch_locked(call)) return true;
    if (!call->no_engine || options_.no_engine_wait_ms <= 0 || stopping_) return false;
    int64_t until = steady_clock_ns() + options_.no_engine_wait_ms * 1000000;
    const int64_t deadline = call->generation.request.deadline_ns;
    if (deadline > 0) until = std::min(until, deadline);
    if (call->wait_until_ns == 0) {
        call->wait_until_ns = until;
        engine_waiting_.push_back(call);
        ++stats_.num_engine_waits;
    }
    return true;
}

void RemoteService::retry_waiting_locked(Failures& failed) {
    if (engine_waiting_.empty()) return;
    const int64_t now = steady_clock_ns();
    std::vector<std::shared_ptr<Call>> waiting = std::move(engine_waiting_);
    engine_waiting_.clear();
    for (std::shared_ptr<Call>& call : waiting) {
        if (call->aborted || call->finished) continue;
        if (dispatch_locked(call)) {
            call->wait_until_ns = 0;
            continue;
        }
        if (call->no_engine && now < call->wait_until_ns) {
            engine_waiting_.push_back(std::move(call));
            continue;
        }
        call->wait_until_ns = 0;
        calls_.erase(call->ticket);
        ++stats_.num_failed;
        const std::string why = call->last_error.empty() ? "" : ": " + call->last_error;
        failed.emplace_back(call, unavailable("no engine is available for this request" + why +
                                              " (" + dispatch_state_locked(*call) + ")"));
    }
}

std::string RemoteService::dispatch_state_locked(const Call& call) const {
    std::string s = "attempt " + std::to_string(call.num_attempts) + " of " +
                    std::to_string(options_.max_attempts) + "; tried";
    for (const std::string& id : call.tried) s += " " + id;
    s += "; engines now:";
    for (const auto& [id, e] : engines_) s += " " + id;
    if (engines_.empty()) s += " none";
    return s;
}

void RemoteService::release_engine_locked(Call& call) {
    if (call.engine_id.empty()) return;
    auto it = engines_.find(call.engine_id);
    if (it != engines_.end()) {
        --it->second.num_requests;
        it->second.kv_tokens -= call.kv_charged;
        if (call.prefill_cost_ns != 0) {
            // Exactly 0 once the engine holds nothing: a sum of fractional costs taken
            // off in another order leaves a rounding residue (0.1 + 0.2 + 0.3 less each
            // is 5.6e-17, not 0), and an engine that is not empty never pulls a prompt
            // that costs more than its whole quota -- the router stalled behind one.
            Engine& e = it->second;
            e.prefill_held_ns = --e.prefill_held_calls <= 0
                                    ? 0.0
                                    : std::max(0.0, e.prefill_held_ns - call.prefill_cost_ns);
            e.prefill_held_calls = std::max<int64_t>(0, e.prefill_held_calls);
        }
    }
    call.engine_id.clear();
    call.kv_charged = 0;
    call.prefill_cost_ns = 0;
}

double RemoteService::prefill_cost_locked(const Call& call) const {
    const int64_t prompt = static_cast<int64_t>(call.generation.request.prompt.size());
    const int64_t hit = std::clamp<int64_t>(call.prefix_hit_tokens, 0, prompt);
    if (options_.prefill_cost_ns) return options_.prefill_cost_ns(prompt - hit, hit);
    return 150'000.0 * static_cast<double>(prompt - hit);
}

void RemoteService::enqueue_prefill_locked(const std::shared_ptr<Call>& call) {
    cluster::PrefillWork w;
    w.id = next_prefill_work_++;
    w.total_tokens = static_cast<int64_t>(call->generation.request.prompt.size());
    w.cost_ns = prefill_cost_locked(*call);
    w.arrival_ns = steady_clock_ns();
    call->prefill_work = w.id;
    prefill_waiting_[w.id] = {w, call};
    if (prefill_lb_) prefill_lb_->submit(w);  // else the next sync submits it
    ++stats_.num_prefill_queued;
}

void RemoteService::sync_prefill_engines_locked(Failures& failed) {
    std::vector<std::string> ids;
    for (const auto& [id, e] : engines_) {
        if (e.member.role == membership::Role::kPrefill) ids.push_back(id);
    }
    if (ids == prefill_ids_ && (prefill_lb_.has_value() || ids.empty())) return;
    prefill_ids_ = std::move(ids);
    prefill_available_.assign(prefill_ids_.size(), true);
    lb_reassignments_seen_ = 0;
    if (prefill_ids_.empty()) {
        // No prefill engine left: the waiting generations go to decode engines now.
        prefill_lb_.reset();
        auto waiting = std::move(prefill_waiting_);
        prefill_waiting_.clear();
        for (auto& [wid, entry] : waiting) {
            const std::shared_ptr<Call>& call = entry.second;
            call->prefill_work = 0;
            if (call->aborted || call->finished) continue;
            if (dispatch_or_wait_locked(call)) {
                ++stats_.num_routed;
                continue;
            }
            calls_.erase(call->ticket);
            ++stats_.num_failed;
            failed.emplace_back(call, unavailable("no engine is available for this request"));
        }
        return;
    }
    prefill_lb_.emplace(options_.prefill_lb, static_cast<int>(prefill_ids_.size()),
                        steady_clock_ns());
    for (const auto& [wid, entry] : prefill_waiting_) prefill_lb_->submit(entry.first);
}

void RemoteService::pump_prefill_locked(Failures& failed) {
    if (stopping_) return;  // the destructor aborts what waits; nothing new is sent
    retry_waiting_locked(failed);
    sync_prefill_engines_locked(failed);
    const int64_t now = steady_clock_ns();
    for (auto it = prefill_waiting_.begin(); it != prefill_waiting_.end();) {
        const std::shared_ptr<Call> call = it->second.second;
        const int64_t deadline = call->generation.request.deadline_ns;
        if (call->aborted || call->finished) {
            it = prefill_waiting_.erase(it);
        } else if (deadline > 0 && deadline <= now) {
            call->prefill_work = 0;
            calls_.erase(call->ticket);
            ++stats_.num_failed;
            failed.emplace_back(call, deadline_exceeded("the request's deadline passed while it "
                                                        "waited for a prefill engine"));
            it = prefill_waiting_.erase(it);
        } else {
            ++it;
        }
    }
    if (!prefill_lb_) return;
    prefill_lb_->tick(now);
    stats_.num_prefill_reassignments += prefill_lb_->num_reassignments() - lb_reassignments_seen_;
    lb_reassignments_seen_ = prefill_lb_->num_reassignments();
    for (size_t i = 0; i < prefill_ids_.size(); ++i) {
        Engine& e = engines_.at(prefill_ids_[i]);
        const bool available = e.avoid_until_ns <= now;
        if (available != prefill_available_[i]) {
            prefill_lb_->set_engine_available(static_cast<int>(i), available);
            prefill_available_[i] = available;
        }
        if (!available) continue;
        for (const cluster::PrefillWork& w :
             prefill_lb_->pull(static_cast<int>(i), e.prefill_held_ns)) {
            auto it = prefill_waiting_.find(w.id);
            if (it == prefill_waiting_.end()) continue;  // aborted while it waited
            const std::shared_ptr<Call> call = it->second.second;
            prefill_waiting_.erase(it);
            call->prefill_work = 0;
            call->pulled_by = prefill_ids_[i];
            if (dispatch_or_wait_locked(call)) {
                ++stats_.num_routed;
                continue;
            }
            calls_.erase(call->ticket);
            ++stats_.num_failed;
            failed.emplace_back(call, unavailable(call->last_error.empty()
                                                      ? "no engine is available for this request"
                                                      : call->last_error));
        }
    }
}

void RemoteService::deliver_failures(Failures& failed) {
    for (auto& [call, why] : failed) call->deliver(final_error(std::move(why)));
    failed.clear();
}

void RemoteService::pump_loop() {
    for (;;) {
        Failures failed;
        {
            MutexLock l(&mu_);
            if (!stopping_) {
                pump_cv_.wait_for(&mu_, std::chrono::milliseconds(options_.pump_interval_ms));
            }
            if (stopping_) return;
            pump_prefill_locked(failed);
        }
        deliver_failures(failed);
    }
}

void RemoteService::start(Ticket ticket, Generation generation, Sink sink) {
    auto call = std::make_shared<Call>();
    call->ticket = ticket;
    call->generation = std::move(generation);
    call->generation.request.mask.reset();  // the engine compiles its own
    call->sink = std::move(sink);
    if (options_.prefix_hit) {
        call->prefix_hit_tokens = options_.prefix_hit(call->generation.request);
    }
    if (swa_ && call->prefix_hit_tokens >= 0) {
        // S-KV-10: the blocks give L1, the states the directory knows decide the hit.
        const engine::GenerateRequest& r = call->generation.request;
        const std::vector<kv::BlockKey> keys = options_.swa_chain_keys(r);
        const auto input = static_cast<int64_t>(r.prompt.size());
        const int64_t blocks = std::min<int64_t>(call->prefix_hit_tokens / kv::kBlockTokens,
                                                 static_cast<int64_t>(keys.size()));
        call->swa = swa_->plan(keys, input, std::min(blocks * kv::kBlockTokens, input));
        call->prefix_hit_tokens = call->swa.plan.hit_tokens;
    }
    Failures failed;
    bool sent = false;
    {
        MutexLock l(&mu_);
        if (call->prefix_hit_tokens >= 0) {
            ++stats_.num_prefix_checks;
            stats_.prefix_hit_tokens += call->prefix_hit_tokens;
        }
        calls_[ticket] = call;
        sent = dispatch_or_wait_locked(call);
        if (sent) {
            if (call->prefill_work == 0) ++stats_.num_routed;  // else when it is pulled
            pump_prefill_locked(failed);
        } else {
            calls_.erase(ticket);
            ++stats_.num_failed;
        }
    }
    deliver_failures(failed);
    if (sent) return;
    call->deliver(final_error(
        unavailable(call->last_error.empty()
                        ? "no engine is available for this request"
                        : "no engine is available for this request: " + call->last_error)));
}

void RemoteService::on_body(const std::shared_ptr<Call>& call, uint64_t attempt,
                            std::string_view bytes) {
    std::vector<Update> out;
    {
        MutexLock l(&mu_);
        if (call->attempt != attempt || call->finished || call->aborted || call->broken ||
            call->handing_over) {
            return;
        }
        if (call->http_status != 200) {
            if (call->error_body.size() < 65536) call->error_body.append(bytes);
            return;
        }
        if (auto it = engines_.find(call->engine_id); it != engines_.end()) {
            it->second.last_bytes_ns = steady_clock_ns();
        }
        call->line_buffer.append(bytes);
        size_t start = 0;
        for (size_t nl; (nl = call->line_buffer.find('\n', start)) != std::string::npos;
             start = nl + 1) {
            Result<Update> u = server::decode_update(
                std::string_view(call->line_buffer).substr(start, nl - start));
            if (!u.is_ok()) {
                call->broken = true;
                call->last_error = "engine " + call->engine_id + " sent " + u.status().message();
                break;
            }
            // Drop the tokens the client already has (a re-sent generation).
            Update fwd = std::move(u).value();
            if (call->cached_prompt_tokens < 0 && (!fwd.tokens.empty() || fwd.finished)) {
                call->cached_prompt_tokens = fwd.cached_prompt_tokens;
            }
            fwd.cached_prompt_tokens = std::max<int64_t>(call->cached_prompt_tokens, 0);
            std::vector<server::TokenOut> keep;
            for (auto& t : fwd.tokens) {
                if (call->seen_tokens++ < call->delivered_tokens) continue;
                keep.push_back(std::move(t));
            }
            fwd.tokens = std::move(keep);
            call->delivered_tokens += static_cast<int64_t>(fwd.tokens.size());
            for (const auto& t : fwd.tokens) call->delivered_ids.push_back(t.token);
            if (auto it = engines_.find(call->engine_id); it != engines_.end()) {
                it->second.kv_tokens += static_cast<int64_t>(fwd.tokens.size());
                call->kv_charged += static_cast<int64_t>(fwd.tokens.size());
            }
            if (fwd.finished && fwd.reason == engine::FinishReason::kAbort) {
                // Nobody here aborted it (abort() ends the call first): the engine gave
                // it up -- a drain's grace ran out. Its tokens so far count; the rest
                // comes from another engine.
                call->broken = true;
                call->given_up = true;
                call->last_error = "engine " + call->engine_id + " aborted the generation";
                fwd.finished = false;
                if (!fwd.tokens.empty()) out.push_back(std::move(fwd));
                break;
            }
            if (call->on_prefill && fwd.finished && fwd.handoff) {
                // The prefill engine sent the prompt's KV (or failed to: the decode
                // engine then computes it) and ended its part: continue on the decode
                // engine.
                if (fwd.handoff->ok) {
                    ++stats_.num_kv_handoffs;
                    stats_.kv_handoff_blocks += fwd.handoff->blocks;
                    stats_.kv_handoff_bytes += fwd.handoff->bytes;
                } else {
                    ++stats_.num_kv_handoffs_failed;
                    call->handoff_engine.clear();
                }
                call->handing_over = true;
                if (!fwd.tokens.empty()) {
                    fwd.finished = false;
                    fwd.reason = engine::FinishReason::kNone;
                    fwd.handoff.reset();
                    out.push_back(std::move(fwd));
                }
                break;
            }
            if (call->on_prefill && !fwd.finished && call->delivered_tokens > 0 &&
                !call->generation.handoff) {
                // The first token came from prefill: close this stream (the prefill
                // engine aborts the generation) and continue on a decode engine.
                call->handing_over = true;
                out.push_back(std::move(fwd));
                break;
            }
            if (fwd.finished) {
                call->finished = true;
                release_engine_locked(*call);
                calls_.erase(call->ticket);
                out.push_back(std::move(fwd));
                break;
            }
            if (!fwd.tokens.empty()) out.push_back(std::move(fwd));
        }
        if (!call->broken && !call->handing_over) call->line_buffer.erase(0, start);
        if (call->line_buffer.size() > (16u << 20)) {  // no line is this long
            call->broken = true;
            call->last_error = "engine " + call->engine_id + " sent an over-long line";
        }
    }
    for (Update& u : out) call->deliver(std::move(u));
}

void RemoteService::on_done(const std::shared_ptr<Call>& call, uint64_t attempt, Status status) {
    std::optional<Update> final_update;
    Failures failed;
    {
        MutexLock l(&mu_);
        if (call->attempt != attempt || call->finished || call->aborted) return;
        const std::string engine = call->engine_id;
        release_engine_locked(*call);
        if (call->handing_over) {
            // Prefill -> decode: a continuation, not a failover. The prefill engine may
            // be tried again as a decode engine only if nothing else is left.
            call->tried.erase(engine);
            --call->num_attempts;
            if (dispatch_or_wait_locked(call)) {
                ++stats_.num_handovers;
            } else {
                calls_.erase(call->ticket);
                ++stats_.num_failed;
                final_update = final_error(unavailable("no decode engine to continue on (" +
                                                       dispatch_state_locked(*call) + ")"));
            }
        } else if (is_final_http_error(call->http_status)) {
            // The engine refused the request itself: the client gets its answer.
            calls_.erase(call->ticket);
            final_update = final_error(status_from_reply(call->http_status, call->error_body));
        } else {
            std::string why =
                call->broken ? call->last_error
                : call->http_status > 0 && call->http_status != 200
                    ? status_from_reply(call->http_status, call->error_body).message()
                    : "stream from engine " + engine + " ended early (" + status.to_string() + ")";
            DSI_LOG(kWarning) << "generation " << call->ticket << ": " << why << "; failing over";
            call->last_error = why;
            if (auto it = engines_.find(engine); it != engines_.end()) {
                it->second.avoid_until_ns =
                    steady_clock_ns() + options_.broken_engine_backoff_ms * 1000000;
            }
            if (call->given_up)
                --call->num_attempts;  // moved, not failed (the engine
                                       // stays in `tried`: it is leaving)
            if (dispatch_or_wait_locked(call)) {
                ++stats_.num_failovers;
            } else {
                calls_.erase(call->ticket);
                ++stats_.num_failed;
                final_update = final_error(
                    unavailable("no engine could finish the generation: " + call->last_error +
                                " (" + dispatch_state_locked(*call) + ")"));
            }
        }
        pump_prefill_locked(failed);  // the engine's prefill quota is free again
    }
    deliver_failures(failed);
    if (final_update) call->deliver(std::move(*final_update));
}

void RemoteService::abort(Ticket ticket) {
    std::shared_ptr<Call> call;
    Failures failed;
    {
        MutexLock l(&mu_);
        auto it = calls_.find(ticket);
        if (it == calls_.end()) return;
        call = it->second;
        calls_.erase(it);
        call->aborted = true;
        if (call->prefill_work != 0) {  // it was waiting for a prefill engine
            prefill_waiting_.erase(call->prefill_work);
            call->prefill_work = 0;
        }
        // Closing the stream aborts the generation on the engine.
        if (auto client = call->client.lock()) client->cancel(call->http_id);
        release_engine_locked(*call);
        pump_prefill_locked(failed);
    }
    deliver_failures(failed);
    Update u;
    u.finished = true;
    u.reason = engine::FinishReason::kAbort;
    call->deliver(std::move(u));
}

void RemoteService::abort_all() {
    std::vector<Ticket> tickets;
    {
        MutexLock l(&mu_);
        for (const auto& [t, c] : calls_) tickets.push_back(t);
    }
    for (Ticket t : tickets) abort(t);
}

server::ServiceStats RemoteService::stats_snapshot() const {
    MutexLock l(&mu_);
    server::ServiceStats s;
    s.num_running = static_cast<int64_t>(calls_.size());
    s.extra_counters = {
        {"router_routed_total", "generations started on an engine", stats_.num_routed},
        {"router_failovers_total", "generations re-sent after a broken stream",
         stats_.num_failovers},
        {"router_handovers_total", "prefill -> decode hand-overs", stats_.num_handovers},
        {"router_failed_total", "generations no engine could finish", stats_.num_failed},
        {"router_engine_waits_total", "times a generation waited for an engine to join",
         stats_.num_engine_waits},
        {"router_engine_waiting", "generations waiting for an engine now",
         static_cast<int64_t>(engine_waiting_.size())},
        {"router_prefix_checks_total", "requests matched against the KV store before routing",
         stats_.num_prefix_checks},
        {"router_prefix_hit_tokens_total", "their prefix hits in tokens", stats_.prefix_hit_tokens},
        {"router_kv_handoffs_total", "prefill -> decode KV hand-overs the decode engine stored",
         stats_.num_kv_handoffs},
        {"router_kv_handoffs_failed_total", "KV hand-overs that failed (the prompt is recomputed)",
         stats_.num_kv_handoffs_failed},
        {"router_kv_handoff_bytes_total", "KV bytes handed over", stats_.kv_handoff_bytes},
        {"router_direct_decode_total", "disaggregated requests that skipped prefill (a hit)",
         stats_.num_direct_decode},
        {"router_prefill_queued_total", "generations that waited in the router for a prefill pull",
         stats_.num_prefill_queued},
        {"router_prefill_reassignments_total",
         "prefill LB rounds that moved engines between buckets", stats_.num_prefill_reassignments},
        {"router_prefill_waiting", "generations waiting for a prefill engine now",
         static_cast<int64_t>(prefill_waiting_.size())},
        {"router_engines", "engines it may route to now", static_cast<int64_t>(engines_.size())},
    };
    if (swa_) {
        const SwaDirectoryServiceStats d = swa_->stats();
        const std::vector<server::ServiceStats::Counter> swa = {
            {"router_swa_lookups_total", "V4 requests planned with the SWA-state directory",
             d.num_lookups},
            {"router_swa_state_hits_total", "of which some engine held a state in [L1-128, L1]",
             d.num_state_hits},
            {"router_swa_replays_total", "of which none did (hit L1 - 128, S-KV-10)",
             d.num_replays},
            {"router_swa_block_hit_tokens_total", "their block hits L1, in tokens",
             d.block_hit_tokens},
            {"router_swa_hit_tokens_total", "their S-KV-10 hits, in tokens", d.hit_tokens},
            {"router_swa_pull_hints_total", "generations told to pull an SWA state",
             stats_.num_swa_pull_hints},
            {"router_swa_directory_states", "SWA states this router's directory part holds",
             d.directory.num_states},
            {"router_swa_directory_entries", "its (state, engine) entries",
             d.directory.num_entries},
            {"router_swa_directory_evictions_total", "entries dropped by its bounds",
             d.directory.evicted},
            {"router_swa_directory_expired_total",
             "entries dropped: engine left, restarted or silent", d.directory.expired},
            {"router_swa_announcements_total", "engine announcements applied",
             d.directory.announcements},
            {"router_swa_poll_failures_total", "announcement polls that failed",
             d.num_poll_failures},
            {"router_swa_routers", "routers the SWA directory's keys are split over",
             d.num_routers},
            {"router_swa_remote_lookups_total", "lookups at the router owning the keys",
             d.num_remote_lookups},
            {"router_swa_remote_lookup_failures_total", "of which unanswered (planned as no state)",
             d.num_remote_lookup_failures},
        };
        s.extra_counters.insert(s.extra_counters.end(), swa.begin(), swa.end());
    }
    return s;
}

// S-KV-8: a first attempt (no output yet) sent to an engine that does not hold the state
// its hit starts from is told where to pull it; a holder, a continuation and a hit
// without such a state get nothing.
void RemoteService::set_swa_pull_locked(Call& call, const std::string& engine) {
    call.generation.swa_pull.reset();
    if (!swa_ || call.delivered_tokens != 0 || call.swa.holders.empty()) return;
    for (const cluster::SwaHolder& h : call.swa.holders) {
        if (h.engine == engine) return;
    }
    for (const cluster::SwaHolder& h : call.swa.holders) {
        const std::string address = swa_->fetch_address(h.engine);
        if (address.empty() || engines_.count(h.engine) == 0) continue;
        call.generation.swa_pull = serving::SwaPullTarget{address, call.swa.key};
        ++stats_.num_swa_pull_hints;
        return;
    }
}

RouterStats RemoteService::router_stats() const {
    MutexLock l(&mu_);
    RouterStats s = stats_;
    s.num_engines = static_cast<int64_t>(engines_.size());
    s.num_in_flight = static_cast<int64_t>(calls_.size());
    s.prefill_waiting = static_cast<int64_t>(prefill_waiting_.size());
    s.engine_waiting = static_cast<int64_t>(engine_waiting_.size());
    for (const auto& [id, e] : engines_) s.requests_on_engine[id] = e.num_requests;
    return s;
}

}  // namespace dsi::router

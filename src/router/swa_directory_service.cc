#include "router/swa_directory_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/check.h"
#include "base/clock.h"
#include "base/logging.h"
#include "server/swa_announce.h"

namespace dsi::router {

cluster::SwaStateId to_state_id(const kv::SwaStateKey& key) {
    return {key.chain.lo, key.chain.hi, key.position};
}

SwaDirectoryService::SwaDirectoryService(SwaDirectoryServiceOptions options)
    : options_(std::move(options)), self_id_(options_.self_id), directory_(options_.directory) {
    thread_ = std::thread([this] { loop(); });
}

SwaDirectoryService::~SwaDirectoryService() {
    {
        MutexLock l(&mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // The clients end (joining their I/O threads, whose last callbacks lock mu_) outside
    // the lock, while every member is alive.
    std::vector<std::shared_ptr<net::HttpClient>> clients;
    {
        MutexLock l(&mu_);
        for (auto& [id, p] : peers_) clients.push_back(std::move(p.client));
        for (auto& [id, c] : router_clients_) clients.push_back(std::move(c));
        for (auto& c : retired_) clients.push_back(std::move(c));
        retired_.clear();
    }
    clients.clear();
}

void SwaDirectoryService::add_locked(const membership::Member& m) {
    if (m.role == membership::Role::kRouter) {
        if (std::find(routers_.begin(), routers_.end(), m.id) == routers_.end()) {
            routers_.push_back(m.id);
            std::sort(routers_.begin(), routers_.end());
        }
        if (m.id != self_id_ && !m.address.empty() && router_clients_.count(m.id) == 0) {
            const size_t colon = m.address.rfind(':');
            router_clients_[m.id] = std::make_shared<net::HttpClient>(
                net::HttpTarget{m.address.substr(0, colon), m.address.substr(colon + 1), ""});
        }
        return;
    }
    if (m.address.empty()) return;
    if (auto it = peers_.find(m.id); it != peers_.end()) {
        if (it->second.member.incarnation == m.incarnation &&
            it->second.member.address == m.address) {
            it->second.member = m;
            return;
        }
        remove_locked(m.id);
    }
    const size_t colon = m.address.rfind(':');
    Peer p;
    p.member = m;
    p.client = std::make_shared<net::HttpClient>(
        net::HttpTarget{m.address.substr(0, colon), m.address.substr(colon + 1), ""});
    peers_[m.id] = std::move(p);
}

void SwaDirectoryService::remove_locked(const std::string& id) {
    routers_.erase(std::remove(routers_.begin(), routers_.end(), id), routers_.end());
    if (auto r = router_clients_.find(id); r != router_clients_.end()) {
        retired_.push_back(std::move(r->second));
        router_clients_.erase(r);
    }
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    it->second.client->cancel_all();
    retired_.push_back(std::move(it->second.client));
    peers_.erase(it);
}

void SwaDirectoryService::sync_locked() {
    std::map<std::string, uint64_t> live;
    for (const auto& [id, p] : peers_) live[id] = p.member.incarnation;
    directory_.set_engines(live);
}

void SwaDirectoryService::set_members(const std::vector<membership::Member>& members) {
    MutexLock l(&mu_);
    const std::vector<std::string> routers_before = routers_;
    std::map<std::string, bool> keep;
    for (const auto& m : members) keep[m.id] = true;
    std::vector<std::string> gone;
    for (const auto& [id, p] : peers_) {
        if (keep.count(id) == 0) gone.push_back(id);
    }
    for (const auto& id : routers_) {
        if (keep.count(id) == 0) gone.push_back(id);
    }
    for (const auto& id : gone) remove_locked(id);
    for (const auto& m : members) add_locked(m);
    if (routers_ != routers_before) {
        // Keys moved between routers: every engine announces its whole set again.
        for (auto& [id, p] : peers_) p.cursor = 0;
    }
    sync_locked();
}

void SwaDirectoryService::apply(const membership::MemberChange& change) {
    MutexLock l(&mu_);
    const std::vector<std::string> routers_before = routers_;
    if (change.kind == membership::ChangeKind::kLeft) {
        remove_locked(change.member.id);
    } else {
        add_locked(change.member);
    }
    if (routers_ != routers_before) {
        for (auto& [id, p] : peers_) p.cursor = 0;
    }
    sync_locked();
}

bool SwaDirectoryService::owned_locked(const cluster::SwaStateId& id) const {
    if (self_id_.empty() || routers_.size() <= 1) return true;
    const int owner = cluster::swa_owner(id, routers_);
    return owner >= 0 && routers_[static_cast<size_t>(owner)] == self_id_;
}

void SwaDirectoryService::poll_locked() {
    for (auto& [id, p] : peers_) {
        if (p.in_flight || p.no_states) continue;
        p.in_flight = true;
        ++stats_.num_polls;
        net::HttpRequest req;
        req.method = "GET";
        req.path = std::string(server::kSwaStatesPath) + "?since=" + std::to_string(p.cursor);
        req.timeout_ms = options_.poll_timeout_ms;
        if (!options_.engine_api_key.empty()) {
            req.headers.emplace_back("Authorization", "Bearer " + options_.engine_api_key);
        }
        struct Answer {
            int http = 0;
            std::string body;
        };
        auto answer = std::make_shared<Answer>();
        net::HttpHandlers h;
        h.on_status = [answer](int status) { answer->http = status; };
        h.on_body = [answer](std::string_view bytes) {
            answer->body.append(bytes);
            return answer->body.size() <= (size_t{64} << 20);  // a bound on one answer
        };
        h.on_done = [this, engine = id, incarnation = p.member.incarnation, answer](Status s) {
            on_answer(engine, incarnation, answer->http, answer->body, std::move(s));
        };
        p.client->start(std::move(req), std::move(h));
    }
}

void SwaDirectoryService::on_answer(const std::string& engine, uint64_t incarnation, int http,
                                    const std::string& body, Status status) {
    Result<server::SwaAnnouncementReply> reply =
        status.is_ok() && http == 200 ? server::decode_swa_announcement(body)
                                      : Result<server::SwaAnnouncementReply>(unavailable(""));
    MutexLock l(&mu_);
    ++stats_.num_answers;
    auto it = peers_.find(engine);
    if (it == peers_.end() || it->second.member.incarnation != incarnation) return;
    Peer& p = it->second;
    p.in_flight = false;
    if (status.is_ok() && http == 404) {
        p.no_states = true;  // a model without SWA states
        return;
    }
    if (!reply.is_ok() || reply->incarnation != incarnation) {
        // Unreachable, refused, malformed, or another process at that address: start
        // over with a snapshot next time.
        ++stats_.num_poll_failures;
        p.cursor = 0;
        return;
    }
    cluster::SwaAnnouncement a;
    a.engine = engine;
    a.incarnation = incarnation;
    a.snapshot = reply->changes.snapshot;
    for (const kv::SwaStateKey& k : reply->changes.added) {
        const cluster::SwaStateId id = to_state_id(k);
        if (owned_locked(id)) a.added.push_back(id);
    }
    for (const kv::SwaStateKey& k : reply->changes.removed) {
        const cluster::SwaStateId id = to_state_id(k);
        if (owned_locked(id)) a.removed.push_back(id);
    }
    if (Status s = directory_.announce(a, steady_clock_ns()); !s.is_ok()) {
        ++stats_.num_poll_failures;
        DSI_LOG(kWarning) << "SWA announcement of " << engine << ": " << s.to_string();
        p.cursor = 0;
        return;
    }
    p.cursor = reply->changes.next;
    p.fetch_address = reply->fetch_address;
}

void SwaDirectoryService::set_self_id(std::string id) {
    MutexLock l(&mu_);
    if (id == self_id_) return;
    self_id_ = std::move(id);
    for (auto& [engine, p] : peers_) p.cursor = 0;  // its part changed: announce again
}

void SwaDirectoryService::poll_now() {
    MutexLock l(&mu_);
    poll_locked();
}

void SwaDirectoryService::loop() {
    MutexLock l(&mu_);
    while (!stopping_) {
        cv_.wait_for(&mu_, std::chrono::milliseconds(options_.poll_interval_ms));
        if (stopping_) break;
        for (const std::string& engine : directory_.expire(steady_clock_ns())) {
            if (auto it = peers_.find(engine); it != peers_.end()) it->second.cursor = 0;
        }
        poll_locked();
    }
}

SwaRoutePlan SwaDirectoryService::plan(std::span<const kv::BlockKey> chain, int64_t input_tokens,
                                       int64_t block_hit_tokens) {
    // The positions the rule asks about (L1, then L1 - 128): a probe with no states.
    std::vector<int64_t> asked;
    const bool probed = kv::plan_swa_hit(input_tokens, block_hit_tokens, [&asked](int64_t pos) {
                            asked.push_back(pos);
                            return false;
                        }).is_ok();
    DSI_CHECK(probed, "SwaDirectoryService::plan: malformed hit");
    std::map<int64_t, std::vector<cluster::SwaHolder>> found;  // by position
    // Keys other routers own, by owner; asked there without the lock.
    std::map<std::string, std::vector<kv::SwaStateKey>> remote;
    std::map<std::string, std::shared_ptr<net::HttpClient>> clients;
    {
        MutexLock l(&mu_);
        for (int64_t pos : asked) {
            if (pos / kv::kBlockTokens > static_cast<int64_t>(chain.size())) continue;
            const kv::SwaStateKey key = kv::swa_state_key(chain, pos);
            const cluster::SwaStateId id = to_state_id(key);
            if (owned_locked(id)) {
                found[pos] = directory_.holders(id);
                continue;
            }
            const std::string& owner =
                routers_[static_cast<size_t>(cluster::swa_owner(id, routers_))];
            auto c = router_clients_.find(owner);
            if (c == router_clients_.end()) continue;
            remote[owner].push_back(key);
            clients[owner] = c->second;
        }
    }
    int64_t num_remote = 0;
    int64_t num_failed = 0;
    for (const auto& [owner, keys] : remote) {
        ++num_remote;
        net::HttpRequest req;
        req.method = "GET";
        req.path = server::encode_swa_lookup_target(keys);
        req.timeout_ms = options_.lookup_timeout_ms;
        if (!options_.router_api_key.empty()) {
            req.headers.emplace_back("Authorization", "Bearer " + options_.router_api_key);
        }
        Result<net::HttpResponse> r = net::fetch(*clients.at(owner), std::move(req));
        Result<std::vector<server::SwaLookupHeld>> held =
            r.is_ok() && r->status == 200
                ? server::decode_swa_lookup_answer(r->body)
                : Result<std::vector<server::SwaLookupHeld>>(unavailable("no answer"));
        if (!held.is_ok()) {
            ++num_failed;
            continue;
        }
        for (const server::SwaLookupHeld& h : *held) {
            for (const kv::SwaStateKey& k : keys) {
                if (!(k == h.key)) continue;
                for (const std::string& e : h.engines) {
                    found[k.position].push_back(cluster::SwaHolder{e, 0, 0});
                }
            }
        }
    }
    auto has_state = [&found](int64_t pos) {
        auto it = found.find(pos);
        return it != found.end() && !it->second.empty();
    };
    Result<kv::SwaHitPlan> p = kv::plan_swa_hit(input_tokens, block_hit_tokens, has_state);
    DSI_CHECK(p.is_ok(), p.status().to_string());
    SwaRoutePlan out;
    out.plan = *p;
    if (p->swa_hit() && p->swa_state_position > 0) {
        out.key = kv::swa_state_key(chain, p->swa_state_position);
        out.holders = found[p->swa_state_position];
    }
    MutexLock l(&mu_);
    ++stats_.num_lookups;
    stats_.num_remote_lookups += num_remote;
    stats_.num_remote_lookup_failures += num_failed;
    stats_.block_hit_tokens += p->block_hit_tokens;
    stats_.hit_tokens += p->hit_tokens;
    if (p->swa_hit()) ++stats_.num_state_hits;
    if (p->kind == kv::SwaHitKind::kReplay) ++stats_.num_replays;
    return out;
}

std::string SwaDirectoryService::answer_lookup(std::string_view target) const {
    Result<std::vector<kv::SwaStateKey>> keys = server::decode_swa_lookup_target(target);
    std::vector<server::SwaLookupHeld> held;
    if (keys.is_ok()) {
        MutexLock l(&mu_);
        for (const kv::SwaStateKey& k : *keys) {
            server::SwaLookupHeld h;
            h.key = k;
            for (const cluster::SwaHolder& e : directory_.holders(to_state_id(k))) {
                h.engines.push_back(e.engine);
            }
            if (!h.engines.empty()) held.push_back(std::move(h));
        }
    }
    return server::encode_swa_lookup_answer(held);
}

std::vector<cluster::SwaHolder> SwaDirectoryService::holders(const kv::SwaStateKey& key) const {
    MutexLock l(&mu_);
    return directory_.holders(to_state_id(key));
}

std::string SwaDirectoryService::fetch_address(const std::string& engine) const {
    MutexLock l(&mu_);
    auto it = peers_.find(engine);
    return it == peers_.end() ? std::string() : it->second.fetch_address;
}

SwaDirectoryServiceStats SwaDirectoryService::stats() const {
    MutexLock l(&mu_);
    SwaDirectoryServiceStats s = stats_;
    s.directory = directory_.stats();
    s.num_routers = std::max<int64_t>(1, static_cast<int64_t>(routers_.size()));
    return s;
}

}  // namespace dsi::router

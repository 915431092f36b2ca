#include "cluster/swa_directory.h"

#include <algorithm>
#include <string_view>

#include "base/check.h"

namespace dsi::cluster {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t hash_id(const SwaStateId& id) {
    return mix64(id.chain_lo ^ mix64(id.chain_hi ^ mix64(static_cast<uint64_t>(id.position))));
}

uint64_t hash_name(std::string_view s) {  // FNV-1a 64, stable across processes
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char c : s) {
        h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
    }
    return h;
}

}  // namespace

size_t SwaStateIdHash::operator()(const SwaStateId& id) const {
    return static_cast<size_t>(hash_id(id));
}

SwaDirectory::SwaDirectory(SwaDirectorySettings settings) : settings_(settings) {
    DSI_CHECK(settings_.unit_tokens >= 1 && settings_.max_entries >= 1 &&
                  settings_.max_holders_per_state >= 1,
              "SwaDirectorySettings out of range");
}

Status SwaDirectory::validate(const SwaAnnouncement& a) const {
    if (a.engine.empty()) return invalid_argument("SWA announcement without an engine id");
    const auto n = static_cast<int64_t>(a.added.size() + a.removed.size());
    if (n > settings_.max_announcement_states) {
        return invalid_argument("SWA announcement of " + std::to_string(n) + " states; at most " +
                                std::to_string(settings_.max_announcement_states));
    }
    for (const auto* list : {&a.added, &a.removed}) {
        for (const SwaStateId& id : *list) {
            if (id.position <= 0 || id.position % settings_.unit_tokens != 0) {
                return invalid_argument("SWA announcement with state position " +
                                        std::to_string(id.position));
            }
        }
    }
    return Status::ok();
}

Status SwaDirectory::announce(const SwaAnnouncement& a, int64_t now_ns) {
    if (Status s = validate(a); !s.is_ok()) {
        ++stats_.malformed_announcements;
        return s;
    }
    auto known = incarnation_.find(a.engine);
    if (known != incarnation_.end() && a.incarnation < known->second) {
        ++stats_.stale_announcements;
        return failed_precondition("SWA announcement from " + a.engine + " incarnation " +
                                   std::to_string(a.incarnation) + " below the known " +
                                   std::to_string(known->second));
    }
    if (known != incarnation_.end() && a.incarnation > known->second) {
        erase_engine(a.engine);  // a restarted engine's pool is new
    }
    incarnation_[a.engine] = a.incarnation;
    last_announce_ns_[a.engine] = now_ns;
    ++stats_.announcements;
    if (a.snapshot) {
        ++stats_.snapshots;
        erase_engine(a.engine);
    }
    for (const SwaStateId& id : a.removed) {
        if (a.snapshot) break;
        auto it = index_.find(id);
        if (it == index_.end()) continue;
        for (List::iterator e : it->second) {
            if (e->engine == a.engine) {
                ++stats_.removed;
                erase(e);
                break;
            }
        }
    }
    for (const SwaStateId& id : a.added) {
        put(id, a.engine, a.incarnation, now_ns);
    }
    return Status::ok();
}

void SwaDirectory::put(const SwaStateId& id, const std::string& engine, uint64_t incarnation,
                       int64_t now_ns) {
    std::vector<List::iterator>& hs = index_[id];
    for (auto h = hs.begin(); h != hs.end(); ++h) {
        if ((*h)->engine != engine) continue;
        // Already held: refresh, move to the front of both orders.
        List::iterator e = *h;
        e->incarnation = incarnation;
        e->seen_ns = now_ns;
        list_.splice(list_.begin(), list_, e);
        hs.erase(h);
        hs.insert(hs.begin(), e);
        return;
    }
    list_.push_front(Entry{id, engine, incarnation, now_ns});
    hs.insert(hs.begin(), list_.begin());
    ++num_by_engine_[engine];
    ++stats_.added;
    if (static_cast<int>(hs.size()) > settings_.max_holders_per_state) {
        ++stats_.evicted;
        erase(hs.back());
    }
    while (static_cast<int64_t>(list_.size()) > settings_.max_entries) {
        ++stats_.evicted;
        erase(std::prev(list_.end()));
    }
}

void SwaDirectory::erase(List::iterator it) {
    auto idx = index_.find(it->id);
    DSI_CHECK(idx != index_.end(), "SwaDirectory entry without an index");
    std::vector<List::iterator>& hs = idx->second;
    hs.erase(std::find(hs.begin(), hs.end(), it));
    if (hs.empty()) index_.erase(idx);
    auto n = num_by_engine_.find(it->engine);
    if (--n->second == 0) num_by_engine_.erase(n);
    list_.erase(it);
}

void SwaDirectory::erase_engine(const std::string& engine) {
    if (num_by_engine_.count(engine) == 0) return;
    for (auto it = list_.begin(); it != list_.end();) {
        auto next = std::next(it);
        if (it->engine == engine) {
            ++stats_.expired;
            erase(it);
        }
        it = next;
    }
}

void SwaDirectory::set_engines(const std::map<std::string, uint64_t>& live) {
    std::vector<std::string> gone;
    for (const auto& [engine, incarnation] : incarnation_) {
        auto l = live.find(engine);
        if (l == live.end() || l->second != incarnation) gone.push_back(engine);
    }
    for (const std::string& engine : gone) {
        erase_engine(engine);
        auto l = live.find(engine);
        // A newer record: announcements of the older incarnation are stale from now on.
        if (l != live.end() && l->second > incarnation_[engine]) {
            incarnation_[engine] = l->second;
        } else if (l == live.end()) {
            incarnation_.erase(engine);
            last_announce_ns_.erase(engine);
        }
    }
}

std::vector<std::string> SwaDirectory::expire(int64_t now_ns) {
    std::vector<std::string> out;
    if (settings_.entry_ttl_ns <= 0) return out;
    for (auto it = last_announce_ns_.begin(); it != last_announce_ns_.end();) {
        if (now_ns - it->second > settings_.entry_ttl_ns) {
            out.push_back(it->first);
            erase_engine(it->first);
            it = last_announce_ns_.erase(it);
        } else {
            ++it;
        }
    }
    return out;
}

std::vector<SwaHolder> SwaDirectory::holders(const SwaStateId& id) const {
    std::vector<SwaHolder> out;
    auto it = index_.find(id);
    if (it == index_.end()) return out;
    for (const List::iterator& e : it->second) {
        out.push_back(SwaHolder{e->engine, e->incarnation, e->seen_ns});
    }
    return out;
}

SwaDirectoryStats SwaDirectory::stats() const {
    SwaDirectoryStats s = stats_;
    s.num_states = static_cast<int64_t>(index_.size());
    s.num_entries = static_cast<int64_t>(list_.size());
    return s;
}

Status SwaDirectory::check_invariants() const {
    int64_t indexed = 0;
    for (const auto& [id, hs] : index_) {
        if (hs.empty()) return internal_error("SwaDirectory: a state without holders");
        for (const List::iterator& e : hs) {
            if (!(e->id == id)) return internal_error("SwaDirectory: index names another state");
        }
        indexed += static_cast<int64_t>(hs.size());
    }
    if (indexed != static_cast<int64_t>(list_.size())) {
        return internal_error("SwaDirectory: index and list differ");
    }
    std::map<std::string, int64_t> counts;
    for (const Entry& e : list_) {
        ++counts[e.engine];
    }
    if (counts != num_by_engine_) return internal_error("SwaDirectory: per-engine counts");
    if (static_cast<int64_t>(list_.size()) > settings_.max_entries) {
        return internal_error("SwaDirectory: over max_entries");
    }
    return Status::ok();
}

int swa_owner(const SwaStateId& id, std::span<const std::string> routers) {
    int best = -1;
    uint64_t best_weight = 0;
    const uint64_t h = hash_id(id);
    for (size_t i = 0; i < routers.size(); ++i) {
        const uint64_t w = mix64(h ^ hash_name(routers[i]));
        if (best < 0 || w > best_weight) {
            best = static_cast<int>(i);
            best_weight = w;
        }
    }
    return best;
}

}  // namespace dsi::cluster

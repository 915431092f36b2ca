// The etcd backend of Registry (registry.h): etcd v3's JSON gateway (grpc-gateway) on
// the client port. Keys and values travel base64-encoded; 64-bit ids as strings.
// Calls: /v3/lease/grant, /v3/lease/keepalive (one request, one answer), /v3/lease/revoke,
// /v3/kv/put, /v3/kv/range, /v3/watch (a stream of newline-separated JSON objects).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/logging.h"
#include "base/mutex.h"
#include "membership/internal/backends.h"
#include "net/base64.h"

namespace dsi::membership::internal {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// etcd's gateway writes 64-bit integers as strings; older ones as numbers.
int64_t json_int(const json& j, const char* key) {
    auto it = j.find(key);
    if (it == j.end()) return 0;
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_string()) {
        const std::string& s = it->get_ref<const std::string&>();
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        return end != nullptr && *end == '\0' ? v : 0;
    }
    return 0;
}

// The smallest key greater than every key with this prefix (etcd's range_end).
std::string prefix_end(std::string prefix) {
    while (!prefix.empty()) {
        auto& c = reinterpret_cast<unsigned char&>(prefix.back());
        if (c < 0xff) {
            ++c;
            return prefix;
        }
        prefix.pop_back();
    }
    return std::string(1, '\0');  // every key
}

class EtcdRegistry final : public Registry {
public:
    EtcdRegistry(net::HttpTarget target, std::string prefix, const RegistryOptions& options)
        : options_(options), prefix_(std::move(prefix)), client_(std::move(target)) {
        keepalive_interval_ms_ = options_.keepalive_interval_ms > 0
                                     ? options_.keepalive_interval_ms
                                     : options_.lease_ttl_s * 1000 / 3;
        worker_ = std::thread([this] { run(); });
    }

    ~EtcdRegistry() override {
        {
            MutexLock l(&mu_);
            stop_ = true;
            cv_.notify_all();
        }
        worker_.join();
        (void)leave();
        client_.cancel_all();
    }

    Status join(const Member& self) override {
        DSI_RETURN_IF_ERROR(validate(self));
        MutexLock serial(&call_mu_);
        int64_t lease = 0;
        {
            MutexLock l(&mu_);
            if (joined_) lease = lease_;
        }
        if (lease == 0) {
            DSI_ASSIGN_OR_RETURN(lease, grant());
        }
        Status s = put_record(self, lease);
        MutexLock l(&mu_);
        if (!s.is_ok()) {
            health_.last_error = s.message();
            return s;
        }
        self_ = self;
        lease_ = lease;
        joined_ = true;
        health_.joined = true;
        health_.lease_ok = true;
        next_keepalive_ = Clock::now() + std::chrono::milliseconds(keepalive_interval_ms_);
        cv_.notify_all();
        return Status::ok();
    }

    Status leave() override {
        MutexLock serial(&call_mu_);
        int64_t lease = 0;
        {
            MutexLock l(&mu_);
            if (!joined_) return Status::ok();
            lease = lease_;
            joined_ = false;
            lease_ = 0;
            health_.joined = false;
            health_.lease_ok = false;
        }
        // Revoking the lease deletes the record at once; if this fails the lease ends
        // by itself after the TTL.
        auto r = call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}});
        return r.is_ok() ? Status::ok() : r.status();
    }

    Result<std::vector<Member>> list() override {
        DSI_ASSIGN_OR_RETURN(Listing l, list_with_revision());
        return std::move(l.members);
    }

    Result<std::vector<Member>> watch(WatchFn fn) override {
        {
            MutexLock l(&mu_);
            if (watch_fn_) return failed_precondition("membership: one watch per registry");
        }
        DSI_ASSIGN_OR_RETURN(Listing listing, list_with_revision());
        MutexLock cb(&callback_mu_);
        // The current members reach `fn` first (as joins), before any stream event: a
        // watcher can build its view from `fn` alone, with no gap between the two.
        for (const MemberChange& c : table_.reset(listing.members)) fn(c);
        MutexLock l(&mu_);
        watch_fn_ = std::move(fn);
        start_watch_locked(listing.revision + 1);
        return std::move(listing.members);
    }

    RegistryHealth health() const override {
        MutexLock l(&mu_);
        return health_;
    }

    std::string describe() const override {
        return "etcd://" + client_.target().host + ":" + client_.target().port + prefix_;
    }

private:
    struct Listing {
        std::vector<Member> members;
        int64_t revision = 0;
    };

    // One unary gateway call; the answer's JSON, or the error (UNAVAILABLE when etcd
    // cannot be reached, the gateway's message for an error answer).
    Result<json> call(const std::string& path, const json& body) {
        net::HttpRequest req;
        req.method = "POST";
        req.path = path;
        req.body = body.dump();
        req.headers = {{"Content-Type", "application/json"}};
        req.timeout_ms = options_.request_timeout_ms;
        DSI_ASSIGN_OR_RETURN(net::HttpResponse resp, net::fetch(client_, std::move(req)));
        json j = json::parse(resp.body, nullptr, /*allow_exceptions=*/false);
        if (resp.status != 200) {
            std::string msg = j.is_object() && j.contains("message") && j["message"].is_string()
                                  ? j["message"].get<std::string>()
                                  : resp.body.substr(0, 200);
            return unavailable("etcd " + path + ": HTTP " + std::to_string(resp.status) + ": " +
                               msg);
        }
        if (j.is_discarded() || !j.is_object()) {
            return unavailable("etcd " + path + ": answer is not a JSON object");
        }
        return j;
    }

    Result<int64_t> grant() {
        DSI_ASSIGN_OR_RETURN(json j, call("/v3/lease/grant", json{{"TTL", options_.lease_ttl_s}}));
        const int64_t id = json_int(j, "ID");
        if (id == 0) return unavailable("etcd lease grant: no lease id in the answer");
        return id;
    }

    Status put_record(const Member& self, int64_t lease) {
        auto r = call("/v3/kv/put", json{{"key", net::base64_encode(prefix_ + self.id)},
                                         {"value", net::base64_encode(to_json(self))},
                                         {"lease", std::to_string(lease)}});
        return r.is_ok() ? Status::ok() : r.status();
    }

    // Member from a kv's base64 value; counts a bad record.
    std::optional<Member> decode_record(const json& kv) {
        auto value = kv.contains("value") && kv["value"].is_string()
                         ? net::base64_decode(kv["value"].get<std::string>())
                         : Result<std::string>(invalid_argument("no value"));
        Result<Member> m = value.is_ok() ? member_from_json(*value) : value.status();
        if (!m.is_ok()) {
            MutexLock l(&mu_);
            ++health_.num_bad_records;
            health_.last_error = "bad member record: " + m.status().message();
            return std::nullopt;
        }
        return std::move(*m);
    }

    Result<Listing> list_with_revision() {
        DSI_ASSIGN_OR_RETURN(
            json j,
            call("/v3/kv/range", json{{"key", net::base64_encode(prefix_)},
                                      {"range_end", net::base64_encode(prefix_end(prefix_))}}));
        Listing out;
        if (j.contains("header") && j["header"].is_object()) {
            out.revision = json_int(j["header"], "revision");
        }
        if (j.contains("kvs") && j["kvs"].is_array()) {
            for (const json& kv : j["kvs"]) {
                if (auto m = decode_record(kv)) out.members.push_back(std::move(*m));
            }
        }
        std::sort(out.members.begin(), out.members.end(),
                  [](const Member& a, const Member& b) { return a.id < b.id; });
        return out;
    }

    // The id of a key under the prefix; empty for another key.
    std::string id_of_key(const json& kv) const {
        if (!kv.contains("key") || !kv["key"].is_string()) return {};
        auto key = net::base64_decode(kv["key"].get<std::string>());
        if (!key.is_ok() || key->compare(0, prefix_.size(), prefix_) != 0) return {};
        return key->substr(prefix_.size());
    }

    // Applies one watch-stream message (I/O thread). Returns false when the stream ended
    // on etcd's side (canceled, compacted, error).
    bool apply_watch_message(const json& msg) {
        if (!msg.is_object() || msg.contains("error")) return false;
        const json& result = msg.contains("result") ? msg["result"] : msg;
        if (!result.is_object()) return false;
        if (result.value("canceled", false) || json_int(result, "compact_revision") > 0) {
            return false;
        }
        if (result.contains("header") && result["header"].is_object()) {
            MutexLock l(&mu_);
            watch_revision_ = std::max(watch_revision_, json_int(result["header"], "revision"));
        }
        if (!result.contains("events") || !result["events"].is_array()) return true;
        for (const json& ev : result["events"]) {
            if (!ev.contains("kv") || !ev["kv"].is_object()) continue;
            const json& kv = ev["kv"];
            std::optional<MemberChange> change;
            const bool is_delete = ev.value("type", std::string()) == "DELETE";
            MutexLock cb(&callback_mu_);
            if (is_delete) {
                const std::string id = id_of_key(kv);
                if (!id.empty()) change = table_.remove(id);
            } else if (auto m = decode_record(kv)) {
                change = table_.put(*m);
            }
            if (change) deliver(*change);
        }
        return true;
    }

    // REQUIRES: callback_mu_ held (one callback at a time, in table order).
    void deliver(const MemberChange& change) DSI_REQUIRES(callback_mu_) {
        WatchFn fn;
        {
            MutexLock l(&mu_);
            fn = watch_fn_;
        }
        if (fn) fn(change);
    }

    void start_watch_locked(int64_t from_revision) DSI_REQUIRES(mu_) {
        // Starting a call only posts to the client's I/O thread: safe under mu_.
        watch_active_ = true;
        auto buffer = std::make_shared<std::string>();
        net::HttpRequest req;
        req.method = "POST";
        req.path = "/v3/watch";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = json{{"create_request",
                         {{"key", net::base64_encode(prefix_)},
                          {"range_end", net::base64_encode(prefix_end(prefix_))},
                          {"start_revision", std::to_string(from_revision)}}}}
                       .dump();
        net::HttpHandlers h;
        h.on_status = [buffer](int status) {
            if (status != 200) buffer->assign("\x01");  // marks a refused watch
        };
        h.on_body = [this, buffer](std::string_view bytes) {
            if (!buffer->empty() && (*buffer)[0] == '\x01') return false;
            buffer->append(bytes);
            size_t start = 0;
            for (size_t nl; (nl = buffer->find('\n', start)) != std::string::npos; start = nl + 1) {
                json msg = json::parse(buffer->begin() + static_cast<std::ptrdiff_t>(start),
                                       buffer->begin() + static_cast<std::ptrdiff_t>(nl), nullptr,
                                       /*allow_exceptions=*/false);
                if (msg.is_discarded() || !apply_watch_message(msg)) return false;
            }
            buffer->erase(0, start);
            return buffer->size() < (64u << 20);  // one message is never this large
        };
        h.on_done = [this](Status s) {
            MutexLock l(&mu_);
            watch_active_ = false;
            if (!stop_) {
                DSI_LOG(kWarning) << "membership: the etcd watch ended (" << s.message()
                                  << "); listing again";
                health_.last_error = "etcd watch ended: " + s.message();
                next_relist_ = Clock::now() + std::chrono::milliseconds(options_.retry_interval_ms);
            }
            cv_.notify_all();
        };
        client_.start(std::move(req), std::move(h));
    }

    // Worker: relist after a broken watch.
    void relist_and_rewatch() {
        auto listing = list_with_revision();
        if (!listing.is_ok()) {
            MutexLock l(&mu_);
            health_.last_error = listing.status().message();
            next_relist_ = Clock::now() + std::chrono::milliseconds(options_.retry_interval_ms);
            return;
        }
        {
            MutexLock cb(&callback_mu_);
            for (const MemberChange& c : table_.reset(listing->members)) deliver(c);
        }
        MutexLock l(&mu_);
        if (stop_) return;
        ++health_.num_watch_restarts;
        start_watch_locked(listing->revision + 1);
    }

    // Worker: one keep-alive; on a lost lease, a new lease and the record again.
    void keepalive_once() {
        MutexLock call_lock(&call_mu_);
        int64_t lease = 0;
        Member self;
        {
            MutexLock l(&mu_);
            if (!joined_) return;
            lease = lease_;
            self = self_;
        }
        auto answer = call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}});
        Status s = answer.status();
        bool rejoined = false;
        if (s.is_ok()) {
            const json& r = answer->contains("result") ? (*answer)["result"] : *answer;
            if (!r.is_object() || json_int(r, "TTL") <= 0) {
                // S-DEPLOY: the lease expired while etcd was away (or etcd lost it):
                // publish again under a new one; the incarnation stays (same process).
                auto fresh = grant();
                s = fresh.is_ok() ? put_record(self, *fresh) : fresh.status();
                if (s.is_ok()) {
                    lease = *fresh;
                    rejoined = true;
                }
            }
        }
        MutexLock l(&mu_);
        if (!joined_) return;  // left meanwhile
        const auto now = Clock::now();
        if (s.is_ok()) {
            if (!health_.lease_ok || rejoined) {
                DSI_LOG(kInfo) << "membership: " << self.id
                               << (rejoined ? " published again under a new lease"
                                            : " lease renewed again");
            }
            lease_ = lease;
            health_.lease_ok = true;
            if (rejoined) ++health_.num_rejoins;
            next_keepalive_ = now + std::chrono::milliseconds(keepalive_interval_ms_);
        } else {
            if (health_.lease_ok) {
                DSI_LOG(kWarning) << "membership: " << self.id
                                  << " could not renew its lease: " << s.message();
            }
            health_.lease_ok = false;
            ++health_.num_keepalive_failures;
            health_.last_error = s.message();
            next_keepalive_ = now + std::chrono::milliseconds(options_.retry_interval_ms);
        }
    }

    enum class Action { kNone, kKeepalive, kRelist, kStop };

    // What the worker does next; waits until something is due.
    Action next_action() DSI_EXCLUDES(mu_) {
        MutexLock l(&mu_);
        while (!stop_) {
            const auto now = Clock::now();
            if (joined_ && now >= next_keepalive_) {
                next_keepalive_ = Clock::time_point::max();  // keepalive_once sets it
                return Action::kKeepalive;
            }
            if (watch_fn_ && !watch_active_ && now >= next_relist_) {
                next_relist_ = Clock::time_point::max();  // relist_and_rewatch sets it
                return Action::kRelist;
            }
            auto wake = now + std::chrono::seconds(1);
            if (joined_) wake = std::min(wake, next_keepalive_);
            if (watch_fn_ && !watch_active_) wake = std::min(wake, next_relist_);
            cv_.wait_until(&mu_, wake);
        }
        return Action::kStop;
    }

    void run() {
        for (Action a; (a = next_action()) != Action::kStop;) {
            if (a == Action::kKeepalive) keepalive_once();
            if (a == Action::kRelist) relist_and_rewatch();
        }
    }

    const RegistryOptions options_;
    const std::string prefix_;
    int64_t keepalive_interval_ms_ = 0;
    // Serialises join / leave / keep-alive so a keep-alive never re-puts a record that
    // leave() is withdrawing. Taken before mu_.
    Mutex call_mu_;
    // Serialises table updates and callbacks (I/O thread and worker). Before mu_.
    Mutex callback_mu_;
    MemberTable table_ DSI_GUARDED_BY(callback_mu_);

    mutable Mutex mu_;
    CondVar cv_;
    bool stop_ DSI_GUARDED_BY(mu_) = false;
    bool joined_ DSI_GUARDED_BY(mu_) = false;
    Member self_ DSI_GUARDED_BY(mu_);
    int64_t lease_ DSI_GUARDED_BY(mu_) = 0;
    Clock::time_point next_keepalive_ DSI_GUARDED_BY(mu_) = Clock::time_point::max();
    WatchFn watch_fn_ DSI_GUARDED_BY(mu_);
    bool watch_active_ DSI_GUARDED_BY(mu_) = false;
    int64_t watch_revision_ DSI_GUARDED_BY(mu_) = 0;
    Clock::time_point next_relist_ DSI_GUARDED_BY(mu_) = Clock::time_point::min();
    RegistryHealth health_ DSI_GUARDED_BY(mu_);
    // Last: destroyed first, so the callbacks its destructor ends see the rest alive.
    net::HttpClient client_;
    std::thread worker_;
};

}  // namespace

std::unique_ptr<Registry> make_etcd_registry(net::HttpTarget target, std::string prefix,
                                             const RegistryOptions& options) {
    return std::make_unique<EtcdRegistry>(std::move(target), std::move(prefix), options);
}

}  // namespace dsi::membership::internal

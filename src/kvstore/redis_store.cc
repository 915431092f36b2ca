// Redis backend (issue 8): chunk placement, erasure coding (S-KV-2: k+m, read any k),
// metadata-only prefix match (S-KV-4), no expiry in the client (S-KV-3).
#include "kvstore/redis_store.h"

#include <hiredis/hiredis.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "base/mutex.h"
#include "base/env.h"
#include "kvstore/internal/resp_reader.h"
#include "kvstore/internal/xxh3_fast.h"

namespace dsi::kvstore {
namespace {

int64_t now_ns() { return Env::default_env()->now_ns(); }
int64_t wall_ns() { return Env::default_env()->wall_ns(); }

std::string meta_key(const std::string& hex) { return "m:" + hex; }
std::string chunk_key(const std::string& hex, int i) {
    return "c:" + hex + ":" + std::to_string(i);
}

bool parse_i64(std::string_view s, int64_t& out) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
}

struct Meta {
    int64_t size = 0;
    int k = 0;
    int m = 0;
    int64_t chunk = 0;
    std::vector<std::string> place;
    int64_t atime = 0;
    TrafficClass cls = TrafficClass::kChatbot;
};

std::vector<std::string> split(std::string_view s, char sep) {
    std::vector<std::string> out;
    while (true) {
        size_t p = s.find(sep);
        out.emplace_back(s.substr(0, p));
        if (p == std::string_view::npos) {
            return out;
        }
        s = s.substr(p + 1);
    }
}

// HGETALL reply -> Meta; false when absent or malformed (a malformed entry is a miss).
bool parse_meta(const redisReply* r, Meta& meta) {
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->elements % 2 != 0) {
        return false;
    }
    int found = 0;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const redisReply* f = r->element[i];
        const redisReply* v = r->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
            return false;
        }
        std::string_view name(f->str, f->len);
        std::string_view val(v->str, v->len);
        int64_t n = 0;
        if (name == "place") {
            meta.place = split(val, ',');
            ++found;
            continue;
        }
        if (!parse_i64(val, n)) {
            return false;
        }
        if (name == "size") {
            meta.size = n;
            ++found;
        } else if (name == "k") {
            meta.k = static_cast<int>(n);
            ++found;
        } else if (name == "m") {
            meta.m = static_cast<int>(n);
            ++found;
        } else if (name == "chunk") {
            meta.chunk = n;
            ++found;
        } else if (name == "atime") {
            meta.atime = n;
        } else if (name == "cls") {
            meta.cls = n == 1 ? TrafficClass::kAgent : TrafficClass::kChatbot;
        }
    }
    if (found != 5 || !ErasureCoder::validate(meta.k, meta.m).is_ok() || meta.size <= 0 ||
        static_cast<uint64_t>(meta.size) > kMaxBlockBytes + header_bytes(kMaxLayers) ||
        meta.chunk != (meta.size + meta.k - 1) / meta.k ||
        meta.place.size() != static_cast<size_t>(meta.k + meta.m)) {
        return false;
    }
    return true;
}

struct ReplyFree {
    void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

}  // namespace

// Connection pools, down-marking, and pipelines over several servers.
class RedisBlockStore::Impl {
public:
    struct Server {
        RedisEndpoint ep;
        std::string name;
        Mutex mu;
        std::vector<redisContext*> idle DSI_GUARDED_BY(mu);
        int64_t down_until_ns DSI_GUARDED_BY(mu) = 0;
    };

    Impl(const RedisStoreOptions& o, StoreMetrics& metrics) : options(o), metrics_(metrics) {
        for (size_t i = 0; i < o.servers.size(); ++i) {
            auto s = std::make_unique<Server>();
            s->ep = o.servers[i];
            s->name = o.servers[i].name();
            by_name[s->name] = static_cast<int>(i);
            servers.push_back(std::move(s));
        }
    }
    ~Impl() {
        for (auto& s : servers) {
            for (redisContext* c : s->idle) {
                redisFree(c);
            }
        }
    }

    bool is_down(int s) {
        MutexLock lock(&servers[s]->mu);
        return servers[s]->down_until_ns > now_ns();
    }

    struct timeval timeout(int64_t deadline_ns) const {
        int64_t ms = options.io_timeout_ms;
        if (deadline_ns != kNoDeadline) {
            ms = std::min(ms, (deadline_ns - now_ns()) / 1'000'000);
        }
        ms = std::max<int64_t>(ms, 1);
        return {static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    }

    // A connection to server s, or nullptr if it is down or does not answer in time.
    redisContext* acquire(int s, int64_t deadline_ns) {
        Server& srv = *servers[s];
        {
            MutexLock lock(&srv.mu);
            if (srv.down_until_ns > now_ns()) {
                return nullptr;
            }
            if (!srv.idle.empty()) {
                redisContext* c = srv.idle.back();
                srv.idle.pop_back();
                redisSetTimeout(c, timeout(deadline_ns));
                return c;
            }
        }
        struct timeval tv = timeout(deadline_ns);
        redisContext* c = redisConnectWithTimeout(srv.ep.host.c_str(), srv.ep.port, tv);
        if (c == nullptr || c->err != 0 || redisSetTimeout(c, tv) != REDIS_OK) {
            if (c != nullptr) {
                redisFree(c);
            }
            mark_down(s);
            return nullptr;
        }
        return c;
    }

    void release(int s, redisContext* c, bool healthy) {
        if (c == nullptr) {
            return;
        }
        if (!healthy || c->err != 0) {
            redisFree(c);
            mark_down(s);
            return;
        }
        MutexLock lock(&servers[s]->mu);
        if (servers[s]->idle.size() < 8) {
            servers[s]->idle.push_back(c);
        } else {
            redisFree(c);
        }
    }

    void mark_down(int s) {
        metrics_.errors.fetch_add(1, std::memory_order_relaxed);
        MutexLock lock(&servers[s]->mu);
        servers[s]->down_until_ns = now_ns() + options.down_backoff_ms * 1'000'000;
        for (redisContext* c : servers[s]->idle) {
            redisFree(c);
        }
        servers[s]->idle.clear();
    }

    RedisStoreOptions options;
    std::vector<std::unique_ptr<Server>> servers;
    std::unordered_map<std::string, int> by_name;

private:
    StoreMetrics& metrics_;
};

namespace {

// Commands to several servers: append everything, then read every reply, so the
// servers work in parallel. Replies of a failed server are null.
class Pipeline {
public:
    Pipeline(RedisBlockStore::Impl& impl, int64_t deadline_ns)
        : impl_(impl), deadline_ns_(deadline_ns) {}
    ~Pipeline() {
        for (auto& [s, c] : conns_) {
            impl_.release(s, c.ctx, !c.failed);
        }
    }

    // Returns the command's index on server s, or -1 if the server is unavailable.
    int append(int s, const std::vector<std::string_view>& args) {
        Conn& c = conns_[s];
        if (!c.tried) {
            c.tried = true;
            c.ctx = impl_.acquire(s, deadline_ns_);
            c.failed = c.ctx == nullptr;
        }
        if (c.failed) {
            return -1;
        }
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (auto a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        if (redisAppendCommandArgv(c.ctx, static_cast<int>(argv.size()), argv.data(),
                                   lens.data()) != REDIS_OK) {
            c.failed = true;
            return -1;
        }
        c.replies.emplace_back();
        return static_cast<int>(c.replies.size()) - 1;
    }

    void execute() {
        for (auto& [s, c] : conns_) {
            for (auto& r : c.replies) {
                if (c.failed) {
                    break;
                }
                void* reply = nullptr;
                if (redisGetReply(c.ctx, &reply) != REDIS_OK || reply == nullptr) {
                    c.failed = true;  // timeout or connection lost: the server is marked down
                    break;
                }
                r.reset(static_cast<redisReply*>(reply));
            }
        }
    }

    // Sends what was appended and reads the replies into `targets`: targets[s] has one
    // entry per command appended to server s, in order (internal/resp_reader.h: bulk
    // replies land in the caller's memory, not in hiredis's buffer). A server whose
    // replies cannot be read is failed (marked down when released).
    void execute_into(std::map<int, std::vector<internal::RespTarget>>& targets,
                      size_t max_bulk_bytes) {
        for (auto& [s, c] : conns_) {
            if (c.failed) {
                continue;
            }
            std::vector<internal::RespTarget>& t = targets[s];
            t.resize(c.replies.size());
            int done = 0;
            while (!done) {
                if (redisBufferWrite(c.ctx, &done) != REDIS_OK) {
                    c.failed = true;
                    break;
                }
            }
            // The pool hands out connections whose reader holds no bytes (every earlier
            // reply was read in full); a reader that does is not bypassed.
            const bool reader_empty = c.ctx->reader->pos == c.ctx->reader->len;
            if (c.failed || !reader_empty ||
                !internal::read_resp_replies(c.ctx->fd, t, max_bulk_bytes)) {
                c.failed = true;
            }
        }
    }

    // Null if the server failed or the command was not sent.
    const redisReply* reply(int s, int index) const {
        auto it = conns_.find(s);
        if (index < 0 || it == conns_.end() ||
            index >= static_cast<int>(it->second.replies.size())) {
            return nullptr;
        }
        return it->second.replies[static_cast<size_t>(index)].get();
    }
    bool ok(int s, int index) const {
        const redisReply* r = reply(s, index);
        return r != nullptr && r->type != REDIS_REPLY_ERROR;
    }

private:
    struct Conn {
        bool tried = false;
        bool failed = false;
        redisContext* ctx = nullptr;
        std::vector<ReplyPtr> replies;
    };
    RedisBlockStore::Impl& impl_;
    int64_t deadline_ns_;
    std::map<int, Conn> conns_;
};

}  // namespace

Status RedisStoreOptions::validate() const {
    if (servers.empty()) {
        return invalid_argument("redis store: no servers");
    }
    for (const auto& s : servers) {
        if (s.host.empty() || s.port <= 0 || s.port > 65535) {
            return invalid_argument("redis store: bad server '" + s.name() + "'");
        }
    }
    DSI_RETURN_IF_ERROR(ErasureCoder::validate(k, m));
    if (static_cast<size_t>(k + m) > servers.size()) {
        return invalid_argument("redis store: k + m exceeds the number of servers");
    }
    if (io_timeout_ms <= 0 || down_backoff_ms < 0) {
        return invalid_argument("redis store: timeouts must be positive");
    }
    return Status::ok();
}

Result<RedisStoreOptions> redis_options_from_uri(const StoreUri& uri) {
    RedisStoreOptions o;
    for (const std::string& hp : split(uri.rest, ',')) {
        size_t colon = hp.rfind(':');
        RedisEndpoint ep;
        int64_t port = 6379;
        if (colon != std::string::npos) {
            ep.host = hp.substr(0, colon);
            if (!parse_i64(std::string_view(hp).substr(colon + 1), port)) {
                return invalid_argument("redis uri: bad port in '" + hp + "'");
            }
        } else {
            ep.host = hp;
        }
        ep.port = static_cast<int>(std::clamp<int64_t>(port, -1, 70000));
        o.servers.push_back(ep);
    }
    DSI_ASSIGN_OR_RETURN(int64_t k, uri_int(uri, "k", 1));
    DSI_ASSIGN_OR_RETURN(int64_t m, uri_int(uri, "m", 0));
    o.k = static_cast<int>(std::min<int64_t>(k, 1000));
    o.m = static_cast<int>(std::min<int64_t>(m, 1000));
    DSI_ASSIGN_OR_RETURN(o.io_timeout_ms, uri_int(uri, "timeout_ms", o.io_timeout_ms));
    DSI_ASSIGN_OR_RETURN(o.down_backoff_ms, uri_int(uri, "backoff_ms", o.down_backoff_ms));
    DSI_ASSIGN_OR_RETURN(o.capacity_bytes, uri_int(uri, "capacity", 0));
    DSI_RETURN_IF_ERROR(o.validate());
    return o;
}

RedisBlockStore::RedisBlockStore(RedisStoreOptions options)
    : options_(std::move(options)),
      coder_(options_.k, options_.m),
      impl_(std::make_unique<Impl>(options_, metrics_)) {}

RedisBlockStore::~RedisBlockStore() = default;

Result<std::unique_ptr<RedisBlockStore>> RedisBlockStore::open(RedisStoreOptions options) {
    DSI_RETURN_IF_ERROR(options.validate());
    return std::unique_ptr<RedisBlockStore>(new RedisBlockStore(std::move(options)));
}

std::string RedisBlockStore::uri() const {
    std::string out = "redis://";
    for (size_t i = 0; i < options_.servers.size(); ++i) {
        out += (i ? "," : "") + options_.servers[i].name();
    }
    return out + "?k=" + std::to_string(options_.k) + "&m=" + std::to_string(options_.m);
}

std::vector<int> RedisBlockStore::window(const StoreKey& key) const {
    std::vector<std::pair<uint64_t, int>> ranked;
    for (size_t i = 0; i < impl_->servers.size(); ++i) {
        const std::string& name = impl_->servers[i]->name;
        XXH64_hash_t h = XXH3_64bits_withSeed(name.data(), name.size(), key.lo ^ (key.hi * 31));
        ranked.emplace_back(h, static_cast<int>(i));
    }
    std::sort(ranked.begin(), ranked.end(), std::greater<>());
    size_t n = std::min(ranked.size(), static_cast<size_t>(options_.k + 2 * options_.m + 1));
    std::vector<int> out;
    for (size_t i = 0; i < n; ++i) {
        out.push_back(ranked[i].second);
    }
    return out;
}

Status RedisBlockStore::put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                            int64_t deadline_ns) {
    int64_t t0 = now_ns();
    auto drop = [&](Status s) {
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return s;
    };
    auto encoded = encode_block(info, layers);
    if (!encoded.is_ok()) {
        return drop(encoded.status());
    }
    const std::vector<uint8_t>& bytes = *encoded;
    const int k = options_.k;
    const int n = k + options_.m;
    std::vector<int> place;
    for (int s : window(info.key)) {
        if (static_cast<int>(place.size()) < n && !impl_->is_down(s)) {
            place.push_back(s);
        }
    }
    if (static_cast<int>(place.size()) < n) {
        return drop(unavailable("redis store: fewer than k + m servers up"));
    }
    // S-KV-2: stripe into k data chunks (zero-padded) + m parity chunks.
    const size_t chunk = (bytes.size() + static_cast<size_t>(k) - 1) / static_cast<size_t>(k);
    std::vector<std::vector<uint8_t>> chunks(static_cast<size_t>(n),
                                             std::vector<uint8_t>(8 + chunk, 0));
    for (int i = 0; i < k; ++i) {
        size_t off = static_cast<size_t>(i) * chunk;
        if (off < bytes.size()) {
            std::memcpy(chunks[i].data() + 8, bytes.data() + off,
                        std::min(chunk, bytes.size() - off));
        }
    }
    std::vector<const uint8_t*> data;
    std::vector<uint8_t*> parity;
    for (int i = 0; i < n; ++i) {
        (i < k ? data.push_back(chunks[i].data() + 8) : parity.push_back(chunks[i].data() + 8));
    }
    coder_.encode(data, parity, chunk);
    for (auto& c : chunks) {
        uint64_t sum = internal::xxh3_ops().hash(c.data() + 8, chunk);
        std::memcpy(c.data(), &sum, 8);
    }
    const std::string hex = to_hex(info.key);
    auto as_view = [](const std::vector<uint8_t>& v) {
        return std::string_view(reinterpret_cast<const char*>(v.data()), v.size());
    };
    {
        Pipeline p(*impl_, deadline_ns);
        std::vector<std::string> keys;
        std::vector<int> idx(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
            keys.push_back(chunk_key(hex, i));
            idx[i] = p.append(place[i], {"SET", keys.back(), as_view(chunks[i])});
        }
        p.execute();
        for (int i = 0; i < n; ++i) {
            if (!p.ok(place[i], idx[i])) {
                const redisReply* r = p.reply(place[i], idx[i]);
                bool oom = r != nullptr && r->type == REDIS_REPLY_ERROR &&
                           std::string_view(r->str, r->len).starts_with("OOM");
                (void)remove(info.key);
                return drop(oom ? resource_exhausted("redis store full")
                                : unavailable("redis store: chunk write failed"));
            }
        }
    }
    std::string place_names;
    for (int i = 0; i < n; ++i) {
        place_names += (i ? "," : "") + impl_->servers[place[i]]->name;
    }
    std::string size = std::to_string(bytes.size());
    std::string ks = std::to_string(k);
    std::string ms = std::to_string(options_.m);
    std::string cs = std::to_string(chunk);
    std::string atime = std::to_string(wall_ns());
    std::string cls = std::to_string(static_cast<int>(info.traffic_class));
    std::string mk = meta_key(hex);
    Pipeline p(*impl_, deadline_ns);
    std::vector<int> idx;
    for (int s : place) {
        idx.push_back(p.append(s, {"HSET", mk, "size", size, "k", ks, "m", ms, "chunk", cs, "place",
                                   place_names, "atime", atime, "cls", cls}));
    }
    p.execute();
    for (size_t i = 0; i < place.size(); ++i) {
        if (!p.ok(place[i], idx[i])) {
            return drop(unavailable("redis store: metadata write failed"));
        }
    }
    metrics_.puts.fetch_add(1, std::memory_order_relaxed);
    metrics_.bytes_written.fetch_add(static_cast<int64_t>(n * (chunk + 8)),
                                     std::memory_order_relaxed);
    metrics_.put_latency.record(now_ns() - t0);
    return Status::ok();
}

namespace {

// One key of a batched read: its metadata, then its chunks. Data chunks 0..k-1 land
// contiguously (they are the encoded block) in the caller's buffer or in `own`; parity
// chunks after them in `own`.
struct ChunkRead {
    std::string hex;
    Meta meta;
    bool found = false;
    Status early;  // set: the result (e.g. the caller's buffer is too small)
    std::vector<int> server;
    std::vector<bool> asked;
    bool present[kMaxErasureChunks] = {};
    int num_present = 0;
    std::span<uint8_t> dst;  // the caller's buffer (>= k chunks), or empty
    BlockBuffer own;         // all k + m chunks, or the m parity chunks when dst is set
    uint8_t* chunk_ptr(int i) const {
        const size_t chunk = static_cast<size_t>(meta.chunk);
        if (!dst.empty()) {
            return i < meta.k ? dst.data() + i * chunk : own.data() + (i - meta.k) * chunk;
        }
        return own.data() + static_cast<size_t>(i) * chunk;
    }
};

// One key once its chunks are in: rebuilds missing data chunks from parity, decodes and
// verifies (into `caller` when given: a view), counts the outcome.
Result<Block> finish_get(StoreMetrics& metrics, ChunkRead& rd, std::span<uint8_t> caller,
                         const BlockInfo* expect) {
    auto miss = [&](Status s) -> Result<Block> {
        metrics.misses.fetch_add(1, std::memory_order_relaxed);
        return s;
    };
    if (!rd.early.is_ok()) {
        return rd.early;
    }
    if (!rd.found) {
        return miss(not_found("no block"));
    }
    const Meta& meta = rd.meta;
    const int k = meta.k;
    const int n = meta.k + meta.m;
    bool data_complete = true;
    for (int i = 0; i < k; ++i) {
        data_complete &= rd.present[i];
    }
    if (!data_complete) {
        if (rd.num_present < k) {
            return miss(not_found("block unreadable: fewer than k chunks"));
        }
        std::vector<uint8_t*> ptrs;
        for (int i = 0; i < n; ++i) {
            ptrs.push_back(rd.chunk_ptr(i));
        }
        ErasureCoder coder(k, meta.m);
        Status s = coder.decode(ptrs, std::span<const bool>(rd.present, n),
                                static_cast<size_t>(meta.chunk));
        if (!s.is_ok()) {
            return miss(not_found("block unreadable: " + s.message()));
        }
        metrics.degraded_reads.fetch_add(1, std::memory_order_relaxed);
    }
    const size_t size = static_cast<size_t>(meta.size);  // drops the padding and parity
    if (caller.empty()) {
        rd.own.truncate(size);
    } else if (rd.dst.empty()) {  // the caller's buffer holds the block, not its padding
        std::memcpy(caller.data(), rd.own.data(), size);
    }
    Result<Block> block = caller.empty() ? decode_block(std::move(rd.own), expect)
                                         : decode_view(caller.first(size), expect);
    if (!block.is_ok()) {
        metrics.corrupt.fetch_add(1, std::memory_order_relaxed);
        return miss(not_found("block unusable: " + block.status().message()));
    }
    metrics.hits.fetch_add(1, std::memory_order_relaxed);
    metrics.bytes_read.fetch_add(static_cast<int64_t>(block->size_bytes()),
                                 std::memory_order_relaxed);
    return block;
}

}  // namespace

Result<Block> RedisBlockStore::get(const StoreKey& key, const BlockInfo* expect,
                                   int64_t deadline_ns) {
    std::span<const BlockInfo> expects;
    if (expect != nullptr) {
        expects = std::span<const BlockInfo>(expect, 1);
    }
    return std::move(get_many(std::span<const StoreKey>(&key, 1), expects, deadline_ns)[0]);
}

std::vector<Result<Block>> RedisBlockStore::get_many(std::span<const StoreKey> keys,
                                                     std::span<const BlockInfo> expects,
                                                     int64_t deadline_ns) {
    return read_blocks(keys, expects, {}, deadline_ns);
}

std::vector<Result<Block>> RedisBlockStore::read_many_into(
    std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
    std::span<const std::span<uint8_t>> dsts, int64_t deadline_ns) {
    DSI_CHECK_EQ(dsts.size(), keys.size());
    return read_blocks(keys, expects, dsts, deadline_ns);
}

std::vector<Result<Block>> RedisBlockStore::read_blocks(std::span<const StoreKey> keys,
                                                        std::span<const BlockInfo> expects,
                                                        std::span<const std::span<uint8_t>> dsts,
                                                        int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    const int64_t t0 = now_ns();
    std::vector<ChunkRead> reads(keys.size());
    {
        // S-KV-4-style metadata lookup: every key's window in one pipelined round.
        Pipeline p(*impl_, deadline_ns);
        std::vector<std::vector<std::pair<int, int>>> asked(keys.size());
        std::vector<std::string> mks;
        for (size_t j = 0; j < keys.size(); ++j) {
            reads[j].hex = to_hex(keys[j]);
            mks.push_back(meta_key(reads[j].hex));
        }
        for (size_t j = 0; j < keys.size(); ++j) {
            for (int s : window(keys[j])) {
                asked[j].emplace_back(s, p.append(s, {"HGETALL", mks[j]}));
            }
        }
        p.execute();
        for (size_t j = 0; j < keys.size(); ++j) {
            for (auto [s, i] : asked[j]) {
                if (parse_meta(p.reply(s, i), reads[j].meta)) {
                    reads[j].found = true;
                    break;
                }
            }
        }
    }
    for (size_t j = 0; j < reads.size(); ++j) {
        ChunkRead& rd = reads[j];
        if (!rd.found) {
            continue;
        }
        const int n = rd.meta.k + rd.meta.m;
        const size_t chunk = static_cast<size_t>(rd.meta.chunk);
        if (!dsts.empty() && dsts[j].size() < static_cast<size_t>(rd.meta.size)) {
            rd.found = false;
            rd.early = invalid_argument("buffer smaller than the stored block");
            continue;
        }
        rd.server.assign(static_cast<size_t>(n), -1);
        rd.asked.assign(static_cast<size_t>(n), false);
        for (int i = 0; i < n; ++i) {
            auto it = impl_->by_name.find(rd.meta.place[i]);
            rd.server[i] = it == impl_->by_name.end() ? -1 : it->second;
        }
        // Pages of chunks never fetched (parity, usually) are never touched.
        if (!dsts.empty() && dsts[j].size() >= rd.meta.k * chunk) {
            rd.dst = dsts[j];
            if (rd.meta.m > 0) {
                rd.own = BlockBuffer::allocate(rd.meta.m * chunk);
            }
        } else {
            rd.own = BlockBuffer::allocate(n * chunk);
        }
    }
    const std::string atime = std::to_string(wall_ns());
    const auto& hash = internal::xxh3_ops().hash;
    // Round 1: every key's data chunks (plus parity for any data chunk whose server is
    // down), one pipeline over all servers; round 2: whatever else a key needs for k.
    for (int round = 0; round < 2; ++round) {
        Pipeline p(*impl_, deadline_ns);
        std::vector<std::vector<std::pair<int, int>>> idx(reads.size());
        bool any = false;
        for (size_t j = 0; j < reads.size(); ++j) {
            ChunkRead& rd = reads[j];
            if (!rd.found || rd.num_present >= rd.meta.k) {
                continue;
            }
            const int n = rd.meta.k + rd.meta.m;
            idx[j].assign(static_cast<size_t>(n), {-1, -1});
            int planned = rd.num_present;
            for (int i = 0; i < n && (round == 1 || planned < rd.meta.k); ++i) {
                if (rd.asked[i] || rd.server[i] < 0 ||
                    (round == 0 && impl_->is_down(rd.server[i]))) {
                    continue;
                }
                rd.asked[i] = true;
                idx[j][i] = {rd.server[i], p.append(rd.server[i], {"GET", chunk_key(rd.hex, i)})};
                ++planned;
                any = true;
            }
            if (round == 0) {
                const std::string mk = meta_key(rd.hex);
                for (int s : rd.server) {  // last access for the GC worker's LRU (S-KV-3)
                    if (s >= 0) {
                        p.append(s, {"HSET", mk, "atime", atime});
                    }
                }
            }
        }
        if (!any) {
            break;
        }
        // Each GET's chunk is received straight into its place (8-byte checksum aside).
        std::map<int, std::vector<internal::RespTarget>> targets;
        for (size_t j = 0; j < reads.size(); ++j) {
            for (size_t i = 0; i < idx[j].size(); ++i) {
                auto [s, k] = idx[j][i];
                if (k < 0) {
                    continue;
                }
                auto& t = targets[s];
                if (t.size() <= static_cast<size_t>(k)) {
                    t.resize(static_cast<size_t>(k) + 1);
                }
                t[static_cast<size_t>(k)].dst = {reads[j].chunk_ptr(static_cast<int>(i)),
                                                 static_cast<size_t>(reads[j].meta.chunk)};
            }
        }
        p.execute_into(targets, kMaxBlockBytes + 8);
        for (size_t j = 0; j < reads.size(); ++j) {
            ChunkRead& rd = reads[j];
            const size_t chunk = static_cast<size_t>(rd.meta.chunk);
            for (size_t i = 0; i < idx[j].size(); ++i) {
                auto [s, k] = idx[j][i];
                if (k < 0) {
                    continue;
                }
                const internal::RespTarget& t = targets[s][static_cast<size_t>(k)];
                if (t.got == internal::RespTarget::Got::kNothing) {
                    continue;  // absent (or the server failed)
                }
                if (t.got != internal::RespTarget::Got::kFilled ||
                    hash(rd.chunk_ptr(static_cast<int>(i)), chunk) != t.prefix) {
                    // A damaged chunk is a missing chunk; parity may still rebuild it.
                    metrics_.corrupt.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                rd.present[i] = true;
                ++rd.num_present;
            }
        }
    }
    std::vector<Result<Block>> out;
    out.reserve(reads.size());
    for (size_t j = 0; j < reads.size(); ++j) {
        out.push_back(finish_get(metrics_, reads[j], dsts.empty() ? std::span<uint8_t>() : dsts[j],
                                 expects.empty() ? nullptr : &expects[j]));
    }
    metrics_.get_latency.record(now_ns() - t0);
    return out;
}

Result<int64_t> RedisBlockStore::match_prefix(std::span<const StoreKey> chain,
                                              int64_t deadline_ns) {
    // S-KV-4: one pipelined round of EXISTS over every key's window; metadata only.
    Pipeline p(*impl_, deadline_ns);
    std::vector<std::vector<std::pair<int, int>>> asked(chain.size());
    std::vector<std::string> keys;
    keys.reserve(chain.size());
    for (size_t i = 0; i < chain.size(); ++i) {
        keys.push_back(meta_key(to_hex(chain[i])));
        for (int s : window(chain[i])) {
            asked[i].emplace_back(s, p.append(s, {"EXISTS", keys.back()}));
        }
    }
    p.execute();
    int64_t hit = 0;
    for (size_t i = 0; i < chain.size(); ++i) {
        bool present = false;
        for (auto [s, idx] : asked[i]) {
            const redisReply* r = p.reply(s, idx);
            present |= r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        }
        if (!present) {
            break;
        }
        ++hit;
    }
    return hit;
}

Result<bool> RedisBlockStore::contains(const StoreKey& key, int64_t deadline_ns) {
    DSI_ASSIGN_OR_RETURN(int64_t n, match_prefix(std::span<const StoreKey>(&key, 1), deadline_ns));
    return n == 1;
}

Status RedisBlockStore::remove(const StoreKey& key) {
    const std::string hex = to_hex(key);
    std::vector<std::string> args = {"DEL", meta_key(hex)};
    for (int i = 0; i < options_.k + options_.m; ++i) {
        args.push_back(chunk_key(hex, i));
    }
    std::vector<std::string_view> views(args.begin(), args.end());
    Pipeline p(*impl_, deadline_after_ms(options_.io_timeout_ms));
    std::vector<std::pair<int, int>> asked;
    for (int s : window(key)) {
        asked.emplace_back(s, p.append(s, views));
    }
    p.execute();
    metrics_.removes.fetch_add(1, std::memory_order_relaxed);
    for (auto [s, idx] : asked) {
        if (!p.ok(s, idx)) {
            return unavailable("redis store: remove could not reach " + impl_->servers[s]->name);
        }
    }
    return Status::ok();
}

Result<std::vector<GcEntry>> RedisBlockStore::list_blocks() {
    std::unordered_map<StoreKey, GcEntry, StoreKeyHash> merged;
    for (size_t s = 0; s < impl_->servers.size(); ++s) {
        std::string cursor = "0";
        int rounds = 0;
        do {
            Pipeline p(*impl_, deadline_after_ms(options_.io_timeout_ms));
            int idx =
                p.append(static_cast<int>(s), {"SCAN", cursor, "MATCH", "m:*", "COUNT", "512"});
            p.execute();
            const redisReply* r = p.reply(static_cast<int>(s), idx);
            if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING) {
                break;  // server down: its blocks are listed by the others or not at all
            }
            cursor.assign(r->element[0]->str, r->element[0]->len);
            const redisReply* names = r->element[1];
            Pipeline q(*impl_, deadline_after_ms(options_.io_timeout_ms));
            std::vector<std::pair<StoreKey, int>> asked;
            for (size_t i = 0; i < names->elements; ++i) {
                std::string_view name(names->element[i]->str, names->element[i]->len);
                auto key = key_from_hex(name.substr(2));
                if (key) {
                    asked.emplace_back(*key, q.append(static_cast<int>(s), {"HGETALL", name}));
                }
            }
            q.execute();
            for (auto [key, i] : asked) {
                Meta meta;
                GcEntry e;
                e.key = key;
                if (parse_meta(q.reply(static_cast<int>(s), i), meta)) {
                    e.size_bytes = (meta.chunk + 8) * (meta.k + meta.m);
                    e.last_access_ns = meta.atime;
                    e.traffic_class = meta.cls;
                }  // malformed metadata: size 0, last access 0, so the TTL removes it
                auto [it, fresh] = merged.emplace(key, e);
                if (!fresh) {
                    it->second.last_access_ns =
                        std::max(it->second.last_access_ns, e.last_access_ns);
                }
            }
        } while (cursor != "0" && ++rounds < 1'000'000);
    }
    std::vector<GcEntry> out;
    out.reserve(merged.size());
    for (auto& [k, e] : merged) {
        out.push_back(e);
    }
    return out;
}

Result<int64_t> RedisBlockStore::capacity_bytes() {
    if (options_.capacity_bytes > 0) {
        return options_.capacity_bytes;
    }
    int64_t total = 0;
    Pipeline p(*impl_, deadline_after_ms(options_.io_timeout_ms));
    std::vector<int> idx;
    for (size_t s = 0; s < impl_->servers.size(); ++s) {
        idx.push_back(p.append(static_cast<int>(s), {"CONFIG", "GET", "maxmemory"}));
    }
    p.execute();
    for (size_t s = 0; s < impl_->servers.size(); ++s) {
        const redisReply* r = p.reply(static_cast<int>(s), idx[s]);
        int64_t v = 0;
        if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            parse_i64(std::string_view(r->element[1]->str, r->element[1]->len), v)) {
            if (v == 0) {
                return INT64_MAX / 4;  // unlimited servers: TTL only, no watermark eviction
            }
            total += v;
        }
    }
    return total > 0 ? total : INT64_MAX / 4;
}

}  // namespace dsi::kvstore

#include "kvstore/block_store.h"

#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>

#include "base/env.h"
#include "kvstore/fetch_service.h"
#include "kvstore/file_store.h"
#include "kvstore/redis_store.h"
#include "kvstore/shm_store.h"
#include "kvstore/uri.h"

namespace dsi::kvstore {

int64_t deadline_after_ms(int64_t ms) { return Env::default_env()->now_ns() + ms * 1'000'000; }

std::vector<Result<Block>> BlockStore::get_many(std::span<const StoreKey> keys,
                                                std::span<const BlockInfo> expects,
                                                int64_t deadline_ns) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    std::vector<Result<Block>> out;
    out.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        out.push_back(get(keys[i], expects.empty() ? nullptr : &expects[i], deadline_ns));
    }
    return out;
}

std::vector<Result<Block>> BlockStore::read_many_into(std::span<const StoreKey> keys,
                                                      std::span<const BlockInfo> expects,
                                                      std::span<const std::span<uint8_t>> dsts,
                                                      int64_t deadline_ns) {
    DSI_CHECK_EQ(dsts.size(), keys.size());
    std::vector<Result<Block>> out = get_many(keys, expects, deadline_ns);
    for (size_t i = 0; i < out.size(); ++i) {
        if (!out[i].is_ok()) {
            continue;
        }
        std::span<const uint8_t> src = out[i]->encoded();
        if (src.size() > dsts[i].size()) {
            out[i] = invalid_argument("buffer smaller than the stored block");
            continue;
        }
        std::memcpy(dsts[i].data(), src.data(), src.size());
        // Already verified by get_many: only the layout is rebuilt (no second hash).
        out[i] = decode_view(dsts[i].first(src.size()), nullptr, out[i]->payload_checksum());
    }
    return out;
}

Result<int64_t> BlockStore::match_prefix(std::span<const StoreKey> chain, int64_t deadline_ns) {
    int64_t n = 0;
    for (const StoreKey& key : chain) {
        DSI_ASSIGN_OR_RETURN(bool present, contains(key, deadline_ns));
        if (!present) {
            break;
        }
        ++n;
    }
    return n;
}

Result<StoreUri> parse_store_uri(std::string_view text) {
    size_t sep = text.find("://");
    if (sep == std::string_view::npos || sep == 0) {
        return invalid_argument("store uri needs scheme://: " + std::string(text));
    }
    StoreUri uri;
    uri.scheme = std::string(text.substr(0, sep));
    std::string_view rest = text.substr(sep + 3);
    size_t q = rest.find('?');
    uri.rest = std::string(rest.substr(0, q));
    if (q != std::string_view::npos) {
        std::string_view query = rest.substr(q + 1);
        while (!query.empty()) {
            size_t amp = query.find('&');
            std::string_view kv = query.substr(0, amp);
            size_t eq = kv.find('=');
            if (eq == std::string_view::npos || eq == 0) {
                return invalid_argument("store uri: bad query item '" + std::string(kv) + "'");
            }
            uri.query[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
            query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
        }
    }
    return uri;
}

Result<int64_t> uri_int(const StoreUri& uri, const std::string& name, int64_t fallback) {
    auto it = uri.query.find(name);
    if (it == uri.query.end()) {
        return fallback;
    }
    int64_t v = 0;
    const std::string& s = it->second;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || v < 0) {
        return invalid_argument("store uri: " + name + " must be a non-negative integer");
    }
    return v;
}

namespace {

// Removes "name=value" from the query of `uri` and returns value (nullopt if absent).
std::optional<std::string> take_query_param(std::string* uri, std::string_view name) {
    const size_t q = uri->find('?');
    if (q == std::string::npos) return std::nullopt;
    std::optional<std::string> value;
    std::string kept;
    size_t pos = q + 1;
    while (pos <= uri->size()) {
        const size_t end = std::min(uri->find('&', pos), uri->size());
        const std::string_view item(uri->data() + pos, end - pos);
        if (item.size() > name.size() && item.starts_with(name) && item[name.size()] == '=') {
            value = std::string(item.substr(name.size() + 1));
        } else if (!item.empty()) {
            kept += (kept.empty() ? "" : "&") + std::string(item);
        }
        pos = end + 1;
    }
    *uri = uri->substr(0, q) + (kept.empty() ? "" : "?" + kept);
    return value;
}

}  // namespace

Result<std::unique_ptr<BlockStore>> open_block_store(const std::string& text) {
    if (size_t bar = text.find('|'); bar != std::string::npos) {
        // "shm://...|<store uri>": the host shm tier over a store (TieredBlockStore).
        if (!text.starts_with("shm://")) {
            return invalid_argument("store uri: only shm:// may sit above '|'");
        }
        // "...&fetcher=/path.sock": shm misses are fetched by the S-KV-5 fetch process
        // listening there (FetchProcessStore, fetch_service.h).
        std::string upper_text = text.substr(0, bar);
        const std::optional<std::string> fetcher = take_query_param(&upper_text, "fetcher");
        if (fetcher && fetcher->empty()) {
            return invalid_argument("store uri: fetcher= needs a socket path");
        }
        DSI_ASSIGN_OR_RETURN(auto upper, open_block_store(upper_text));
        DSI_ASSIGN_OR_RETURN(auto lower, open_block_store(text.substr(bar + 1)));
        std::unique_ptr<ShmBlockStore> shm(static_cast<ShmBlockStore*>(upper.release()));
        if (fetcher) {
            return std::unique_ptr<BlockStore>(
                std::make_unique<FetchProcessStore>(std::move(shm), std::move(lower), *fetcher));
        }
        return std::unique_ptr<BlockStore>(
            std::make_unique<TieredBlockStore>(std::move(shm), std::move(lower)));
    }
    DSI_ASSIGN_OR_RETURN(StoreUri uri, parse_store_uri(text));
    if (uri.scheme == "file") {
        FileStoreOptions options;
        DSI_ASSIGN_OR_RETURN(options.capacity_bytes, uri_int(uri, "capacity", 0));
        DSI_ASSIGN_OR_RETURN(int64_t fsync, uri_int(uri, "fsync", 1));
        options.fsync = fsync != 0;
        auto io = uri.query.find("io");
        if (io != uri.query.end()) {
            if (io->second != "pread" && io->second != "uring" && io->second != "mmap") {
                return invalid_argument("store uri: io must be pread, uring or mmap");
            }
            options.use_io_uring = io->second == "uring";
            options.map_reads = io->second == "mmap";
        }
        const auto fd_cache_default = static_cast<int64_t>(options.fd_cache_entries);
        DSI_ASSIGN_OR_RETURN(int64_t fd_cache, uri_int(uri, "fd_cache", fd_cache_default));
        options.fd_cache_entries = static_cast<size_t>(fd_cache);
        DSI_ASSIGN_OR_RETURN(auto store, FileBlockStore::open(uri.rest, std::move(options)));
        return std::unique_ptr<BlockStore>(std::move(store));
    }
    if (uri.scheme == "redis") {
        DSI_ASSIGN_OR_RETURN(RedisStoreOptions options, redis_options_from_uri(uri));
        DSI_ASSIGN_OR_RETURN(auto store, RedisBlockStore::open(std::move(options)));
        return std::unique_ptr<BlockStore>(std::move(store));
    }
    if (uri.scheme == "shm") {
        ShmStoreOptions options;
        options.name = uri.rest;
        DSI_ASSIGN_OR_RETURN(options.num_slots, uri_int(uri, "slots", 0));
        DSI_ASSIGN_OR_RETURN(options.slot_bytes, uri_int(uri, "slot_bytes", 0));
        DSI_ASSIGN_OR_RETURN(int64_t unlink, uri_int(uri, "unlink", 0));
        options.unlink_on_close = unlink != 0;
        DSI_ASSIGN_OR_RETURN(auto store, ShmBlockStore::open(std::move(options)));
        return std::unique_ptr<BlockStore>(std::move(store));
    }
    return invalid_argument("unknown store scheme '" + uri.scheme + "'");
}

}  // namespace dsi::kvstore

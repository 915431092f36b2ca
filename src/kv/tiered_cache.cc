#include "kv/tiered_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/check.h"
#include "base/logging.h"

namespace dsi::kv {
namespace {

// A stored SWA state is the slot copy followed by an 8-byte seal (XXH3-64 of the copy
// and its position), checked before a restore: a damaged state is a miss, never a
// wrong continuation.
uint64_t swa_seal_of(std::span<const uint8_t> slot, int64_t position) {
    return XXH3_64bits_withSeed(slot.data(), slot.size(), static_cast<uint64_t>(position));
}

int64_t block_floats_of(const std::vector<CacheGroupSpec>& groups) {
    int64_t n = 0;  // every cache group's slice of one block
    for (const CacheGroupSpec& g : groups) n += g.block_floats();
    return n;
}

}  // namespace

void swa_seal(std::vector<uint8_t>& bytes, int64_t position) {
    const uint64_t h = swa_seal_of(bytes, position);
    const auto* p = reinterpret_cast<const uint8_t*>(&h);
    bytes.insert(bytes.end(), p, p + kSwaSealBytes);
}

// The stored region of a slot (S-KV-8): the ranges' words back to back (all: the slot).
std::vector<uint8_t> swa_pack(std::vector<uint8_t> slot,
                              std::span<const std::pair<int64_t, int64_t>> ranges) {
    if (ranges.empty()) return slot;
    std::vector<uint8_t> out;
    for (const auto& [b, e] : ranges) {
        out.insert(out.end(), slot.begin() + b * 4, slot.begin() + e * 4);
    }
    return out;
}

size_t swa_stored_bytes(size_t slot_bytes, std::span<const std::pair<int64_t, int64_t>> ranges) {
    if (ranges.empty()) return slot_bytes;
    size_t n = 0;
    for (const auto& [b, e] : ranges) n += static_cast<size_t>(e - b) * 4;
    return n;
}

bool swa_sealed_ok(const SwaState& st, size_t slot_bytes) {
    if (st.bytes.size() != slot_bytes + kSwaSealBytes) return false;
    uint64_t h = 0;
    std::memcpy(&h, st.bytes.data() + slot_bytes, kSwaSealBytes);
    return h == swa_seal_of(std::span<const uint8_t>(st.bytes).first(slot_bytes), st.key.position);
}

void copy_block_to_host(BlockPool& pool, const HostCopy& c) {
    float* host = c.host;
    for (size_t g = 0; g < pool.groups().size(); ++g) {
        const size_t n = static_cast<size_t>(pool.groups()[g].block_floats());
        std::memcpy(host, pool.data(g, c.block), n * sizeof(float));
        host += n;
    }
}

void copy_block_from_host(BlockPool& pool, const HostCopy& c) {
    const float* host = c.host;
    for (size_t g = 0; g < pool.groups().size(); ++g) {
        const size_t n = static_cast<size_t>(pool.groups()[g].block_floats());
        std::memcpy(pool.data(g, c.block), host, n * sizeof(float));
        host += n;
    }
}

int64_t num_store_layers(const BlockPool& pool) {
    int64_t n = 0;
    for (const CacheGroupSpec& g : pool.groups()) n += g.num_layers;
    return n;
}

void copy_fetched_layer(BlockPool& pool, const SwapIn& s, int64_t layer) {
    std::span<const uint8_t> src = s.data->layer(static_cast<uint32_t>(layer));
    int64_t l = layer;
    for (size_t g = 0; g < pool.groups().size(); ++g) {
        const CacheGroupSpec& spec = pool.groups()[g];
        if (l >= spec.num_layers) {
            l -= spec.num_layers;
            continue;
        }
        // A group's block is [layer][entry][floats].
        const int64_t layer_floats = spec.entries_per_block() * spec.floats_per_entry;
        std::memcpy(pool.data(g, s.block) + l * layer_floats, src.data(), src.size());
        return;
    }
    DSI_CHECK(false, "store layer ", layer, " outside the block");
}

Result<std::unique_ptr<TieredCache>> TieredCache::create(TieredCacheOptions options) {
    if (options.groups.empty()) return invalid_argument("tiered cache needs a cache group");
    if (options.state_floats < 0 || (options.state_floats > 0 && options.num_state_slots < 1)) {
        return invalid_argument("tiered cache: a state-slot layout needs state_floats > 0 and "
                                "at least one slot");
    }
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool,
                         BlockPool::create(options.groups, options.num_blocks));
    return std::unique_ptr<TieredCache>(new TieredCache(std::move(options), std::move(pool)));
}

TieredCache::TieredCache(TieredCacheOptions options, std::unique_ptr<BlockPool> pool)
    : options_(std::move(options)),
      pool_(std::move(pool)),
      swap_(options_.swap_space_bytes, block_floats_of(options_.groups)) {
    if (options_.state_floats > 0) {
        slots_ = std::make_unique<StateSlotPool>(options_.num_state_slots, options_.state_floats);
        if (options_.prefix_cache) {
            if (options_.swa_pool != nullptr) {
                swa_ = options_.swa_pool;
            } else if (options_.swa_pool_bytes > 0) {
                owned_swa_ = std::make_unique<SwaStatePool>(options_.swa_pool_bytes);
                swa_ = owned_swa_.get();
            }
        }
    }
    open_store();
}

TieredCache::~TieredCache() {
    // Stop the tier threads before the store they use goes.
    fetcher_.reset();
    // Shutdown drains the write-behind queue, bounded (a dead store cannot hold us).
    if (write_behind_ != nullptr) (void)write_behind_->flush(kvstore::deadline_after_ms(5000));
    write_behind_.reset();
}

// A store that cannot be opened is logged and left out: serving goes on.
void TieredCache::open_store() {
    if (options_.store != nullptr) {
        store_ = options_.store;
    } else if (!options_.store_uri.empty()) {
        Result<std::unique_ptr<kvstore::BlockStore>> st =
            kvstore::open_block_store(options_.store_uri);
        if (!st.is_ok()) {
            DSI_LOG(kWarning) << "kv store " << options_.store_uri
                              << " unavailable, serving without it: " << st.status().to_string();
            return;
        }
        owned_store_ = std::move(st).value();
        store_ = owned_store_.get();
    }
    if (store_ == nullptr || !options_.prefix_cache) {
        store_ = nullptr;
        return;
    }
    model_identity_ = kvstore::model_identity(options_.model_id);
    if (options_.store_write) {
        kvstore::WriteBehind::Options wo;
        wo.max_queued_bytes = options_.write_queue_bytes;
        write_behind_ = std::make_unique<kvstore::WriteBehind>(store_, wo);
    }
    // S-KV-5: blocks are read straight into reused host buffers (read_many_into),
    // each sized for one encoded block; the swap-in copies from them.
    kvstore::Fetcher::Options fo;
    fo.buffer_bytes = kvstore::header_bytes(static_cast<uint32_t>(store_layers())) +
                      static_cast<size_t>(block_payload_bytes());
    fo.max_buffers = std::max<int64_t>(
        1, options_.fetch_buffer_bytes / static_cast<int64_t>(fo.buffer_bytes));
    fetcher_ = std::make_unique<kvstore::Fetcher>(store_, fo);
}

TieredCache::Seq& TieredCache::at(SeqId id) {
    auto it = seqs_.find(id);
    DSI_CHECK(it != seqs_.end(), "unknown sequence");
    return it->second;
}

const TieredCache::Seq& TieredCache::at(SeqId id) const {
    auto it = seqs_.find(id);
    DSI_CHECK(it != seqs_.end(), "unknown sequence");
    return it->second;
}

int64_t TieredCache::layer_bytes(int64_t i) const {
    for (const CacheGroupSpec& g : options_.groups) {
        if (i < g.num_layers) {
            return g.entries_per_block() * g.floats_per_entry * static_cast<int64_t>(sizeof(float));
        }
        i -= g.num_layers;
    }
    DSI_CHECK(false, "store layer outside the block");
    return 0;
}

int64_t TieredCache::block_payload_bytes() const {
    return block_floats_of(options_.groups) * static_cast<int64_t>(sizeof(float));
}

kvstore::BlockInfo TieredCache::store_info(const Seq& s, std::span<const int32_t> tokens,
                                           int64_t b) const {
    kvstore::BlockInfo info;
    info.key = kvstore::StoreKey{s.keys[b].lo, s.keys[b].hi};
    info.model = model_identity_;
    info.num_layers = static_cast<uint32_t>(store_layers());
    // A block written under another dtype is a mismatch on fetch.
    info.dtype = options_.store_dtype;
    info.num_tokens = static_cast<uint32_t>(kBlockTokens);
    info.token_hash = kvstore::token_ids_hash(tokens.subspan(b * kBlockTokens, kBlockTokens));
    info.traffic_class = s.traffic;
    return info;
}

// S-KV-7: a block just published (prefill or decode) is offered to the store. One
// bounded copy here (WriteBehind::offer copies and never blocks; a full queue drops).
void TieredCache::offer_block(const Seq& s, std::span<const int32_t> tokens, int64_t b) {
    if (write_behind_ == nullptr) return;
    std::vector<std::span<const uint8_t>> layers;  // every group's layers (num_store_layers)
    for (size_t g = 0; g < options_.groups.size(); ++g) {
        const float* base = pool_->data(g, s.blocks[b]);
        const CacheGroupSpec& spec = options_.groups[g];
        const int64_t floats = spec.entries_per_block() * spec.floats_per_entry;
        for (int64_t l = 0; l < spec.num_layers; ++l) {
            layers.emplace_back(reinterpret_cast<const uint8_t*>(base + l * floats),
                                static_cast<size_t>(floats) * sizeof(float));
        }
    }
    if (write_behind_->offer(store_info(s, tokens, b), layers)) {
        ++stats_.store_blocks_offered;
        stats_.store_bytes_offered += block_payload_bytes();
    } else {
        ++stats_.store_blocks_dropped;
    }
}

std::shared_ptr<const KvExport> TieredCache::export_blocks(SeqId id, std::span<const int32_t> tokens,
                                                          int64_t num_rows) const {
    const Seq& s = at(id);
    if (!options_.prefix_cache || s.num_published == 0) return nullptr;
    auto e = std::make_shared<KvExport>();
    auto n = static_cast<size_t>(s.num_published);
    if (slots_ != nullptr) {
        // Blocks of a state-slot layout are worth something only with the state at their
        // end: the prefill's, at its store position P (S-KV-9), which the pool holds since
        // the prefill's last chunk ran (docs/cluster.md "V4 / V4.1 hand-over").
        if (swa_ == nullptr) return nullptr;
        const Result<int64_t> p = prefill_store_position(s.swa_prompt);
        if (!p.is_ok() || *p == 0 || *p > s.num_published * kBlockTokens) return nullptr;
        Result<std::shared_ptr<const SwaState>> st = swa_->get(swa_state_key(s.keys, *p));
        if (!st.is_ok()) return nullptr;
        e->swa_state = std::move(st).value();
        n = static_cast<size_t>(*p / kBlockTokens);
    }
    e->model_id = options_.model_id;
    e->dtype = options_.store_dtype;
    e->traffic_class = s.traffic;
    e->block_tokens = static_cast<uint32_t>(kBlockTokens);
    for (size_t b = 0; b < n; ++b) {
        e->keys.push_back(kvstore::StoreKey{s.keys[b].lo, s.keys[b].hi});
        e->token_hashes.push_back(kvstore::token_ids_hash(
            tokens.subspan(b * static_cast<size_t>(kBlockTokens), kBlockTokens)));
    }
    // Store layers in group order, each that group's slice of the block (offer_block).
    for (size_t g = 0; g < options_.groups.size(); ++g) {
        const CacheGroupSpec& spec = options_.groups[g];
        const int64_t floats = spec.entries_per_block() * spec.floats_per_entry;
        const auto bytes = static_cast<uint64_t>(floats) * sizeof(float);
        for (int64_t l = 0; l < spec.num_layers; ++l) {
            std::vector<uint8_t>& dst = e->layers.emplace_back(n * bytes);
            e->layer_block_bytes.push_back(bytes);
            for (size_t b = 0; b < n; ++b) {
                std::memcpy(dst.data() + b * bytes, pool_->data(g, s.blocks[b]) + l * floats,
                            bytes);
            }
        }
    }
    // The rows past the last full block (V2/V3: one entry per token): the first rows of
    // the tail block's slice of each layer, keyed after the last full block.
    const int64_t full = static_cast<int64_t>(n) * kBlockTokens;
    const int64_t tail = std::min<int64_t>(num_rows, static_cast<int64_t>(tokens.size())) - full;
    if (landing_supported() && tail > 0 && tail < kBlockTokens && s.blocks.size() > n &&
        static_cast<int64_t>(s.keys.size()) >= static_cast<int64_t>(n)) {
        const auto rows = tokens.subspan(static_cast<size_t>(full), static_cast<size_t>(tail));
        const BlockKey k = tail_key(n > 0 ? s.keys[n - 1] : BlockKey{}, rows, s.salt);
        e->tail_tokens = static_cast<uint32_t>(tail);
        e->tail_key = kvstore::StoreKey{k.lo, k.hi};
        e->tail_token_hash = kvstore::token_ids_hash(rows);
        size_t layer = 0;
        for (size_t g = 0; g < options_.groups.size(); ++g) {
            const CacheGroupSpec& spec = options_.groups[g];
            const int64_t floats = spec.entries_per_block() * spec.floats_per_entry;
            for (int64_t l = 0; l < spec.num_layers; ++l, ++layer) {
                const auto* src =
                    reinterpret_cast<const uint8_t*>(pool_->data(g, s.blocks[n]) + l * floats);
                std::vector<uint8_t>& dst = e->layers[layer];
                dst.insert(dst.end(), src, src + e->tail_bytes(layer));
            }
        }
    }
    return e;
}

bool TieredCache::landing_supported() const {
    if (slots_ != nullptr || !options_.prefix_cache) return false;
    return std::all_of(options_.groups.begin(), options_.groups.end(),
                       [](const CacheGroupSpec& g) { return g.tokens_per_entry == 1; });
}

Result<int64_t> TieredCache::reserve_landing(int64_t num_tokens) {
    if (!landing_supported() || num_tokens <= 0) {
        return failed_precondition("no hand-over landing for this cache layout");
    }
    // Running sequences keep a block each to grow into: a hand-over does not make the
    // scheduler preempt them.
    const int64_t need = blocks_for_tokens(num_tokens);
    const auto running = static_cast<int64_t>(std::count_if(
        seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.admitted; }));
    if (need > pool_->num_available() - running) {
        ++stats_.landings_refused;
        return resource_exhausted("hand-over landing: " + std::to_string(need) + " blocks, " +
                                  std::to_string(pool_->num_available()) + " available for " +
                                  std::to_string(running) + " running sequences");
    }
    Result<std::vector<BlockId>> b = pool_->allocate(need);
    if (!b.is_ok()) {
        ++stats_.landings_refused;
        return b.status().with_context("hand-over landing");
    }
    const int64_t handle = next_landing_++;
    Landing& l = landings_[handle];
    l.num_tokens = num_tokens;
    l.blocks = std::move(b).value();
    ++stats_.landings_reserved;
    return handle;
}

std::vector<std::vector<uint8_t*>> TieredCache::landing_memory(int64_t handle) {
    const Landing& l = landings_.at(handle);
    std::vector<std::vector<uint8_t*>> out;
    for (size_t g = 0; g < options_.groups.size(); ++g) {
        const CacheGroupSpec& spec = options_.groups[g];
        const int64_t floats = spec.entries_per_block() * spec.floats_per_entry;
        for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
            std::vector<uint8_t*>& v = out.emplace_back();
            for (BlockId b : l.blocks) {
                v.push_back(reinterpret_cast<uint8_t*>(pool_->data(g, b) + layer * floats));
            }
        }
    }
    return out;
}

Status TieredCache::land(int64_t handle, std::span<const BlockKey> keys, const BlockKey& tail,
                         int64_t expires_ns) {
    auto it = landings_.find(handle);
    if (it == landings_.end()) return not_found("hand-over landing " + std::to_string(handle));
    Landing& l = it->second;
    if (l.landed || static_cast<int64_t>(keys.size()) != l.num_full()) {
        release_landing(it);
        ++stats_.landings_dropped;
        return invalid_argument("hand-over landing: keys for another block count");
    }
    // A key the index has already (the same prefix cached here) keeps that block; this
    // one stays private to the landing, and the continuation pins the indexed one.
    for (size_t b = 0; b < keys.size(); ++b) (void)pool_->publish(l.blocks[b], keys[b]);
    l.landed = true;
    l.last_key = keys.empty() ? BlockKey{} : keys.back();
    l.tail_key = tail;
    l.expires_ns = expires_ns;
    ++stats_.landings_landed;
    return Status::ok();
}

void TieredCache::release_landing(std::map<int64_t, Landing>::iterator it) {
    pool_->release_all(it->second.blocks);
    landings_.erase(it);
}

void TieredCache::drop_landing(int64_t handle) {
    auto it = landings_.find(handle);
    if (it == landings_.end()) return;
    release_landing(it);
    ++stats_.landings_dropped;
}

int64_t TieredCache::expire_landings(int64_t now_ns) {
    int64_t n = 0;
    for (auto it = landings_.begin(); it != landings_.end();) {
        if (it->second.landed && it->second.expires_ns <= now_ns) {
            release_landing(it++);
            ++n;
        } else {
            ++it;
        }
    }
    stats_.landings_expired += n;
    return n;
}

int64_t TieredCache::match_landing(SeqId id, Seq& s, std::span<const int32_t> tokens,
                                   int64_t hit_blocks) {
    for (auto& [handle, l] : landings_) {
        // S-KV-9: at least one token of the continuation is left to compute.
        if (!l.landed || l.num_tokens >= static_cast<int64_t>(tokens.size()) ||
            l.num_full() != hit_blocks) {
            continue;
        }
        if (l.claimant != 0 && l.claimant != id) {
            auto other = seqs_.find(l.claimant);
            if (other != seqs_.end() && !other->second.admitted &&
                other->second.landing == handle) {
                continue;
            }
        }
        const int64_t f = l.num_full();
        ensure_keys(s, tokens, f);
        const BlockKey parent = f > 0 ? s.keys[static_cast<size_t>(f - 1)] : BlockKey{};
        if (parent != l.last_key) continue;
        if (l.tail_tokens() > 0 &&
            tail_key(parent, tokens.subspan(static_cast<size_t>(f * kBlockTokens),
                                            static_cast<size_t>(l.tail_tokens())),
                     s.salt) != l.tail_key) {
            continue;
        }
        l.claimant = id;
        return handle;
    }
    return 0;
}

// Keys of the first n full blocks of tokens.
void TieredCache::ensure_keys(Seq& s, std::span<const int32_t> tokens, int64_t n) {
    while (static_cast<int64_t>(s.keys.size()) < n) {
        const size_t b = s.keys.size();
        const BlockKey parent = b == 0 ? BlockKey{} : s.keys[b - 1];
        s.keys.push_back(chain_key(parent, tokens.subspan(b * kBlockTokens, kBlockTokens), s.salt));
    }
}

// S-KV-9: a hit keeps at least one token back (its logits start the output).
int64_t TieredCache::max_hit_blocks(size_t num_tokens) const {
    // A state-slot layout resumes only from a stored state (SWA cache).
    if (!options_.prefix_cache || (slots_ != nullptr && swa_ == nullptr)) return 0;
    return (static_cast<int64_t>(num_tokens) - 1) / kBlockTokens;
}

void TieredCache::release_staged(Seq& s) {
    pool_->release_all(s.staged);
    s.staged.clear();
    s.staged_data.clear();
    s.staged_first = 0;
}

void TieredCache::drop_fetch(Seq& s) {
    if (s.fetch == nullptr) return;
    s.fetch.reset();
    --num_fetching_;
}

// S-KV-4/5: after the local match, ask the store for the rest of the chain (metadata
// only) and fetch the hits off-thread. True if a fetch is now in flight.
bool TieredCache::start_fetch(Seq& s, std::span<const int32_t> tokens, int64_t max_hit) {
    s.store_checked = true;
    const PrefixPeek p =
        pool_->peek(std::span<const BlockKey>(s.keys).first(static_cast<size_t>(max_hit)));
    const int64_t first = p.num_hit_blocks;
    if (first >= max_hit) return false;
    std::vector<kvstore::StoreKey> chain;
    for (int64_t b = first; b < max_hit; ++b) chain.push_back({s.keys[b].lo, s.keys[b].hi});
    ++stats_.store_lookups;
    Result<int64_t> n = store_->match_prefix(
        chain, kvstore::deadline_after_ms(options_.match_timeout_ms));
    if (!n.is_ok() || *n <= 0) return false;  // a dead store is a miss
    chain.resize(static_cast<size_t>(*n));
    std::vector<kvstore::BlockInfo> expects;
    for (int64_t b = first; b < first + *n; ++b) expects.push_back(store_info(s, tokens, b));
    s.fetch_first_block = first;
    s.fetch_num_blocks = *n;
    s.fetch_submit_ns = kvstore::deadline_after_ms(0);
    s.fetch_deadline_ns = kvstore::deadline_after_ms(options_.fetch_timeout_ms);
    s.fetch = fetcher_->submit(std::move(chain), std::move(expects), s.fetch_deadline_ns);
    ++num_fetching_;
    return true;
}

// A finished (or late) fetch: pin the local prefix, take the leading verified blocks
// into new pool blocks the sequence holds (staged). Anything unusable is a miss: the
// sequence computes those tokens.
void TieredCache::resolve_fetch(Seq& s) {
    std::shared_ptr<kvstore::FetchTicket> t = s.fetch;
    const int64_t now = kvstore::deadline_after_ms(0);
    drop_fetch(s);
    if (!t->done()) {  // late: the fetch goes on, its result is dropped
        stats_.store_miss_blocks += s.fetch_num_blocks;
        return;
    }
    const int64_t lat = now - s.fetch_submit_ns;
    ++stats_.fetch_count;
    stats_.fetch_sum_ns += lat;
    stats_.fetch_max_ns = std::max(stats_.fetch_max_ns, lat);
    // Each fetched block holds a Fetcher host buffer until the swap-in has copied it
    // (the step plan drops it) or the sequence ends.
    std::vector<Result<kvstore::FetchedBlock>>& res = t->results();
    std::vector<std::shared_ptr<const kvstore::Block>> got;
    for (Result<kvstore::FetchedBlock>& r : res) {
        if (!r.is_ok()) break;  // the chain stops at the first miss
        const kvstore::Block& b = **r;
        bool ok = b.num_layers() == static_cast<uint32_t>(store_layers());
        for (uint32_t l = 0; ok && l < b.num_layers(); ++l)
            ok = static_cast<int64_t>(b.layer(l).size()) == layer_bytes(l);
        if (!ok) break;
        got.push_back(std::move(r).value());
    }
    stats_.store_miss_blocks += static_cast<int64_t>(res.size() - got.size());
    if (got.empty()) return;
    const int64_t first = s.fetch_first_block;
    const int64_t end = first + static_cast<int64_t>(got.size());
    // The local prefix may have changed while fetching: pin what is there now.
    std::vector<BlockId> pinned =
        pool_->match_and_pin(std::span<const BlockKey>(s.keys).first(static_cast<size_t>(end)));
    const int64_t m = static_cast<int64_t>(pinned.size());
    if (m < first) {  // a parent was evicted meanwhile: the chain is broken
        pool_->release_all(pinned);
        stats_.store_miss_blocks += static_cast<int64_t>(got.size());
        return;
    }
    const int64_t need = end - m;
    if (need > 0) {
        Result<std::vector<BlockId>> nb = pool_->allocate(need);
        if (!nb.is_ok()) {  // pool short: compute instead
            pool_->release_all(pinned);
            stats_.store_miss_blocks += static_cast<int64_t>(got.size());
            return;
        }
        pinned.insert(pinned.end(), nb->begin(), nb->end());
        s.staged_data.assign(got.begin() + (m - first), got.end());
    }
    s.staged = std::move(pinned);
    s.staged_first = m;
}

void TieredCache::add(SeqId id, const BlockKey& salt, kvstore::TrafficClass traffic,
                      bool continuation) {
    Seq s;
    s.salt = salt;
    s.traffic = traffic;
    s.continuation = continuation;
    const bool inserted = seqs_.emplace(id, std::move(s)).second;
    DSI_CHECK(inserted, "sequence added twice");
}

void TieredCache::remove(SeqId id) {
    Seq& s = at(id);
    swa_store_held(s);  // S-KV-9: at request end the latest complete copy is stored
    pool_->release_all(s.blocks);
    s.blocks.clear();
    release_staged(s);
    drop_fetch(s);
    swap_.release(s.swap_slots);  // abort of a swapped-out sequence frees its host space
    release_state(s);
    seqs_.erase(id);
}

bool TieredCache::fetching(SeqId id) const { return at(id).fetch != nullptr; }

bool TieredCache::poll_fetch(SeqId id) {
    Seq& s = at(id);
    DSI_CHECK(s.fetch != nullptr);
    if (!s.fetch->done() && kvstore::deadline_after_ms(0) < s.fetch_deadline_ns) return false;
    resolve_fetch(s);
    return true;
}

std::optional<AdmissionPeek> TieredCache::peek_admission(SeqId id,
                                                         std::span<const int32_t> tokens) {
    Seq& s = at(id);
    AdmissionPeek p;
    s.landing = 0;
    if (swa_ != nullptr) {  // no hit unless the SWA hit rule below finds one
        s.swa_plan = SwaHitPlan{};
        s.swa_plan.input_tokens = static_cast<int64_t>(tokens.size());
        s.swa_start = 0;
    }
    if (!s.swap_slots.empty()) {
        // Swapped out: its rows come back from host memory, no prefix lookup.
        p.num_cached_tokens = s.swapped_rows;
        p.num_swapped_blocks = static_cast<int64_t>(s.swap_slots.size());
        return p;
    }
    const int64_t max_hit = max_hit_blocks(tokens.size());
    const auto len = static_cast<int64_t>(tokens.size());
    if (max_hit > 0 && store_ != nullptr && !s.store_checked && s.staged.empty()) {
        ensure_keys(s, tokens, max_hit);
        // SWA: no block is fetched past where a stored state lets the sequence start.
        const int64_t fetch_max =
            swa_ != nullptr ? swa_plan_start(s, len, max_hit * kBlockTokens) / kBlockTokens
                            : max_hit;
        if (fetch_max > 0 && start_fetch(s, tokens, fetch_max)) return std::nullopt;
    }
    if (!s.staged.empty() && swa_ != nullptr) {
        // The fetched chain may be shorter than asked, or a state gone: start where the
        // rule says with the blocks held, and let go of those past it.
        const int64_t start =
            swa_plan_start(s, len, static_cast<int64_t>(s.staged.size()) * kBlockTokens);
        trim_staged(s, start / kBlockTokens);
    }
    if (!s.staged.empty()) {
        // Prefix blocks already held (local pins + fetched): nothing to pin.
        p.num_cached_tokens = static_cast<int64_t>(s.staged.size()) * kBlockTokens;
    } else if (max_hit > 0) {
        ensure_keys(s, tokens, max_hit);
        PrefixPeek hit =
            pool_->peek(std::span<const BlockKey>(s.keys).first(static_cast<size_t>(max_hit)));
        if (swa_ != nullptr) {
            // S-KV-10: the blocks give L1, the stored states decide where to start.
            swa_plan_start(s, len, hit.num_hit_blocks * kBlockTokens);
            if (s.swa_start < hit.num_hit_blocks * kBlockTokens) {
                hit = pool_->peek(std::span<const BlockKey>(s.keys).first(
                    static_cast<size_t>(s.swa_start / kBlockTokens)));
            }
        }
        p.num_cached_tokens = hit.num_hit_blocks * kBlockTokens;
        p.num_cached_unreferenced_blocks = hit.num_unreferenced;
        if (s.continuation && !landings_.empty()) {
            // A hand-over landed for it: start past the tail rows too (admit adopts them).
            s.landing = match_landing(id, s, tokens, hit.num_hit_blocks);
            if (s.landing != 0) p.num_cached_tokens = landings_.at(s.landing).num_tokens;
        }
    }
    return p;
}

int64_t TieredCache::swa_plan_start(Seq& s, int64_t input_tokens, int64_t block_hit_tokens) {
    Result<SwaHitPlan> plan = plan_swa_hit(input_tokens, block_hit_tokens,
                                           [&](int64_t pos) { return swa_has_state(s, pos); });
    DSI_CHECK(plan.is_ok(), plan.status().to_string());
    s.swa_plan = *plan;
    s.swa_start = swa_fallback_start(s, *plan);
    if (s.continuation) swa_continuation_start(s, input_tokens, block_hit_tokens);
    return s.swa_start;
}

// A continuation past S-KV-10's cap (Policies): the exact state at the highest block
// boundary of its blocks that keeps one token back (S-KV-9), or one unit below (a
// prefill of k x 128 tokens stored at (k - 1) x 128). The restored slot is the whole
// state, copied with lateness 0, so the steps from there are the first engine's.
void TieredCache::swa_continuation_start(Seq& s, int64_t input_tokens, int64_t block_hit_tokens) {
    const int64_t top =
        std::min(block_hit_tokens, (input_tokens - 1) / kBlockTokens * kBlockTokens);
    for (int64_t pos = top; pos > s.swa_start && pos >= top - kBlockTokens; pos -= kBlockTokens) {
        if (!swa_has_state(s, pos)) continue;
        SwaHitPlan p;
        p.input_tokens = input_tokens;
        p.block_hit_tokens = pos;
        p.hit_tokens = pos;
        p.kind = SwaHitKind::kExact;
        p.swa_state_position = pos;
        p.compute_begin = pos;
        s.swa_plan = p;
        s.swa_start = pos;
        return;
    }
}

void TieredCache::trim_staged(Seq& s, int64_t keep_blocks) {
    const auto keep = static_cast<size_t>(keep_blocks);
    if (s.staged.size() <= keep) return;
    if (keep == 0) {
        release_staged(s);
        return;
    }
    pool_->release_all(std::span<const BlockId>(s.staged).subspan(keep));
    s.staged.resize(keep);
    const auto first = static_cast<size_t>(s.staged_first);
    s.staged_data.resize(keep > first ? std::min(s.staged_data.size(), keep - first) : 0);
    s.staged_first = std::min<int64_t>(s.staged_first, keep_blocks);
}

bool TieredCache::swa_has_state(const Seq& s, int64_t position) const {
    return position > 0 && position / kBlockTokens <= static_cast<int64_t>(s.keys.size()) &&
           swa_->contains(swa_state_key(s.keys, position));
}

// S-KV-10 with exact replay: kExact starts at L1, kCatchUp at L1 - 128 (the plan's
// compute_begin); kReplay would rebuild the window approximately, which this model
// does not do: start at the newest stored state below L1 - 128, else at 0.
int64_t TieredCache::swa_fallback_start(const Seq& s, const SwaHitPlan& plan) const {
    if (plan.kind != SwaHitKind::kReplay) return plan.compute_begin;
    // S-SWA: the blocks of [0, L1) are used; the first step replays [L1 - 128, L1).
    if (options_.swa_bounded_replay) return plan.block_hit_tokens;
    for (int64_t pos = plan.hit_tokens - kBlockTokens; pos > 0; pos -= kBlockTokens) {
        if (swa_has_state(s, pos)) return pos;
    }
    return 0;
}

// The state the hit starts from, pinned for the first step; false (a miss) when it is
// gone or fails its seal (then it leaves the pool).
bool TieredCache::swa_take_restore(Seq& s, int64_t hit_tokens) {
    const SwaStateKey key = swa_state_key(s.keys, hit_tokens);
    Result<std::shared_ptr<const SwaState>> st = swa_->get(key);
    const size_t slot_bytes = static_cast<size_t>(options_.state_floats) * sizeof(float);
    const auto& ranges = options_.swa_stored_ranges;
    if (st.is_ok() && swa_sealed_ok(**st, swa_stored_bytes(slot_bytes, ranges))) {
        if (ranges.empty()) {
            s.swa_restore = std::move(st).value();
        } else {
            // The stored region into a zeroed slot image; the dropped region is rebuilt.
            auto full = std::make_shared<SwaState>();
            full->key = (*st)->key;
            full->traffic_class = (*st)->traffic_class;
            full->bytes.assign(slot_bytes, 0);
            size_t at = 0;
            for (const auto& [b, e] : ranges) {
                const auto n = static_cast<size_t>(e - b) * 4;
                std::memcpy(full->bytes.data() + b * 4, (*st)->bytes.data() + at, n);
                at += n;
            }
            s.swa_restore = std::move(full);
        }
        ++stats_.swa_states_restored;
        return true;
    }
    if (st.is_ok()) (void)swa_->erase(key);
    ++stats_.swa_states_rejected;
    return false;
}

int64_t TieredCache::admit(SeqId id, int64_t num_cached_tokens) {
    Seq& s = at(id);
    DSI_CHECK(!s.admitted);
    s.admitted = true;
    if (slots_ != nullptr) {
        Result<SlotId> slot = slots_->allocate();
        DSI_CHECK(slot.is_ok(), "admission without a free state slot: ", slot.status().to_string());
        s.state_slot = *slot;
    }
    if (!s.swap_slots.empty()) {
        // Blocks for the swapped rows are allocated by restore(), after every pin.
        s.num_store_blocks = s.swapped_rows / kBlockTokens;  // written before
        return s.swapped_rows;
    }
    int64_t hit = num_cached_tokens / kBlockTokens;
    if (swa_ != nullptr) {
        s.swa_restore.reset();
        // S-SWA: a kReplay hit served by bounded replay has no state to restore.
        const bool replay = options_.swa_bounded_replay &&
                            s.swa_plan.kind == SwaHitKind::kReplay && hit > 0 &&
                            hit * kBlockTokens == s.swa_start;
        s.swa_replay_begin = replay ? s.swa_plan.rerun_begin : 0;
        if (hit > 0 && !replay && !swa_take_restore(s, hit * kBlockTokens)) {  // a miss
            hit = 0;
            release_staged(s);
        }
        if (hit * kBlockTokens == s.swa_start) {
            stats_.swa.record(s.swa_plan, s.traffic);
            if (!replay) stats_.swa_fallback_tokens += s.swa_plan.compute_begin - s.swa_start;
        } else {  // the state was refused: nothing of the plan is used
            SwaHitPlan none;
            none.input_tokens = s.swa_plan.input_tokens;
            stats_.swa.record(none, s.traffic);
        }
        s.swa_tracker = SwaStoreTracker();
        s.swa_prompt = s.swa_plan.input_tokens;
        DSI_CHECK(s.swa_tracker.begin_prefill(hit * kBlockTokens, s.swa_prompt).is_ok());
        const Result<int64_t> p = prefill_store_position(s.swa_prompt);
        s.swa_prefill_pos = p.is_ok() && *p > hit * kBlockTokens ? *p : 0;
        s.swa_held_pos = 0;
        s.swa_held.clear();
    }
    if (!s.staged.empty()) {
        // S-KV-6: the fetched blocks go to the worker with this step's item
        // (take_swap_in); they are published after the step that copied them.
        s.blocks = std::move(s.staged);
        s.staged.clear();
        s.num_published = s.staged_first;
        s.num_store_blocks = static_cast<int64_t>(s.blocks.size());
        const int64_t fetched = static_cast<int64_t>(s.staged_data.size());
        stats_.store_hit_blocks += fetched;
        stats_.store_hit_tokens += fetched * kBlockTokens;
    } else {
        s.blocks =
            pool_->match_and_pin(std::span<const BlockKey>(s.keys).first(static_cast<size_t>(hit)));
        s.num_published = hit;
        s.num_store_blocks = hit;
    }
    DSI_CHECK_EQ(static_cast<int64_t>(s.blocks.size()), hit);
    int64_t rows = hit * kBlockTokens;
    if (auto it = landings_.find(std::exchange(s.landing, 0)); it != landings_.end()) {
        // The hand-over's continuation: its full blocks are pinned above; the tail block
        // (rows [hit x 128, num_tokens)) becomes the sequence's, and the landing lets go.
        Landing& l = it->second;
        if (l.tail_tokens() > 0 && num_cached_tokens == l.num_tokens && hit == l.num_full()) {
            s.blocks.push_back(l.blocks.back());
            l.blocks.pop_back();
            rows = l.num_tokens;
            stats_.landing_tail_tokens += l.tail_tokens();
        }
        release_landing(it);
        ++stats_.landings_attached;
    }
    return rows;
}

bool TieredCache::swapped_out(SeqId id) const { return !at(id).swap_slots.empty(); }

Result<std::vector<HostCopy>> TieredCache::restore(SeqId id) {
    Seq& s = at(id);
    DSI_CHECK(s.admitted && !s.swap_slots.empty() && s.blocks.empty());
    Result<std::vector<BlockId>> rb = pool_->allocate(static_cast<int64_t>(s.swap_slots.size()));
    if (!rb.is_ok()) {
        return internal_error("scheduler over-committed blocks for a swap-in: " +
                              rb.status().to_string());
    }
    std::vector<HostCopy> copies;
    for (size_t i = 0; i < rb->size(); ++i) copies.push_back({(*rb)[i], swap_.slot(s.swap_slots[i])});
    s.blocks = std::move(rb).value();
    stats_.swapped_in_blocks += static_cast<int64_t>(s.swap_slots.size());
    swap_.release(s.swap_slots);  // reusable from the next plan on
    s.swap_slots.clear();
    s.swapped_rows = 0;
    return copies;
}

Status TieredCache::grow(SeqId id, int64_t n) {
    if (n <= 0) return Status::ok();
    Seq& s = at(id);
    Result<std::vector<BlockId>> nb = pool_->allocate(n);
    if (!nb.is_ok()) {
        return internal_error("scheduler over-committed blocks: " + nb.status().to_string());
    }
    s.blocks.insert(s.blocks.end(), nb->begin(), nb->end());
    return Status::ok();
}

void TieredCache::truncate(SeqId id, int64_t num_rows) {
    Seq& s = at(id);
    const auto keep = static_cast<size_t>(blocks_for_tokens(num_rows));
    DSI_CHECK_LE(s.num_published, static_cast<int64_t>(keep));
    if (s.blocks.size() <= keep) return;
    pool_->release_all(std::span<const BlockId>(s.blocks).subspan(keep));
    s.blocks.resize(keep);
}

int64_t TieredCache::num_blocks(SeqId id) const {
    return static_cast<int64_t>(at(id).blocks.size());
}

int64_t TieredCache::num_exclusive_blocks(SeqId id) const {
    int64_t n = 0;
    for (BlockId b : at(id).blocks) n += pool_->ref_count(b) == 1;
    return n;
}

PagedKvCache TieredCache::table(SeqId id) {
    const Seq& s = at(id);
    float* state = s.state_slot >= 0 ? slots_->data(s.state_slot) : nullptr;
    return PagedKvCache(pool_.get(), 0, s.blocks, state);
}

void TieredCache::release_state(Seq& s) {
    if (s.state_slot < 0) return;
    slots_->release(s.state_slot);
    s.state_slot = -1;
}

SwapInBatch TieredCache::take_swap_in(SeqId id) {
    Seq& s = at(id);
    SwapInBatch batch;
    if (s.staged_data.empty()) return batch;
    batch.begin_pos = s.staged_first * kBlockTokens;
    for (size_t j = 0; j < s.staged_data.size(); ++j) {
        batch.blocks.push_back(
            {s.blocks[static_cast<size_t>(s.staged_first) + j], std::move(s.staged_data[j])});
    }
    s.staged_data.clear();
    return batch;
}

void TieredCache::publish(SeqId id, std::span<const int32_t> tokens, int64_t num_full_blocks) {
    if (!options_.prefix_cache) return;
    Seq& s = at(id);
    if (num_full_blocks <= s.num_published) return;
    ensure_keys(s, tokens, num_full_blocks);
    for (int64_t b = s.num_published; b < num_full_blocks; ++b) {
        // S-KV-7: new blocks (prefill and decode) are written behind; blocks that came
        // from a tier are not written back.
        if (pool_->publish(s.blocks[b], s.keys[b]) && b >= s.num_store_blocks) {
            offer_block(s, tokens, b);
        }
    }
    s.num_published = num_full_blocks;
}

bool TieredCache::preempt(SeqId id, int64_t rows) {
    Seq& s = at(id);
    swa_store_held(s);  // the sequence may resume from it
    bool swapped = false;
    // State (window ring, partial windows) is not in the blocks: recompute.
    if (rows > 0 && slots_ == nullptr) {
        const int64_t n = blocks_for_tokens(rows);
        if (std::optional<std::vector<int32_t>> slots = swap_.allocate(n)) {
            for (int64_t i = 0; i < n; ++i) {
                pending_saves_.push_back(
                    {s.blocks[static_cast<size_t>(i)], swap_.slot((*slots)[static_cast<size_t>(i)])});
            }
            s.swap_slots = std::move(*slots);
            s.swapped_rows = rows;
            ++stats_.preemptions_swapped;
            stats_.swapped_out_blocks += n;
            swapped = true;
        }
    }
    pool_->release_all(s.blocks);
    s.blocks.clear();
    release_state(s);
    s.admitted = false;
    s.num_published = 0;
    s.store_checked = false;
    s.num_store_blocks = 0;
    return swapped;
}

SwaStepPlan TieredCache::plan_swa_step(SeqId id, int64_t begin, int64_t end) {
    SwaStepPlan p;
    p.end = end;
    if (swa_ == nullptr) return p;
    Seq& s = at(id);
    p.restore = std::move(s.swa_restore);
    s.swa_restore.reset();
    p.replay_begin = s.swa_replay_begin;
    s.swa_replay_begin = 0;
    // S-KV-9: the prefill's state at P is copied right after a step that ends at P.
    const int64_t pp = s.swa_prefill_pos;
    if (pp > 0 && begin < pp && pp <= end) {
        p.end = pp;
        p.capture_position = pp;
    } else if (end > s.swa_prompt && end % kBlockTokens == 0 && begin < end) {
        // S-KV-9: a copy each time decode crosses a boundary; taken right at it.
        p.capture_position = end;
    }
    return p;
}

void TieredCache::on_swa_step(SeqId id, std::span<const int32_t> tokens, int64_t begin,
                              int64_t end, std::vector<uint8_t> captured) {
    if (swa_ == nullptr) return;
    Seq& s = at(id);
    SwaStoreTracker& t = s.swa_tracker;
    const bool prefill = begin < s.swa_prompt;
    int64_t landed = 0;
    if (prefill) {
        Result<std::optional<SwaCopyRegion>> r = t.on_prefill_chunk(begin, end);
        DSI_CHECK(r.is_ok(), r.status().to_string());
        if (r->has_value()) landed = (*r)->store_position;
    } else {
        Result<int64_t> b = t.on_tokens(end);
        DSI_CHECK(b.is_ok(), b.status().to_string());
        if (*b > 0 && *b == end && !captured.empty()) {
            DSI_CHECK(t.on_copy_landed(*b, end).is_ok());  // taken at the boundary: lateness 0
            landed = *b;
        }
    }
    if (landed > 0 && !captured.empty()) {
        DSI_CHECK_EQ(captured.size(), static_cast<size_t>(options_.state_floats) * sizeof(float));
        ++stats_.swa_captures;
        ensure_keys(s, tokens, landed / kBlockTokens);
        captured = swa_pack(std::move(captured), options_.swa_stored_ranges);
        swa_seal(captured, landed);
        s.swa_held_pos = landed;
        s.swa_held_key = swa_state_key(s.keys, landed);
        s.swa_held = std::move(captured);
    }
    // S-KV-9: the prefill copy is stored once the prefill's last chunk has run.
    if (prefill && end == s.swa_prompt && t.latest_complete() == s.swa_held_pos) swa_store_held(s);
}

void TieredCache::swa_store_held(Seq& s) {
    if (swa_ == nullptr || s.swa_held.empty()) return;
    // Only a complete copy (a prefill one becomes complete at the prefill's end).
    if (s.swa_tracker.latest_complete() == s.swa_held_pos) {
        if (swa_->put(s.swa_held_key, s.traffic, std::move(s.swa_held)).is_ok()) {
            ++stats_.swa_states_stored;
        }
    }
    s.swa_held.clear();
    s.swa_held_pos = 0;
}

std::vector<HostCopy> TieredCache::take_saves() {
    std::vector<HostCopy> saves = std::move(pending_saves_);
    pending_saves_.clear();
    return saves;
}

void TieredCache::end_plan() { swap_.end_plan(); }

void TieredCache::wait_for_fetch(int64_t max_wait_ms) {
    for (auto& [id, s] : seqs_) {
        if (s.fetch == nullptr) continue;
        (void)s.fetch->wait(std::min(s.fetch_deadline_ns, kvstore::deadline_after_ms(max_wait_ms)));
        return;
    }
}

TieredCacheStats TieredCache::stats() const {
    TieredCacheStats s = stats_;
    s.pool = pool_->stats();
    for (const auto& [handle, l] : landings_) {
        s.landing_blocks_held += static_cast<int64_t>(l.blocks.size());
    }
    if (swa_ != nullptr) s.swa.set_pool(swa_->stats());
    s.swap_slots_held = swap_.num_held();
    if (slots_ != nullptr) s.state_slots_in_use = slots_->num_slots() - slots_->num_free();
    if (write_behind_ != nullptr) {
        s.store_blocks_written = write_behind_->num_written();
        s.store_blocks_dropped = write_behind_->num_dropped();
    }
    if (store_ != nullptr) s.store_puts_dropped = store_->metrics().puts_dropped;
    if (fetcher_ != nullptr) {
        const kvstore::FetchBufferStats fb = fetcher_->buffer_stats();
        s.fetch_buffers_allocated = fb.allocated;
        s.fetch_buffers_in_use = fb.in_use;
        s.fetch_buffer_leases = fb.leases;
    }
    return s;
}

Status TieredCache::check_invariants() const {
    std::vector<int32_t> refs(static_cast<size_t>(pool_->num_blocks()), 0);
    std::vector<int32_t> held_slots;
    std::vector<SlotId> state_held;
    for (const auto& [id, s] : seqs_) {
        if ((s.state_slot >= 0) != (s.admitted && slots_ != nullptr)) {
            return internal_error("sequence " + std::to_string(id) +
                                  (s.admitted ? " is admitted without" : " is waiting with") +
                                  " a state slot");
        }
        if (s.state_slot >= 0) state_held.push_back(s.state_slot);
        held_slots.insert(held_slots.end(), s.swap_slots.begin(), s.swap_slots.end());
        if (!s.swap_slots.empty() &&
            (s.admitted || s.swapped_rows <= 0 ||
             blocks_for_tokens(s.swapped_rows) != static_cast<int64_t>(s.swap_slots.size()))) {
            return internal_error("sequence " + std::to_string(id) + " has inconsistent swap state");
        }
        for (BlockId b : s.blocks) ++refs[static_cast<size_t>(b)];
        for (BlockId b : s.staged) ++refs[static_cast<size_t>(b)];
        if (!s.admitted && !s.blocks.empty()) {
            return internal_error("waiting sequence " + std::to_string(id) + " holds blocks");
        }
    }
    for (const auto& [handle, l] : landings_) {
        if (static_cast<int64_t>(l.blocks.size()) != blocks_for_tokens(l.num_tokens)) {
            return internal_error("hand-over landing " + std::to_string(handle) +
                                  " holds the wrong block count");
        }
        for (BlockId b : l.blocks) ++refs[static_cast<size_t>(b)];
    }
    DSI_RETURN_IF_ERROR(swap_.check_invariants(held_slots));
    if (slots_ != nullptr) {
        DSI_RETURN_IF_ERROR(slots_->check_invariants());
        std::sort(state_held.begin(), state_held.end());
        const bool shared =
            std::adjacent_find(state_held.begin(), state_held.end()) != state_held.end() ||
            std::any_of(state_held.begin(), state_held.end(),
                        [&](SlotId id) { return !slots_->is_taken(id); });
        if (shared || slots_->num_slots() - slots_->num_free() !=
                          static_cast<int64_t>(state_held.size())) {
            return internal_error("state slots taken (" +
                                  std::to_string(slots_->num_slots() - slots_->num_free()) +
                                  ") are not the distinct slots the sequences hold (" +
                                  std::to_string(state_held.size()) + ")");
        }
    }
    return pool_->check_invariants(refs);
}

}  // namespace dsi::kv

#include "serving/kv_handoff.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "base/logging.h"
#include "kv/tiered_cache.h"
#include "serving/internal/wire.h"

namespace dsi::serving {
namespace {

using transfer::BeginMessage;
using transfer::Timeout;

// Refusals of connections over the queue bound: at most this many pending (more are
// closed without a word); each waits this long for the sender's first frame and lingers
// this long after the Failure.
constexpr size_t kMaxPendingRefusals = 16;
constexpr transfer::Timeout kRefusalWait{1'000};
constexpr transfer::Timeout kRefusalLinger{500};
constexpr uint32_t kKvBlocksVersion = 1;
constexpr uint32_t kKvBlocksTailVersion = 2;  // + the tail's entry
constexpr size_t kKvBlocksHeaderBytes = 16;
constexpr size_t kKvBlocksEntryBytes = 24;
using internal::get_u32;
using internal::get_u64;
using internal::kSwaStateHeaderBytes;
using internal::kSwaStateVersion;
using internal::put_u32;
using internal::put_u64;
using internal::split_address;
using internal::valid_traffic_class;

std::vector<uint8_t> encode_block_list(const kv::KvExport& kv) {
    std::vector<uint8_t> out;
    out.reserve(kKvBlocksHeaderBytes + kKvBlocksEntryBytes * (kv.num_blocks() + 1));
    put_u32(out, kv.tail_tokens > 0 ? kKvBlocksTailVersion : kKvBlocksVersion);
    put_u32(out, kv.dtype);
    put_u32(out, static_cast<uint32_t>(kv.traffic_class));
    put_u32(out, static_cast<uint32_t>(kv.num_blocks()));
    for (size_t b = 0; b < kv.num_blocks(); ++b) {
        put_u64(out, kv.keys[b].lo);
        put_u64(out, kv.keys[b].hi);
        put_u64(out, kv.token_hashes[b]);
    }
    if (kv.tail_tokens > 0) {
        put_u64(out, kv.tail_key.lo);
        put_u64(out, kv.tail_key.hi);
        put_u64(out, kv.tail_token_hash);
    }
    return out;
}

// The export's layers, in pieces that never cross a block's slice: the inbox places
// each chunk straight into that block of its pool (PoolDestination::layer_memory).
class BlockPieceSource final : public transfer::SequenceSource {
public:
    BlockPieceSource(const kv::KvExport& kv, std::vector<std::span<const uint8_t>> states)
        : kv_(kv), states_(std::move(states)) {}
    std::span<const uint8_t> layer_piece(uint32_t layer, uint64_t offset,
                                         uint64_t max_bytes) override {
        const uint64_t b = kv_.layer_block_bytes[layer];
        const uint64_t n = std::min(max_bytes, b - offset % b);
        return std::span<const uint8_t>(kv_.layers[layer])
            .subspan(offset, std::min<uint64_t>(n, kv_.layers[layer].size() - offset));
    }
    std::span<const uint8_t> state_piece(size_t section, uint64_t offset,
                                         uint64_t max_bytes) override {
        const std::span<const uint8_t> s = states_[section];
        return s.subspan(offset, std::min<uint64_t>(max_bytes, s.size() - offset));
    }

private:
    const kv::KvExport& kv_;
    std::vector<std::span<const uint8_t>> states_;
};

// The swa_state section: its header, then the stored state's bytes.
std::vector<uint8_t> encode_state_section(const kv::SwaState& st) {
    std::vector<uint8_t> out = internal::encode_state_header(st);
    out.insert(out.end(), st.bytes.begin(), st.bytes.end());
    return out;
}

}  // namespace

Result<std::pair<std::string, uint16_t>> internal::split_address(const std::string& address) {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
        return invalid_argument("transfer address '" + address + "' is not host:port");
    }
    const std::string port = address.substr(colon + 1);
    int64_t p = 0;
    for (char c : port) {
        if (c < '0' || c > '9' || (p = p * 10 + (c - '0')) > 65535) {
            return invalid_argument("transfer address '" + address + "': bad port");
        }
    }
    if (p == 0) return invalid_argument("transfer address '" + address + "': bad port");
    return std::pair<std::string, uint16_t>(address.substr(0, colon), static_cast<uint16_t>(p));
}

namespace {

// Where one transfer is received: its state sections in host memory, its layers in
// staging memory (StagingDestination) or in the decode engine's pool (PoolDestination).
class InboxDestination : public transfer::Destination {
public:
    explicit InboxDestination(const BeginMessage& begin) {
        sections_.reserve(begin.state_sections.size());
        for (const auto& s : begin.state_sections) sections_.emplace_back(s.bytes);
    }
    void write_state(size_t section, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy(sections_[section].data() + offset, bytes.data(), bytes.size());
    }
    const std::vector<uint8_t>& section(size_t s) const { return sections_[s]; }
    virtual bool in_pool() const = 0;

private:
    std::vector<std::vector<uint8_t>> sections_;
};

// The staging copy of one transfer: each layer contiguous, so the transport reads the
// data straight into place (Destination::layer_memory).
class StagingDestination final : public InboxDestination {
public:
    explicit StagingDestination(const BeginMessage& begin) : InboxDestination(begin) {
        layers_.reserve(begin.layer_bytes.size());
        for (uint64_t n : begin.layer_bytes) layers_.emplace_back(n);
    }
    void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy(layers_[layer].data() + offset, bytes.data(), bytes.size());
    }
    std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) override {
        return std::span<uint8_t>(layers_[layer]).subspan(offset, n);
    }
    const std::vector<uint8_t>& layer(size_t l) const { return layers_[l]; }
    bool in_pool() const override { return false; }

private:
    std::vector<std::vector<uint8_t>> layers_;
};

// Blocks of the decode engine's pool reserved for one transfer (engine::KvLanding):
// byte o of layer l is byte o % B of block o / B's slice of that layer (B: one layer of
// one block), the tail's rows the first of the last block's. Dropped unless landed.
class PoolDestination final : public InboxDestination {
public:
    PoolDestination(const BeginMessage& begin, engine::KvLanding* landing,
                    engine::KvLanding::Grant grant, const std::vector<uint64_t>& block_bytes)
        : InboxDestination(begin), landing_(landing), grant_(std::move(grant)),
          block_bytes_(block_bytes) {}
    ~PoolDestination() override {
        if (!landed_) landing_->drop(grant_.handle);
    }
    void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) override {
        while (!bytes.empty()) {
            const uint64_t b = block_bytes_[layer];
            const uint64_t n = std::min<uint64_t>(bytes.size(), b - offset % b);
            std::memcpy(grant_.layers[layer][offset / b] + offset % b, bytes.data(), n);
            bytes = bytes.subspan(n);
            offset += n;
        }
    }
    std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) override {
        const uint64_t b = block_bytes_[layer];
        if (offset % b + n > b) return {};  // across two blocks: write_layer
        return {grant_.layers[layer][offset / b] + offset % b, n};
    }
    bool in_pool() const override { return true; }
    // Publishes and holds the blocks for the continuation (the receiver writes no more).
    Status land(std::vector<kv::BlockKey> keys, const kv::BlockKey& tail,
                std::chrono::milliseconds wait) {
        landed_ = true;
        return landing_->land(grant_.handle, std::move(keys), tail, wait);
    }

private:
    engine::KvLanding* const landing_;
    engine::KvLanding::Grant grant_;
    const std::vector<uint64_t>& block_bytes_;
    bool landed_ = false;
};

}  // namespace

Result<transfer::SendReport> send_kv_export(transfer::Transport& transport, const kv::KvExport& kv,
                                            const HandoffTarget& target,
                                            const HandoffSendOptions& options) {
    if (kv.num_blocks() == 0 || kv.num_layers() == 0) {
        return invalid_argument("nothing to hand over: the export has no block");
    }
    DSI_ASSIGN_OR_RETURN(auto hp, split_address(target.address));
    BeginMessage begin;
    begin.model_id = kv.model_id;
    begin.num_tokens = kv.num_tokens();
    begin.block_size_tokens = kv.block_tokens;
    for (size_t l = 0; l < kv.layer_block_bytes.size(); ++l) {
        begin.layer_bytes.push_back(kv.num_blocks() * kv.layer_block_bytes[l] + kv.tail_bytes(l));
    }
    const std::vector<uint8_t> list = encode_block_list(kv);
    begin.state_sections.push_back({std::string(kKvBlocksSection), list.size()});
    std::vector<std::span<const uint8_t>> sections = {std::span<const uint8_t>(list)};
    std::vector<uint8_t> state;
    if (kv.swa_state) {
        state = encode_state_section(*kv.swa_state);
        begin.state_sections.push_back({std::string(kSwaStateSection), state.size()});
        sections.emplace_back(state);
    }
    BlockPieceSource source(kv, std::move(sections));
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<transfer::Connection> conn,
                         transport.connect(hp.first, hp.second, options.io_timeout));
    transfer::SendOptions so;
    so.transfer_id = target.id;
    so.self = options.self;
    so.io_timeout = options.io_timeout;
    so.should_abort = options.should_abort;
    return transfer::send_sequence(*conn, so, begin, source);
}

Result<std::unique_ptr<KvInbox>> KvInbox::start(KvInboxOptions options, kvstore::BlockStore* store,
                                                std::unique_ptr<transfer::Transport> transport) {
    if (store == nullptr || options.layer_block_bytes.empty() ||
        std::find(options.layer_block_bytes.begin(), options.layer_block_bytes.end(), 0) !=
            options.layer_block_bytes.end() ||
        options.block_tokens == 0 || options.model_id.empty() || options.num_threads < 1) {
        return invalid_argument("kv inbox: no store, or options that describe no block");
    }
    if (options.swa_state_bytes > 0 &&
        (options.swa_pool == nullptr || options.swa_state_bytes <= kv::kSwaSealBytes)) {
        return invalid_argument("kv inbox: an SWA state needs a pool and more than its seal");
    }
    if (transport == nullptr) transport = transfer::make_tcp_transport();
    std::unique_ptr<KvInbox> inbox(new KvInbox(std::move(options), store, std::move(transport)));
    DSI_ASSIGN_OR_RETURN(inbox->listener_,
                         inbox->transport_->listen(inbox->options_.host, inbox->options_.port));
    inbox->port_ = inbox->listener_->port();
    inbox->threads_.emplace_back([p = inbox.get()] { p->accept_loop(); });
    inbox->threads_.emplace_back([p = inbox.get()] { p->refuse_loop(); });
    for (int i = 0; i < inbox->options_.num_threads; ++i) {
        inbox->threads_.emplace_back([p = inbox.get()] { p->receive_loop(); });
    }
    return inbox;
}

KvInbox::KvInbox(KvInboxOptions options, kvstore::BlockStore* store,
                 std::unique_ptr<transfer::Transport> transport)
    : options_(std::move(options)), store_(store), transport_(std::move(transport)) {}

KvInbox::~KvInbox() {
    stopping_ = true;
    {
        MutexLock l(&mu_);
        cv_.notify_all();
    }
    for (std::thread& t : threads_) t.join();
    if (listener_) listener_->close();
}

KvInboxStats KvInbox::stats() const {
    MutexLock l(&mu_);
    return stats_;
}

void KvInbox::accept_loop() {
    while (!stopping_) {
        auto conn = listener_->accept(Timeout(200));
        if (!conn.is_ok()) {
            if (conn.status().code() != StatusCode::kDeadlineExceeded && !stopping_) {
                DSI_LOG(kWarning) << "kv inbox accept: " << conn.status().to_string();
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
            continue;
        }
        MutexLock l(&mu_);
        if (static_cast<int>(queue_.size()) >= options_.max_queued) {
            ++stats_.num_rejected;
            if (refusals_.size() >= kMaxPendingRefusals) {
                (*conn)->close();
            } else {
                refusals_.push_back(std::move(conn).value());
                cv_.notify_all();
            }
            continue;
        }
        queue_.push_back(std::move(conn).value());
        cv_.notify_all();  // (the refusing thread waits on cv_ too)
    }
}

// Tells the senders of connections over the queue bound that the inbox is busy (their
// send fails RESOURCE_EXHAUSTED at once, not with a reset connection), one at a time.
void KvInbox::refuse_loop() {
    for (;;) {
        std::unique_ptr<transfer::Connection> conn;
        int64_t waiting = 0;
        {
            MutexLock l(&mu_);
            while (refusals_.empty() && !stopping_) {
                cv_.wait_for(&mu_, std::chrono::milliseconds(200));
            }
            if (stopping_) {
                for (auto& c : refusals_) c->close();
                refusals_.clear();
                return;
            }
            conn = std::move(refusals_.front());
            refusals_.pop_front();
            waiting = static_cast<int64_t>(queue_.size());
        }
        const Status busy =
            resource_exhausted("kv inbox busy: " + std::to_string(options_.num_threads) +
                               " transfers in progress, " + std::to_string(waiting) + " waiting");
        transfer::refuse_transfer(*conn, options_.self, busy, kRefusalWait, kRefusalLinger);
    }
}

void KvInbox::receive_loop() {
    for (;;) {
        std::unique_ptr<transfer::Connection> conn;
        {
            MutexLock l(&mu_);
            while (queue_.empty() && !stopping_) cv_.wait_for(&mu_, std::chrono::milliseconds(200));
            if (stopping_) {
                for (auto& c : queue_) c->close();
                queue_.clear();
                return;
            }
            conn = std::move(queue_.front());
            queue_.pop_front();
        }
        receive_one(*conn);
    }
}

Result<std::unique_ptr<transfer::Destination>> KvInbox::make_destination(
    const BeginMessage& begin) {
    const auto fail = [&](const std::string& why) {
        return failed_precondition("kv hand-over refused: " + why);
    };
    if (begin.block_size_tokens != options_.block_tokens) {
        return fail("block size " + std::to_string(begin.block_size_tokens) + " tokens, not " +
                    std::to_string(options_.block_tokens));
    }
    const uint64_t n = begin.num_tokens / options_.block_tokens;
    const uint64_t tail = begin.num_tokens % options_.block_tokens;
    // A tail (rows past the last full block) needs one entry per token (V2/V3).
    const bool tails = options_.swa_state_bytes == 0 &&
                       std::all_of(options_.layer_block_bytes.begin(),
                                   options_.layer_block_bytes.end(),
                                   [&](uint64_t b) { return b % options_.block_tokens == 0; });
    if (n == 0 || (tail > 0 && !tails)) {
        return fail(std::to_string(begin.num_tokens) + " tokens are not whole blocks");
    }
    const auto num_layers = static_cast<uint32_t>(options_.layer_block_bytes.size());
    if (begin.num_layers() != num_layers) {
        return fail(std::to_string(begin.num_layers()) + " layers, not " +
                    std::to_string(num_layers));
    }
    for (uint32_t l = 0; l < num_layers; ++l) {
        const uint64_t b = options_.layer_block_bytes[l];
        if (begin.layer_bytes[l] != n * b + tail * (b / options_.block_tokens)) {
            return fail("layer " + std::to_string(l) + " of " +
                        std::to_string(begin.layer_bytes[l]) + " bytes, not " + std::to_string(n) +
                        " blocks of " + std::to_string(b) + " and " + std::to_string(tail) +
                        " tail rows");
        }
    }
    const auto& sections = begin.state_sections;
    const uint64_t entries = n + (tail > 0 ? 1 : 0);
    if (sections.empty() || sections[0].name != kKvBlocksSection ||
        sections[0].bytes != kKvBlocksHeaderBytes + kKvBlocksEntryBytes * entries) {
        return fail("the block list is missing or of the wrong size");
    }
    // V4: the state at the blocks' end, of the model's size (checked here, before the
    // staging memory is taken); V2/V3: nothing else.
    const size_t want_sections = options_.swa_state_bytes > 0 ? 2 : 1;
    if (sections.size() > want_sections) {
        return fail("unexpected state section '" + sections[want_sections].name + "'" +
                    (want_sections == 1 ? " (this model keeps no SWA state)" : ""));
    }
    if (want_sections == 2) {
        if (sections.size() < 2 || sections[1].name != kSwaStateSection) {
            return fail("the SWA state section is missing");
        }
        const uint64_t want = kSwaStateHeaderBytes + options_.swa_state_bytes;
        if (sections[1].bytes != want) {
            return fail("an SWA state section of " + std::to_string(sections[1].bytes) +
                        " bytes, not " + std::to_string(want));
        }
    }
    if (options_.landing != nullptr) {
        // Straight into the decode engine's pool; no room (or no engine): staging.
        Result<engine::KvLanding::Grant> g =
            options_.landing->reserve(static_cast<int64_t>(begin.num_tokens), options_.landing_wait);
        if (g.is_ok()) {
            return std::unique_ptr<transfer::Destination>(new PoolDestination(
                begin, options_.landing, std::move(g).value(), options_.layer_block_bytes));
        }
        DSI_LOG(kDebug) << "kv hand-over into the store tier: " << g.status().to_string();
        MutexLock l(&mu_);
        ++stats_.num_landing_fallbacks;
    }
    return std::unique_ptr<transfer::Destination>(new StagingDestination(begin));
}

Status KvInbox::commit(const BeginMessage& begin, transfer::Destination& d) {
    auto& inbox_dest = static_cast<InboxDestination&>(d);
    const std::vector<uint8_t>& list = inbox_dest.section(0);
    const uint64_t n = begin.num_tokens / options_.block_tokens;
    const uint64_t tail = begin.num_tokens % options_.block_tokens;
    if (get_u32(list.data()) != (tail > 0 ? kKvBlocksTailVersion : kKvBlocksVersion)) {
        return invalid_argument("kv hand-over: block list version " +
                                std::to_string(get_u32(list.data())) + " with " +
                                std::to_string(tail) + " tail tokens");
    }
    if (get_u32(list.data() + 4) != options_.dtype) {
        return failed_precondition("kv hand-over refused: KV dtype " +
                                   std::to_string(get_u32(list.data() + 4)) + ", not " +
                                   std::to_string(options_.dtype));
    }
    const uint32_t traffic = get_u32(list.data() + 8);
    if (!valid_traffic_class(traffic)) {
        return invalid_argument("kv hand-over: traffic class " + std::to_string(traffic));
    }
    if (get_u32(list.data() + 12) != n) {
        return invalid_argument("kv hand-over: the block list counts " +
                                std::to_string(get_u32(list.data() + 12)) + " blocks, Begin " +
                                std::to_string(n));
    }
    // The state is checked before anything is stored: a bad one stores nothing.
    std::optional<kv::SwaState> state;
    if (options_.swa_state_bytes > 0) {
        DSI_ASSIGN_OR_RETURN(state, parse_state(inbox_dest.section(1), list, n));
        const int64_t capacity = options_.swa_pool->stats().capacity_bytes;
        if (static_cast<int64_t>(state->bytes.size()) > capacity) {
            return resource_exhausted(
                "kv hand-over: the SWA state of " + std::to_string(state->bytes.size()) +
                " bytes is larger than the pool of " + std::to_string(capacity));
        }
    }
    uint64_t block_bytes = 0;
    for (uint64_t b : options_.layer_block_bytes) block_bytes += b;
    std::vector<kv::BlockKey> keys;  // the blocks' chain keys
    for (uint64_t b = 0; b < n; ++b) {
        const uint8_t* e = list.data() + kKvBlocksHeaderBytes + b * kKvBlocksEntryBytes;
        keys.push_back({get_u64(e), get_u64(e + 8)});
    }
    if (inbox_dest.in_pool()) {
        // Published under the chain keys and held for the continuation before the Ack.
        const uint8_t* t = list.data() + kKvBlocksHeaderBytes + n * kKvBlocksEntryBytes;
        const kv::BlockKey tail_key = tail > 0 ? kv::BlockKey{get_u64(t), get_u64(t + 8)}
                                               : kv::BlockKey{};
        DSI_RETURN_IF_ERROR(static_cast<PoolDestination&>(d)
                                .land(keys, tail_key, options_.landing_wait)
                                .with_context("kv hand-over: landing in the pool"));
        {
            MutexLock l(&mu_);
            ++stats_.num_landed;
            stats_.blocks_landed += static_cast<int64_t>(n);
            stats_.tail_tokens_landed += static_cast<int64_t>(tail);
            uint64_t tail_bytes = 0;
            for (uint64_t b : options_.layer_block_bytes) {
                tail_bytes += tail * b / options_.block_tokens;
            }
            stats_.bytes_received += static_cast<int64_t>(n * block_bytes + tail_bytes);
        }
        if (options_.on_stored) options_.on_stored(std::move(keys));
        return Status();
    }
    const auto& dest = static_cast<const StagingDestination&>(d);
    const kvstore::StoreKey model = kvstore::model_identity(options_.model_id);
    const int64_t deadline =
        kvstore::deadline_after_ms(std::chrono::milliseconds(options_.io_timeout).count());
    const auto num_layers = static_cast<uint32_t>(options_.layer_block_bytes.size());
    std::vector<std::span<const uint8_t>> layers(num_layers);
    for (uint64_t b = 0; b < n; ++b) {
        const uint8_t* e = list.data() + kKvBlocksHeaderBytes + b * kKvBlocksEntryBytes;
        kvstore::BlockInfo info;
        info.key = kvstore::StoreKey{get_u64(e), get_u64(e + 8)};
        info.model = model;
        info.num_layers = num_layers;
        info.dtype = options_.dtype;
        info.num_tokens = options_.block_tokens;
        info.token_hash = get_u64(e + 16);
        info.traffic_class = static_cast<kvstore::TrafficClass>(traffic);
        for (uint32_t l = 0; l < num_layers; ++l) {
            const uint64_t size = options_.layer_block_bytes[l];
            layers[l] = std::span<const uint8_t>(dest.layer(l)).subspan(b * size, size);
        }
        Status s = store_->put(info, layers, deadline);
        if (!s.is_ok()) {
            MutexLock l(&mu_);
            stats_.blocks_stored += static_cast<int64_t>(b);
            return s.with_context("kv hand-over: stored " + std::to_string(b) + " of " +
                                  std::to_string(n) + " blocks");
        }
    }
    uint64_t state_bytes = 0;
    if (state) {
        // Into the decode engine's pool before the Ack: the continuation finds it.
        state_bytes = state->bytes.size();
        Status s =
            options_.swa_pool->put(state->key, state->traffic_class, std::move(state->bytes));
        if (!s.is_ok()) {
            MutexLock l(&mu_);
            stats_.blocks_stored += static_cast<int64_t>(n);
            return s.with_context("kv hand-over: the SWA state");
        }
    }
    {
        MutexLock l(&mu_);
        stats_.blocks_stored += static_cast<int64_t>(n);
        stats_.states_stored += state ? 1 : 0;
        stats_.bytes_received += static_cast<int64_t>(n * block_bytes + state_bytes);
    }
    if (options_.on_stored) options_.on_stored(std::move(keys));
    return Status();
}

Result<kv::SwaState> KvInbox::parse_state(std::span<const uint8_t> section,
                                          std::span<const uint8_t> block_list,
                                          uint64_t num_blocks) const {
    const uint8_t* p = section.data();
    if (get_u32(p) != kSwaStateVersion) {
        return invalid_argument("kv hand-over: SWA state version " + std::to_string(get_u32(p)));
    }
    const uint32_t traffic = get_u32(p + 4);
    if (!valid_traffic_class(traffic)) {
        return invalid_argument("kv hand-over: SWA state traffic class " + std::to_string(traffic));
    }
    kv::SwaState st;
    st.traffic_class = static_cast<kvstore::TrafficClass>(traffic);
    st.key.chain = kv::BlockKey{get_u64(p + 8), get_u64(p + 16)};
    st.key.position = static_cast<int64_t>(get_u64(p + 24));
    // The state continues the blocks: at their end, named by the last one's chain key.
    const uint64_t end = num_blocks * options_.block_tokens;
    if (static_cast<uint64_t>(st.key.position) != end) {
        return invalid_argument("kv hand-over: an SWA state at position " +
                                std::to_string(get_u64(p + 24)) + ", not at the blocks' end " +
                                std::to_string(end));
    }
    const uint8_t* last =
        block_list.data() + kKvBlocksHeaderBytes + (num_blocks - 1) * kKvBlocksEntryBytes;
    if (st.key.chain.lo != get_u64(last) || st.key.chain.hi != get_u64(last + 8)) {
        return invalid_argument("kv hand-over: the SWA state's key is not the last block's");
    }
    st.bytes.assign(section.begin() + kSwaStateHeaderBytes, section.end());
    if (!kv::swa_sealed_ok(st, options_.swa_state_bytes - kv::kSwaSealBytes)) {
        return data_loss("kv hand-over: the SWA state fails its seal");
    }
    return st;
}

void KvInbox::receive_one(transfer::Connection& conn) {
    transfer::ReceiveOptions ro;
    ro.self = options_.self;
    ro.io_timeout = options_.io_timeout;
    ro.max_duration = options_.max_transfer_time;
    ro.limits.max_transfer_bytes = options_.max_transfer_bytes;
    ro.limits.expected_model_id = options_.model_id;
    ro.should_abort = [this] { return stopping_.load(); };
    ro.commit = [this](const transfer::TransferId&, const BeginMessage& begin,
                       const transfer::HelloMessage&,
                       transfer::Destination& d) { return commit(begin, d); };
    const transfer::DestinationFactory factory = [this](const transfer::TransferId&,
                                                        const BeginMessage& begin) {
        return make_destination(begin);
    };
    Result<transfer::ReceivedSequence> got = transfer::receive_sequence(conn, ro, peers_, factory);
    MutexLock l(&mu_);
    if (got.is_ok()) {
        ++stats_.num_received;
    } else {
        ++stats_.num_failed;
        DSI_LOG(kInfo) << "kv hand-over failed: " << got.status().to_string();
    }
}

}  // namespace dsi::serving

#include "serving/kv_handoff.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "base/logging.h"

namespace dsi::serving {
namespace {

using transfer::BeginMessage;
using transfer::Timeout;

constexpr uint32_t kKvBlocksVersion = 1;
constexpr size_t kKvBlocksHeaderBytes = 16;
constexpr size_t kKvBlocksEntryBytes = 24;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);  // little-endian hosts only (x86-64, aarch64)
    out.insert(out.end(), b, b + 4);
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
    uint8_t b[8];
    std::memcpy(b, &v, 8);
    out.insert(out.end(), b, b + 8);
}
uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t get_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

std::vector<uint8_t> encode_block_list(const kv::KvExport& kv) {
    std::vector<uint8_t> out;
    out.reserve(kKvBlocksHeaderBytes + kKvBlocksEntryBytes * kv.num_blocks());
    put_u32(out, kKvBlocksVersion);
    put_u32(out, kv.dtype);
    put_u32(out, static_cast<uint32_t>(kv.traffic_class));
    put_u32(out, static_cast<uint32_t>(kv.num_blocks()));
    for (size_t b = 0; b < kv.num_blocks(); ++b) {
        put_u64(out, kv.keys[b].lo);
        put_u64(out, kv.keys[b].hi);
        put_u64(out, kv.token_hashes[b]);
    }
    return out;
}

Result<std::pair<std::string, uint16_t>> split_address(const std::string& address) {
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

// The staging copy of one transfer: each layer and the block list contiguous, so the
// transport reads the data straight into place (Destination::layer_memory).
class StagingDestination final : public transfer::Destination {
public:
    StagingDestination(const BeginMessage& begin) {
        layers_.reserve(begin.layer_bytes.size());
        for (uint64_t n : begin.layer_bytes) layers_.emplace_back(n);
        sections_.reserve(begin.state_sections.size());
        for (const auto& s : begin.state_sections) sections_.emplace_back(s.bytes);
    }
    void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy(layers_[layer].data() + offset, bytes.data(), bytes.size());
    }
    void write_state(size_t section, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy(sections_[section].data() + offset, bytes.data(), bytes.size());
    }
    std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) override {
        return std::span<uint8_t>(layers_[layer]).subspan(offset, n);
    }
    const std::vector<uint8_t>& layer(size_t l) const { return layers_[l]; }
    const std::vector<uint8_t>& section(size_t s) const { return sections_[s]; }

private:
    std::vector<std::vector<uint8_t>> layers_;
    std::vector<std::vector<uint8_t>> sections_;
};

}  // namespace

Result<transfer::SendReport> send_kv_export(transfer::Transport& transport,
                                            const kv::KvExport& kv, const HandoffTarget& target,
                                            const HandoffSendOptions& options) {
    if (kv.num_blocks() == 0 || kv.num_layers() == 0) {
        return invalid_argument("nothing to hand over: the export has no block");
    }
    DSI_ASSIGN_OR_RETURN(auto hp, split_address(target.address));
    BeginMessage begin;
    begin.model_id = kv.model_id;
    begin.num_tokens = kv.num_blocks() * kv.block_tokens;
    begin.block_size_tokens = kv.block_tokens;
    begin.layer_bytes.assign(kv.num_layers(), kv.num_blocks() * kv.layer_block_bytes);
    const std::vector<uint8_t> list = encode_block_list(kv);
    begin.state_sections.push_back({std::string(kKvBlocksSection), list.size()});
    std::vector<std::span<const uint8_t>> layers;
    for (const auto& l : kv.layers) layers.emplace_back(l);
    transfer::SpanSource source(std::move(layers), {std::span<const uint8_t>(list)});
    DSI_ASSIGN_OR_RETURN(std::unique_ptr<transfer::Connection> conn,
                         transport.connect(hp.first, hp.second, options.io_timeout));
    transfer::SendOptions so;
    so.transfer_id = target.id;
    so.self = options.self;
    so.io_timeout = options.io_timeout;
    so.should_abort = options.should_abort;
    return transfer::send_sequence(*conn, so, begin, source);
}

Result<std::unique_ptr<KvInbox>> KvInbox::start(KvInboxOptions options,
                                                kvstore::BlockStore* store,
                                                std::unique_ptr<transfer::Transport> transport) {
    if (store == nullptr || options.num_layers == 0 || options.layer_block_bytes == 0 ||
        options.block_tokens == 0 || options.model_id.empty() || options.num_threads < 1) {
        return invalid_argument("kv inbox: no store, or options that describe no block");
    }
    if (transport == nullptr) transport = transfer::make_tcp_transport();
    std::unique_ptr<KvInbox> inbox(new KvInbox(std::move(options), store, std::move(transport)));
    DSI_ASSIGN_OR_RETURN(inbox->listener_,
                         inbox->transport_->listen(inbox->options_.host, inbox->options_.port));
    inbox->port_ = inbox->listener_->port();
    inbox->threads_.emplace_back([p = inbox.get()] { p->accept_loop(); });
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
            (*conn)->close();
            continue;
        }
        queue_.push_back(std::move(conn).value());
        cv_.notify_one();
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
    const BeginMessage& begin) const {
    const auto fail = [&](const std::string& why) {
        return failed_precondition("kv hand-over refused: " + why);
    };
    if (begin.block_size_tokens != options_.block_tokens) {
        return fail("block size " + std::to_string(begin.block_size_tokens) + " tokens, not " +
                    std::to_string(options_.block_tokens));
    }
    if (begin.num_tokens == 0 || begin.num_tokens % options_.block_tokens != 0) {
        return fail(std::to_string(begin.num_tokens) + " tokens are not whole blocks");
    }
    const uint64_t n = begin.num_tokens / options_.block_tokens;
    if (begin.num_layers() != options_.num_layers) {
        return fail(std::to_string(begin.num_layers()) + " layers, not " +
                    std::to_string(options_.num_layers));
    }
    for (uint64_t bytes : begin.layer_bytes) {
        if (bytes != n * options_.layer_block_bytes) {
            return fail("a layer of " + std::to_string(bytes) + " bytes, not " +
                        std::to_string(n) + " blocks of " +
                        std::to_string(options_.layer_block_bytes));
        }
    }
    if (begin.state_sections.size() != 1 || begin.state_sections[0].name != kKvBlocksSection ||
        begin.state_sections[0].bytes != kKvBlocksHeaderBytes + kKvBlocksEntryBytes * n) {
        return fail("the block list is missing or of the wrong size");
    }
    return std::unique_ptr<transfer::Destination>(new StagingDestination(begin));
}

Status KvInbox::commit(const BeginMessage& begin, transfer::Destination& d) {
    const auto& dest = static_cast<const StagingDestination&>(d);
    const std::vector<uint8_t>& list = dest.section(0);
    const uint64_t n = begin.num_tokens / options_.block_tokens;
    if (get_u32(list.data()) != kKvBlocksVersion) {
        return invalid_argument("kv hand-over: block list version " +
                                std::to_string(get_u32(list.data())));
    }
    if (get_u32(list.data() + 4) != options_.dtype) {
        return failed_precondition("kv hand-over refused: KV dtype " +
                                   std::to_string(get_u32(list.data() + 4)) + ", not " +
                                   std::to_string(options_.dtype));
    }
    const uint32_t traffic = get_u32(list.data() + 8);
    if (traffic > static_cast<uint32_t>(kvstore::TrafficClass::kAgent)) {
        return invalid_argument("kv hand-over: traffic class " + std::to_string(traffic));
    }
    if (get_u32(list.data() + 12) != n) {
        return invalid_argument("kv hand-over: the block list counts " +
                                std::to_string(get_u32(list.data() + 12)) + " blocks, Begin " +
                                std::to_string(n));
    }
    const kvstore::StoreKey model = kvstore::model_identity(options_.model_id);
    const int64_t deadline =
        kvstore::deadline_after_ms(std::chrono::milliseconds(options_.io_timeout).count());
    std::vector<std::span<const uint8_t>> layers(options_.num_layers);
    for (uint64_t b = 0; b < n; ++b) {
        const uint8_t* e = list.data() + kKvBlocksHeaderBytes + b * kKvBlocksEntryBytes;
        kvstore::BlockInfo info;
        info.key = kvstore::StoreKey{get_u64(e), get_u64(e + 8)};
        info.model = model;
        info.num_layers = options_.num_layers;
        info.dtype = options_.dtype;
        info.num_tokens = options_.block_tokens;
        info.token_hash = get_u64(e + 16);
        info.traffic_class = static_cast<kvstore::TrafficClass>(traffic);
        for (uint32_t l = 0; l < options_.num_layers; ++l) {
            layers[l] = std::span<const uint8_t>(dest.layer(l)).subspan(
                b * options_.layer_block_bytes, options_.layer_block_bytes);
        }
        Status s = store_->put(info, layers, deadline);
        if (!s.is_ok()) {
            MutexLock l(&mu_);
            stats_.blocks_stored += static_cast<int64_t>(b);
            return s.with_context("kv hand-over: stored " + std::to_string(b) + " of " +
                                  std::to_string(n) + " blocks");
        }
    }
    MutexLock l(&mu_);
    stats_.blocks_stored += static_cast<int64_t>(n);
    stats_.bytes_received += static_cast<int64_t>(n * options_.num_layers *
                                                  options_.layer_block_bytes);
    return Status();
}

void KvInbox::receive_one(transfer::Connection& conn) {
    transfer::ReceiveOptions ro;
    ro.self = options_.self;
    ro.io_timeout = options_.io_timeout;
    ro.limits.max_transfer_bytes = options_.max_transfer_bytes;
    ro.limits.expected_model_id = options_.model_id;
    ro.should_abort = [this] { return stopping_.load(); };
    ro.commit = [this](const transfer::TransferId&, const BeginMessage& begin,
                       const transfer::HelloMessage&, transfer::Destination& d) {
        return commit(begin, d);
    };
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

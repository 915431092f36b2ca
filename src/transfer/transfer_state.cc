#include "transfer/transfer_state.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace dsi::transfer {

// ---- Sources and destinations ----

namespace {

std::span<const uint8_t> piece_of(std::span<const uint8_t> all, uint64_t offset,
                                  uint64_t max_bytes) {
    DSI_CHECK_LT(offset, all.size());
    return all.subspan(offset, std::min<uint64_t>(max_bytes, all.size() - offset));
}

void write_into(std::vector<uint8_t>* dst, uint64_t offset, std::span<const uint8_t> bytes) {
    DSI_CHECK_LE(offset + bytes.size(), dst->size());
    if (!bytes.empty()) {
        std::memcpy(dst->data() + offset, bytes.data(), bytes.size());
    }
}

// A chunk of `what` at [offset, offset + n) of its `size` bytes, `received` so far:
// it must lie inside and continue exactly where the last one ended (TCP keeps order, so
// anything else is a broken or malicious sender).
std::optional<Status> check_piece(const std::string& what, uint64_t offset, uint64_t n,
                                  uint64_t size, uint64_t received) {
    if (offset > size || n > size - offset) {
        return out_of_range(what + " bytes [" + std::to_string(offset) + ", +" + std::to_string(n) +
                            ") outside its " + std::to_string(size) + " bytes");
    }
    if (offset != received || n == 0) {
        return invalid_argument(what + " chunk at offset " + std::to_string(offset) +
                                ", expected " + std::to_string(received));
    }
    return std::nullopt;
}

}  // namespace

std::span<const uint8_t> SpanSource::layer_piece(uint32_t layer, uint64_t offset,
                                                 uint64_t max_bytes) {
    DSI_CHECK_LT(layer, layers_.size());
    return piece_of(layers_[layer], offset, max_bytes);
}

std::span<const uint8_t> SpanSource::state_piece(size_t section, uint64_t offset,
                                                 uint64_t max_bytes) {
    DSI_CHECK_LT(section, states_.size());
    return piece_of(states_[section], offset, max_bytes);
}

VectorDestination::VectorDestination(const BeginMessage& begin) {
    for (uint64_t b : begin.layer_bytes) {
        layers_.emplace_back(b);
    }
    for (const auto& s : begin.state_sections) {
        states_.emplace_back(s.bytes);
    }
}

void VectorDestination::write_layer(uint32_t layer, uint64_t offset,
                                    std::span<const uint8_t> bytes) {
    write_into(&layers_.at(layer), offset, bytes);
}

std::span<uint8_t> VectorDestination::layer_memory(uint32_t layer, uint64_t offset, uint64_t n) {
    auto& l = layers_.at(layer);
    DSI_CHECK_LE(offset + n, l.size());
    return {l.data() + offset, n};
}

void VectorDestination::write_state(size_t section, uint64_t offset,
                                    std::span<const uint8_t> bytes) {
    write_into(&states_.at(section), offset, bytes);
}

// ---- PeerTable ----

Status PeerTable::observe(const std::string& peer_id, uint64_t incarnation) {
    MutexLock l(&mu_);
    uint64_t& known = incarnations_[peer_id];
    if (incarnation < known) {
        return failed_precondition("stale incarnation " + std::to_string(incarnation) +
                                   " of peer '" + peer_id + "' (current " + std::to_string(known) +
                                   ")");
    }
    known = incarnation;
    return Status::ok();
}

uint64_t PeerTable::current(const std::string& peer_id) const {
    MutexLock l(&mu_);
    auto it = incarnations_.find(peer_id);
    return it == incarnations_.end() ? 0 : it->second;
}

// ---- FrameStamper ----

EncodedFrame FrameStamper::stamp(MessageType type, std::vector<uint8_t> prefix,
                                 std::span<const uint8_t> body) {
    FrameFields f{type, id_, incarnation_, next_sequence_++};
    return encode_frame(f, std::move(prefix), body);
}

// ---- TransferSender ----

TransferSender::TransferSender(TransferId id, HelloMessage self, BeginMessage begin,
                               SequenceSource* source, uint64_t chunk_bytes)
    : id_(id),
      self_(std::move(self)),
      begin_(std::move(begin)),
      source_(source),
      chunk_bytes_(chunk_bytes),
      stamper_(id, self_.incarnation) {
    DSI_CHECK(chunk_bytes_ > 0);
    DSI_CHECK(source_ != nullptr);
}

TransferSender::~TransferSender() = default;

std::optional<EncodedFrame> TransferSender::next_frame() {
    if (state_ != State::kSending) {
        return std::nullopt;
    }
    if (phase_ == -2) {
        phase_ = -1;
        return stamper_.stamp(MessageType::kHello, encode_payload(self_));
    }
    if (phase_ == -1) {
        phase_ = 0;
        return stamper_.stamp(MessageType::kBegin, encode_payload(begin_));
    }
    // State sections first: a V4 sequence cannot decode without them, and they are small.
    while (section_ < begin_.state_sections.size()) {
        const uint64_t size = begin_.state_sections[section_].bytes;
        if (offset_ >= size) {
            ++section_;
            offset_ = 0;
            continue;
        }
        const auto piece = source_->state_piece(section_, offset_, chunk_bytes_);
        DSI_CHECK(!piece.empty(), "empty state piece");
        auto frame = stamper_.stamp(
            MessageType::kState,
            encode_state_chunk_prefix(begin_.state_sections[section_].name, offset_), piece);
        offset_ += piece.size();
        data_bytes_ += piece.size();
        end_digest_ = chain_digest(end_digest_, frame.digest);
        return frame;
    }
    while (layer_ < begin_.num_layers()) {
        if (offset_ >= begin_.layer_bytes[layer_]) {
            ++layer_;
            offset_ = 0;
            continue;
        }
        const auto piece = source_->layer_piece(layer_, offset_, chunk_bytes_);
        DSI_CHECK(!piece.empty(), "empty layer piece");
        auto frame = stamper_.stamp(MessageType::kLayerChunk,
                                    encode_layer_chunk_prefix(layer_, offset_), piece);
        offset_ += piece.size();
        data_bytes_ += piece.size();
        end_digest_ = chain_digest(end_digest_, frame.digest);
        return frame;
    }
    state_ = State::kAwaitAck;
    end_sequence_ = stamper_.next_sequence();
    return stamper_.stamp(MessageType::kEnd, encode_payload(EndMessage{data_bytes_, end_digest_}));
}

EncodedFrame TransferSender::abort(std::string reason) {
    state_ = State::kAborted;
    status_ = cancelled("transfer " + id_.to_string() + " aborted: " + reason);
    return stamper_.stamp(MessageType::kAbort, encode_payload(AbortMessage{std::move(reason)}));
}

void TransferSender::fail(Status s) {
    state_ = State::kFailed;
    status_ = std::move(s);
}

void TransferSender::on_error(Status status) {
    if (state_ == State::kSending || state_ == State::kAwaitAck) {
        fail(std::move(status));
    }
}

Status TransferSender::on_frame(const FrameView& frame) {
    if (state_ == State::kDone || state_ == State::kFailed || state_ == State::kAborted) {
        ++num_late_;
        return status_;
    }
    if (frame.header.transfer_id != id_) {
        fail(invalid_argument("reply for transfer " + frame.header.transfer_id.to_string() +
                              " on the connection of " + id_.to_string()));
        return status_;
    }
    switch (frame.header.type) {
        case MessageType::kHello: {
            auto hello = decode_hello(frame.payload);
            if (!hello.is_ok()) {
                fail(hello.status());
            } else {
                peer_ = std::move(hello).value();
            }
            break;
        }
        case MessageType::kAck: {
            auto ack = decode_ack(frame.payload);
            if (!ack.is_ok()) {
                fail(ack.status());
            } else if (state_ != State::kAwaitAck || ack->acked_sequence != end_sequence_) {
                fail(internal_error("Ack of sequence " + std::to_string(ack->acked_sequence) +
                                    " before End was sent"));
            } else {
                state_ = State::kDone;
            }
            break;
        }
        case MessageType::kFailure: {
            auto f = decode_failure(frame.payload);
            if (!f.is_ok()) {
                fail(f.status());
            } else {
                fail(Status(f->code, "receiver failed the transfer: " + f->message));
            }
            break;
        }
        case MessageType::kAbort: {
            auto a = decode_abort(frame.payload);
            state_ = State::kAborted;
            status_ = cancelled("receiver aborted: " + (a.is_ok() ? a->reason : "(malformed)"));
            break;
        }
        default:
            fail(invalid_argument("unexpected " +
                                  std::string(message_type_name(frame.header.type)) +
                                  " from the receiver"));
    }
    return status_;
}

// ---- TransferReceiver ----

TransferReceiver::TransferReceiver(TransferId id, PeerTable* peers, DestinationFactory factory,
                                   ReceiverLimits limits)
    : id_(id), peers_(peers), factory_(std::move(factory)), limits_(std::move(limits)) {
    DSI_CHECK(peers_ != nullptr);
}

TransferReceiver::~TransferReceiver() = default;

TransferReceiver::Verdict TransferReceiver::fail(Status s) {
    state_ = State::kFailed;
    status_ = std::move(s);
    destination_.reset();  // the caller's buffers go back now, not when the receiver dies
    return Verdict::kFailed;
}

void TransferReceiver::on_error(Status status) {
    if (!ended()) {
        fail(std::move(status));
    }
}

void TransferReceiver::abort(std::string reason) {
    if (!ended()) {
        state_ = State::kAborted;
        status_ = cancelled("transfer aborted here: " + reason);
        destination_.reset();
    }
}

std::unique_ptr<Destination> TransferReceiver::take_destination() {
    DSI_CHECK(state_ == State::kComplete, "take_destination before the transfer completed");
    return std::move(destination_);
}

TransferReceiver::Verdict TransferReceiver::on_frame(const FrameView& frame) {
    const FrameHeader& h = frame.header;
    if (ended()) {
        ++counters_.num_late;
        return Verdict::kIgnored;
    }
    if (h.transfer_id != id_) {
        return fail(invalid_argument("frame of transfer " + h.transfer_id.to_string() +
                                     " on the connection of " + id_.to_string()));
    }
    if (peer_) {
        if (h.incarnation < peer_->incarnation) {
            ++counters_.num_stale;
            return Verdict::kIgnored;
        }
        if (h.incarnation > peer_->incarnation ||
            peers_->current(peer_->peer_id) > peer_->incarnation) {
            return fail(failed_precondition(
                "peer '" + peer_->peer_id + "' restarted (incarnation " +
                std::to_string(peer_->incarnation) + " -> " +
                std::to_string(std::max(h.incarnation, peers_->current(peer_->peer_id))) +
                ") during the transfer"));
        }
    }
    if (last_sequence_seen_ && h.sequence <= *last_sequence_seen_) {
        ++counters_.num_duplicates;
        return Verdict::kIgnored;
    }
    const uint64_t expected = last_sequence_seen_ ? *last_sequence_seen_ + 1 : 0;
    if (h.sequence != expected) {
        return fail(data_loss("frame sequence " + std::to_string(h.sequence) + ", expected " +
                              std::to_string(expected) + ": frames were lost"));
    }
    last_sequence_seen_ = h.sequence;
    Verdict v = Verdict::kFailed;
    switch (h.type) {
        case MessageType::kHello:
            v = on_hello(frame);
            break;
        case MessageType::kBegin:
            v = on_begin(frame);
            break;
        case MessageType::kLayerChunk:
            v = on_layer_chunk(frame);
            break;
        case MessageType::kState:
            v = on_state_chunk(frame);
            break;
        case MessageType::kEnd:
            v = on_end(frame);
            break;
        case MessageType::kAbort: {
            auto a = decode_abort(frame.payload);
            state_ = State::kAborted;
            status_ = cancelled("sender aborted: " + (a.is_ok() ? a->reason : "(malformed)"));
            destination_.reset();
            return Verdict::kAborted;
        }
        case MessageType::kFailure: {
            auto f = decode_failure(frame.payload);
            return fail(f.is_ok() ? Status(f->code, "sender failed: " + f->message) : f.status());
        }
        case MessageType::kAck:
            return fail(invalid_argument("unexpected Ack from the sender"));
    }
    if (v != Verdict::kFailed) {
        ++counters_.num_accepted;
    }
    return v;
}

TransferReceiver::Verdict TransferReceiver::on_hello(const FrameView& frame) {
    if (state_ != State::kAwaitHello) {
        return fail(invalid_argument("second Hello on one transfer"));
    }
    auto hello = decode_hello(frame.payload);
    if (!hello.is_ok()) {
        return fail(hello.status());
    }
    if (hello->incarnation != frame.header.incarnation) {
        return fail(invalid_argument("Hello's incarnation differs from its frame's"));
    }
    Status s = peers_->observe(hello->peer_id, hello->incarnation);
    if (!s.is_ok()) {
        return fail(std::move(s));
    }
    peer_ = std::move(hello).value();
    state_ = State::kAwaitBegin;
    return Verdict::kAccepted;
}

TransferReceiver::Verdict TransferReceiver::on_begin(const FrameView& frame) {
    if (state_ != State::kAwaitBegin) {
        return fail(
            invalid_argument(state_ == State::kAwaitHello ? "Begin before Hello" : "second Begin"));
    }
    auto begin = decode_begin(frame.payload);
    if (!begin.is_ok()) {
        return fail(begin.status());
    }
    if (begin->num_layers() == 0) {
        return fail(invalid_argument("Begin describes no layers"));
    }
    if (limits_.expected_model_id && begin->model_id != *limits_.expected_model_id) {
        return fail(failed_precondition("Begin for model '" + begin->model_id + "', expected '" +
                                        *limits_.expected_model_id + "'"));
    }
    uint64_t total = 0;
    for (uint64_t b : begin->layer_bytes) {
        if (b > limits_.max_transfer_bytes - total) {
            return fail(resource_exhausted("transfer over the limit of " +
                                           std::to_string(limits_.max_transfer_bytes) + " bytes"));
        }
        total += b;
    }
    std::set<std::string> names;
    for (const auto& s : begin->state_sections) {
        if (!names.insert(s.name).second) {
            return fail(invalid_argument("state section '" + s.name + "' named twice"));
        }
        if (s.bytes > limits_.max_transfer_bytes - total) {
            return fail(resource_exhausted("transfer over the limit of " +
                                           std::to_string(limits_.max_transfer_bytes) + " bytes"));
        }
        total += s.bytes;
    }
    auto dest = factory_(id_, *begin);
    if (!dest.is_ok()) {
        return fail(dest.status().with_context("no destination for the transfer"));
    }
    destination_ = std::move(dest).value();
    DSI_CHECK(destination_ != nullptr, "the destination factory returned null");
    layer_received_.assign(begin->num_layers(), 0);
    state_received_.assign(begin->state_sections.size(), 0);
    begin_ = std::move(begin).value();
    state_ = State::kReceiving;
    // Zero-byte layers are ready at once.
    while (num_layers_ready_ < begin_->num_layers() &&
           begin_->layer_bytes[num_layers_ready_] == 0) {
        ++num_layers_ready_;
    }
    return Verdict::kAccepted;
}

void TransferReceiver::add_data(const FrameHeader& header, uint64_t n) {
    end_digest_ = chain_digest(end_digest_, header.digest);
    counters_.data_bytes += n;
}

TransferReceiver::Verdict TransferReceiver::on_layer_chunk(const FrameView& frame) {
    if (state_ != State::kReceiving) {
        return fail(invalid_argument("LayerChunk before Begin"));
    }
    auto chunk = decode_layer_chunk(frame.payload);
    if (!chunk.is_ok()) {
        return fail(chunk.status());
    }
    const uint32_t layer = chunk->layer;
    if (layer >= begin_->num_layers()) {
        return fail(out_of_range("layer " + std::to_string(layer) + " of " +
                                 std::to_string(begin_->num_layers())));
    }
    if (auto bad =
            check_piece("layer " + std::to_string(layer), chunk->offset_bytes, chunk->data.size(),
                        begin_->layer_bytes[layer], layer_received_[layer])) {
        return fail(std::move(*bad));
    }
    const uint64_t n = chunk->data.size();
    destination_->write_layer(layer, chunk->offset_bytes, chunk->data);
    add_layer_data(frame.header, layer, n);
    return Verdict::kAccepted;
}

void TransferReceiver::add_layer_data(const FrameHeader& header, uint32_t layer, uint64_t n) {
    layer_received_[layer] += n;
    add_data(header, n);
    while (num_layers_ready_ < begin_->num_layers() &&
           layer_received_[num_layers_ready_] == begin_->layer_bytes[num_layers_ready_]) {
        ++num_layers_ready_;
    }
}

std::span<uint8_t> TransferReceiver::place_layer_chunk(const FrameHeader& h,
                                                       std::span<const uint8_t> prefix) {
    const uint64_t expected = last_sequence_seen_ ? *last_sequence_seen_ + 1 : 0;
    if (state_ != State::kReceiving || h.type != MessageType::kLayerChunk || h.transfer_id != id_ ||
        h.incarnation != peer_->incarnation || h.sequence != expected ||
        peers_->current(peer_->peer_id) != peer_->incarnation) {
        return {};
    }
    auto chunk = decode_layer_chunk(prefix);
    if (!chunk.is_ok() || chunk->layer >= begin_->num_layers() || h.payload_bytes < prefix.size()) {
        return {};
    }
    const uint64_t n = h.payload_bytes - prefix.size();
    if (check_piece("", chunk->offset_bytes, n, begin_->layer_bytes[chunk->layer],
                    layer_received_[chunk->layer])) {
        return {};
    }
    const auto memory = destination_->layer_memory(chunk->layer, chunk->offset_bytes, n);
    return memory.size() == n ? memory : std::span<uint8_t>();
}

TransferReceiver::Verdict TransferReceiver::commit_placed_layer_chunk(
    const FrameHeader& h, std::span<const uint8_t> prefix) {
    auto chunk = decode_layer_chunk(prefix);
    DSI_CHECK(chunk.is_ok() && state_ == State::kReceiving, "commit of a frame not placed");
    last_sequence_seen_ = h.sequence;
    ++counters_.num_accepted;
    ++counters_.num_placed;
    add_layer_data(h, chunk->layer, h.payload_bytes - prefix.size());
    return Verdict::kAccepted;
}

TransferReceiver::Verdict TransferReceiver::on_state_chunk(const FrameView& frame) {
    if (state_ != State::kReceiving) {
        return fail(invalid_argument("State before Begin"));
    }
    auto chunk = decode_state_chunk(frame.payload);
    if (!chunk.is_ok()) {
        return fail(chunk.status());
    }
    const auto& sections = begin_->state_sections;
    const auto it = std::find_if(sections.begin(), sections.end(),
                                 [&](const StateSectionInfo& s) { return s.name == chunk->name; });
    if (it == sections.end()) {
        return fail(invalid_argument("state section '" + chunk->name + "' not in Begin"));
    }
    const size_t section = static_cast<size_t>(it - sections.begin());
    if (auto bad = check_piece("state section '" + it->name + "'", chunk->offset_bytes,
                               chunk->data.size(), it->bytes, state_received_[section])) {
        return fail(std::move(*bad));
    }
    const uint64_t n = chunk->data.size();
    destination_->write_state(section, chunk->offset_bytes, chunk->data);
    state_received_[section] += n;
    add_data(frame.header, n);
    return Verdict::kAccepted;
}

TransferReceiver::Verdict TransferReceiver::on_end(const FrameView& frame) {
    if (state_ != State::kReceiving) {
        return fail(invalid_argument("End before Begin"));
    }
    auto end = decode_end(frame.payload);
    if (!end.is_ok()) {
        return fail(end.status());
    }
    for (uint32_t l = 0; l < begin_->num_layers(); ++l) {
        if (layer_received_[l] != begin_->layer_bytes[l]) {
            return fail(data_loss("End with layer " + std::to_string(l) + " at " +
                                  std::to_string(layer_received_[l]) + " of " +
                                  std::to_string(begin_->layer_bytes[l]) + " bytes"));
        }
    }
    for (size_t s = 0; s < state_received_.size(); ++s) {
        if (state_received_[s] != begin_->state_sections[s].bytes) {
            return fail(data_loss("End with state section '" + begin_->state_sections[s].name +
                                  "' at " + std::to_string(state_received_[s]) + " of " +
                                  std::to_string(begin_->state_sections[s].bytes) + " bytes"));
        }
    }
    if (end->total_bytes != counters_.data_bytes) {
        return fail(data_loss("End counts " + std::to_string(end->total_bytes) +
                              " data bytes, received " + std::to_string(counters_.data_bytes)));
    }
    if (end->total_digest != end_digest_) {
        return fail(data_loss("end-to-end digest mismatch over " +
                              std::to_string(counters_.data_bytes) + " bytes"));
    }
    last_sequence_ = frame.header.sequence;
    state_ = State::kComplete;
    return Verdict::kComplete;
}

}  // namespace dsi::transfer

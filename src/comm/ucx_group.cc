// UCX EP group (issue 19). The protocol is in ucx_group.h and docs/comm.md "Between
// hosts: UCX"; this file says why where it is not obvious. The only translation unit of
// comm/ that includes UCX (built when CMake finds libucx-dev; else ucx_group_stub.cc).
#include "comm/ucx_group.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/clock.h"
#include "comm/internal/bootstrap.h"

namespace dsi::comm {
namespace {

constexpr int64_t kSleepSliceMs = 5;  // liveness and deadline checks between sleeps
constexpr int64_t kSpinNs = 50'000;   // progress without sleeping first
constexpr int64_t kCloseTimeoutNs = 1'000'000'000;

// Tags: kind (4 bits) | source rank (20 bits) | collective sequence number (40 bits).
enum Kind : uint64_t { kGather = 1, kRows = 2, kOutputs = 3 };
ucp_tag_t make_tag(Kind kind, int src, uint64_t seq) {
    return (uint64_t{kind} << 60) | (static_cast<uint64_t>(src) << 40) | (seq & ((1ULL << 40) - 1));
}
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};

Status from_ucs(ucs_status_t st, const std::string& what) {
    return internal_error(what + ": " + ucs_status_string(st));
}

// UCX's log level is process-wide, read when the library loads: lowered once unless the
// user set it (transfer/ucx_transport.cc does the same).
void set_global_defaults() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (std::getenv("UCX_LOG_LEVEL") == nullptr) {
            (void)ucs_global_opts_set_value("LOG_LEVEL", "error");
        }
    });
}

class UcxMoeCommunicator final : public MoeCommunicator {
public:
    explicit UcxMoeCommunicator(const UcxGroupOptions& options)
        : options_(options), shape_(options.shape), rank_(options.rank) {}
    ~UcxMoeCommunicator() override { shut_down(broken_.is_ok()); }

    Status start();

    int rank() const override { return rank_; }
    const MoeShape& shape() const override { return shape_; }
    Result<MoeLayout> layout(const PlacementTable& placement, std::span<const int32_t> topk_ids,
                             int num_tokens, ReplicaChoice choice) override;
    Result<DispatchView> dispatch(const MoeLayout& layout,
                                  std::span<const float> hidden_rows) override;
    std::span<float> expert_output_buffer(const MoeLayout& layout) override {
        return {outs_.data(),
                static_cast<size_t>(layout.num_recv()) * static_cast<size_t>(shape_.hidden)};
    }
    Status combine(const MoeLayout& layout, std::span<const float> expert_outputs,
                   std::span<const float> gate, std::span<float> out) override;
    Status barrier() override;
    Result<std::vector<int64_t>> all_gather(int64_t value, int64_t timeout_ms = 0) override;

private:
    enum class Phase { kIdle, kLaidOut, kDispatched };
    struct Peer {
        UcxMoeCommunicator* self = nullptr;
        int rank = 0;
        ucp_ep_h ep = nullptr;
        bool failed = false;
        ucs_status_t error = UCS_OK;
    };
    struct Pending {
        void* request;
        int peer;
    };

    static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
        auto* peer = static_cast<Peer*>(arg);
        peer->failed = true;
        peer->error = status;
    }

    // Posts a tagged send to `peer` of the pieces (iov; one piece is sent contiguous).
    Status post_send(int peer, ucp_tag_t tag, std::vector<ucp_dt_iov_t>& iov);
    Status post_recv(int peer, ucp_tag_t tag, std::vector<ucp_dt_iov_t>& iov);
    // Progresses until every pending request is done (the vectors of the posts must live
    // until then). UNAVAILABLE when a peer a request depends on failed, DEADLINE_EXCEEDED.
    Status wait_pending(const char* step, int64_t timeout_ms = 0);
    // Every rank sends `mine` to every other rank and receives theirs (same size on all).
    Result<std::vector<uint8_t>> exchange(const void* mine, size_t bytes, const char* step,
                                          int64_t timeout_ms = 0);
    Status check_call(const MoeLayout& layout, Phase expected, const char* step);
    // Sticky error; closes the endpoints so the peers fail now, not at their deadline.
    Status fail(Status status);
    void shut_down(bool flush);

    UcxGroupOptions options_;
    MoeShape shape_;
    int rank_;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    int efd_ = -1;
    std::vector<Peer> peers_;  // [num_ranks]; never resized after start (error-handler args)
    std::vector<Pending> pending_;
    std::vector<std::vector<ucp_dt_iov_t>> iovs_;  // live while their requests are pending
    uint64_t seq_ = 0;                             // collective steps, the same count on every rank
    uint64_t call_ = 0;                            // layout() calls
    Phase phase_ = Phase::kIdle;
    Status broken_;
    // This rank's receive side and the combine's staging, sized once.
    std::vector<float> recv_rows_;      // [capacity][hidden]
    std::vector<RowOrigin> origins_;    // [capacity]
    std::vector<float> outs_;           // [capacity][hidden]
    std::vector<float> staging_;        // [max_tokens * top_k][hidden]: outputs from peers
    std::vector<int32_t> recv_counts_;  // this call: [src][slots] rows src sends here
};

Status UcxMoeCommunicator::start() {
    const int n = shape_.num_ranks;
    DSI_ASSIGN_OR_RETURN(internal::HostPort at, internal::parse_host_port(options_.coordinator));
    const int64_t deadline = steady_clock_ns() + options_.attach_timeout_ms * 1'000'000;

    set_global_defaults();
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) {
        return from_ucs(st, "ucp_config_read");
    }
    if (std::getenv("UCX_TLS") == nullptr) {
        // TCP only unless the user says otherwise (containers, network namespaces; a user
        // with RDMA sets UCX_TLS=rc,... themselves). Not setenv: the process may be a rank
        // of something else too.
        (void)ucp_config_modify(config, "TLS", "tcp");
        // Over TCP the rendezvous protocol copies the same bytes through the socket after
        // a handshake whose round trips each wait for the peer to progress: eager
        // messages (fragmented, no handshake) took 3.2-3.5x fewer us per call at 1 token x
        // 7168 and 2x at 128 x 2048 (bench/RESULTS.md "EP dispatch + combine over UCX").
        // Only with the TCP default: over RDMA rendezvous is the zero-copy path.
        if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
            (void)ucp_config_modify(config, "RNDV_THRESH", "inf");
        }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) {
        context_ = nullptr;
        return from_ucs(st, "ucp_init");
    }
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(context_, &wparams, &worker_);
    if (st != UCS_OK) {
        worker_ = nullptr;
        return from_ucs(st, "ucp_worker_create");
    }
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) {
        return from_ucs(st, "ucp_worker_get_efd");
    }
    ucp_address_t* address = nullptr;
    size_t address_bytes = 0;
    st = ucp_worker_get_address(worker_, &address, &address_bytes);
    if (st != UCS_OK) {
        return from_ucs(st, "ucp_worker_get_address");
    }
    std::vector<uint8_t> own(reinterpret_cast<uint8_t*>(address),
                             reinterpret_cast<uint8_t*>(address) + address_bytes);
    ucp_worker_release_address(worker_, address);

    DSI_ASSIGN_OR_RETURN(
        std::vector<std::vector<uint8_t>> addresses,
        internal::exchange_worker_addresses(options_, at, std::move(own), deadline));

    peers_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
        Peer& p = peers_[static_cast<size_t>(r)];
        p.self = this;
        p.rank = r;
        if (r == rank_) {
            continue;
        }
        ucp_ep_params_t ep{};
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address =
            reinterpret_cast<const ucp_address_t*>(addresses[static_cast<size_t>(r)].data());
        // A peer that dies must fail our requests (and call on_ep_error), not hang them.
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = &UcxMoeCommunicator::on_ep_error;
        ep.err_handler.arg = &p;
        st = ucp_ep_create(worker_, &ep, &p.ep);
        if (st != UCS_OK) {
            p.ep = nullptr;
            return from_ucs(st, "ucp_ep_create to rank " + std::to_string(r));
        }
    }
    const size_t cap = static_cast<size_t>(shape_.recv_capacity());
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    recv_rows_.resize(cap * hidden);
    origins_.resize(cap);
    outs_.resize(cap * hidden);
    staging_.resize(static_cast<size_t>(shape_.max_tokens_per_rank) * shape_.top_k * hidden);
    // Wire the endpoints up (each needs both workers progressed once) before returning,
    // within the attach deadline.
    const int64_t left_ms = std::max<int64_t>(1, (deadline - steady_clock_ns()) / 1'000'000);
    Result<std::vector<int64_t>> wired = all_gather(0, left_ms);
    if (!wired.is_ok()) {
        return wired.status();
    }
    return Status::ok();
}

Status UcxMoeCommunicator::post_send(int peer, ucp_tag_t tag, std::vector<ucp_dt_iov_t>& iov) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    void* req =
        ucp_tag_send_nbx(peers_[static_cast<size_t>(peer)].ep, iov.data(), iov.size(), tag, &param);
    if (UCS_PTR_IS_ERR(req)) {
        return fail(unavailable("ucx group: send to rank " + std::to_string(peer) + ": " +
                                ucs_status_string(UCS_PTR_STATUS(req))));
    }
    if (req != nullptr) {
        pending_.push_back({req, peer});
    }
    return Status::ok();
}

Status UcxMoeCommunicator::post_recv(int peer, ucp_tag_t tag, std::vector<ucp_dt_iov_t>& iov) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    void* req = ucp_tag_recv_nbx(worker_, iov.data(), iov.size(), tag, kFullMask, &param);
    if (UCS_PTR_IS_ERR(req)) {
        return fail(internal_error("ucx group: receive from rank " + std::to_string(peer) + ": " +
                                   ucs_status_string(UCS_PTR_STATUS(req))));
    }
    if (req != nullptr) {
        pending_.push_back({req, peer});
    }
    return Status::ok();
}

Status UcxMoeCommunicator::wait_pending(const char* step, int64_t timeout_ms) {
    if (timeout_ms <= 0) {
        timeout_ms = options_.op_timeout_ms;
    }
    const int64_t start = steady_clock_ns();
    const int64_t deadline = start + timeout_ms * 1'000'000;
    for (;;) {
        while (ucp_worker_progress(worker_) != 0) {
        }
        for (size_t i = 0; i < pending_.size();) {
            const ucs_status_t st = ucp_request_check_status(pending_[i].request);
            if (st == UCS_INPROGRESS) {
                ++i;
                continue;
            }
            const int peer = pending_[i].peer;
            ucp_request_free(pending_[i].request);
            pending_[i] = pending_.back();
            pending_.pop_back();
            if (st != UCS_OK) {
                return fail(unavailable("ucx group " + options_.coordinator + ", " + step +
                                        ": rank " + std::to_string(peer) +
                                        " is gone or left the group (" + ucs_status_string(st) +
                                        ")"));
            }
        }
        if (pending_.empty()) {
            iovs_.clear();
            return Status::ok();
        }
        for (const Pending& p : pending_) {
            const Peer& peer = peers_[static_cast<size_t>(p.peer)];
            if (peer.failed) {
                return fail(unavailable("ucx group " + options_.coordinator + ", " + step +
                                        ": rank " + std::to_string(p.peer) +
                                        " is gone or left the group (" +
                                        ucs_status_string(peer.error) + ")"));
            }
        }
        const int64_t now = steady_clock_ns();
        if (now > deadline) {
            return fail(deadline_exceeded("ucx group " + options_.coordinator + ", " + step +
                                          ": rank " + std::to_string(pending_.front().peer) +
                                          " did not arrive within " + std::to_string(timeout_ms) +
                                          " ms"));
        }
        if (now - start < kSpinNs) {
            continue;
        }
        // Sleep on the worker's event fd; a missed wake-up costs one slice, never a hang.
        if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) {
            continue;
        }
        pollfd p{efd_, POLLIN, 0};
        (void)::poll(
            &p, 1,
            static_cast<int>(std::min<int64_t>(kSleepSliceMs, (deadline - now) / 1'000'000 + 1)));
    }
}

Result<std::vector<uint8_t>> UcxMoeCommunicator::exchange(const void* mine, size_t bytes,
                                                          const char* step, int64_t timeout_ms) {
    const int n = shape_.num_ranks;
    const uint64_t seq = ++seq_;
    std::vector<uint8_t> all(bytes * static_cast<size_t>(n));
    std::memcpy(all.data() + bytes * static_cast<size_t>(rank_), mine, bytes);
    iovs_.assign(static_cast<size_t>(2 * n), {});
    for (int r = 0; r < n; ++r) {
        if (r == rank_) {
            continue;
        }
        auto& in = iovs_[static_cast<size_t>(2 * r)];
        in.push_back({all.data() + bytes * static_cast<size_t>(r), bytes});
        DSI_RETURN_IF_ERROR(post_recv(r, make_tag(kGather, r, seq), in));
        auto& out = iovs_[static_cast<size_t>(2 * r + 1)];
        out.push_back({const_cast<void*>(mine), bytes});
        DSI_RETURN_IF_ERROR(post_send(r, make_tag(kGather, rank_, seq), out));
    }
    DSI_RETURN_IF_ERROR(wait_pending(step, timeout_ms));
    return all;
}

Status UcxMoeCommunicator::barrier() {
    DSI_RETURN_IF_ERROR(broken_);
    const uint8_t none = 0;
    return exchange(&none, 1, "barrier").status();
}

Result<std::vector<int64_t>> UcxMoeCommunicator::all_gather(int64_t value, int64_t timeout_ms) {
    DSI_RETURN_IF_ERROR(broken_);
    if (phase_ != Phase::kIdle) {
        return fail(failed_precondition("ucx group: all_gather inside an MoE call"));
    }
    DSI_ASSIGN_OR_RETURN(std::vector<uint8_t> all,
                         exchange(&value, sizeof value, "all_gather", timeout_ms));
    std::vector<int64_t> values(static_cast<size_t>(shape_.num_ranks));
    std::memcpy(values.data(), all.data(), all.size());
    return values;
}

Status UcxMoeCommunicator::check_call(const MoeLayout& layout, Phase expected, const char* step) {
    DSI_RETURN_IF_ERROR(broken_);
    if (layout.call != call_ || phase_ != expected) {
        return fail(failed_precondition(std::string("ucx group: ") + step +
                                        " out of order (layout -> dispatch -> combine, one call "
                                        "at a time, with the latest layout)"));
    }
    return Status::ok();
}

Result<MoeLayout> UcxMoeCommunicator::layout(const PlacementTable& placement,
                                             std::span<const int32_t> topk_ids, int num_tokens,
                                             ReplicaChoice choice) {
    DSI_RETURN_IF_ERROR(broken_);
    if (phase_ != Phase::kIdle) {
        return fail(failed_precondition("ucx group: layout before the previous call's combine"));
    }
    const int n = shape_.num_ranks;
    const int slots = shape_.slots_per_rank;
    const size_t line = 1 + static_cast<size_t>(slots);  // [flag, rows per slot]
    MoeLayout L;
    L.call = ++call_;
    Status input = route_tokens(shape_, placement, rank_, topk_ids, num_tokens, choice, L);
    // This rank's line of every destination's count table ([dst][flag, slots]); every rank
    // gets every rank's, so all compute the same receive orders and fail alike.
    std::vector<int32_t> mine(static_cast<size_t>(n) * line, 0);
    for (int dst = 0; dst < n; ++dst) {
        mine[static_cast<size_t>(dst) * line] = input.is_ok() ? 0 : 1;
    }
    if (input.is_ok()) {
        for (size_t i = 0; i < L.dst_rank.size(); ++i) {
            ++mine[static_cast<size_t>(L.dst_rank[i]) * line + 1 +
                   static_cast<size_t>(L.dst_slot[i])];
        }
    }
    DSI_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                         exchange(mine.data(), mine.size() * sizeof(int32_t), "layout"));
    // counts(src, dst)[0..line): src's line of dst's table.
    auto counts = [&](int src, int dst) {
        return reinterpret_cast<const int32_t*>(bytes.data()) +
               (static_cast<size_t>(src) * n + dst) * line;
    };
    for (int src = 0; src < n; ++src) {
        if (counts(src, 0)[0] != 0) {
            if (src == rank_) {
                return input;
            }
            return failed_precondition("ucx group: rank " + std::to_string(src) +
                                       " gave invalid routing input for this call");
        }
    }
    // The same receive order as ShmMoeCommunicator, so the DispatchView is the same on
    // both transports.
    DSI_RETURN_IF_ERROR(order_receives(
        shape_, rank_, "ucx group",
        [&](int src, int dst, int s) { return counts(src, dst)[1 + s]; }, L));
    recv_counts_.assign(static_cast<size_t>(n) * slots, 0);
    for (int src = 0; src < n; ++src) {
        for (int s = 0; s < slots; ++s) {
            recv_counts_[static_cast<size_t>(src) * slots + s] = counts(src, rank_)[1 + s];
        }
    }
    phase_ = Phase::kLaidOut;
    return L;
}

Result<DispatchView> UcxMoeCommunicator::dispatch(const MoeLayout& layout,
                                                  std::span<const float> hidden_rows) {
    DSI_RETURN_IF_ERROR(check_call(layout, Phase::kLaidOut, "dispatch"));
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    const size_t row_bytes = hidden * sizeof(float);
    if (hidden_rows.size() != static_cast<size_t>(layout.num_tokens) * hidden) {
        return fail(invalid_argument("dispatch: " + std::to_string(hidden_rows.size()) +
                                     " floats for " + std::to_string(layout.num_tokens) +
                                     " tokens x hidden " + std::to_string(hidden)));
    }
    const int n = shape_.num_ranks;
    const int slots = shape_.slots_per_rank;
    const uint64_t seq = ++seq_;
    // Per destination: the (token, k) indices in receive order, so one message carries a
    // source's rows for that destination in the order they land (slot, then (token, k)).
    std::vector<std::vector<size_t>> order(static_cast<size_t>(n));
    for (size_t i = 0; i < layout.dst_rank.size(); ++i) {
        order[static_cast<size_t>(layout.dst_rank[i])].push_back(i);
    }
    // Origins of the rows sent to each peer, in that order (the message's tail).
    std::vector<std::vector<RowOrigin>> sent_origins(static_cast<size_t>(n));
    iovs_.assign(static_cast<size_t>(2 * n), {});
    for (int r = 0; r < n; ++r) {
        auto& idx = order[static_cast<size_t>(r)];
        std::sort(idx.begin(), idx.end(),
                  [&](size_t a, size_t b) { return layout.dst_row[a] < layout.dst_row[b]; });
        if (r == rank_) {
            // Our own rows: one copy, as the shared-memory transport does.
            for (size_t i : idx) {
                const size_t row = static_cast<size_t>(layout.dst_row[i]);
                std::memcpy(recv_rows_.data() + row * hidden,
                            hidden_rows.data() + (i / layout.top_k) * hidden, row_bytes);
                origins_[row] = RowOrigin{rank_, static_cast<int32_t>(i / layout.top_k),
                                          static_cast<int32_t>(i % layout.top_k)};
            }
            continue;
        }
        // Receive: the rows of each slot from r are contiguous here; their origins too.
        auto& in = iovs_[static_cast<size_t>(2 * r)];
        int64_t num_in = 0;
        for (int pass = 0; pass < 2; ++pass) {
            for (int s = 0; s < slots; ++s) {
                const int32_t c = recv_counts_[static_cast<size_t>(r) * slots + s];
                if (c == 0) {
                    continue;
                }
                int64_t begin = layout.slot_offsets[static_cast<size_t>(s)];
                for (int src = 0; src < r; ++src) {
                    begin += recv_counts_[static_cast<size_t>(src) * slots + s];
                }
                if (pass == 0) {
                    in.push_back({recv_rows_.data() + static_cast<size_t>(begin) * hidden,
                                  static_cast<size_t>(c) * row_bytes});
                    num_in += c;
                } else {
                    in.push_back(
                        {origins_.data() + begin, static_cast<size_t>(c) * sizeof(RowOrigin)});
                }
            }
        }
        if (num_in > 0) {
            DSI_RETURN_IF_ERROR(post_recv(r, make_tag(kRows, r, seq), in));
        }
        if (idx.empty()) {
            continue;
        }
        auto& out = iovs_[static_cast<size_t>(2 * r + 1)];
        auto& origins = sent_origins[static_cast<size_t>(r)];
        for (size_t i : idx) {
            out.push_back(
                {const_cast<float*>(hidden_rows.data()) + (i / layout.top_k) * hidden, row_bytes});
            origins.push_back(RowOrigin{rank_, static_cast<int32_t>(i / layout.top_k),
                                        static_cast<int32_t>(i % layout.top_k)});
        }
        out.push_back({origins.data(), origins.size() * sizeof(RowOrigin)});
        DSI_RETURN_IF_ERROR(post_send(r, make_tag(kRows, rank_, seq), out));
    }
    if (options_.before_dispatch_wait) {
        options_.before_dispatch_wait(layout.call);
    }
    DSI_RETURN_IF_ERROR(wait_pending("dispatch"));
    phase_ = Phase::kDispatched;
    const size_t num_recv = static_cast<size_t>(layout.num_recv());
    return DispatchView{std::span<const float>(recv_rows_.data(), num_recv * hidden),
                        std::span<const RowOrigin>(origins_.data(), num_recv),
                        std::span<const int64_t>(layout.slot_offsets)};
}

Status UcxMoeCommunicator::combine(const MoeLayout& layout, std::span<const float> expert_outputs,
                                   std::span<const float> gate, std::span<float> out) {
    DSI_RETURN_IF_ERROR(check_call(layout, Phase::kDispatched, "combine"));
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    const size_t row_bytes = hidden * sizeof(float);
    const size_t num_tokens = static_cast<size_t>(layout.num_tokens);
    const size_t top_k = static_cast<size_t>(layout.top_k);
    const size_t num_recv = static_cast<size_t>(layout.num_recv());
    if (expert_outputs.size() != num_recv * hidden || gate.size() != num_tokens * top_k ||
        out.size() != num_tokens * hidden) {
        return fail(
            invalid_argument("combine: expert outputs " + std::to_string(expert_outputs.size()) +
                             ", gate " + std::to_string(gate.size()) + ", out " +
                             std::to_string(out.size()) + " floats do not match the layout"));
    }
    const int n = shape_.num_ranks;
    const uint64_t seq = ++seq_;
    iovs_.assign(static_cast<size_t>(2 * n), {});
    // Receive: the outputs of our (token, k) rows served by peer r, in r's receive order
    // (dst_row ascending), each into its staging row.
    std::vector<std::vector<size_t>> mine(static_cast<size_t>(n));
    for (size_t i = 0; i < layout.dst_rank.size(); ++i) {
        mine[static_cast<size_t>(layout.dst_rank[i])].push_back(i);
    }
    // Send: the outputs of the rows we served for home rank h, in our receive order.
    for (size_t row = 0; row < num_recv; ++row) {
        const int home = origins_[row].rank;
        if (home != rank_) {
            iovs_[static_cast<size_t>(2 * home + 1)].push_back(
                {const_cast<float*>(expert_outputs.data()) + row * hidden, row_bytes});
        }
    }
    for (int r = 0; r < n; ++r) {
        if (r == rank_) {
            continue;
        }
        auto& idx = mine[static_cast<size_t>(r)];
        if (!idx.empty()) {
            std::sort(idx.begin(), idx.end(),
                      [&](size_t a, size_t b) { return layout.dst_row[a] < layout.dst_row[b]; });
            auto& in = iovs_[static_cast<size_t>(2 * r)];
            for (size_t i : idx) {
                in.push_back({staging_.data() + i * hidden, row_bytes});
            }
            DSI_RETURN_IF_ERROR(post_recv(r, make_tag(kOutputs, r, seq), in));
        }
        auto& send = iovs_[static_cast<size_t>(2 * r + 1)];
        if (!send.empty()) {
            DSI_RETURN_IF_ERROR(post_send(r, make_tag(kOutputs, rank_, seq), send));
        }
    }
    DSI_RETURN_IF_ERROR(wait_pending("combine"));
    // S-ENG-2 / issue 19: fixed top-k order on the home rank; our own rows read in place.
    combine_in_order(layout.num_tokens, layout.top_k, shape_.hidden, gate, out,
                     [&](int t, int k) -> const float* {
                         const size_t i = static_cast<size_t>(t) * top_k + static_cast<size_t>(k);
                         if (layout.dst_rank[i] == rank_) {
                             return expert_outputs.data() +
                                    static_cast<size_t>(layout.dst_row[i]) * hidden;
                         }
                         return staging_.data() + i * hidden;
                     });
    phase_ = Phase::kIdle;
    return Status::ok();
}

Status UcxMoeCommunicator::fail(Status status) {
    if (broken_.is_ok()) {
        broken_ = status;
        shut_down(false);
    }
    return status;
}

void UcxMoeCommunicator::shut_down(bool flush) {
    if (worker_ != nullptr) {
        for (const Pending& p : pending_) {
            ucp_request_cancel(worker_, p.request);
        }
        // Progresses until every request of `reqs` is done or `deadline`; frees the done.
        auto drain = [this](std::vector<void*>& reqs, int64_t deadline) {
            for (;;) {
                while (ucp_worker_progress(worker_) != 0) {
                }
                std::erase_if(reqs, [](void* req) {
                    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
                        return false;
                    }
                    ucp_request_free(req);
                    return true;
                });
                if (reqs.empty() || steady_clock_ns() > deadline) {
                    return;
                }
                ::usleep(200);
            }
        };
        std::vector<void*> waiting;
        for (const Pending& p : pending_) {
            waiting.push_back(p.request);
        }
        pending_.clear();
        // A clean close first pushes out what this rank still queues (a peer may still be
        // receiving our last message); that needs no peer to progress, unlike a flushing
        // close, which waits for each peer's answer — and a peer may be busy elsewhere
        // (rank 0 reaping its ranks) while holding its communicator. Then every endpoint
        // is closed at once; a broken group skips the flush (the peers fail now).
        if (flush) {
            ucp_request_param_t param{};
            void* req = ucp_worker_flush_nbx(worker_, &param);
            if (UCS_PTR_IS_PTR(req)) {
                waiting.push_back(req);
            }
        }
        drain(waiting, steady_clock_ns() + kCloseTimeoutNs);
        for (Peer& p : peers_) {
            if (p.ep == nullptr) {
                continue;
            }
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            void* req = ucp_ep_close_nbx(p.ep, &param);
            p.ep = nullptr;
            if (UCS_PTR_IS_PTR(req)) {
                waiting.push_back(req);
            }
        }
        drain(waiting, steady_clock_ns() + kCloseTimeoutNs);
        // What is still in flight is released now (UCX frees it when it completes, which
        // a forced close of every endpoint makes immediate), then the worker goes.
        for (void* req : waiting) {
            ucp_request_free(req);
        }
        ucp_worker_destroy(worker_);
        worker_ = nullptr;
    }
    if (context_ != nullptr) {
        ucp_cleanup(context_);
        context_ = nullptr;
    }
}

}  // namespace

bool ucx_available() { return true; }

Result<std::unique_ptr<MoeCommunicator>> create_ucx_communicator(const UcxGroupOptions& options) {
    DSI_RETURN_IF_ERROR(options.shape.validate());
    if (options.rank < 0 || options.rank >= options.shape.num_ranks ||
        options.shape.num_ranks >= (1 << 20)) {
        return invalid_argument("ucx group: rank " + std::to_string(options.rank) + " of " +
                                std::to_string(options.shape.num_ranks));
    }
    auto comm = std::make_unique<UcxMoeCommunicator>(options);
    DSI_RETURN_IF_ERROR(comm->start());
    return std::unique_ptr<MoeCommunicator>(std::move(comm));
}

}  // namespace dsi::comm

#include "transfer/fault_transport.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "base/env.h"

namespace dsi::transfer {

namespace {

class FaultyConnection : public Connection {
public:
    FaultyConnection(std::unique_ptr<Connection> base, const FaultPlan& plan, uint64_t index,
                     FaultInjectingTransport::Counters* counters)
        : base_(std::move(base)),
          plan_(plan),
          rng_(plan.seed * 0x9e3779b97f4a7c15ULL + index),
          counters_(counters) {}

    Status write(std::span<const std::span<const uint8_t>> pieces, Timeout timeout) override {
        if (cut_) {
            return unavailable("write: connection cut (fault injection)");
        }
        const uint64_t index = num_writes_++;
        counters_->writes.fetch_add(1);
        // Every decision draws from the generator, taken or not, so one fault's setting
        // does not shift the others' choices.
        const bool drop = rng_.next_double() < plan_.drop_rate;
        const bool corrupt = rng_.next_double() < plan_.corrupt_rate;
        const uint64_t corrupt_pick = rng_.next();
        const uint64_t delay_pick = rng_.next();
        if (index < plan_.spare_first_writes) {
            return pass(pieces, timeout);
        }
        if (plan_.max_delay.count() > 0) {
            counters_->delayed.fetch_add(1);
            const auto ms = static_cast<int64_t>(delay_pick % (plan_.max_delay.count() + 1));
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        }
        if (drop) {
            counters_->dropped.fetch_add(1);
            return Status::ok();
        }
        size_t total = 0;
        for (const auto& p : pieces) {
            total += p.size();
        }
        if (!corrupt || total == 0) {
            return pass(pieces, timeout);
        }
        counters_->corrupted.fetch_add(1);
        std::vector<uint8_t> copy;
        copy.reserve(total);
        for (const auto& p : pieces) {
            copy.insert(copy.end(), p.begin(), p.end());
        }
        copy[corrupt_pick % total] ^= 0x5a;
        const std::span<const uint8_t> one(copy);
        return pass(std::span<const std::span<const uint8_t>>(&one, 1), timeout);
    }

    Result<size_t> read_some(std::span<uint8_t> buf, Timeout timeout) override {
        if (cut_) {
            return unavailable("read: connection cut (fault injection)");
        }
        return base_->read_some(buf, timeout);
    }
    size_t available() override { return cut_ ? 0 : base_->available(); }
    void shutdown_write() override { base_->shutdown_write(); }
    void close() override { base_->close(); }
    std::string peer_address() const override { return base_->peer_address(); }

private:
    // Writes through, honouring the cut.
    Status pass(std::span<const std::span<const uint8_t>> pieces, Timeout timeout) {
        if (!plan_.cut_after_bytes) {
            return base_->write(pieces, timeout);
        }
        const uint64_t limit = *plan_.cut_after_bytes;
        std::vector<std::span<const uint8_t>> allowed;
        bool crossed = false;
        for (const auto& p : pieces) {
            const uint64_t room = limit - std::min(limit, bytes_written_);
            if (p.size() > room) {
                allowed.push_back(p.first(room));
                crossed = true;
                break;
            }
            allowed.push_back(p);
            bytes_written_ += p.size();
        }
        if (!crossed) {
            return base_->write(allowed, timeout);
        }
        Status s = base_->write(allowed, timeout);
        bytes_written_ = limit;
        cut_ = true;
        counters_->cuts.fetch_add(1);
        base_->close();
        (void)s;
        return unavailable("write: connection cut after " + std::to_string(limit) +
                           " bytes (fault injection)");
    }

    std::unique_ptr<Connection> base_;
    FaultPlan plan_;
    SplitMix64 rng_;
    FaultInjectingTransport::Counters* counters_;
    uint64_t num_writes_ = 0;
    uint64_t bytes_written_ = 0;
    bool cut_ = false;
};

class FaultyListener : public Listener {
public:
    FaultyListener(std::unique_ptr<Listener> base, FaultInjectingTransport* owner)
        : base_(std::move(base)), owner_(owner) {}
    Result<std::unique_ptr<Connection>> accept(Timeout timeout) override {
        DSI_ASSIGN_OR_RETURN(auto conn, base_->accept(timeout));
        return owner_->wrap(std::move(conn));
    }
    uint16_t port() const override { return base_->port(); }
    void close() override { base_->close(); }

private:
    std::unique_ptr<Listener> base_;
    FaultInjectingTransport* owner_;
};

}  // namespace

std::unique_ptr<Connection> FaultInjectingTransport::wrap(std::unique_ptr<Connection> conn) {
    return std::make_unique<FaultyConnection>(std::move(conn), plan_, num_connections_.fetch_add(1),
                                              &counters_);
}

Result<std::unique_ptr<Listener>> FaultInjectingTransport::listen(const std::string& host,
                                                                  uint16_t port) {
    DSI_ASSIGN_OR_RETURN(auto l, base_->listen(host, port));
    return std::unique_ptr<Listener>(std::make_unique<FaultyListener>(std::move(l), this));
}

Result<std::unique_ptr<Connection>> FaultInjectingTransport::connect(const std::string& host,
                                                                     uint16_t port,
                                                                     Timeout timeout) {
    DSI_ASSIGN_OR_RETURN(auto c, base_->connect(host, port, timeout));
    return wrap(std::move(c));
}

FaultCounts FaultInjectingTransport::counts() const {
    return FaultCounts{counters_.writes.load(), counters_.dropped.load(), counters_.delayed.load(),
                       counters_.corrupted.load(), counters_.cuts.load()};
}

}  // namespace dsi::transfer

// KV transfer throughput (issue 18): one sequence's KV (LAYERS layers of LAYER_KB each,
// plus a V4-style state section of 1 MiB) sent over loopback TCP through dsi_transfer
// (send_sequence -> receive_sequence: framing, per-frame XXH3 digests, the end-to-end
// digest, Hello/Begin/End/Ack; the destination exposes its memory, so LayerChunk data is
// read from the socket straight into place, as the raw side's is) against a raw loopback TCP stream
// of the same bytes measured in the same run: POSIX sockets, TCP_NODELAY, the sender writing each
// layer in CHUNK_KB calls, the receiver reading straight into the destination buffers (no framing,
// no digest: the transport's ceiling). Goal: transfer / raw >= 0.8. Equal work: both sides write
// into the same preallocated destination buffers (touched once before the first pass), both clocks
// run from the sender's first byte (connect included) to the receiver holding every byte (the
// transfer's also include the Ack). A third side, dsi_transfer into a write-only destination,
// measures the copy path (a paged destination's) beside the zero-copy one. CPU seconds (user + sys
// of the process, both ends) per GB are printed too: less sensitive than wall time to the machine's
// load. Fairness: one warm-up pass of each side, then REPS rounds rotating which side goes first;
// figures are medians with (min-max); the ratio is of medians. Where UCX is built,
// a fourth side sends the same transfer (zero-copy receive) over the UCX transport
// (make_transport("ucx"), UCX_TLS=tcp unless set). Usage: transfer_bench [LAYERS=30]
// [LAYER_KB=8192] [REPS=5] [CHUNK_KB=1024]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "transfer/session.h"

using namespace dsi;
using namespace dsi::transfer;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kStateBytes = uint64_t{1} << 20;

std::string run_command(const char* cmd) {
    std::string out;
    if (FILE* f = popen(cmd, "r")) {
        char buf[4096];
        size_t n = 0;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            out.append(buf, n);
        }
        pclose(f);
    }
    return out;
}

// Writes into buffers the bench owns (so no pass pays for fresh pages).
class FixedDestination : public Destination {
public:
    FixedDestination(std::vector<std::vector<uint8_t>>* layers, std::vector<uint8_t>* state,
                     bool expose_memory)
        : layers_(layers), state_(state), expose_memory_(expose_memory) {}
    void write_layer(uint32_t layer, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy((*layers_)[layer].data() + offset, bytes.data(), bytes.size());
    }
    void write_state(size_t, uint64_t offset, std::span<const uint8_t> bytes) override {
        std::memcpy(state_->data() + offset, bytes.data(), bytes.size());
    }
    // Contiguous layers: chunks are read from the socket straight into place (unless the
    // pass measures the copy path, as for a paged or write-only destination).
    std::span<uint8_t> layer_memory(uint32_t layer, uint64_t offset, uint64_t n) override {
        if (!expose_memory_) {
            return {};
        }
        return {(*layers_)[layer].data() + offset, n};
    }

private:
    std::vector<std::vector<uint8_t>>* layers_;
    std::vector<uint8_t>* state_;
    bool expose_memory_;
};

struct Data {
    BeginMessage begin;
    std::vector<std::vector<uint8_t>> src_layers;
    std::vector<uint8_t> src_state;
    std::vector<std::vector<uint8_t>> dst_layers;
    std::vector<uint8_t> dst_state;
    uint64_t total_bytes = 0;
};

// One pass through dsi_transfer; returns seconds.
double transfer_pass(Data& d, uint64_t chunk_bytes, PeerTable& peers, uint64_t pass, bool zero_copy,
                     const char* transport_name) {
    auto transport = make_transport(transport_name);
    DSI_CHECK(transport.is_ok(), transport.status().to_string());
    auto listener = (*transport)->listen("127.0.0.1", 0);
    DSI_CHECK(listener.is_ok(), listener.status().to_string());
    ReceiveOptions ro;
    ro.self = {"decode-bench", PeerRole::kDecode, 1};
    Status receive_status;
    std::thread receiver([&] {
        auto conn = (*listener)->accept(std::chrono::seconds(30));
        DSI_CHECK(conn.is_ok(), conn.status().to_string());
        auto got = receive_sequence(
            **conn, ro, peers,
            [&d, zero_copy](const TransferId&,
                            const BeginMessage&) -> Result<std::unique_ptr<Destination>> {
                return std::unique_ptr<Destination>(
                    std::make_unique<FixedDestination>(&d.dst_layers, &d.dst_state, zero_copy));
            });
        receive_status = got.status();
    });
    SendOptions so;
    so.transfer_id = {pass, pass};
    so.self = {"prefill-bench", PeerRole::kPrefill, 1};
    so.chunk_bytes = chunk_bytes;
    std::vector<std::span<const uint8_t>> layers(d.src_layers.begin(), d.src_layers.end());
    SpanSource source(std::move(layers), {std::span<const uint8_t>(d.src_state)});
    const auto t0 = Clock::now();
    auto conn = (*transport)->connect("127.0.0.1", (*listener)->port(), std::chrono::seconds(30));
    DSI_CHECK(conn.is_ok(), conn.status().to_string());
    auto sent = send_sequence(**conn, so, d.begin, source);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    receiver.join();
    DSI_CHECK(sent.is_ok(), sent.status().to_string());
    DSI_CHECK(receive_status.is_ok(), receive_status.to_string());
    return s;
}

// One pass of the raw stream; returns seconds.
double raw_pass(Data& d, uint64_t chunk_bytes) {
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    DSI_CHECK(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    socklen_t len = sizeof addr;
    DSI_CHECK(getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    DSI_CHECK(listen(lfd, 1) == 0);
    std::thread receiver([&] {
        const int fd = accept(lfd, nullptr, nullptr);
        DSI_CHECK(fd >= 0);
        auto read_all = [fd](uint8_t* p, uint64_t n) {
            while (n > 0) {
                const ssize_t got = read(fd, p, n);
                DSI_CHECK(got > 0, "raw read failed");
                p += got;
                n -= static_cast<uint64_t>(got);
            }
        };
        read_all(d.dst_state.data(), d.dst_state.size());
        for (auto& l : d.dst_layers) {
            read_all(l.data(), l.size());
        }
        close(fd);
    });
    const auto t0 = Clock::now();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    DSI_CHECK(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    auto write_all = [fd, chunk_bytes](const uint8_t* p, uint64_t n) {
        while (n > 0) {
            const ssize_t put = write(fd, p, std::min(n, chunk_bytes));
            DSI_CHECK(put > 0, "raw write failed");
            p += put;
            n -= static_cast<uint64_t>(put);
        }
    };
    write_all(d.src_state.data(), d.src_state.size());
    for (const auto& l : d.src_layers) {
        write_all(l.data(), l.size());
    }
    receiver.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    close(fd);
    close(lfd);
    return s;
}

bool same_bytes(const Data& d) {
    return d.src_layers == d.dst_layers && d.src_state == d.dst_state;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
    const uint32_t num_layers = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 30;
    const uint64_t layer_bytes = (argc > 2 ? std::atoll(argv[2]) : 8192) * uint64_t{1024};
    const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
    const uint64_t chunk_bytes = (argc > 4 ? std::atoll(argv[4]) : 1024) * uint64_t{1024};

    Data d;
    SplitMix64 rng(20261203);
    auto fill = [&rng](std::vector<uint8_t>& v) {
        for (size_t i = 0; i + 8 <= v.size(); i += 8) {
            const uint64_t x = rng.next();
            std::memcpy(v.data() + i, &x, 8);
        }
    };
    d.begin.model_id = "bench";
    d.begin.num_tokens = 4096;
    d.begin.block_size_tokens = 128;
    for (uint32_t l = 0; l < num_layers; ++l) {
        d.src_layers.emplace_back(layer_bytes);
        fill(d.src_layers.back());
        d.dst_layers.emplace_back(layer_bytes, 0);
        d.begin.layer_bytes.push_back(layer_bytes);
    }
    d.src_state.resize(kStateBytes);
    fill(d.src_state);
    d.dst_state.assign(kStateBytes, 0);
    d.begin.state_sections.push_back({"swa_ring", kStateBytes});
    d.total_bytes = d.begin.total_bytes();

    const std::string lscpu = run_command("lscpu");
    auto line_of = [&lscpu](const char* key) {
        const auto at = lscpu.find(key);
        if (at == std::string::npos) {
            return std::string("?");
        }
        const auto end = lscpu.find('\n', at);
        return lscpu.substr(at, end - at);
    };
    std::printf(
        "# transfer_bench: %u layers x %llu KiB + %llu KiB state = %.1f MiB per pass, "
        "chunk %llu KiB, %d reps\n",
        num_layers, static_cast<unsigned long long>(layer_bytes >> 10),
        static_cast<unsigned long long>(kStateBytes >> 10),
        static_cast<double>(d.total_bytes) / (1 << 20),
        static_cast<unsigned long long>(chunk_bytes >> 10), reps);
    std::printf("# %s\n# %s\n# %s\n# uptime: %s", line_of("Model name").c_str(),
                line_of("CPU(s):").c_str(), line_of("Flags").c_str(),
                run_command("uptime").c_str());

    PeerTable peers;
    uint64_t pass = 1;
    // Three sides: dsi_transfer into exposed memory (zero-copy), dsi_transfer into a
    // write-only destination (each chunk copied from the decoder's buffer), raw TCP; and
    // the zero-copy transfer over UCX where it is built.
    enum Side { kZeroCopy, kCopy, kRaw, kUcx, kMaxSides };
    const int kNumSides = make_transport("ucx").is_ok() ? 4 : 3;
    const char* kSideNames[kMaxSides] = {
        "dsi_transfer, zero-copy receive", "dsi_transfer, write-only destination (copy)",
        "raw loopback TCP stream", "dsi_transfer over UCX (UCX_TLS=tcp), zero-copy receive"};
    auto run_side = [&](int side) {
        return side == kRaw ? raw_pass(d, chunk_bytes)
                            : transfer_pass(d, chunk_bytes, peers, pass++, side != kCopy,
                                            side == kUcx ? "ucx" : "tcp");
    };
    // Warm-up (every side), and the bit-exact check of each.
    for (int side = 0; side < kNumSides; ++side) {
        std::fill(d.dst_state.begin(), d.dst_state.end(), 0);
        for (auto& l : d.dst_layers) {
            std::fill(l.begin(), l.end(), 0);
        }
        run_side(side);
        DSI_CHECK(same_bytes(d), kSideNames[side], ": the bytes differ");
    }

    auto cpu_seconds = [] {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
               1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    };
    std::vector<double> gbs[kMaxSides], cpu[kMaxSides];
    const double gb = static_cast<double>(d.total_bytes) / 1e9;
    for (int r = 0; r < reps; ++r) {
        // Rotate which side goes first.
        for (int k = 0; k < kNumSides; ++k) {
            const int side = (r + k) % kNumSides;
            const double c0 = cpu_seconds();
            const double s = run_side(side);
            gbs[side].push_back(gb / s);
            cpu[side].push_back((cpu_seconds() - c0) / gb);
        }
    }
    DSI_CHECK(same_bytes(d));
    std::printf(
        "\n| path | GB/s median (min-max) | CPU s per GB, both ends (median) |\n"
        "|---|---|---|\n");
    for (int side = 0; side < kNumSides; ++side) {
        const auto& v = gbs[side];
        std::printf("| %s | %.2f (%.2f-%.2f) | %.3f |\n", kSideNames[side], median(v),
                    *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()),
                    median(cpu[side]));
    }
    std::printf("\nratio zero-copy / raw (medians): %.3f (goal >= 0.8)\n",
                median(gbs[kZeroCopy]) / median(gbs[kRaw]));
    std::printf("ratio copy / raw (medians): %.3f\n", median(gbs[kCopy]) / median(gbs[kRaw]));
    std::printf("CPU per GB, zero-copy / raw: %.3f\n", median(cpu[kZeroCopy]) / median(cpu[kRaw]));
    if (kNumSides > kUcx) {
        std::printf(
            "ratio UCX / raw (medians): %.3f; UCX / TCP transfer: %.3f; CPU per GB UCX / raw: "
            "%.3f\n",
            median(gbs[kUcx]) / median(gbs[kRaw]), median(gbs[kUcx]) / median(gbs[kZeroCopy]),
            median(cpu[kUcx]) / median(cpu[kRaw]));
    }
    std::printf("# uptime after: %s", run_command("uptime").c_str());
    return 0;
}

// EP dispatch + combine throughput across 2 processes (issue 19 figure: goal >= 0.7 of
// a memcpy of the same bytes), through comm::ShmMoeCommunicator.
//
// Two ranks (forked processes, rank r pinned to the r-th allowed CPU) of one shared-memory
// group. Each rank has TOKENS tokens of
// HIDDEN f32, routed uniformly at random to TOP_K distinct experts of 2 x EXPERTS_PER_RANK
// (about half the rows stay on the rank, half go to the peer; both go through the
// segment). One iteration = layout + dispatch + combine (the expert step is left out: the
// outputs are whatever the buffer holds). Bytes per iteration per rank: the dispatched
// rows TOKENS x TOP_K x HIDDEN x 4 plus the same again for the combined expert outputs.
// Baseline in the same run (the goal's reference): each rank memcpy's the same number of
// bytes (two copies of TOKENS x TOP_K x HIDDEN x 4 between private buffers of that size)
// at the same time as the other rank, the same number of iterations per repetition as the
// comm side. Second reference, what two cores can do at best: a cross-core copy of the
// same bytes — each rank copies TOKENS x TOP_K x HIDDEN x 4 from a private buffer into its
// half of a shared buffer, publishes it (a release store to its own flag line), waits for
// the peer's flag and copies the peer's half out into a private buffer (two copies per
// rank, the second one reading lines the other core wrote; two halves alternate by
// iteration). All three sides are warmed up (20 iterations, then a quarter of a repetition
// each), then the repetitions alternate memcpy, cross-core, comm, memcpy, ... (REPS each);
// each figure is the median over repetitions (min-max) of each rank's bytes/s; a ratio is
// the ratio of medians (the goal: comm / memcpy >= 0.7).
// Usage: comm_bench [TOKENS=128] [HIDDEN=2048] [TOP_K=8] [EXPERTS_PER_RANK=8] [REPS=5]
//                   [SECONDS_PER_REP=0.5] [STREAMING_MIN_BYTES=-1 (automatic)] [EXPERT=0] [UCX=1]
// EXPERT=1: a stand-in expert step between dispatch and combine (each received row copied
// to its output row), its time left out: the comm steps then find the caches as a real
// MoE layer leaves them (outputs dirty in the serving core's cache, received rows read).
// [UCX=1]: also the same calls through comm::UcxMoeCommunicator (ucx_group.h; TCP over
// loopback unless UCX_TLS says otherwise), a fourth side in the alternation with its own
// iteration count (rank 0's, from its warm-up), and a fifth, what loopback TCP itself
// does with those bytes: one socket between the ranks, each sending TOKENS x TOP_K x
// HIDDEN x 4 (about what crosses in a call: half the rows out, their outputs back) while
// receiving as much, both directions at once (non-blocking, poll). UCX=0 leaves both out.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "comm/shm_group.h"
#include "comm/ucx_group.h"

using namespace dsi;
using namespace dsi::comm;

namespace {

struct Config {
    int tokens = 128;
    int hidden = 2048;
    int top_k = 8;
    int experts_per_rank = 8;
    int reps = 5;
    double seconds_per_rep = 0.5;
    int64_t streaming_min_bytes = -1;  // ShmOptions::streaming_min_bytes (-1: automatic)
    bool expert = false;  // run a stand-in expert step between dispatch and combine (untimed)
    bool ucx = true;      // also measure the UCX communicator
    int ucx_port = 0;     // its coordinator's port on 127.0.0.1 (picked by the parent)
    int tcp_port = 0;     // the TCP reference's port on 127.0.0.1
};

constexpr int kRanks = 2;
constexpr int kMaxReps = 64;

// Per-rank results, in memory shared with the parent.
struct Shared {
    double memcpy_gbps[kRanks][kMaxReps];
    double xcore_gbps[kRanks][kMaxReps];
    double comm_gbps[kRanks][kMaxReps];
    double comm_us_per_iter[kRanks][kMaxReps];
    double ucx_gbps[kRanks][kMaxReps];
    double tcp_gbps[kRanks][kMaxReps];
    double ucx_us_per_iter[kRanks][kMaxReps];
    int64_t ucx_iters;
    int64_t iterations[kRanks][kMaxReps];
    double phase_us[kRanks][3];  // mean layout / dispatch / combine per call
    double ucx_phase_us[kRanks][3];
    int64_t iters;  // per repetition, both sides: agreed by rank 0 after the warm-up
};

// The cross-core reference's shared buffers: per rank two halves (by iteration parity) of
// `bytes` each, and each rank's published iteration on its own cache line.
struct CrossCore {
    struct alignas(64) Flag {
        std::atomic<int64_t> published{0};
    };
    Flag flags[kRanks];
    char* buffers = nullptr;  // [kRanks][2][bytes]
    size_t bytes = 0;
    char* half(int rank, int64_t iteration) {
        return buffers +
               (static_cast<size_t>(rank) * 2 + static_cast<size_t>(iteration % 2)) * bytes;
    }
};

volatile float g_sink = 0;

// The TCP reference's socket: rank 0 listens on `port` (loopback), rank 1 connects.
int tcp_pair(int rank, int port) {
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    at.sin_port = htons(static_cast<uint16_t>(port));
    const int one = 1;
    int fd = -1;
    if (rank == 0) {
        const int l = ::socket(AF_INET, SOCK_STREAM, 0);
        (void)::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(l, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 || ::listen(l, 1) != 0) {
            return -1;
        }
        fd = ::accept(l, nullptr, nullptr);
        ::close(l);
    } else {
        for (int tries = 0; tries < 500 && fd < 0; ++tries) {
            fd = ::socket(AF_INET, SOCK_STREAM, 0);
            if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) {
                ::close(fd);
                fd = -1;
                ::usleep(10'000);
            }
        }
    }
    if (fd >= 0) {
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        (void)::fcntl(fd, F_SETFL, O_NONBLOCK);
    }
    return fd;
}

// Sends `out` and receives `in` (same size) on `fd` at once; false on an error.
bool tcp_exchange(int fd, const char* out, char* in, size_t n) {
    size_t sent = 0, got = 0;
    while (sent < n || got < n) {
        pollfd p{fd, static_cast<short>((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0)), 0};
        if (::poll(&p, 1, 10'000) <= 0) {
            return false;
        }
        if (sent < n && (p.revents & POLLOUT)) {
            const ssize_t w = ::send(fd, out + sent, n - sent, MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN) {
                return false;
            }
            sent += w > 0 ? static_cast<size_t>(w) : 0;
        }
        if (got < n && (p.revents & POLLIN)) {
            const ssize_t r = ::recv(fd, in + got, n - got, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                return false;
            }
            got += r > 0 ? static_cast<size_t>(r) : 0;
        }
    }
    return true;
}

MoeShape shape_of(const Config& c) {
    MoeShape shape;
    shape.num_ranks = kRanks;
    shape.hidden = c.hidden;
    shape.top_k = c.top_k;
    shape.max_tokens_per_rank = c.tokens;
    shape.slots_per_rank = c.experts_per_rank;
    return shape;
}

// Rank r runs on the r-th CPU this process may use (when there are two): unpinned, the
// scheduler at times put both ranks on one core, where every wait spins out its time
// slice (runs bimodal by 5-10x), and the cross-core reference would not cross cores.
void pin_to_cpu(int rank) {
    cpu_set_t allowed;
    if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < kRanks) {
        return;
    }
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &allowed) && seen++ == rank) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            (void)::sched_setaffinity(0, sizeof(one), &one);
            return;
        }
    }
}

int run_rank(const Config& c, int rank, Shared* out, CrossCore* xc) {
    pin_to_cpu(rank);
    ShmOptions options;
    options.name = "dsi_comm_bench_" + std::to_string(::getppid());
    options.rank = rank;
    options.shape = shape_of(c);
    options.streaming_min_bytes = c.streaming_min_bytes;
    auto comm = ShmMoeCommunicator::create(options);
    if (!comm.is_ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().to_string().c_str());
        return 1;
    }
    std::unique_ptr<MoeCommunicator> ucx;
    if (c.ucx) {
        UcxGroupOptions uo;
        uo.coordinator = "127.0.0.1:" + std::to_string(c.ucx_port);
        uo.rank = rank;
        uo.shape = shape_of(c);
        auto made = create_ucx_communicator(uo);
        if (!made.is_ok()) {
            std::fprintf(stderr, "rank %d: %s\n", rank, made.status().to_string().c_str());
            return 1;
        }
        ucx = std::move(*made);
    }
    const int experts = kRanks * c.experts_per_rank;
    const PlacementTable placement =
        PlacementTable::identity(experts, kRanks, c.experts_per_rank).value();
    std::mt19937 rng(7 + rank);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t hidden = static_cast<size_t>(c.hidden);
    std::vector<float> x(static_cast<size_t>(c.tokens) * hidden);
    for (float& v : x) {
        v = u(rng);
    }
    // Eight routings used in turn (a new layout every iteration, as layers do).
    std::vector<std::vector<int32_t>> routings(8);
    std::vector<int> perm(static_cast<size_t>(experts));
    for (auto& ids : routings) {
        for (int t = 0; t < c.tokens; ++t) {
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            ids.insert(ids.end(), perm.begin(), perm.begin() + c.top_k);
        }
    }
    std::vector<float> gate(static_cast<size_t>(c.tokens) * c.top_k, 0.125f);
    std::vector<float> combined(x.size());
    const size_t copy_bytes = static_cast<size_t>(c.tokens) * c.top_k * hidden * sizeof(float);
    std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 2), src2(copy_bytes, 3),
        dst2(copy_bytes, 4);
    const double bytes_per_iter = 2.0 * static_cast<double>(copy_bytes);

    int64_t phase_ns[3] = {0, 0, 0};  // layout, dispatch, combine (each incl. its barrier)
    int64_t ucx_phase_ns[3] = {0, 0, 0};
    int64_t expert_ns = 0;  // the stand-in expert step (EXPERT=1), left out
    auto one_call = [&](MoeCommunicator* m, int64_t* phases, int64_t i) -> bool {
        const int64_t t0 = steady_clock_ns();
        auto layout = m->layout(placement, routings[static_cast<size_t>(i % 8)], c.tokens,
                                ReplicaChoice::kFirst);
        if (!layout.is_ok()) {
            return false;
        }
        const int64_t t1 = steady_clock_ns();
        auto view = m->dispatch(*layout, x);
        if (!view.is_ok()) {
            return false;
        }
        int64_t t2 = steady_clock_ns();
        if (c.expert) {
            // Stand-in expert: reads every received row and writes its output row (a copy),
            // so that combine finds the outputs where a real expert leaves them (in the
            // serving core's cache) and dispatch's rows have been read by their receiver.
            // Not counted in the comm time.
            const std::span<float> y = m->expert_output_buffer(*layout);
            std::memcpy(y.data(), view->rows.data(), view->rows.size_bytes());
            const int64_t t2e = steady_clock_ns();
            expert_ns += t2e - t2;
            t2 = t2e;
        }
        const bool ok =
            m->combine(*layout, m->expert_output_buffer(*layout), gate, combined).is_ok();
        const int64_t t3 = steady_clock_ns();
        phases[0] += t1 - t0;
        phases[1] += t2 - t1;
        phases[2] += t3 - t2;
        return ok;
    };
    auto one_comm = [&](int64_t i) { return one_call(comm->get(), phase_ns, i); };
    auto one_ucx = [&](int64_t i) { return one_call(ucx.get(), ucx_phase_ns, i); };
    // Cross-core copy: iteration s writes this rank's half s % 2; the peer reads it after
    // seeing s published. The peer is done reading half s % 2 of iteration s - 2 once it has
    // published s - 1 (it publishes only after its copy-out), which this rank waited for.
    int64_t xcore_seq = 0;
    auto one_xcore = [&](int64_t) -> bool {
        const int64_t s = ++xcore_seq;
        std::memcpy(xc->half(rank, s), src.data(), copy_bytes);
        xc->flags[rank].published.store(s, std::memory_order_release);
        const int64_t give_up = steady_clock_ns() + 10'000'000'000;
        for (int spins = 0; xc->flags[1 - rank].published.load(std::memory_order_acquire) < s;) {
            if (++spins % 1024 == 0 && steady_clock_ns() > give_up) {
                return false;  // the peer failed
            }
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        }
        std::memcpy(dst2.data(), xc->half(1 - rank, s), copy_bytes);
        g_sink = g_sink + static_cast<float>(dst2[copy_bytes / 3]);
        return true;
    };
    auto one_memcpy = [&](int64_t) -> bool {
        std::memcpy(dst.data(), src.data(), copy_bytes);
        std::memcpy(dst2.data(), src2.data(), copy_bytes);
        g_sink = g_sink + static_cast<float>(dst[copy_bytes / 2] + dst2[copy_bytes / 3]);
        return true;
    };
    // Rank 0 decides the iteration count of each repetition (from the warm-up speed) so
    // both ranks run the same number of collective iterations.
    auto timed = [&](auto&& one, int64_t iters) -> double {
        if (!(*comm)->barrier().is_ok()) {
            return -1;
        }
        const int64_t t0 = steady_clock_ns();
        const int64_t expert0 = expert_ns;
        for (int64_t i = 0; i < iters; ++i) {
            if (!one(i)) {
                return -1;
            }
        }
        return static_cast<double>(steady_clock_ns() - t0 - (expert_ns - expert0)) * 1e-9;
    };
    // Warm-up of both sides; sizes the repetitions the same way on both ranks.
    const double warm_comm = timed(one_comm, 20);
    const double warm_copy = timed(one_memcpy, 20);
    const double warm_xcore = timed(one_xcore, 20);
    const double warm_ucx = c.ucx ? timed(one_ucx, 20) : 1.0;
    const int tcp_fd = c.ucx ? tcp_pair(rank, c.tcp_port) : -1;
    auto one_tcp = [&](int64_t) {
        return tcp_exchange(tcp_fd, src.data(), dst.data(), copy_bytes);
    };
    const double warm_tcp = c.ucx ? timed(one_tcp, 20) : 1.0;
    if (warm_comm < 0 || warm_copy < 0 || warm_xcore < 0 || warm_ucx < 0 || warm_tcp < 0) {
        return 2;
    }
    // Collective steps need the same iteration count on both ranks: rank 0's, from its
    // warm-up of the comm side, through the shared page. The memcpy side runs as many.
    if (rank == 0) {
        out->iters =
            std::max<int64_t>(10, static_cast<int64_t>(c.seconds_per_rep / (warm_comm / 20)));
        out->ucx_iters =
            std::max<int64_t>(10, static_cast<int64_t>(c.seconds_per_rep / (warm_ucx / 20)));
    }
    if (!(*comm)->barrier().is_ok()) {
        return 2;
    }
    const int64_t agreed_comm_iters = out->iters;
    const int64_t copy_iters = agreed_comm_iters;
    const int64_t ucx_iters = out->ucx_iters;
    if (timed(one_comm, agreed_comm_iters / 4) < 0 || timed(one_memcpy, copy_iters / 4) < 0 ||
        timed(one_xcore, copy_iters / 4) < 0 ||
        (c.ucx && (timed(one_ucx, ucx_iters / 4) < 0 || timed(one_tcp, ucx_iters / 4) < 0))) {
        return 2;
    }
    std::fill(phase_ns, phase_ns + 3, 0);
    std::fill(ucx_phase_ns, ucx_phase_ns + 3, 0);
    for (int r = 0; r < c.reps; ++r) {
        const double copy_s = timed(one_memcpy, copy_iters);
        const double xcore_s = timed(one_xcore, copy_iters);
        const double comm_s = timed(one_comm, agreed_comm_iters);
        const double ucx_s = c.ucx ? timed(one_ucx, ucx_iters) : 1.0;
        const double tcp_s = c.ucx ? timed(one_tcp, ucx_iters) : 1.0;
        if (copy_s < 0 || xcore_s < 0 || comm_s < 0 || ucx_s < 0 || tcp_s < 0) {
            return 3;
        }
        out->tcp_gbps[rank][r] = bytes_per_iter * static_cast<double>(ucx_iters) / tcp_s / 1e9;
        out->ucx_gbps[rank][r] = bytes_per_iter * static_cast<double>(ucx_iters) / ucx_s / 1e9;
        out->ucx_us_per_iter[rank][r] = ucx_s * 1e6 / static_cast<double>(ucx_iters);
        out->memcpy_gbps[rank][r] = bytes_per_iter * static_cast<double>(copy_iters) / copy_s / 1e9;
        out->xcore_gbps[rank][r] = bytes_per_iter * static_cast<double>(copy_iters) / xcore_s / 1e9;
        out->comm_gbps[rank][r] =
            bytes_per_iter * static_cast<double>(agreed_comm_iters) / comm_s / 1e9;
        out->comm_us_per_iter[rank][r] = comm_s * 1e6 / static_cast<double>(agreed_comm_iters);
        out->iterations[rank][r] = agreed_comm_iters;
    }
    for (int p = 0; p < 3; ++p) {
        out->phase_us[rank][p] = static_cast<double>(phase_ns[p]) / 1e3 /
                                 static_cast<double>(agreed_comm_iters * c.reps);
        out->ucx_phase_us[rank][p] =
            static_cast<double>(ucx_phase_ns[p]) / 1e3 / static_cast<double>(ucx_iters * c.reps);
    }
    return 0;
}

struct Stat {
    double median, min, max;
};

Stat summarize(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

}  // namespace

int main(int argc, char** argv) {
    Config c;
    if (argc > 1) c.tokens = std::atoi(argv[1]);
    if (argc > 2) c.hidden = std::atoi(argv[2]);
    if (argc > 3) c.top_k = std::atoi(argv[3]);
    if (argc > 4) c.experts_per_rank = std::atoi(argv[4]);
    if (argc > 5) c.reps = std::clamp(std::atoi(argv[5]), 3, kMaxReps);
    if (argc > 6) c.seconds_per_rep = std::atof(argv[6]);
    if (argc > 7) c.streaming_min_bytes = std::atoll(argv[7]);
    if (argc > 8) c.expert = std::atoi(argv[8]) != 0;
    if (argc > 9) c.ucx = std::atoi(argv[9]) != 0;
    if (c.ucx) {
        auto port = pick_free_port("127.0.0.1");
        if (!port.is_ok()) {
            std::fprintf(stderr, "comm_bench: %s\n", port.status().to_string().c_str());
            return 1;
        }
        c.ucx_port = *port;
        auto port2 = pick_free_port("127.0.0.1");
        if (!port2.is_ok() || *port2 == c.ucx_port) {
            std::fprintf(stderr, "comm_bench: no second free port\n");
            return 1;
        }
        c.tcp_port = *port2;
    }
    auto* shared = static_cast<Shared*>(
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (shared == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    std::memset(shared, 0, sizeof(Shared));
    const size_t xcore_bytes = static_cast<size_t>(c.tokens) * c.top_k * c.hidden * sizeof(float);
    void* xmem = ::mmap(nullptr, sizeof(CrossCore) + xcore_bytes * kRanks * 2,
                        PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (xmem == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    auto* xc = new (xmem) CrossCore;
    xc->bytes = xcore_bytes;
    xc->buffers = static_cast<char*>(xmem) + sizeof(CrossCore);
    const MoeShape shape = shape_of(c);
    std::printf(
        "comm_bench: 2 ranks, %d tokens/rank, hidden %d, top_k %d, %d experts/rank, "
        "%d reps, segment %.1f MiB%s\n",
        c.tokens, c.hidden, c.top_k, c.experts_per_rank, c.reps,
        static_cast<double>(ShmMoeCommunicator::segment_bytes(shape)) / (1 << 20),
        c.expert ? ", stand-in expert step (untimed)" : "");
    std::fflush(stdout);
    std::vector<pid_t> pids;
    for (int r = 0; r < kRanks; ++r) {
        pid_t pid = ::fork();
        if (pid == 0) {
            ::_exit(run_rank(c, r, shared, xc));
        }
        pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    (void)ShmMoeCommunicator::unlink("dsi_comm_bench_" + std::to_string(::getpid()));
    if (failed > 0) {
        std::fprintf(stderr, "comm_bench: %d rank(s) failed\n", failed);
        return 1;
    }
    for (int rank = 0; rank < kRanks; ++rank) {
        std::vector<double> copy(shared->memcpy_gbps[rank], shared->memcpy_gbps[rank] + c.reps);
        std::vector<double> xcore(shared->xcore_gbps[rank], shared->xcore_gbps[rank] + c.reps);
        std::vector<double> comm(shared->comm_gbps[rank], shared->comm_gbps[rank] + c.reps);
        std::vector<double> us(shared->comm_us_per_iter[rank],
                               shared->comm_us_per_iter[rank] + c.reps);
        const Stat sc = summarize(copy), sx = summarize(xcore), sm = summarize(comm),
                   su = summarize(us);
        std::printf(
            "rank %d: memcpy %.2f GB/s (%.2f-%.2f) | cross-core copy %.2f GB/s "
            "(%.2f-%.2f) | dispatch+combine %.2f GB/s (%.2f-%.2f), %.1f us/call "
            "(%.1f-%.1f), %lld calls/rep | ratio %.2f (goal >= 0.7), vs cross-core "
            "%.2f\n",
            rank, sc.median, sc.min, sc.max, sx.median, sx.min, sx.max, sm.median, sm.min, sm.max,
            su.median, su.min, su.max, static_cast<long long>(shared->iterations[rank][0]),
            sm.median / sc.median, sm.median / sx.median);
        std::printf(
            "rank %d: per call (mean, incl. barriers): layout %.1f us, dispatch %.1f us, "
            "combine %.1f us\n",
            rank, shared->phase_us[rank][0], shared->phase_us[rank][1], shared->phase_us[rank][2]);
        if (c.ucx) {
            const Stat ug = summarize(
                std::vector<double>(shared->ucx_gbps[rank], shared->ucx_gbps[rank] + c.reps));
            const Stat uu = summarize(std::vector<double>(shared->ucx_us_per_iter[rank],
                                                          shared->ucx_us_per_iter[rank] + c.reps));
            const Stat ut = summarize(
                std::vector<double>(shared->tcp_gbps[rank], shared->tcp_gbps[rank] + c.reps));
            std::printf(
                "rank %d: loopback TCP of the crossing bytes %.2f GB/s (%.2f-%.2f) | ucx "
                "vs tcp %.3f\n",
                rank, ut.median, ut.min, ut.max, ug.median / ut.median);
            std::printf(
                "rank %d: ucx dispatch+combine %.2f GB/s (%.2f-%.2f), %.1f us/call "
                "(%.1f-%.1f), %lld calls/rep | vs memcpy %.3f, vs shm %.3f | layout %.1f "
                "us, dispatch %.1f us, combine %.1f us\n",
                rank, ug.median, ug.min, ug.max, uu.median, uu.min, uu.max,
                static_cast<long long>(shared->ucx_iters), ug.median / sc.median,
                ug.median / sm.median, shared->ucx_phase_us[rank][0], shared->ucx_phase_us[rank][1],
                shared->ucx_phase_us[rank][2]);
        }
    }
    return 0;
}

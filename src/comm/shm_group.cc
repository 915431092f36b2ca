// Shared-memory EP group (issue 19). The layout and protocol are in shm_group.h and
// docs/comm.md; this file says why where it is not obvious.
#include "comm/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

#include "base/clock.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dsi::comm {
namespace {

constexpr uint64_t kMagic = 0x4d4d4f434d495344ULL;  // "DSIMCOMM" little-endian
// 2: all_gather values in the control block; 3: the sleeper count beside the futex word.
constexpr uint32_t kVersion = 3;
constexpr size_t kPage = 4096;
constexpr uint32_t kStateAttached = 1, kStateLeft = 2;
constexpr int kSpinIterations = 2000;    // before sleeping on the futex
constexpr int64_t kSleepSliceNs = 5'000'000;  // liveness and deadline checks between slices

struct Header {
    uint64_t magic;
    uint32_t version;
    uint32_t num_ranks;
    uint32_t hidden;
    uint32_t top_k;
    uint32_t max_tokens_per_rank;
    uint32_t slots_per_rank;
    int64_t recv_capacity;
    int64_t total_bytes;
    // The futex word and the number of ranks sleeping on it, on their own cache line: a
    // publish touches them only when someone sleeps (see wait_all).
    alignas(64) uint32_t wake;
    uint32_t sleepers;
};
static_assert(sizeof(Header) <= kPage);

struct alignas(64) Control {
    uint32_t pid;          // 0 = not attached
    uint32_t state;        // kStateAttached / kStateLeft
    uint64_t seq;          // barriers this rank has passed its half of
    uint64_t start_ticks;  // the process's start time (/proc stat field 22), 0 if unknown
    int64_t gather[2];     // all_gather values, by the parity of the gather
};
static_assert(sizeof(Control) == 64);

template <typename T>
std::atomic_ref<T> at(T& x) {
    return std::atomic_ref<T>(x);
}

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Byte offsets of one rank's buffer set (one parity).
struct BlockLayout {
    size_t counts = 0, origins = 0, rows = 0, outs = 0, bytes = 0;
    size_t control_end = 0;
};

BlockLayout block_layout(const MoeShape& s) {
    BlockLayout b;
    const size_t cap = static_cast<size_t>(s.recv_capacity());
    const size_t row_bytes = static_cast<size_t>(s.hidden) * sizeof(float);
    const size_t counts_bytes =
        round_up(sizeof(int32_t) * static_cast<size_t>(s.num_ranks) * (1 + s.slots_per_rank), kPage);
    const size_t origins_bytes = round_up(sizeof(RowOrigin) * cap, kPage);
    const size_t rows_bytes = round_up(row_bytes * cap, kPage);
    b.counts = 0;
    b.origins = counts_bytes;
    b.rows = b.origins + origins_bytes;
    b.outs = b.rows + rows_bytes;
    b.bytes = b.outs + rows_bytes;
    b.control_end = kPage + round_up(sizeof(Control) * static_cast<size_t>(s.num_ranks), kPage);
    return b;
}

bool valid_name(const std::string& name) {
    if (name.empty() || name.size() > 200 || name == "." || name == "..") {
        return false;
    }
    return std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
    });
}

// /proc/PID/stat after the command name: the state letter (field 3) and the start time in
// clock ticks (field 22). state 0 when unreadable.
struct ProcStat {
    char state = 0;
    uint64_t start_ticks = 0;
};

ProcStat read_proc_stat(const std::string& pid) {
    // read(2), not a stream: the process may exit mid-read (ESRCH), and libstdc++'s
    // filebuf throws on that.
    std::string text;
    const int fd = ::open(("/proc/" + pid + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[1024];
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        ::close(fd);
        text.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
    }
    const size_t close = text.rfind(')');  // the name may hold spaces and parentheses
    ProcStat st;
    if (close == std::string::npos || close + 2 >= text.size()) {
        return st;
    }
    st.state = text[close + 2];
    const char* p = text.c_str() + close + 2;
    for (int field = 3; field < 22 && p != nullptr; ++field) {
        p = std::strchr(p, ' ');
        p = p != nullptr ? p + 1 : nullptr;
    }
    st.start_ticks = p != nullptr ? std::strtoull(p, nullptr, 10) : 0;
    return st;
}

// A process that exists, is not a zombie (a SIGKILLed rank stays a zombie until its parent
// reaps it, and kill(pid, 0) still succeeds on a zombie) and, when `start_ticks` is known,
// started when the rank did (so a reused pid is not taken for the rank).
bool process_alive(uint32_t pid, uint64_t start_ticks) {
    if (pid == 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) {
        return false;
    }
    const ProcStat st = read_proc_stat(std::to_string(pid));
    if (st.state == 0) {
        return true;  // no /proc: trust kill()
    }
    return st.state != 'Z' && st.state != 'X' &&
           (start_ticks == 0 || st.start_ticks == start_ticks);
}

void futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) {
    timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
                static_cast<long>(timeout_ns % 1'000'000'000)};
    // Not FUTEX_PRIVATE: the word is shared between processes.
    ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) { ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// The bytes above which a dispatch writes its rows with streaming stores
// (ShmOptions::streaming_min_bytes when >= 0): twice this core's L2. Below, plain stores
// are faster: the rows stay in the caches the receiver pulls them from, and those serve
// the read-for-ownership. Measured on the 2-core VM (bench/RESULTS.md, "EP dispatch +
// combine", 2026-12-04; 1 MiB L2): at 1-8 tokens x 7168 x top-8 (0.2-1.8 MB sent per rank)
// plain stores win, at 16 tokens (3.7 MB) streaming does. The L2, not the L3: this VM's
// cpuid reports a 320 MiB L3 (sysconf) that is not there.
size_t streaming_threshold(int64_t option) {
    if (option >= 0) {
        return static_cast<size_t>(option);
    }
    static const size_t automatic = [] {
        const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
        return 2 * static_cast<size_t>(l2 > 0 ? l2 : 1L << 20);
    }();
    return automatic;
}

// Copies one row into the segment. With `stream`, on x86-64 with 16-byte aligned rows:
// streaming (non-temporal) stores — the rows are read by another core after the barrier,
// not by this one, so writing around the cache saves the read-for-ownership of every line
// (what glibc's memcpy does for large copies too). REQUIRES: stream_fence() before the
// rows are published.
void copy_row(float* dst, const float* src, size_t n, bool stream) {
#if defined(__x86_64__)
    if (stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && n % 16 == 0) {
        for (size_t i = 0; i < n; i += 16) {
            _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
            _mm_stream_ps(dst + i + 4, _mm_loadu_ps(src + i + 4));
            _mm_stream_ps(dst + i + 8, _mm_loadu_ps(src + i + 8));
            _mm_stream_ps(dst + i + 12, _mm_loadu_ps(src + i + 12));
        }
        return;
    }
#endif
    std::memcpy(dst, src, n * sizeof(float));
}

// Streaming stores are not ordered by the release store that publishes them.
void stream_fence() {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Status check_shape(const Header& h, const MoeShape& s, int64_t total) {
    auto differs = [](const char* field, int64_t here, int64_t there) {
        return failed_precondition("segment layout differs: " + std::string(field) + " " +
                                   std::to_string(here) + " here, " + std::to_string(there) +
                                   " in the segment");
    };
    if (h.version != kVersion) {
        return differs("version", kVersion, h.version);
    }
    if (h.num_ranks != static_cast<uint32_t>(s.num_ranks)) {
        return differs("ranks", s.num_ranks, h.num_ranks);
    }
    if (h.hidden != static_cast<uint32_t>(s.hidden)) {
        return differs("hidden", s.hidden, h.hidden);
    }
    if (h.top_k != static_cast<uint32_t>(s.top_k)) {
        return differs("top_k", s.top_k, h.top_k);
    }
    if (h.max_tokens_per_rank != static_cast<uint32_t>(s.max_tokens_per_rank)) {
        return differs("max tokens per rank", s.max_tokens_per_rank, h.max_tokens_per_rank);
    }
    if (h.slots_per_rank != static_cast<uint32_t>(s.slots_per_rank)) {
        return differs("slots per rank", s.slots_per_rank, h.slots_per_rank);
    }
    if (h.recv_capacity != s.recv_capacity()) {
        return differs("receive capacity", s.recv_capacity(), h.recv_capacity);
    }
    if (h.total_bytes != total) {
        return differs("bytes", total, h.total_bytes);
    }
    return Status::ok();
}

}  // namespace

struct ShmMoeCommunicator::Segment {
    std::byte* base = nullptr;
    size_t bytes = 0;
    BlockLayout b;
    int num_ranks = 0;

    ~Segment() {
        if (base != nullptr) {
            ::munmap(base, bytes);
        }
    }
    Header& header() { return *reinterpret_cast<Header*>(base); }
    Control& control(int r) { return reinterpret_cast<Control*>(base + kPage)[r]; }
    std::byte* block(int r, uint64_t call) {
        return base + b.control_end + (static_cast<size_t>(r) * 2 + call % 2) * b.bytes;
    }
    int32_t* counts(int r, uint64_t call) { return reinterpret_cast<int32_t*>(block(r, call) + b.counts); }
    RowOrigin* origins(int r, uint64_t call) {
        return reinterpret_cast<RowOrigin*>(block(r, call) + b.origins);
    }
    float* rows(int r, uint64_t call) { return reinterpret_cast<float*>(block(r, call) + b.rows); }
    float* outs(int r, uint64_t call) { return reinterpret_cast<float*>(block(r, call) + b.outs); }
};

int64_t ShmMoeCommunicator::segment_bytes(const MoeShape& shape) {
    const BlockLayout b = block_layout(shape);
    return static_cast<int64_t>(b.control_end + b.bytes * 2 * static_cast<size_t>(shape.num_ranks));
}

Status ShmMoeCommunicator::unlink(const std::string& name) {
    if (!valid_name(name)) {
        return invalid_argument("shm group: bad segment name '" + name + "'");
    }
    if (::shm_unlink(("/" + name).c_str()) != 0) {
        return errno == ENOENT ? not_found("shm group: no segment " + name)
                               : internal_error(errno_text("shm_unlink"));
    }
    return Status::ok();
}

namespace {

// Rank 0: a fresh segment, initialised, magic stored last (release) so an attaching rank
// that sees the magic sees the whole header.
Result<std::byte*> create_segment(const std::string& path, const MoeShape& shape, size_t total) {
    int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST) {
            return Status(StatusCode::kAlreadyExists,
                          "shm group: segment " + path +
                              " exists (another group, or one that never formed: unlink it)");
        }
        return internal_error(errno_text("shm_open"));
    }
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
        Status s = internal_error(errno_text("ftruncate") + " (" + std::to_string(total) + " bytes)");
        ::close(fd);
        ::shm_unlink(path.c_str());
        return s;
    }
    // Reserve the pages now: a sparse segment larger than what /dev/shm can hold would
    // SIGBUS on first touch in the middle of a step instead of failing here. (It also
    // takes the page faults out of the first steps.)
    if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
        Status s = err == ENOSPC || err == ENOMEM
                       ? resource_exhausted("shm group: cannot reserve " + std::to_string(total) +
                                            " bytes of shared memory (" + std::strerror(err) +
                                            "); lower max_recv_rows or max tokens")
                       : internal_error(std::string("posix_fallocate: ") + std::strerror(err));
        ::close(fd);
        ::shm_unlink(path.c_str());
        return s;
    }
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
        ::shm_unlink(path.c_str());
        return internal_error(errno_text("mmap"));
    }
    auto& h = *static_cast<Header*>(p);
    h.version = kVersion;
    h.num_ranks = static_cast<uint32_t>(shape.num_ranks);
    h.hidden = static_cast<uint32_t>(shape.hidden);
    h.top_k = static_cast<uint32_t>(shape.top_k);
    h.max_tokens_per_rank = static_cast<uint32_t>(shape.max_tokens_per_rank);
    h.slots_per_rank = static_cast<uint32_t>(shape.slots_per_rank);
    h.recv_capacity = shape.recv_capacity();
    h.total_bytes = static_cast<int64_t>(total);
    at(h.magic).store(kMagic, std::memory_order_release);
    return static_cast<std::byte*>(p);
}

// Ranks > 0: open the segment rank 0 creates, retrying until the deadline; then check
// that it is the layout this rank expects.
Result<std::byte*> attach_segment(const std::string& path, const MoeShape& shape, size_t total,
                                  int64_t deadline_ns, const std::function<bool()>& abandoned) {
    for (;; std::this_thread::sleep_for(std::chrono::milliseconds(1))) {
        if (steady_clock_ns() > deadline_ns) {
            return deadline_exceeded("shm group: segment " + path +
                                     " did not appear (or was not initialised) in time");
        }
        if (abandoned && abandoned()) {
            return unavailable("shm group: segment " + path +
                               ": the group was abandoned while this rank attached");
        }
        int fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
            if (errno == ENOENT) {
                continue;
            }
            return internal_error(errno_text("shm_open"));
        }
        struct stat st {};
        if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kPage) {
            ::close(fd);
            continue;  // rank 0 has not sized it yet
        }
        void* hp = ::mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
        if (hp == MAP_FAILED) {
            ::close(fd);
            return internal_error(errno_text("mmap"));
        }
        auto& h = *static_cast<Header*>(hp);
        const uint64_t magic = at(h.magic).load(std::memory_order_acquire);
        Status s = magic == kMagic   ? check_shape(h, shape, static_cast<int64_t>(total))
                   : magic == 0      ? Status(StatusCode::kUnavailable, "")
                                     : failed_precondition("shm group: " + path +
                                                           " is not an EP group segment");
        ::munmap(hp, kPage);
        if (s.code() == StatusCode::kUnavailable) {
            ::close(fd);
            continue;  // not initialised yet
        }
        if (!s.is_ok() || static_cast<size_t>(st.st_size) != total) {
            ::close(fd);
            return s.is_ok() ? failed_precondition("shm group: segment size differs") : s;
        }
        void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) {
            return internal_error(errno_text("mmap"));
        }
        return static_cast<std::byte*>(p);
    }
}

}  // namespace

Result<std::unique_ptr<ShmMoeCommunicator>> ShmMoeCommunicator::create(
    const ShmOptions& options) {
    DSI_RETURN_IF_ERROR(options.shape.validate());
    if (!valid_name(options.name)) {
        return invalid_argument("shm group: bad segment name '" + options.name +
                                "' (letters, digits, '_', '.', '-')");
    }
    if (options.rank < 0 || options.rank >= options.shape.num_ranks) {
        return invalid_argument("shm group: rank " + std::to_string(options.rank) + " not in [0, " +
                                std::to_string(options.shape.num_ranks) + ")");
    }
    const std::string path = "/" + options.name;
    const size_t total = static_cast<size_t>(segment_bytes(options.shape));
    const int64_t deadline = steady_clock_ns() + options.attach_timeout_ms * 1'000'000;
    auto seg = std::make_unique<Segment>();
    seg->bytes = total;
    seg->b = block_layout(options.shape);
    seg->num_ranks = options.shape.num_ranks;
    if (options.rank == 0) {
        DSI_ASSIGN_OR_RETURN(seg->base, create_segment(path, options.shape, total));
    } else {
        DSI_ASSIGN_OR_RETURN(
            seg->base, attach_segment(path, options.shape, total, deadline, options.abandoned));
    }
    Control& mine = seg->control(options.rank);
    uint32_t expected = 0;
    if (!at(mine.pid).compare_exchange_strong(expected, static_cast<uint32_t>(::getpid()))) {
        return Status(StatusCode::kAlreadyExists,
                      "shm group: rank " + std::to_string(options.rank) +
                          " is attached already (pid " + std::to_string(expected) + ")");
    }
    at(mine.start_ticks).store(read_proc_stat("self").start_ticks, std::memory_order_relaxed);
    at(mine.state).store(kStateAttached, std::memory_order_release);
    // Join: every rank attached, or the deadline.
    for (;;) {
        std::string missing;
        for (int r = 0; r < options.shape.num_ranks; ++r) {
            if (at(seg->control(r).pid).load(std::memory_order_acquire) == 0) {
                missing += (missing.empty() ? "" : ",") + std::to_string(r);
            }
        }
        if (missing.empty()) {
            break;
        }
        const bool abandoned = options.abandoned && options.abandoned();
        if (abandoned || steady_clock_ns() > deadline) {
            if (options.rank == 0) {
                ::shm_unlink(path.c_str());
            }
            at(mine.state).store(kStateLeft, std::memory_order_release);
            if (abandoned) {
                return unavailable("shm group " + options.name + ": abandoned while ranks " +
                                   missing + " had not attached");
            }
            return deadline_exceeded("shm group " + options.name + ": ranks " + missing +
                                     " did not attach within " +
                                     std::to_string(options.attach_timeout_ms) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (options.rank == 0) {
        // Everyone has it mapped: drop the name so a crash leaves nothing behind.
        ::shm_unlink(path.c_str());
    }
    return std::unique_ptr<ShmMoeCommunicator>(new ShmMoeCommunicator(options, std::move(seg)));
}

ShmMoeCommunicator::ShmMoeCommunicator(const ShmOptions& options, std::unique_ptr<Segment> segment)
    : rank_(options.rank), shape_(options.shape), options_(options), seg_(std::move(segment)) {}

ShmMoeCommunicator::~ShmMoeCommunicator() { mark_left(); }

void ShmMoeCommunicator::mark_left() {
    // Wakes every sleeper unconditionally: leaving is rare, and a peer that is about to
    // sleep sees the state at its next check.
    at(seg_->control(rank_).state).store(kStateLeft, std::memory_order_seq_cst);
    at(seg_->header().wake).fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&seg_->header().wake);
}

Status ShmMoeCommunicator::leave_group(Status status) {
    // The peers are inside this call's collective steps: leaving makes their waits end
    // with UNAVAILABLE now instead of at their deadline.
    if (broken_.is_ok()) {
        broken_ = status;
        mark_left();
    }
    return status;
}

int ShmMoeCommunicator::first_behind(uint64_t target, std::memory_order order) {
    for (int r = 0; r < shape_.num_ranks; ++r) {
        if (at(seg_->control(r).seq).load(order) < target) {
            return r;
        }
    }
    return -1;
}

Status ShmMoeCommunicator::wait_all(uint64_t target, const char* step, int64_t timeout_ms) {
    // Publish this rank's half of the barrier. The futex word is bumped and woken only when
    // a rank sleeps on it: most barriers of a busy group end while spinning, and then a
    // publish is one store to this rank's own control line (no syscall, no shared line
    // bounced between the ranks). The store and the sleeper count are sequentially
    // consistent, as is the sleeper's increment before it reads the word and the numbers:
    // either this rank sees the sleeper (and wakes it) or the sleeper sees this number.
    Header& h = seg_->header();
    at(seg_->control(rank_).seq).store(target, std::memory_order_seq_cst);
    if (at(h.sleepers).load(std::memory_order_seq_cst) != 0) {
        at(h.wake).fetch_add(1, std::memory_order_seq_cst);
        futex_wake_all(&h.wake);
    }
    for (int spins = 0; spins < kSpinIterations; ++spins) {
        if (first_behind(target, std::memory_order_acquire) < 0) {
            return Status::ok();
        }
        cpu_relax();
    }
    if (timeout_ms <= 0) {
        timeout_ms = options_.op_timeout_ms;
    }
    const int64_t start = steady_clock_ns();
    const int64_t deadline = start + timeout_ms * 1'000'000;
    // The first check of the peer's process comes after one slice asleep: a barrier that
    // ends after the spin does not pay for reading /proc.
    int64_t next_liveness_check = start + kSleepSliceNs;
    for (;;) {
        at(h.sleepers).fetch_add(1, std::memory_order_seq_cst);
        const uint32_t seen = at(h.wake).load(std::memory_order_seq_cst);
        int waiting_for = first_behind(target, std::memory_order_seq_cst);
        const int64_t now = steady_clock_ns();
        const int64_t wake_at = std::min(next_liveness_check, deadline);
        if (waiting_for >= 0 && now < wake_at) {
            futex_wait(&h.wake, seen, wake_at - now);
            waiting_for = first_behind(target, std::memory_order_acquire);
        }
        at(h.sleepers).fetch_sub(1, std::memory_order_relaxed);
        if (waiting_for < 0) {
            return Status::ok();
        }
        // A peer that left (cheap to see) is checked at every wake-up; its process (a read
        // of /proc) once per slice.
        Control& peer = seg_->control(waiting_for);
        const bool left = at(peer.state).load(std::memory_order_acquire) == kStateLeft;
        const int64_t after = steady_clock_ns();
        if (!left && after < next_liveness_check && after <= deadline) {
            continue;
        }
        next_liveness_check = after + kSleepSliceNs;
        const uint32_t pid = at(peer.pid).load(std::memory_order_acquire);
        const bool gone =
            left || !process_alive(pid, at(peer.start_ticks).load(std::memory_order_relaxed));
        // A peer may publish and then exit between the scan above and this check: look at
        // its number again before calling it gone.
        if (gone && at(peer.seq).load(std::memory_order_acquire) >= target) {
            continue;
        }
        const std::string who = "shm group " + options_.name + ", " + step + ": rank " +
                                std::to_string(waiting_for);
        if (left) {
            return broken_ = unavailable(who + " left the group");
        }
        if (gone) {
            return broken_ = unavailable(who + " (pid " + std::to_string(pid) + ") is gone");
        }
        if (after > deadline) {
            return broken_ = deadline_exceeded(who + " did not arrive within " +
                                               std::to_string(timeout_ms) + " ms");
        }
    }
}

Status ShmMoeCommunicator::barrier() {
    DSI_RETURN_IF_ERROR(broken_);
    return wait_all(++seq_, "barrier");
}

Result<std::vector<int64_t>> ShmMoeCommunicator::all_gather(int64_t value, int64_t timeout_ms) {
    DSI_RETURN_IF_ERROR(broken_);
    if (phase_ != Phase::kIdle) {
        return leave_group(failed_precondition("shm group: all_gather inside an MoE call"));
    }
    // Two value slots alternate by gather, as the buffer sets do by call: a rank can write
    // gather g + 2's value only after every rank passed gather g + 1's barrier, i.e. read g.
    const size_t parity = ++gathers_ % 2;
    at(seg_->control(rank_).gather[parity]).store(value, std::memory_order_relaxed);
    DSI_RETURN_IF_ERROR(wait_all(++seq_, "all_gather", timeout_ms));
    std::vector<int64_t> values(static_cast<size_t>(shape_.num_ranks));
    for (int r = 0; r < shape_.num_ranks; ++r) {
        values[static_cast<size_t>(r)] =
            at(seg_->control(r).gather[parity]).load(std::memory_order_relaxed);
    }
    return values;
}

Status ShmMoeCommunicator::check_call(const MoeLayout& layout, Phase expected,
                                      const char* step) {
    DSI_RETURN_IF_ERROR(broken_);
    if (layout.call != call_ || phase_ != expected) {
        return leave_group(failed_precondition(std::string("shm group: ") + step +
                                   " out of order (layout -> dispatch -> combine, one call at a "
                                   "time, with the latest layout)"));
    }
    return Status::ok();
}

Result<MoeLayout> ShmMoeCommunicator::layout(const PlacementTable& placement,
                                             std::span<const int32_t> topk_ids, int num_tokens,
                                             ReplicaChoice choice) {
    DSI_RETURN_IF_ERROR(broken_);
    if (phase_ != Phase::kIdle) {
        return leave_group(
            failed_precondition("shm group: layout before the previous call's combine"));
    }
    const uint64_t call = ++call_;
    const int n = shape_.num_ranks;
    const int slots = shape_.slots_per_rank;
    const size_t row_len = 1 + static_cast<size_t>(slots);  // [flag, counts per slot]
    MoeLayout L;
    L.call = call;
    Status input = route_tokens(shape_, placement, rank_, topk_ids, num_tokens, choice, L);
    // This rank's row in every destination's count table; a bad input is flagged there so
    // every rank fails this call instead of waiting for this one.
    for (int dst = 0; dst < n; ++dst) {
        int32_t* row = seg_->counts(dst, call) + static_cast<size_t>(rank_) * row_len;
        std::fill(row, row + row_len, 0);
        row[0] = input.is_ok() ? 0 : 1;
    }
    if (input.is_ok()) {
        for (size_t i = 0; i < L.dst_rank.size(); ++i) {
            ++seg_->counts(L.dst_rank[i], call)[static_cast<size_t>(rank_) * row_len + 1 +
                                                static_cast<size_t>(L.dst_slot[i])];
        }
    }
    DSI_RETURN_IF_ERROR(wait_all(++seq_, "layout"));
    for (int src = 0; src < n; ++src) {
        if (seg_->counts(0, call)[static_cast<size_t>(src) * row_len] != 0) {
            if (src == rank_) {
                return input;
            }
            return failed_precondition("shm group: rank " + std::to_string(src) +
                                       " gave invalid routing input for this call");
        }
    }
    DSI_RETURN_IF_ERROR(order_receives(
        shape_, rank_, "shm group",
        [&](int src, int dst, int s) {
            return seg_->counts(dst, call)[static_cast<size_t>(src) * row_len + 1 + s];
        },
        L));
    phase_ = Phase::kLaidOut;
    return L;
}

Result<DispatchView> ShmMoeCommunicator::dispatch(const MoeLayout& layout,
                                                  std::span<const float> hidden_rows) {
    DSI_RETURN_IF_ERROR(check_call(layout, Phase::kLaidOut, "dispatch"));
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    if (hidden_rows.size() != static_cast<size_t>(layout.num_tokens) * hidden) {
        return leave_group(invalid_argument("dispatch: " + std::to_string(hidden_rows.size()) +
                                            " floats for " + std::to_string(layout.num_tokens) +
                                            " tokens x hidden " + std::to_string(hidden)));
    }
    const uint64_t call = layout.call;
    const bool stream = static_cast<size_t>(layout.dst_rank.size()) * hidden * sizeof(float) >
                        streaming_threshold(options_.streaming_min_bytes);
    for (int t = 0; t < layout.num_tokens; ++t) {
        const float* src = hidden_rows.data() + static_cast<size_t>(t) * hidden;
        for (int k = 0; k < layout.top_k; ++k) {
            const size_t i = static_cast<size_t>(t) * layout.top_k + k;
            const int dst = layout.dst_rank[i];
            const size_t row = static_cast<size_t>(layout.dst_row[i]);
            copy_row(seg_->rows(dst, call) + row * hidden, src, hidden, stream);
            seg_->origins(dst, call)[row] = RowOrigin{rank_, t, k};
        }
    }
    stream_fence();
    if (options_.before_dispatch_publish) {
        options_.before_dispatch_publish(call);
    }
    DSI_RETURN_IF_ERROR(wait_all(++seq_, "dispatch"));
    phase_ = Phase::kDispatched;
    const size_t num_recv = static_cast<size_t>(layout.num_recv());
    return DispatchView{
        std::span<const float>(seg_->rows(rank_, call), num_recv * hidden),
        std::span<const RowOrigin>(seg_->origins(rank_, call), num_recv),
        std::span<const int64_t>(layout.slot_offsets)};
}

std::span<float> ShmMoeCommunicator::expert_output_buffer(const MoeLayout& layout) {
    return {seg_->outs(rank_, layout.call),
            static_cast<size_t>(layout.num_recv()) * static_cast<size_t>(shape_.hidden)};
}

Status ShmMoeCommunicator::combine(const MoeLayout& layout, std::span<const float> expert_outputs,
                                   std::span<const float> gate, std::span<float> out) {
    DSI_RETURN_IF_ERROR(check_call(layout, Phase::kDispatched, "combine"));
    const size_t hidden = static_cast<size_t>(shape_.hidden);
    const size_t n = static_cast<size_t>(layout.num_tokens);
    if (expert_outputs.size() != static_cast<size_t>(layout.num_recv()) * hidden ||
        gate.size() != n * static_cast<size_t>(layout.top_k) || out.size() != n * hidden) {
        return leave_group(invalid_argument(
            "combine: expert outputs " + std::to_string(expert_outputs.size()) + ", gate " +
            std::to_string(gate.size()) + ", out " + std::to_string(out.size()) +
            " floats do not match the layout"));
    }
    const uint64_t call = layout.call;
    float* mine = seg_->outs(rank_, call);
    if (expert_outputs.data() != mine && !expert_outputs.empty()) {
        std::memcpy(mine, expert_outputs.data(), expert_outputs.size_bytes());
    }
    DSI_RETURN_IF_ERROR(wait_all(++seq_, "combine"));
    // S-ENG-2 / issue 19: fixed top-k order on the home rank, read in place from the rank
    // that served each (token, k).
    combine_in_order(layout.num_tokens, layout.top_k, shape_.hidden, gate, out,
                     [&](int t, int k) -> const float* {
                         const size_t i = static_cast<size_t>(t) * layout.top_k + k;
                         return seg_->outs(layout.dst_rank[i], call) +
                                static_cast<size_t>(layout.dst_row[i]) * hidden;
                     });
    phase_ = Phase::kIdle;
    return Status::ok();
}

}  // namespace dsi::comm

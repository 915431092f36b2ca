// Host shared-memory tier (issue 8, S-KV-1/5). See shm_store.h for the layout and the
// protocol; docs/kvstore.md for the byte table another process follows to fill it.
#include "kvstore/shm_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/env.h"
#include "kvstore/uri.h"

namespace dsi::kvstore {
namespace {

constexpr uint64_t kShmMagic = 0x4d48534b56495344ULL;  // "DSIKVSHM" little-endian
constexpr uint32_t kShmVersion = 1;
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSlotEntryBytes = 64;
constexpr size_t kPage = 4096;
constexpr uint32_t kFree = 0, kWriting = 1, kReady = 2;
constexpr int64_t kLockTimeoutMs = 1000;  // every wait has a deadline
constexpr int64_t kInitWaitMs = 1000;     // a creator still initialising the header

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

int64_t wall_ns() { return Env::default_env()->wall_ns(); }

// Field 22 of /proc/PID/stat (start time in clock ticks); 0 if the process is gone.
uint64_t process_start(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) {
        return 0;
    }
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 22 && (rest >> field); ++i) {
        if (i == 22) {
            return std::strtoull(field.c_str(), nullptr, 10);
        }
    }
    return 0;
}

bool pid_alive(uint32_t pid) {
    if (pid == 0) {
        return false;
    }
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

bool valid_name(const std::string& name) {
    if (name.empty() || name.size() > 200) {
        return false;
    }
    for (char c : name) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) {
            return false;
        }
    }
    return name != "." && name != "..";
}

template <typename T>
std::atomic_ref<T> at(T& x) {
    return std::atomic_ref<T>(x);
}

}  // namespace

struct ShmBlockStore::Header {
    uint64_t magic;  // written last at creation (release)
    uint32_t version;
    uint32_t header_bytes;
    uint64_t num_slots;
    uint64_t slot_bytes;
    uint32_t creator_pid;
    uint32_t reserved0;
    uint64_t creator_start;  // /proc start time of the creator (pid reuse)
    uint64_t data_offset;
    uint64_t reserved1[2];
    pthread_mutex_t mu;  // robust, process-shared; guards the slot table's transitions
};

struct ShmBlockStore::Slot {
    uint32_t state;       // kFree / kWriting / kReady
    uint32_t writer_pid;  // the process filling a kWriting slot
    uint64_t seq;         // odd while being written; +2 on every change
    uint64_t key_lo, key_hi;
    uint64_t size;         // encoded block bytes (kReady)
    int64_t last_use_ns;   // wall clock; LRU order
    uint64_t reserved[2];
};

// The segment mutex with a deadline and robust-mutex recovery.
class ShmBlockStore::Lock {
public:
    explicit Lock(ShmBlockStore& s) : s_(s) {
        Header* h = reinterpret_cast<Header*>(s_.base_);
        struct timespec ts;
        ::clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += kLockTimeoutMs / 1000;
        int rc = ::pthread_mutex_timedlock(&h->mu, &ts);
        if (rc == EOWNERDEAD) {
            // The holder died inside a transition: every transition leaves the table
            // valid at each store, so marking it consistent is enough; slots it was
            // writing are reclaimed by claim_locked once its pid is gone.
            ::pthread_mutex_consistent(&h->mu);
            rc = 0;
        }
        locked_ = rc == 0;
    }
    ~Lock() {
        if (locked_) {
            ::pthread_mutex_unlock(&reinterpret_cast<Header*>(s_.base_)->mu);
        }
    }
    bool ok() const { return locked_; }

private:
    ShmBlockStore& s_;
    bool locked_ = false;
};

Status ShmBlockStore::unlink(const std::string& name) {
    static_assert(sizeof(Header) <= kHeaderBytes);
    static_assert(sizeof(Slot) == kSlotEntryBytes);
    if (!valid_name(name)) {
        return invalid_argument("shm store: bad name '" + name + "'");
    }
    if (::shm_unlink(("/" + name).c_str()) != 0 && errno != ENOENT) {
        return internal_error("shm_unlink " + name + ": " + std::strerror(errno));
    }
    return Status::ok();
}

Result<std::unique_ptr<ShmBlockStore>> ShmBlockStore::open(ShmStoreOptions options) {
    if (!valid_name(options.name)) {
        return invalid_argument("shm store: name must be 1-200 of [A-Za-z0-9_.-]");
    }
    if (options.num_slots < 1 || options.num_slots > kShmMaxSlots) {
        return invalid_argument("shm store: slots out of range (1.." +
                                std::to_string(kShmMaxSlots) + ")");
    }
    if (options.slot_bytes < static_cast<int64_t>(kPage) ||
        options.slot_bytes > kShmMaxSlotBytes) {
        return invalid_argument("shm store: slot_bytes out of range (4096..1 GiB)");
    }
    const size_t slot_bytes = round_up(static_cast<size_t>(options.slot_bytes), kPage);
    const size_t table = static_cast<size_t>(options.num_slots) * kSlotEntryBytes;
    const size_t data_offset = round_up(kHeaderBytes + table, kPage);
    const uint64_t total = data_offset + static_cast<uint64_t>(options.num_slots) * slot_bytes;
    if (total > static_cast<uint64_t>(kShmMaxBytes)) {
        return invalid_argument("shm store: segment over 1 TiB");
    }
    const std::string path = "/" + options.name;
    std::unique_ptr<ShmBlockStore> s(new ShmBlockStore());
    s->options_ = options;
    s->num_slots_ = options.num_slots;
    s->slot_bytes_ = static_cast<int64_t>(slot_bytes);
    s->data_offset_ = data_offset;
    s->map_bytes_ = total;
    if (options.anonymous) {
        void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return resource_exhausted(std::string("shm store: anonymous mmap: ") +
                                      std::strerror(errno));
        }
        s->base_ = static_cast<uint8_t*>(p);
        s->init_header();
        s->created_ = true;
        return s;
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
        int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            // Create: size, reserve (ENOSPC now, not SIGBUS later), map, header, magic.
            int rc = ::ftruncate(fd, static_cast<off_t>(total)) == 0
                         ? ::posix_fallocate(fd, 0, static_cast<off_t>(total))
                         : errno;
            if (rc != 0) {
                ::close(fd);
                ::shm_unlink(path.c_str());
                return rc == ENOSPC ? resource_exhausted("shm store: /dev/shm full")
                                    : internal_error(std::string("shm store: reserve: ") +
                                                     std::strerror(rc));
            }
            void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            ::close(fd);
            if (p == MAP_FAILED) {
                ::shm_unlink(path.c_str());
                return internal_error(std::string("shm store: mmap: ") + std::strerror(errno));
            }
            s->base_ = static_cast<uint8_t*>(p);
            s->init_header();
            s->created_ = true;
            return s;
        }
        if (errno != EEXIST) {
            return internal_error("shm_open " + path + ": " + std::strerror(errno));
        }
        // Attach: wait (bounded) for a creator to finish, then check the header.
        fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
            continue;  // removed meanwhile: create it
        }
        bool stale = false;
        Status mismatch = Status::ok();
        const int64_t give_up = wall_ns() + kInitWaitMs * 1'000'000;
        for (;;) {
            struct stat st;
            if (::fstat(fd, &st) != 0) {
                ::close(fd);
                return internal_error(std::string("shm store: fstat: ") + std::strerror(errno));
            }
            Header h{};
            bool complete = false;
            if (static_cast<size_t>(st.st_size) >= kHeaderBytes) {
                void* p = ::mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) {
                    Header* hp = static_cast<Header*>(p);
                    complete = at(hp->magic).load(std::memory_order_acquire) == kShmMagic;
                    std::memcpy(static_cast<void*>(&h), hp, sizeof(Header));
                    ::munmap(p, kHeaderBytes);
                }
            }
            const bool creator_alive =
                pid_alive(h.creator_pid) &&
                (h.creator_start == 0 || process_start(static_cast<pid_t>(h.creator_pid)) ==
                                             h.creator_start);
            if (complete) {
                bool same = h.version == kShmVersion && h.header_bytes == kHeaderBytes &&
                            h.num_slots == static_cast<uint64_t>(options.num_slots) &&
                            h.slot_bytes == slot_bytes && h.data_offset == data_offset &&
                            static_cast<uint64_t>(st.st_size) == total;
                if (same) {
                    break;
                }
                if (creator_alive) {
                    mismatch = failed_precondition(
                        "shm store: segment " + options.name +
                        " is in use with another version or geometry");
                } else {
                    stale = true;
                }
                break;
            }
            if (wall_ns() >= give_up || (h.creator_pid != 0 && !creator_alive)) {
                stale = true;  // never finished, and nobody is finishing it
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!mismatch.is_ok()) {
            ::close(fd);
            return mismatch;
        }
        if (stale) {
            ::close(fd);
            ::shm_unlink(path.c_str());
            continue;  // create afresh
        }
        void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) {
            return internal_error(std::string("shm store: mmap: ") + std::strerror(errno));
        }
        s->base_ = static_cast<uint8_t*>(p);
        return s;
    }
    return unavailable("shm store: segment " + options.name + " keeps changing under us");
}

// A new segment's header: geometry, creator, the robust process-shared mutex; the
// magic last (attaching processes wait for it).
void ShmBlockStore::init_header() {
    Header* h = reinterpret_cast<Header*>(base_);
    h->version = kShmVersion;
    h->header_bytes = kHeaderBytes;
    h->num_slots = static_cast<uint64_t>(num_slots_);
    h->slot_bytes = static_cast<uint64_t>(slot_bytes_);
    h->creator_pid = static_cast<uint32_t>(::getpid());
    h->creator_start = process_start(::getpid());
    h->data_offset = data_offset_;
    pthread_mutexattr_t attr;
    ::pthread_mutexattr_init(&attr);
    ::pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    ::pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    ::pthread_mutex_init(&h->mu, &attr);
    ::pthread_mutexattr_destroy(&attr);
    at(h->magic).store(kShmMagic, std::memory_order_release);
}

ShmBlockStore::~ShmBlockStore() {
    if (base_ != nullptr) {
        ::munmap(base_, map_bytes_);
    }
    if (created_ && options_.unlink_on_close && !options_.anonymous) {
        (void)unlink(options_.name);
    }
}

ShmBlockStore::Slot* ShmBlockStore::slot(int64_t i) const {
    return reinterpret_cast<Slot*>(base_ + kHeaderBytes + static_cast<size_t>(i) * kSlotEntryBytes);
}

uint8_t* ShmBlockStore::data(int64_t i) const {
    return base_ + data_offset_ + static_cast<size_t>(i) * static_cast<size_t>(slot_bytes_);
}

std::string ShmBlockStore::uri() const {
    return "shm://" + options_.name + "?slots=" + std::to_string(num_slots_) +
           "&slot_bytes=" + std::to_string(slot_bytes_);
}

int64_t ShmBlockStore::find_locked(const StoreKey& key) const {
    for (int64_t i = 0; i < num_slots_; ++i) {
        Slot* e = slot(i);
        if (at(e->state).load(std::memory_order_relaxed) == kReady && e->key_lo == key.lo &&
            e->key_hi == key.hi) {
            return i;
        }
    }
    return -1;
}

int64_t ShmBlockStore::claim_locked(const StoreKey& key) {
    int64_t same = -1, free_slot = -1, lru = -1, orphan = -1;
    int64_t lru_ns = INT64_MAX;
    for (int64_t i = 0; i < num_slots_; ++i) {
        Slot* e = slot(i);
        uint32_t st = at(e->state).load(std::memory_order_relaxed);
        if (st == kReady && e->key_lo == key.lo && e->key_hi == key.hi) {
            same = i;
            break;
        }
        if (st == kFree) {
            if (free_slot < 0) free_slot = i;
        } else if (st == kReady) {
            int64_t t = at(e->last_use_ns).load(std::memory_order_relaxed);
            if (t < lru_ns) {
                lru_ns = t;
                lru = i;
            }
        } else if (orphan < 0 && !pid_alive(e->writer_pid)) {
            orphan = i;  // its writer died mid-copy
        }
    }
    int64_t i = same >= 0 ? same : free_slot >= 0 ? free_slot : lru >= 0 ? lru : orphan;
    if (i < 0) {
        return -1;
    }
    Slot* e = slot(i);
    // seq odd before the state says WRITING: a reader that copied earlier sees a change.
    uint64_t seq = at(e->seq).load(std::memory_order_relaxed);
    at(e->seq).store((seq | 1) + ((seq & 1) ? 2 : 0), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    e->writer_pid = static_cast<uint32_t>(::getpid());
    e->key_lo = key.lo;
    e->key_hi = key.hi;
    e->size = 0;
    at(e->state).store(kWriting, std::memory_order_release);
    return i;
}

Status ShmBlockStore::write_slot(const StoreKey& key, size_t size,
                                 const std::function<void(uint8_t*)>& fill) {
    const int64_t t0 = Env::default_env()->now_ns();
    if (size > static_cast<size_t>(slot_bytes_)) {
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return resource_exhausted("shm store: block of " + std::to_string(size) +
                                  " bytes over the slot size");
    }
    int64_t i;
    {
        Lock lock(*this);
        if (!lock.ok()) {
            metrics_.errors.fetch_add(1, std::memory_order_relaxed);
            metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
            return unavailable("shm store: lock timeout");
        }
        i = claim_locked(key);
    }
    if (i < 0) {
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return resource_exhausted("shm store: every slot is being written");
    }
    fill(data(i));
    Slot* e = slot(i);
    Lock lock(*this);
    const bool ours = at(e->state).load(std::memory_order_relaxed) == kWriting &&
                      e->writer_pid == static_cast<uint32_t>(::getpid()) && e->key_lo == key.lo &&
                      e->key_hi == key.hi;
    if (!lock.ok() || !ours) {
        // Lost the slot (reclaimed) or the lock: leave nothing half-published.
        if (ours) at(e->state).store(kFree, std::memory_order_release);
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return unavailable("shm store: slot lost while writing");
    }
    e->size = size;
    at(e->last_use_ns).store(wall_ns(), std::memory_order_relaxed);
    at(e->state).store(kReady, std::memory_order_relaxed);
    at(e->seq).store(at(e->seq).load(std::memory_order_relaxed) + 1, std::memory_order_release);
    metrics_.puts.fetch_add(1, std::memory_order_relaxed);
    metrics_.bytes_written.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
    metrics_.put_latency.record(Env::default_env()->now_ns() - t0);
    return Status::ok();
}

Status ShmBlockStore::put(const BlockInfo& info, std::span<const std::span<const uint8_t>> layers,
                          int64_t /*deadline_ns*/) {
    Result<size_t> size = encoded_size(info, layers);
    if (!size.is_ok()) {
        metrics_.puts_dropped.fetch_add(1, std::memory_order_relaxed);
        return size.status();
    }
    return write_slot(info.key, *size, [&](uint8_t* p) {
        // Cannot fail: encoded_size checked the same limits.
        DSI_CHECK(encode_block_to(info, layers, std::span<uint8_t>(p, *size)).is_ok());
    });
}

Status ShmBlockStore::put_encoded(const StoreKey& key, std::span<const uint8_t> encoded) {
    return write_slot(key, encoded.size(),
                      [&](uint8_t* p) { std::memcpy(p, encoded.data(), encoded.size()); });
}

size_t ShmBlockStore::copy_out(int64_t i, uint64_t seq, size_t size, std::span<uint8_t> dst) {
    std::memcpy(dst.data(), data(i), size);
    std::atomic_thread_fence(std::memory_order_acquire);
    return at(slot(i)->seq).load(std::memory_order_relaxed) == seq ? size : 0;
}

std::vector<Result<Block>> ShmBlockStore::read_many_into(std::span<const StoreKey> keys,
                                                         std::span<const BlockInfo> expects,
                                                         std::span<const std::span<uint8_t>> dsts,
                                                         int64_t /*deadline_ns*/) {
    DSI_CHECK(expects.empty() || expects.size() == keys.size());
    const bool own = dsts.empty();  // get(): fresh buffers
    DSI_CHECK(own || dsts.size() == keys.size());
    const int64_t t0 = Env::default_env()->now_ns();
    std::vector<Result<Block>> out;
    for (size_t k = 0; k < keys.size(); ++k) {
        auto miss = [&](Status st, bool corrupt) -> Result<Block> {
            metrics_.misses.fetch_add(1, std::memory_order_relaxed);
            if (corrupt) metrics_.corrupt.fetch_add(1, std::memory_order_relaxed);
            return st;
        };
        int64_t i;
        uint64_t seq = 0;
        size_t size = 0;
        {
            Lock lock(*this);
            if (!lock.ok()) {
                metrics_.errors.fetch_add(1, std::memory_order_relaxed);
                out.push_back(miss(unavailable("shm store: lock timeout"), false));
                continue;
            }
            i = find_locked(keys[k]);
            if (i >= 0) {
                Slot* e = slot(i);
                seq = at(e->seq).load(std::memory_order_acquire);
                size = e->size;
                at(e->last_use_ns).store(wall_ns(), std::memory_order_relaxed);
            }
        }
        if (i < 0) {
            out.push_back(miss(not_found("no block"), false));
            continue;
        }
        if (size < kFixedHeaderBytes || size > static_cast<size_t>(slot_bytes_) || (seq & 1)) {
            out.push_back(miss(not_found("block unusable: bad slot entry"), true));
            continue;
        }
        if (!own && dsts[k].size() < size) {
            out.push_back(invalid_argument("buffer smaller than the stored block"));
            continue;
        }
        BlockBuffer buf = own ? BlockBuffer::allocate(size) : BlockBuffer();
        std::span<uint8_t> dst = own ? buf.span() : dsts[k].first(size);
        if (copy_out(i, seq, size, dst) != size) {
            out.push_back(miss(not_found("block replaced while reading"), false));
            continue;
        }
        const BlockInfo* expect = expects.empty() ? nullptr : &expects[k];
        Result<Block> b = own ? decode_block(std::move(buf), expect) : decode_view(dst, expect);
        if (!b.is_ok()) {
            // A corrupted entry is a miss and is freed (if nobody replaced it meanwhile).
            Lock lock(*this);
            if (lock.ok() && at(slot(i)->seq).load(std::memory_order_relaxed) == seq) {
                at(slot(i)->state).store(kFree, std::memory_order_relaxed);
                at(slot(i)->seq).store(seq + 2, std::memory_order_release);
            }
            out.push_back(miss(not_found("block unusable: " + b.status().message()), true));
            continue;
        }
        metrics_.hits.fetch_add(1, std::memory_order_relaxed);
        metrics_.bytes_read.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
        out.push_back(std::move(b));
    }
    metrics_.get_latency.record(Env::default_env()->now_ns() - t0);
    return out;
}

Result<Block> ShmBlockStore::get(const StoreKey& key, const BlockInfo* expect,
                                 int64_t deadline_ns) {
    std::vector<BlockInfo> expects;
    if (expect != nullptr) expects.push_back(*expect);
    auto r = read_many_into(std::span<const StoreKey>(&key, 1), expects, {}, deadline_ns);
    return std::move(r[0]);
}

Result<bool> ShmBlockStore::contains(const StoreKey& key, int64_t /*deadline_ns*/) {
    Lock lock(*this);
    if (!lock.ok()) {
        return unavailable("shm store: lock timeout");
    }
    return find_locked(key) >= 0;
}

Result<int64_t> ShmBlockStore::match_prefix(std::span<const StoreKey> chain,
                                            int64_t /*deadline_ns*/) {
    Lock lock(*this);  // one lock for the whole chain
    if (!lock.ok()) {
        return unavailable("shm store: lock timeout");
    }
    int64_t n = 0;
    while (n < static_cast<int64_t>(chain.size()) && find_locked(chain[n]) >= 0) {
        ++n;
    }
    return n;
}

Status ShmBlockStore::remove(const StoreKey& key) {
    Lock lock(*this);
    if (!lock.ok()) {
        return unavailable("shm store: lock timeout");
    }
    int64_t i = find_locked(key);
    if (i >= 0) {
        Slot* e = slot(i);
        at(e->state).store(kFree, std::memory_order_relaxed);
        at(e->seq).store(at(e->seq).load(std::memory_order_relaxed) + 2,
                         std::memory_order_release);
        metrics_.removes.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::ok();
}

Result<std::vector<GcEntry>> ShmBlockStore::list_blocks() {
    Lock lock(*this);
    if (!lock.ok()) {
        return unavailable("shm store: lock timeout");
    }
    std::vector<GcEntry> out;
    for (int64_t i = 0; i < num_slots_; ++i) {
        Slot* e = slot(i);
        if (at(e->state).load(std::memory_order_relaxed) != kReady) continue;
        GcEntry g;
        g.key = {e->key_lo, e->key_hi};
        g.size_bytes = static_cast<int64_t>(e->size);
        g.last_access_ns = at(e->last_use_ns).load(std::memory_order_relaxed);
        auto info = peek_block_info(std::span<const uint8_t>(
            data(i), std::min<size_t>(e->size, header_bytes(kMaxLayers))));
        if (info.is_ok()) g.traffic_class = info->traffic_class;
        out.push_back(g);
    }
    return out;
}

Result<int64_t> ShmBlockStore::capacity_bytes() { return num_slots_ * slot_bytes_; }

uint8_t* ShmBlockStore::slot_data_for_test(const StoreKey& key) {
    Lock lock(*this);
    int64_t i = lock.ok() ? find_locked(key) : -1;
    return i < 0 ? nullptr : data(i);
}

void ShmBlockStore::lock_forever_for_test() {
    ::pthread_mutex_lock(&reinterpret_cast<Header*>(base_)->mu);
}

// ---- TieredBlockStore ----

TieredBlockStore::TieredBlockStore(std::unique_ptr<ShmBlockStore> shm,
                                   std::unique_ptr<BlockStore> lower)
    : owned_shm_(std::move(shm)),
      owned_lower_(std::move(lower)),
      shm_(owned_shm_.get()),
      lower_(owned_lower_.get()) {
    DSI_CHECK(shm_ != nullptr && lower_ != nullptr);
}

TieredBlockStore::TieredBlockStore(ShmBlockStore* shm, BlockStore* lower)
    : shm_(shm), lower_(lower) {
    DSI_CHECK(shm_ != nullptr && lower_ != nullptr);
}

Status TieredBlockStore::put(const BlockInfo& info,
                             std::span<const std::span<const uint8_t>> layers,
                             int64_t deadline_ns) {
    (void)shm_->put(info, layers, deadline_ns);  // best effort: drops are counted there
    return lower_->put(info, layers, deadline_ns);
}

std::vector<Result<Block>> TieredBlockStore::get_many(std::span<const StoreKey> keys,
                                                      std::span<const BlockInfo> expects,
                                                      int64_t deadline_ns) {
    std::vector<Result<Block>> out = shm_->get_many(keys, expects, deadline_ns);
    std::vector<StoreKey> rest;
    std::vector<BlockInfo> rest_expects;
    std::vector<size_t> where;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i].is_ok() || out[i].status().code() != StatusCode::kNotFound) continue;
        rest.push_back(keys[i]);
        if (!expects.empty()) rest_expects.push_back(expects[i]);
        where.push_back(i);
    }
    if (rest.empty()) {
        return out;
    }
    std::vector<Result<Block>> below = lower_->get_many(rest, rest_expects, deadline_ns);
    for (size_t j = 0; j < below.size(); ++j) {
        if (below[j].is_ok()) {
            // Promotion: the next reader (this engine or another process) hits in shm.
            (void)shm_->put_encoded(rest[j], below[j]->encoded());
        }
        out[where[j]] = std::move(below[j]);
    }
    return out;
}

std::vector<Result<Block>> TieredBlockStore::read_many_into(
    std::span<const StoreKey> keys, std::span<const BlockInfo> expects,
    std::span<const std::span<uint8_t>> dsts, int64_t deadline_ns) {
    DSI_CHECK_EQ(dsts.size(), keys.size());
    std::vector<Result<Block>> out = shm_->read_many_into(keys, expects, dsts, deadline_ns);
    std::vector<StoreKey> rest;
    std::vector<BlockInfo> rest_expects;
    std::vector<std::span<uint8_t>> rest_dsts;
    std::vector<size_t> where;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i].is_ok() || out[i].status().code() != StatusCode::kNotFound) continue;
        rest.push_back(keys[i]);
        if (!expects.empty()) rest_expects.push_back(expects[i]);
        rest_dsts.push_back(dsts[i]);
        where.push_back(i);
    }
    if (rest.empty()) {
        return out;
    }
    std::vector<Result<Block>> below =
        lower_->read_many_into(rest, rest_expects, rest_dsts, deadline_ns);
    for (size_t j = 0; j < below.size(); ++j) {
        if (below[j].is_ok()) {
            (void)shm_->put_encoded(rest[j], below[j]->encoded());  // promotion
        }
        out[where[j]] = std::move(below[j]);
    }
    return out;
}

Result<Block> TieredBlockStore::get(const StoreKey& key, const BlockInfo* expect,
                                    int64_t deadline_ns) {
    std::vector<BlockInfo> expects;
    if (expect != nullptr) expects.push_back(*expect);
    auto r = get_many(std::span<const StoreKey>(&key, 1), expects, deadline_ns);
    return std::move(r[0]);
}

Result<bool> TieredBlockStore::contains(const StoreKey& key, int64_t deadline_ns) {
    Result<bool> in_shm = shm_->contains(key, deadline_ns);
    if (in_shm.is_ok() && *in_shm) return true;
    return lower_->contains(key, deadline_ns);
}

Result<int64_t> TieredBlockStore::match_prefix(std::span<const StoreKey> chain,
                                               int64_t deadline_ns) {
    // S-KV-4 across tiers: the chain's head may be in shm and its tail only below.
    Result<int64_t> upper = shm_->match_prefix(chain, deadline_ns);
    const int64_t n = upper.is_ok() ? *upper : 0;
    if (n == static_cast<int64_t>(chain.size())) return n;
    DSI_ASSIGN_OR_RETURN(int64_t m, lower_->match_prefix(chain.subspan(static_cast<size_t>(n)),
                                                         deadline_ns));
    return n + m;
}

Status TieredBlockStore::remove(const StoreKey& key) {
    (void)shm_->remove(key);
    return lower_->remove(key);
}

std::string TieredBlockStore::uri() const { return shm_->uri() + " + " + lower_->uri(); }

}  // namespace dsi::kvstore

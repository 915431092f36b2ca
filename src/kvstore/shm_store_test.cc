#include "kvstore/shm_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "kvstore/file_store.h"
#include "kvstore/test_util.h"

namespace dsi::kvstore {
namespace {

using testing::make_block;
using testing::TempDir;

// A name of its own per test (tests may run in parallel processes), removed at the end.
class ShmName {
public:
    ShmName() {
        name_ = "dsi_test_" + std::to_string(::getpid()) + "_" +
                std::to_string(counter_++);
        (void)ShmBlockStore::unlink(name_);
    }
    ~ShmName() { (void)ShmBlockStore::unlink(name_); }
    const std::string& str() const { return name_; }

private:
    static inline int counter_ = 0;
    std::string name_;
};

std::unique_ptr<ShmBlockStore> open_shm(const std::string& name, int64_t slots,
                                        int64_t slot_bytes = 64 << 10) {
    ShmStoreOptions o;
    o.name = name;
    o.num_slots = slots;
    o.slot_bytes = slot_bytes;
    auto r = ShmBlockStore::open(o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : nullptr;
}

Status put(BlockStore& s, const testing::TestBlock& b) {
    auto spans = b.spans();
    return s.put(b.info, spans);
}

bool same_layers(const Block& got, const testing::TestBlock& want) {
    for (uint32_t l = 0; l < want.info.num_layers; ++l) {
        if (got.layer(l).size() != want.layers[l].size() ||
            std::memcmp(got.layer(l).data(), want.layers[l].data(), want.layers[l].size()) != 0) {
            return false;
        }
    }
    return true;
}

TEST(ShmStore, PutGetRemoveAndReadIntoCallerBuffers) {
    ShmName name;
    auto s = open_shm(name.str(), 4);
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->created());
    auto a = make_block(1, 3, 5000);
    EXPECT_EQ(s->get(a.info.key, &a.info).status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(put(*s, a).is_ok());
    auto g = s->get(a.info.key, &a.info);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_TRUE(same_layers(*g, a));
    std::vector<uint8_t> mem(64 << 10);
    std::vector<std::span<uint8_t>> dsts = {mem};
    auto v = s->read_many_into(std::span<const StoreKey>(&a.info.key, 1),
                               std::span<const BlockInfo>(&a.info, 1), dsts);
    ASSERT_TRUE(v[0].is_ok());
    EXPECT_EQ(v[0]->encoded().data(), mem.data());
    EXPECT_TRUE(same_layers(*v[0], a));
    ASSERT_TRUE(s->remove(a.info.key).is_ok());
    EXPECT_FALSE(*s->contains(a.info.key));
    auto m = s->metrics().snapshot();
    EXPECT_EQ(m.hits, 2);
    EXPECT_EQ(m.misses, 1);
}

// An anonymous store (the KV hand-over inbox): the same store, private to the process,
// nothing in /dev/shm; two of one name are two stores.
TEST(ShmStore, AnonymousStoresArePrivateAndLeaveNothingInDevShm) {
    ShmName name;
    ShmStoreOptions o;
    o.name = name.str();
    o.num_slots = 4;
    o.slot_bytes = 64 << 10;
    o.anonymous = true;
    auto a = ShmBlockStore::open(o);
    auto b = ShmBlockStore::open(o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    EXPECT_TRUE((*a)->created());
    EXPECT_NE(::access(("/dev/shm/" + name.str()).c_str(), F_OK), 0);
    auto blk = make_block(7, 2, 3000);
    ASSERT_TRUE(put(**a, blk).is_ok());
    auto g = (*a)->get(blk.info.key, &blk.info);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_TRUE(same_layers(*g, blk));
    EXPECT_EQ((*a)->match_prefix(std::span<const StoreKey>(&blk.info.key, 1)).value(), 1);
    EXPECT_FALSE(*(*b)->contains(blk.info.key));
    // Slot eviction by LRU works there as in a named segment.
    for (uint64_t k = 10; k < 16; ++k) ASSERT_TRUE(put(**a, make_block(k, 2, 3000)).is_ok());
    EXPECT_EQ((*a)->list_blocks()->size(), 4u);
}

TEST(ShmStore, LruEvictionAndMatchPrefix) {
    ShmName name;
    auto s = open_shm(name.str(), 3);
    ASSERT_NE(s, nullptr);
    std::vector<testing::TestBlock> b;
    for (int i = 0; i < 4; ++i) b.push_back(make_block(10 + i, 2, 1000));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(put(*s, b[i]).is_ok());
    // Touch 0 so 1 is the least recently used; the 4th put takes 1's slot.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(s->get(b[0].info.key, &b[0].info).is_ok());
    ASSERT_TRUE(put(*s, b[3]).is_ok());
    EXPECT_TRUE(*s->contains(b[0].info.key));
    EXPECT_FALSE(*s->contains(b[1].info.key));
    EXPECT_TRUE(*s->contains(b[2].info.key));
    EXPECT_TRUE(*s->contains(b[3].info.key));
    std::vector<StoreKey> chain = {b[0].info.key, b[2].info.key, b[1].info.key, b[3].info.key};
    EXPECT_EQ(*s->match_prefix(chain), 2);
    EXPECT_EQ(s->list_blocks()->size(), 3u);
    EXPECT_EQ(*s->capacity_bytes(), 3 * (64 << 10));
}

TEST(ShmStore, LimitsAndMalformedOptions) {
    ShmName name;
    ShmStoreOptions o;
    o.name = name.str();
    o.num_slots = 0;
    o.slot_bytes = 4096;
    EXPECT_EQ(ShmBlockStore::open(o).status().code(), StatusCode::kInvalidArgument);
    o.num_slots = kShmMaxSlots + 1;
    EXPECT_EQ(ShmBlockStore::open(o).status().code(), StatusCode::kInvalidArgument);
    o.num_slots = 2;
    o.slot_bytes = 100;
    EXPECT_EQ(ShmBlockStore::open(o).status().code(), StatusCode::kInvalidArgument);
    o.slot_bytes = 4096;
    for (const std::string& bad :
         std::vector<std::string>{"", "a/b", "..", std::string(201, 'x'), "sp ace"}) {
        o.name = bad;
        EXPECT_EQ(ShmBlockStore::open(o).status().code(), StatusCode::kInvalidArgument) << bad;
    }
    EXPECT_FALSE(open_block_store("shm://" + name.str() + "?slots=2").is_ok());
    auto s = open_block_store("shm://" + name.str() + "?slots=2&slot_bytes=4096&unlink=1");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    // A block larger than a slot is dropped and counted; the pool goes on.
    auto big = make_block(1, 2, 4000);
    EXPECT_EQ(put(**s, big).code(), StatusCode::kResourceExhausted);
    EXPECT_EQ((*s)->metrics().snapshot().puts_dropped, 1);
    auto fits = make_block(2, 2, 1000);
    EXPECT_TRUE(put(**s, fits).is_ok());
    // A live segment of other geometry is refused, not clobbered.
    o.name = name.str();
    o.num_slots = 3;
    EXPECT_EQ(ShmBlockStore::open(o).status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*s)->get(fits.info.key, &fits.info).is_ok());
}

TEST(ShmStore, CorruptedEntryIsAMissAndFreed) {
    ShmName name;
    auto s = open_shm(name.str(), 2);
    ASSERT_NE(s, nullptr);
    auto a = make_block(3, 2, 3000);
    ASSERT_TRUE(put(*s, a).is_ok());
    uint8_t* p = s->slot_data_for_test(a.info.key);
    ASSERT_NE(p, nullptr);
    p[header_bytes(2) + 17] ^= 0xff;  // as a buggy or dying writer could leave it
    EXPECT_EQ(s->get(a.info.key, &a.info).status().code(), StatusCode::kNotFound);
    EXPECT_FALSE(*s->contains(a.info.key));
    EXPECT_EQ(s->metrics().snapshot().corrupt, 1);
}

// Another process fills the pool by name; this one reads what it wrote; the segment
// outlives its creator.
TEST(ShmStore, AnotherProcessFillsThePoolAndCreatorGone) {
    ShmName name;
    auto a = make_block(4, 3, 2000);
    pid_t pid = ::fork();
    if (pid == 0) {
        ShmStoreOptions o;
        o.name = name.str();
        o.num_slots = 4;
        o.slot_bytes = 64 << 10;
        auto s = ShmBlockStore::open(o);
        auto spans = a.spans();
        ::_exit(s.is_ok() && (*s)->created() && (*s)->put(a.info, spans).is_ok() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    auto s = open_shm(name.str(), 4);
    ASSERT_NE(s, nullptr);
    EXPECT_FALSE(s->created()) << "attached to the dead creator's segment";
    auto g = s->get(a.info.key, &a.info);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    EXPECT_TRUE(same_layers(*g, a));
}

// A stale segment of other geometry whose creator is gone is replaced, not refused.
TEST(ShmStore, StaleSegmentOfDeadCreatorIsRecreated) {
    ShmName name;
    pid_t pid = ::fork();
    if (pid == 0) {
        ShmStoreOptions o;
        o.name = name.str();
        o.num_slots = 7;
        o.slot_bytes = 4096;
        ::_exit(ShmBlockStore::open(o).is_ok() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    auto s = open_shm(name.str(), 2);
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->created());
    EXPECT_EQ(s->num_slots(), 2);
}

// A process that dies holding the segment mutex does not wedge the pool.
TEST(ShmStore, DeadLockHolderIsRecovered) {
    ShmName name;
    auto s = open_shm(name.str(), 2);
    ASSERT_NE(s, nullptr);
    auto a = make_block(5, 2, 1000);
    ASSERT_TRUE(put(*s, a).is_ok());
    pid_t pid = ::fork();
    if (pid == 0) {
        auto c = open_shm(name.str(), 2);
        if (c == nullptr) ::_exit(1);
        c->lock_forever_for_test();
        ::_exit(0);  // dies holding the mutex
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    auto g = s->get(a.info.key, &a.info);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    auto b = make_block(6, 2, 1000);
    EXPECT_TRUE(put(*s, b).is_ok());
}

// The chain pool -> shm -> store: a hit at each tier, promotion into shm, a damaged
// shm entry falls through to the store, match_prefix spans both tiers.
TEST(TieredStore, HitsAtEachTierAndPromotion) {
    ShmName name;
    TempDir dir;
    auto shm = open_shm(name.str(), 8);
    ASSERT_NE(shm, nullptr);
    auto file = FileBlockStore::open(dir.path());
    ASSERT_TRUE(file.is_ok());
    TieredBlockStore t(shm.get(), file->get());
    auto a = make_block(1, 2, 2000);
    auto b = make_block(2, 2, 2000);
    auto c = make_block(3, 2, 2000);
    ASSERT_TRUE(put(t, a).is_ok());  // both tiers
    ASSERT_TRUE(put(**file, b).is_ok());  // store only (written by another engine)
    EXPECT_TRUE(*shm->contains(a.info.key));
    EXPECT_FALSE(*shm->contains(b.info.key));
    std::vector<StoreKey> chain = {a.info.key, b.info.key, c.info.key};
    EXPECT_EQ(*t.match_prefix(chain), 2) << "a in shm, b below, c nowhere";
    std::vector<BlockInfo> expects = {a.info, b.info, c.info};
    auto r = t.get_many(chain, expects);
    ASSERT_TRUE(r[0].is_ok());
    ASSERT_TRUE(r[1].is_ok());
    EXPECT_EQ(r[2].status().code(), StatusCode::kNotFound);
    EXPECT_TRUE(same_layers(*r[0], a));
    EXPECT_TRUE(same_layers(*r[1], b));
    EXPECT_EQ(shm->metrics().snapshot().hits, 1);
    EXPECT_EQ((*file)->metrics().snapshot().hits, 1);
    EXPECT_TRUE(*shm->contains(b.info.key)) << "promoted";
    auto again = t.get(b.info.key, &b.info);
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(shm->metrics().snapshot().hits, 2);
    // Damaged in shm: a miss there, served by the store.
    shm->slot_data_for_test(a.info.key)[header_bytes(2) + 5] ^= 1;
    auto fall = t.get(a.info.key, &a.info);
    ASSERT_TRUE(fall.is_ok());
    EXPECT_TRUE(same_layers(*fall, a));
    EXPECT_EQ(shm->metrics().snapshot().corrupt, 1);
    EXPECT_EQ((*file)->metrics().snapshot().hits, 2);
}

TEST(TieredStore, OpensFromAChainedUri) {
    ShmName name;
    TempDir dir;
    const std::string shm = "shm://" + name.str() + "?slots=4&slot_bytes=65536&unlink=1";
    auto t = open_block_store(shm + "|file://" + dir.path());
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto a = make_block(1, 2, 1000);
    ASSERT_TRUE(put(**t, a).is_ok());
    EXPECT_TRUE((*t)->get(a.info.key, &a.info).is_ok());
    EXPECT_EQ((*t)->uri(), "shm://" + name.str() + "?slots=4&slot_bytes=65536 + file://" +
                               dir.path());
    EXPECT_FALSE(open_block_store("file://" + dir.path() + "|" + shm).is_ok());
    EXPECT_FALSE(open_block_store(shm + "|bogus://x").is_ok());
}

}  // namespace
}  // namespace dsi::kvstore

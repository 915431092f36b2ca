// Run-time choice of the XXH3 implementation (see xxh3_fast.h).
#define XXH_STATIC_LINKING_ONLY
#include "kvstore/internal/xxh3_fast.h"

#include <xxhash.h>

#include "kvstore/internal/xxh3_ops_impl.h"

namespace dsi::kvstore::internal {

extern const Xxh3Ops kXxh3AVX2;
extern const Xxh3Ops kXxh3AVX512;

namespace {

const Xxh3Ops kLibrary = {"libxxhash", xxh3_hash, xxh3_reset, xxh3_update, xxh3_digest};

struct Table {
    const Xxh3Ops* ops[3];
    size_t count = 0;
};

Table make_table() {
    Table t;
    // Best first.
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
        t.ops[t.count++] = &kXxh3AVX512;
    }
    if (__builtin_cpu_supports("avx2")) {
        t.ops[t.count++] = &kXxh3AVX2;
    }
    t.ops[t.count++] = &kLibrary;
    return t;
}

const Table& table() {
    static const Table t = make_table();
    return t;
}

}  // namespace

const Xxh3Ops& xxh3_ops() { return *table().ops[0]; }

const Xxh3Ops* const* xxh3_ops_all(size_t* count) {
    *count = table().count;
    return table().ops;
}

}  // namespace dsi::kvstore::internal

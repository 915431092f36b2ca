// The body of one XXH3 implementation unit: include after <xxhash.h> has been included
// with that unit's XXH_VECTOR (xxh3_avx2.cc, xxh3_avx512.cc) or for the system library
// (xxh3_fast.cc). Each unit gets its own copy (anonymous namespace).
#pragma once

#include "kvstore/internal/xxh3_fast.h"

namespace dsi::kvstore::internal {
namespace {

static_assert(sizeof(XXH3_state_t) == kXxh3StateBytes && alignof(XXH3_state_t) <= kXxh3StateAlign);

uint64_t xxh3_hash(const void* data, size_t n) { return XXH3_64bits(data, n); }
void xxh3_reset(Xxh3State* s) { XXH3_64bits_reset(reinterpret_cast<XXH3_state_t*>(s)); }
void xxh3_update(Xxh3State* s, const void* data, size_t n) {
    XXH3_64bits_update(reinterpret_cast<XXH3_state_t*>(s), data, n);
}
uint64_t xxh3_digest(const Xxh3State* s) {
    return XXH3_64bits_digest(reinterpret_cast<const XXH3_state_t*>(s));
}

}  // namespace
}  // namespace dsi::kvstore::internal

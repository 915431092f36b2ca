// XXH3 compiled for AVX512 (this file only; chosen at run time by xxh3_fast.cc).
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
#include <xxhash.h>

#include "kvstore/internal/xxh3_ops_impl.h"

namespace dsi::kvstore::internal {
extern const Xxh3Ops kXxh3AVX512 = {"avx512", xxh3_hash, xxh3_reset, xxh3_update, xxh3_digest};
}  // namespace dsi::kvstore::internal

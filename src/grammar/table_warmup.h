// Warming the shared position-table cache (issue 21): the first mask at a position
// whose table nobody built yet walks the vocabulary (~1-12 ms), inside a decode step.
// Most schemas meet the same structures -- a JSON string's characters, numbers, the
// first character of an undeclared key, the common formats, `.*` in a pattern -- so a
// process builds those tables once, at start, from a fixed list of small schemas and
// instances (table_warmup.cc), instead of in the first request that meets them.
//
// Thread model: a free function; the cache is internally locked, so requests may
// compile and mask while it runs (they build what they miss themselves).
#pragma once

#include <cstdint>
#include <memory>

#include "grammar/matcher.h"
#include "grammar/vocabulary.h"

namespace dsi::grammar {

struct WarmupStats {
    int num_grammars = 0;
    int64_t num_masks = 0;     // masks computed (one per byte of each instance)
    int64_t tables_added = 0;  // entries the shared cache gained
};

// Compiles the warm-up schemas with `options` and computes a mask at every byte of
// their instances, so options.table_cache holds their tables.
// REQUIRES: options.table_cache is set.
WarmupStats warm_table_cache(const std::shared_ptr<const Vocabulary>& vocab,
                             const MatcherOptions& options);

}  // namespace dsi::grammar

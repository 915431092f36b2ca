#include "kvstore/erasure.h"

#include <gtest/gtest.h>

#include "base/env.h"

namespace dsi::kvstore {
namespace {

// Every subset of erased chunks of size <= m is recoverable; m+1 erasures are not.
void check_all_erasures(int k, int m, size_t len) {
    ErasureCoder coder(k, m);
    const int n = k + m;
    std::vector<std::vector<uint8_t>> chunks(n, std::vector<uint8_t>(len));
    SplitMix64 rng(static_cast<uint64_t>(k * 100 + m));
    for (int i = 0; i < k; ++i) {
        for (auto& b : chunks[i]) {
            b = static_cast<uint8_t>(rng.next());
        }
    }
    std::vector<const uint8_t*> data;
    std::vector<uint8_t*> parity;
    for (int i = 0; i < k; ++i) {
        data.push_back(chunks[i].data());
    }
    for (int i = k; i < n; ++i) {
        parity.push_back(chunks[i].data());
    }
    coder.encode(data, parity, len);
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
        int erased = __builtin_popcount(mask);
        auto copy = chunks;
        std::vector<uint8_t*> ptrs;
        std::vector<char> present_c(n);
        for (int i = 0; i < n; ++i) {
            if (mask & (1u << i)) {
                std::fill(copy[i].begin(), copy[i].end(), 0xEE);
            }
            ptrs.push_back(copy[i].data());
            present_c[i] = !(mask & (1u << i));
        }
        bool present[kMaxErasureChunks];
        for (int i = 0; i < n; ++i) {
            present[i] = present_c[i] != 0;
        }
        Status s = coder.decode(ptrs, std::span<const bool>(present, n), len);
        if (erased <= m) {
            ASSERT_TRUE(s.is_ok()) << "mask " << mask;
            for (int i = 0; i < k; ++i) {
                ASSERT_EQ(copy[i], chunks[i]) << "k=" << k << " m=" << m << " mask " << mask;
            }
        } else {
            bool data_lost = false;
            for (int i = 0; i < k; ++i) {
                data_lost |= (mask & (1u << i)) != 0;
            }
            EXPECT_EQ(s.is_ok(), !data_lost) << "mask " << mask;
        }
    }
}

TEST(Erasure, AnyKOfKPlusMRecovers) {
    check_all_erasures(1, 0, 10);
    check_all_erasures(2, 1, 333);
    check_all_erasures(4, 2, 1000);
    check_all_erasures(3, 3, 64);
}

TEST(Erasure, ProductionShapeTenPlusTwo) { check_all_erasures(10, 2, 256); }

TEST(Erasure, Validate) {
    EXPECT_FALSE(ErasureCoder::validate(0, 1).is_ok());
    EXPECT_FALSE(ErasureCoder::validate(2, -1).is_ok());
    EXPECT_FALSE(ErasureCoder::validate(60, 10).is_ok());
    EXPECT_TRUE(ErasureCoder::validate(10, 2).is_ok());
}

}  // namespace
}  // namespace dsi::kvstore

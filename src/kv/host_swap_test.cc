// HostSwapSpace: bounded slots, all-or-nothing allocation, release ordered by plans,
// and the invariant check catching leaks and double use.
#include "kv/host_swap.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace dsi::kv {
namespace {

TEST(HostSwapSpaceTest, AllocationIsBoundedAndReleaseWaitsForThePlan) {
    HostSwapSpace sp(10 * 16 * sizeof(float) + 5, 16);  // room for 10 slots
    EXPECT_EQ(sp.num_slots(), 10);
    std::optional<std::vector<int32_t>> a = sp.allocate(7);
    ASSERT_TRUE(a.has_value());
    EXPECT_FALSE(sp.allocate(4).has_value());  // all or nothing
    EXPECT_EQ(sp.num_free(), 3);
    for (int32_t s : *a) sp.slot(s)[15] = static_cast<float>(s);  // memory exists
    ASSERT_TRUE(sp.check_invariants(*a).is_ok());
    sp.release(*a);
    EXPECT_EQ(sp.num_held(), 0);
    EXPECT_FALSE(sp.allocate(4).has_value());  // released slots wait for end_plan()
    sp.end_plan();
    EXPECT_TRUE(sp.allocate(10).has_value());
    EXPECT_EQ(sp.num_free(), 0);
    EXPECT_EQ(HostSwapSpace(0, 16).num_slots(), 0);
    EXPECT_FALSE(HostSwapSpace(0, 16).allocate(1).has_value());
}

TEST(HostSwapSpaceTest, InvariantsCatchLeaksAndDoubleUse) {
    HostSwapSpace sp(4 * 8 * sizeof(float), 8);
    std::vector<int32_t> held = *sp.allocate(2);
    EXPECT_TRUE(sp.check_invariants(held).is_ok());
    EXPECT_FALSE(sp.check_invariants(std::vector<int32_t>{held[0]}).is_ok());  // leaked
    std::vector<int32_t> twice = {held[0], held[1], held[1]};
    EXPECT_FALSE(sp.check_invariants(twice).is_ok());
    std::vector<int32_t> bad = {held[0], held[1], 99};
    EXPECT_FALSE(sp.check_invariants(bad).is_ok());
}

}  // namespace
}  // namespace dsi::kv

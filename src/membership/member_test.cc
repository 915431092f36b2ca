#include <gtest/gtest.h>

#include "membership/member.h"

namespace dsi::membership {
namespace {

Member make(std::string id, uint64_t incarnation, Role role = Role::kDecode) {
    Member m;
    m.id = std::move(id);
    m.role = role;
    m.address = "127.0.0.1:8001";
    m.transfer_address = "127.0.0.1:9001";
    m.capacity = 64;
    m.incarnation = incarnation;
    return m;
}

TEST(Member, JsonRoundTrip) {
    for (Role r : {Role::kRouter, Role::kPrefill, Role::kDecode, Role::kBoth}) {
        Member m = make("engine-1", 1'733'000'000'123'456'789ULL, r);
        auto back = member_from_json(to_json(m));
        ASSERT_TRUE(back.is_ok()) << back.status().message();
        EXPECT_EQ(*back, m);
    }
}

TEST(Member, MalformedRecordsNameTheField) {
    const std::pair<const char*, const char*> cases[] = {
        {"", "not a JSON object"},
        {"[1]", "not a JSON object"},
        {R"({"role":"decode","address":"h:1","incarnation":"1"})", "'id'"},
        {R"({"id":"a","role":"decoder","address":"h:1","incarnation":"1"})", "role"},
        {R"({"id":"a","role":"decode","address":"h","incarnation":"1"})", "address"},
        {R"({"id":"a","role":"decode","address":"h:70000","incarnation":"1"})", "address"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":1})", "incarnation"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":"0"})", "incarnation"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":"99999999999999999999"})",
         "incarnation"},
        {R"({"id":"a/b","role":"decode","address":"h:1","incarnation":"1"})", "id"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":"1","capacity":-1})",
         "capacity"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":"1","capacity":"2"})",
         "capacity"},
        {R"({"id":"a","role":"decode","address":"h:1","incarnation":"1",
             "transfer_address":"x"})",
         "transfer_address"},
    };
    for (const auto& [json, field] : cases) {
        auto m = member_from_json(json);
        ASSERT_FALSE(m.is_ok()) << json;
        EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(m.status().message().find(field), std::string::npos)
            << json << " -> " << m.status().message();
    }
}

TEST(MemberTable, IncarnationRule) {
    MemberTable t;
    auto c = t.put(make("d1", 10));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->kind, ChangeKind::kJoined);
    EXPECT_FALSE(t.put(make("d1", 10)));  // no change
    Member more = make("d1", 10);
    more.capacity = 128;
    c = t.put(more);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->kind, ChangeKind::kUpdated);
    // A late record of the predecessor is stale.
    EXPECT_FALSE(t.put(make("d1", 9)));
    EXPECT_EQ(t.num_stale(), 1);
    EXPECT_EQ(t.find("d1")->capacity, 128);
    c = t.put(make("d1", 11));
    ASSERT_TRUE(c);
    EXPECT_EQ(c->kind, ChangeKind::kRestarted);
    // A late delete of the predecessor cannot remove its successor.
    EXPECT_FALSE(t.remove("d1", 10));
    EXPECT_EQ(t.num_stale(), 2);
    ASSERT_NE(t.find("d1"), nullptr);
    c = t.remove("d1");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->kind, ChangeKind::kLeft);
    EXPECT_EQ(c->member.incarnation, 11u);
    EXPECT_FALSE(t.remove("d1"));
    EXPECT_TRUE(t.members().empty());
}

TEST(MemberTable, ResetReportsTheDifference) {
    MemberTable t;
    t.put(make("a", 1));
    t.put(make("b", 1));
    t.put(make("c", 5));
    Member b2 = make("b", 1);
    b2.capacity = 1;
    auto changes = t.reset({make("c", 6), b2, make("d", 1)});
    ASSERT_EQ(changes.size(), 4u);
    EXPECT_EQ(changes[0].kind, ChangeKind::kLeft);
    EXPECT_EQ(changes[0].member.id, "a");
    EXPECT_EQ(changes[1].kind, ChangeKind::kUpdated);
    EXPECT_EQ(changes[1].member.id, "b");
    EXPECT_EQ(changes[2].kind, ChangeKind::kRestarted);
    EXPECT_EQ(changes[2].member.id, "c");
    EXPECT_EQ(changes[3].kind, ChangeKind::kJoined);
    EXPECT_EQ(changes[3].member.id, "d");
    EXPECT_TRUE(t.reset(t.members()).empty());
    const auto ids = t.members();
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(ids[0].id, "b");
    EXPECT_EQ(ids[2].id, "d");
}

}  // namespace
}  // namespace dsi::membership

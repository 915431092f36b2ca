// Member: one process of a dsinfer cluster as it is published in the membership
// directory (etcd or a static file), and MemberTable, the pure view a watcher keeps of
// the directory.
//
// Incarnation rule (issue 18): every process start draws a new, larger incarnation
// (wall-clock ns at start). A record whose incarnation is lower than the one the table
// holds for the same id is stale (a late write or watch event of a dead predecessor)
// and is ignored; a higher one means the peer restarted, and everything that referred
// to the old incarnation (transfers, in-flight requests) must be treated as lost.
// A delete removes the id only when it is not older than what the table holds: a late
// delete of a predecessor's record cannot remove its successor.
//
// Thread model: Member is a value; MemberTable is not thread-safe (one owner, usually
// the registry's watch thread, which hands out copies).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsi::membership {

enum class Role { kRouter, kPrefill, kDecode, kBoth };

std::string_view role_name(Role r);
Result<Role> parse_role(std::string_view s);

struct Member {
    std::string id;                // unique in the cluster: [A-Za-z0-9._-]{1,128}
    Role role = Role::kBoth;
    std::string address;           // host:port of its HTTP API
    std::string transfer_address;  // host:port of its KV transfer endpoint; may be empty
    int64_t capacity = 0;          // concurrent sequences it admits (>= 0; 0: unknown)
    uint64_t incarnation = 0;      // >= 1; new and larger at every process start

    bool operator==(const Member&) const = default;
};

// REQUIRES nothing: every field is checked; the error names the field.
Status validate(const Member& m);
std::string to_json(const Member& m);
// INVALID_ARGUMENT (naming the field) for malformed JSON, missing or wrong-typed
// fields, or a record that fails validate().
Result<Member> member_from_json(std::string_view json);

// A fresh incarnation for this process start: wall-clock ns, so a restart on the same
// machine always draws a larger one (clocks of different machines only need to be
// roughly right: ids differ there).
uint64_t new_incarnation(int64_t wall_ns);

enum class ChangeKind {
    kJoined,     // new id
    kUpdated,    // same id and incarnation, other fields changed
    kRestarted,  // same id, higher incarnation
    kLeft,       // removed (lease expired, left, or deleted from the file)
};

std::string_view change_name(ChangeKind k);

struct MemberChange {
    ChangeKind kind = ChangeKind::kJoined;
    Member member;  // for kLeft: the record that left
};

class MemberTable {
public:
    // Applies a put. Returns the change, or nothing when the record changes nothing or
    // is stale (counted in num_stale()).
    std::optional<MemberChange> put(const Member& m);
    // Applies a delete of `id`. `incarnation` 0 means "whatever is there" (etcd delete
    // events carry no value); otherwise a delete older than the held record is stale.
    std::optional<MemberChange> remove(std::string_view id, uint64_t incarnation = 0);
    // Replaces the whole table with `members` (a relist after a lost watch) and returns
    // the changes that turn the old table into the new one, in id order.
    std::vector<MemberChange> reset(const std::vector<Member>& members);

    const Member* find(std::string_view id) const;
    std::vector<Member> members() const;  // in id order
    int64_t num_stale() const { return num_stale_; }

private:
    std::map<std::string, Member, std::less<>> members_;
    int64_t num_stale_ = 0;
};

}  // namespace dsi::membership

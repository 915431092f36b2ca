#include "membership/member.h"

#include <cerrno>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace dsi::membership {

std::string_view role_name(Role r) {
    switch (r) {
        case Role::kRouter: return "router";
        case Role::kPrefill: return "prefill";
        case Role::kDecode: return "decode";
        case Role::kBoth: return "both";
    }
    return "?";
}

Result<Role> parse_role(std::string_view s) {
    for (Role r : {Role::kRouter, Role::kPrefill, Role::kDecode, Role::kBoth}) {
        if (s == role_name(r)) return r;
    }
    return invalid_argument("role must be router, prefill, decode or both (got '" +
                            std::string(s) + "')");
}

std::string_view change_name(ChangeKind k) {
    switch (k) {
        case ChangeKind::kJoined: return "joined";
        case ChangeKind::kUpdated: return "updated";
        case ChangeKind::kRestarted: return "restarted";
        case ChangeKind::kLeft: return "left";
    }
    return "?";
}

namespace {

bool valid_id(std::string_view id) {
    if (id.empty() || id.size() > 128) return false;
    for (char c : id) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// host:port with a port in 1..65535 and a non-empty host without spaces.
bool valid_host_port(std::string_view a) {
    const size_t colon = a.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size()) return false;
    if (a.find_first_of(" \t\r\n/") != std::string_view::npos) return false;
    int port = 0;
    for (char c : a.substr(colon + 1)) {
        if (c < '0' || c > '9') return false;
        port = port * 10 + (c - '0');
        if (port > 65535) return false;
    }
    return port >= 1;
}

}  // namespace

Status validate(const Member& m) {
    if (!valid_id(m.id)) {
        return invalid_argument("member id must be 1-128 of [A-Za-z0-9._-] (got '" + m.id + "')");
    }
    if (!valid_host_port(m.address)) {
        return invalid_argument("member '" + m.id + "': address must be host:port (got '" +
                                m.address + "')");
    }
    if (!m.transfer_address.empty() && !valid_host_port(m.transfer_address)) {
        return invalid_argument("member '" + m.id +
                                "': transfer_address must be host:port (got '" +
                                m.transfer_address + "')");
    }
    if (m.capacity < 0) {
        return invalid_argument("member '" + m.id + "': capacity must be >= 0");
    }
    if (m.incarnation == 0) {
        return invalid_argument("member '" + m.id + "': incarnation must be >= 1");
    }
    return Status::ok();
}

std::string to_json(const Member& m) {
    nlohmann::json j = {{"id", m.id},
                        {"role", role_name(m.role)},
                        {"address", m.address},
                        {"transfer_address", m.transfer_address},
                        {"capacity", m.capacity},
                        // As a string: JSON readers in other languages keep 64 bits.
                        {"incarnation", std::to_string(m.incarnation)}};
    return j.dump();
}

Result<Member> member_from_json(std::string_view json) {
    nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
        return invalid_argument("member record is not a JSON object");
    }
    auto str = [&](const char* key, bool required, std::string* out) -> Status {
        auto it = j.find(key);
        if (it == j.end()) {
            return required ? invalid_argument(std::string("member record has no '") + key + "'")
                            : Status::ok();
        }
        if (!it->is_string()) {
            return invalid_argument(std::string("member record: '") + key + "' must be a string");
        }
        *out = it->get<std::string>();
        return Status::ok();
    };
    Member m;
    std::string role, incarnation;
    DSI_RETURN_IF_ERROR(str("id", true, &m.id));
    DSI_RETURN_IF_ERROR(str("role", true, &role));
    DSI_RETURN_IF_ERROR(str("address", true, &m.address));
    DSI_RETURN_IF_ERROR(str("transfer_address", false, &m.transfer_address));
    DSI_RETURN_IF_ERROR(str("incarnation", true, &incarnation));
    DSI_ASSIGN_OR_RETURN(m.role, parse_role(role));
    if (auto it = j.find("capacity"); it != j.end()) {
        if (!it->is_number_integer()) {
            return invalid_argument("member record: 'capacity' must be an integer");
        }
        m.capacity = it->get<int64_t>();
    }
    if (incarnation.empty() || incarnation.size() > 20 ||
        incarnation.find_first_not_of("0123456789") != std::string::npos) {
        return invalid_argument("member record: 'incarnation' must be a decimal string");
    }
    errno = 0;
    const unsigned long long v = std::strtoull(incarnation.c_str(), nullptr, 10);
    if (errno != 0) return invalid_argument("member record: 'incarnation' out of range");
    m.incarnation = v;
    DSI_RETURN_IF_ERROR(validate(m));
    return m;
}

uint64_t new_incarnation(int64_t wall_ns) {
    return wall_ns > 0 ? static_cast<uint64_t>(wall_ns) : 1;
}

std::optional<MemberChange> MemberTable::put(const Member& m) {
    auto it = members_.find(m.id);
    if (it == members_.end()) {
        members_.emplace(m.id, m);
        return MemberChange{ChangeKind::kJoined, m};
    }
    if (m.incarnation < it->second.incarnation) {
        ++num_stale_;
        return std::nullopt;
    }
    if (m == it->second) return std::nullopt;
    const ChangeKind kind =
        m.incarnation > it->second.incarnation ? ChangeKind::kRestarted : ChangeKind::kUpdated;
    it->second = m;
    return MemberChange{kind, m};
}

std::optional<MemberChange> MemberTable::remove(std::string_view id, uint64_t incarnation) {
    auto it = members_.find(id);
    if (it == members_.end()) return std::nullopt;
    if (incarnation != 0 && incarnation < it->second.incarnation) {
        ++num_stale_;
        return std::nullopt;
    }
    MemberChange c{ChangeKind::kLeft, it->second};
    members_.erase(it);
    return c;
}

std::vector<MemberChange> MemberTable::reset(const std::vector<Member>& members) {
    std::map<std::string, const Member*, std::less<>> next;
    for (const Member& m : members) next[m.id] = &m;
    std::vector<MemberChange> changes;
    // Ids that are gone (in id order), then puts for the new list (in id order).
    for (auto it = members_.begin(); it != members_.end();) {
        if (next.find(it->first) == next.end()) {
            changes.push_back({ChangeKind::kLeft, it->second});
            it = members_.erase(it);
        } else {
            ++it;
        }
    }
    for (const auto& [id, m] : next) {
        auto it = members_.find(id);
        if (it != members_.end() && m->incarnation < it->second.incarnation) {
            // A relist is the directory's truth: a lower incarnation there means the
            // newer process is gone and an old record came back (never in etcd, where
            // records carry leases; possible in a hand-edited static file).
            changes.push_back({ChangeKind::kRestarted, *m});
            it->second = *m;
            continue;
        }
        if (auto c = put(*m)) changes.push_back(std::move(*c));
    }
    return changes;
}

const Member* MemberTable::find(std::string_view id) const {
    auto it = members_.find(id);
    return it == members_.end() ? nullptr : &it->second;
}

std::vector<Member> MemberTable::members() const {
    std::vector<Member> out;
    out.reserve(members_.size());
    for (const auto& [id, m] : members_) out.push_back(m);
    return out;
}

}  // namespace dsi::membership

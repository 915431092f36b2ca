#include "protocol/conversation.h"

namespace dsi::protocol {

std::string_view role_name(Role role) {
    switch (role) {
        case Role::kSystem: return "system";
        case Role::kDeveloper: return "developer";
        case Role::kUser: return "user";
        case Role::kAssistant: return "assistant";
        case Role::kTool: return "tool";
        case Role::kLatestReminder: return "latest_reminder";
    }
    return "?";
}

std::optional<Role> role_from_name(std::string_view name) {
    for (Role r : {Role::kSystem, Role::kDeveloper, Role::kUser, Role::kAssistant, Role::kTool}) {
        if (role_name(r) == name) {
            return r;
        }
    }
    return std::nullopt;
}

std::string Tool::name() const {
    if (function.is_object() && function.contains("name") && function["name"].is_string()) {
        return function["name"].get<std::string>();
    }
    return {};
}

}  // namespace dsi::protocol

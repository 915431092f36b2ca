#include "base/settings.h"

#include <cctype>

namespace dsi {

std::string setting_env_name(std::string_view flag) {
    while (!flag.empty() && flag.front() == '-') flag.remove_prefix(1);
    std::string out = "DSINFER_";
    for (char c : flag) {
        out += (c == '-' || c == '.') ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return out;
}

}  // namespace dsi

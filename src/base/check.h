// DSI_CHECK: invariants that must hold in every build (release too). A failed
// check prints file:line and the message, then aborts. Use Status for anything a
// caller or an input can cause; DSI_CHECK only for programming errors.
#pragma once

#include <sstream>
#include <string>

namespace dsi::internal {

[[noreturn]] void check_failed(const char* file, int line, const char* expr,
                               const std::string& message);

template <typename... Args>
std::string concat_message(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

}  // namespace dsi::internal

#define DSI_CHECK(cond, ...)                                                      \
    do {                                                                          \
        if (!(cond)) [[unlikely]] {                                               \
            ::dsi::internal::check_failed(__FILE__, __LINE__, #cond,              \
                                          ::dsi::internal::concat_message(        \
                                              "" __VA_OPT__(, ) __VA_ARGS__));    \
        }                                                                         \
    } while (0)

#define DSI_CHECK_EQ(a, b, ...) DSI_CHECK((a) == (b), #a " == " #b " " __VA_OPT__(, ) __VA_ARGS__)
#define DSI_CHECK_LT(a, b, ...) DSI_CHECK((a) < (b), #a " < " #b " " __VA_OPT__(, ) __VA_ARGS__)
#define DSI_CHECK_LE(a, b, ...) DSI_CHECK((a) <= (b), #a " <= " #b " " __VA_OPT__(, ) __VA_ARGS__)

#ifdef NDEBUG
#define DSI_DCHECK(cond, ...) \
    do {                      \
    } while (0)
#else
#define DSI_DCHECK(cond, ...) DSI_CHECK(cond __VA_OPT__(, ) __VA_ARGS__)
#endif

// Status and Result<T>: the error currency at every module boundary.
//
// Expected failures (bad input, I/O, capacity, deadline, shutdown) travel as a
// Status or Result<T>; broken invariants are DSI_CHECK (check.h). Each code maps
// one-to-one to an HTTP status so the server can answer in the caller's protocol.
// Thread model: value types, no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace dsi {

enum class StatusCode : uint8_t {
    kOk = 0,
    kInvalidArgument,     // 400: malformed request or file
    kUnauthenticated,     // 401
    kPermissionDenied,    // 403
    kNotFound,            // 404
    kAlreadyExists,       // 409
    kFailedPrecondition,  // 409: state does not allow the operation
    kOutOfRange,          // 400: a value outside its valid range (offsets, lengths)
    kResourceExhausted,   // 429: capacity, quotas, limits
    kCancelled,           // 499: the caller went away
    kInternal,            // 500
    kUnimplemented,       // 501
    kUnavailable,         // 503: shutting down, draining, not ready
    kDeadlineExceeded,    // 504
    kDataLoss,            // 500: corrupt or truncated data
};

std::string_view status_code_name(StatusCode code);
int http_status(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;  // OK
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok() { return Status(); }

    bool is_ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    // "INVALID_ARGUMENT: message" (or "OK").
    std::string to_string() const;
    // Returns a copy with `context + ": "` prepended to the message.
    Status with_context(std::string_view context) const;

    bool operator==(const Status& other) const = default;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

Status invalid_argument(std::string message);
Status not_found(std::string message);
Status out_of_range(std::string message);
Status resource_exhausted(std::string message);
Status failed_precondition(std::string message);
Status data_loss(std::string message);
Status internal_error(std::string message);
Status unimplemented(std::string message);
Status unavailable(std::string message);
Status cancelled(std::string message);
Status deadline_exceeded(std::string message);

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
    Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
        DSI_CHECK(!std::get<Status>(v_).is_ok(), "Result constructed from an OK status");
    }

    bool is_ok() const { return std::holds_alternative<T>(v_); }
    const Status& status() const {
        static const Status kOk;
        return is_ok() ? kOk : std::get<Status>(v_);
    }
    // REQUIRES: is_ok().
    T& value() & {
        DSI_CHECK(is_ok(), "Result::value on error: ", std::get<Status>(v_).to_string());
        return std::get<T>(v_);
    }
    const T& value() const& {
        DSI_CHECK(is_ok(), "Result::value on error: ", std::get<Status>(v_).to_string());
        return std::get<T>(v_);
    }
    T&& value() && {
        DSI_CHECK(is_ok(), "Result::value on error: ", std::get<Status>(v_).to_string());
        return std::get<T>(std::move(v_));
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

private:
    std::variant<T, Status> v_;
};

}  // namespace dsi

#define DSI_CONCAT_INNER_(a, b) a##b
#define DSI_CONCAT_(a, b) DSI_CONCAT_INNER_(a, b)

// DSI_RETURN_IF_ERROR(expr): expr yields a Status; returns it when not OK.
#define DSI_RETURN_IF_ERROR(expr)                                \
    do {                                                         \
        ::dsi::Status dsi_status_ = (expr);                      \
        if (!dsi_status_.is_ok()) return dsi_status_;            \
    } while (0)

// DSI_ASSIGN_OR_RETURN(decl, expr): expr yields a Result<T>; on error returns its
// Status, else moves the value into `decl` (e.g. `auto x` or an existing lvalue).
#define DSI_ASSIGN_OR_RETURN(decl, expr) \
    DSI_ASSIGN_OR_RETURN_IMPL_(DSI_CONCAT_(dsi_result_, __LINE__), decl, expr)
#define DSI_ASSIGN_OR_RETURN_IMPL_(tmp, decl, expr) \
    auto tmp = (expr);                              \
    if (!tmp.is_ok()) return tmp.status();          \
    decl = std::move(tmp).value()

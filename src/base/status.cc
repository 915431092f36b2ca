#include "base/status.h"

#include <cstdio>
#include <cstdlib>

namespace dsi {

std::string_view status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "OK";
        case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
        case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
        case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
        case StatusCode::kNotFound: return "NOT_FOUND";
        case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
        case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
        case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
        case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
        case StatusCode::kCancelled: return "CANCELLED";
        case StatusCode::kInternal: return "INTERNAL";
        case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
        case StatusCode::kUnavailable: return "UNAVAILABLE";
        case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
        case StatusCode::kDataLoss: return "DATA_LOSS";
    }
    return "UNKNOWN";
}

int http_status(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return 200;
        case StatusCode::kInvalidArgument: return 400;
        case StatusCode::kOutOfRange: return 400;
        case StatusCode::kUnauthenticated: return 401;
        case StatusCode::kPermissionDenied: return 403;
        case StatusCode::kNotFound: return 404;
        case StatusCode::kAlreadyExists: return 409;
        case StatusCode::kFailedPrecondition: return 409;
        case StatusCode::kResourceExhausted: return 429;
        case StatusCode::kCancelled: return 499;
        case StatusCode::kInternal: return 500;
        case StatusCode::kDataLoss: return 500;
        case StatusCode::kUnimplemented: return 501;
        case StatusCode::kUnavailable: return 503;
        case StatusCode::kDeadlineExceeded: return 504;
    }
    return 500;
}

std::string Status::to_string() const {
    if (is_ok()) return "OK";
    std::string s(status_code_name(code_));
    s += ": ";
    s += message_;
    return s;
}

Status Status::with_context(std::string_view context) const {
    if (is_ok()) return *this;
    return Status(code_, std::string(context) + ": " + message_);
}

Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

namespace internal {

void check_failed(const char* file, int line, const char* expr, const std::string& message) {
    std::fprintf(stderr, "DSI_CHECK failed at %s:%d: %s %s\n", file, line, expr, message.c_str());
    std::fflush(stderr);
    std::abort();
}

}  // namespace internal
}  // namespace dsi

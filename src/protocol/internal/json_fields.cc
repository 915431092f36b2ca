#include "protocol/internal/json_fields.h"

namespace dsi::protocol::internal {

Result<std::optional<std::string>> opt_string(const J& j, std::string_view key,
                                              std::string_view path) {
    const J* v = member(j, key);
    if (v == nullptr) {
        return std::optional<std::string>();
    }
    if (!v->is_string()) {
        return field_error(join_path(path, key), "expected a string");
    }
    return std::optional<std::string>(v->get<std::string>());
}

Result<std::string> req_string(const J& j, std::string_view key, std::string_view path) {
    DSI_ASSIGN_OR_RETURN(auto v, opt_string(j, key, path));
    if (!v) {
        return field_error(join_path(path, key), "required field is missing");
    }
    return *v;
}

Result<std::optional<double>> opt_number(const J& j, std::string_view key, std::string_view path,
                                         double lo, double hi) {
    const J* v = member(j, key);
    if (v == nullptr) {
        return std::optional<double>();
    }
    if (!v->is_number()) {
        return field_error(join_path(path, key), "expected a number");
    }
    const double d = v->get<double>();
    if (!(d >= lo && d <= hi)) {
        return field_error(join_path(path, key), "must be between " + J(lo).dump() + " and " +
                                                     J(hi).dump());
    }
    return std::optional<double>(d);
}

Result<std::optional<int64_t>> opt_int(const J& j, std::string_view key, std::string_view path,
                                       int64_t lo, int64_t hi) {
    const J* v = member(j, key);
    if (v == nullptr) {
        return std::optional<int64_t>();
    }
    if (!v->is_number_integer()) {
        return field_error(join_path(path, key), "expected an integer");
    }
    const int64_t n = v->is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
                          : v->get<int64_t>();
    if (n < lo || n > hi) {
        return field_error(join_path(path, key),
                           "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    return std::optional<int64_t>(n);
}

Result<std::optional<bool>> opt_bool(const J& j, std::string_view key, std::string_view path) {
    const J* v = member(j, key);
    if (v == nullptr) {
        return std::optional<bool>();
    }
    if (!v->is_boolean()) {
        return field_error(join_path(path, key), "expected a boolean");
    }
    return std::optional<bool>(v->get<bool>());
}

Status expect_object(const J& j, std::string_view path) {
    return j.is_object() ? Status::ok() : field_error(path, "expected an object");
}

Status expect_array(const J& j, std::string_view path) {
    return j.is_array() ? Status::ok() : field_error(path, "expected an array");
}

}  // namespace dsi::protocol::internal

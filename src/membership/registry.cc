#include "membership/registry.h"

#include "membership/internal/backends.h"

namespace dsi::membership {

Result<std::unique_ptr<Registry>> open_registry(std::string_view uri,
                                                const RegistryOptions& options, Env* env) {
    if (options.lease_ttl_s < 2) {
        return invalid_argument("membership lease TTL must be at least 2 s (etcd's minimum)");
    }
    if (options.keepalive_interval_ms < 0 ||
        options.keepalive_interval_ms >= options.lease_ttl_s * 1000) {
        return invalid_argument("membership keep-alive interval must be shorter than the TTL");
    }
    if (options.request_timeout_ms <= 0 || options.retry_interval_ms <= 0 ||
        options.file_poll_interval_ms <= 0) {
        return invalid_argument("membership timeouts and intervals must be positive");
    }
    if (env == nullptr) env = Env::default_env();
    constexpr std::string_view kEtcd = "etcd://";
    constexpr std::string_view kFile = "file://";
    if (uri.substr(0, kEtcd.size()) == kEtcd) {
        std::string_view rest = uri.substr(kEtcd.size());
        const size_t slash = rest.find('/');
        std::string prefix = "/dsinfer/members/";
        if (slash != std::string_view::npos && slash + 1 < rest.size()) {
            prefix = std::string(rest.substr(slash));
            if (prefix.back() != '/') prefix.push_back('/');
        }
        DSI_ASSIGN_OR_RETURN(net::HttpTarget target,
                             net::parse_base_url("http://" + std::string(rest.substr(0, slash))));
        if (target.port == "80" && rest.substr(0, slash).find(':') == std::string_view::npos) {
            target.port = "2379";  // etcd's client port, not HTTP's
        }
        return internal::make_etcd_registry(std::move(target), std::move(prefix), options);
    }
    if (uri.substr(0, kFile.size()) == kFile) {
        std::string path(uri.substr(kFile.size()));
        if (path.empty() || path.front() != '/') {
            return invalid_argument("file membership URI needs an absolute path: file:///path");
        }
        return internal::make_file_registry(std::move(path), options, env);
    }
    return invalid_argument("membership URI must be etcd://host:port[/prefix] or "
                            "file:///path (got '" +
                            std::string(uri) + "')");
}

}  // namespace dsi::membership

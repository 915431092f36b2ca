// free_loopback_port: a TCP port on 127.0.0.1 that was free a moment ago (bound to port 0
// and released), for test servers and `cluster up`'s local processes. Another process
// may take it before the caller binds it: callers that can, bind port 0 themselves.
// Header-only (test servers of several modules include it without linking net/).
// Thread model: a free function, any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dsi::net {

// -1 when no socket could be bound.
inline int free_loopback_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
    }
    ::close(fd);
    return port;
}

}  // namespace dsi::net

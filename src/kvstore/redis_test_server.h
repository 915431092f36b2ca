// RedisTestServer: a throw-away redis-server on a free loopback port in a temp dir, for
// tests and benchmarks (never a server started by hand). Killed (SIGKILL) on destruction
// and if the parent dies (PR_SET_PDEATHSIG). Thread model: test code, one thread.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "kvstore/test_util.h"
#include "net/ports.h"

namespace dsi::kvstore::testing {

using net::free_loopback_port;

inline bool have_redis_server() {
    return ::access("/usr/bin/redis-server", X_OK) == 0 ||
           ::access("/usr/local/bin/redis-server", X_OK) == 0;
}

class RedisTestServer {
public:
    explicit RedisTestServer(const std::string& maxmemory = "0") {
        port_ = free_loopback_port();
        std::string port = std::to_string(port_);
        std::string log = dir_.path() + "/redis.log";
        pid_ = ::fork();
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            ::execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", dir_.path().c_str(), "--logfile",
                     log.c_str(), "--maxmemory", maxmemory.c_str(), "--maxmemory-policy",
                     "noeviction", static_cast<char*>(nullptr));
            ::_exit(127);
        }
        // Ready when it answers PING; give up after 10 s.
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (std::chrono::steady_clock::now() < until) {
            struct timeval tv = {0, 200'000};
            redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
            if (c != nullptr && c->err == 0) {
                auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
                bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
                if (r != nullptr) {
                    freeReplyObject(r);
                }
                redisFree(c);
                if (ok) {
                    ready_ = true;
                    return;
                }
            } else if (c != nullptr) {
                redisFree(c);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ~RedisTestServer() { kill9(); }
    RedisTestServer(const RedisTestServer&) = delete;
    RedisTestServer& operator=(const RedisTestServer&) = delete;

    bool ready() const { return ready_; }
    int port() const { return port_; }
    void kill9() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }
    // Runs one command on this server (test setup / damage).
    void command(const std::string& a, const std::string& b, const std::string& c) {
        struct timeval tv = {1, 0};
        redisContext* ctx = redisConnectWithTimeout("127.0.0.1", port_, tv);
        if (ctx != nullptr && ctx->err == 0) {
            const char* argv[] = {a.c_str(), b.c_str(), c.c_str()};
            size_t lens[] = {a.size(), b.size(), c.size()};
            auto* r = static_cast<redisReply*>(redisCommandArgv(ctx, 3, argv, lens));
            if (r != nullptr) {
                freeReplyObject(r);
            }
        }
        if (ctx != nullptr) {
            redisFree(ctx);
        }
    }

private:
    TempDir dir_;
    int port_ = -1;
    pid_t pid_ = -1;
    bool ready_ = false;
};

}  // namespace dsi::kvstore::testing

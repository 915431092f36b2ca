// EtcdTestServer: a throw-away etcd (Debian's etcd-server) on free loopback ports in a
// temp dir, for tests (never a server started by hand). kill9() and restart() drive the
// failure drills; SIGKILLed on destruction and if the parent dies (PR_SET_PDEATHSIG).
// Thread model: test code, one thread.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "net/http_client.h"
#include "net/ports.h"

namespace dsi::membership::testing {

using net::free_loopback_port;

class EtcdTestServer {
public:
    EtcdTestServer() {
        char tmpl[] = "/tmp/dsinfer-etcd-XXXXXX";
        dir_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
        client_port_ = free_loopback_port();
        peer_port_ = free_loopback_port();
        start();
    }
    ~EtcdTestServer() {
        kill9();
        std::error_code ec;
        if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
    }
    EtcdTestServer(const EtcdTestServer&) = delete;
    EtcdTestServer& operator=(const EtcdTestServer&) = delete;

    bool ready() const { return ready_; }
    int port() const { return client_port_; }
    std::string uri(const std::string& prefix = "") const {
        return "etcd://127.0.0.1:" + std::to_string(client_port_) + prefix;
    }
    void kill9() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
        ready_ = false;
    }
    // Starts again on the same ports; `lose_data` starts from an empty data dir (leases
    // and records gone, revisions from 1).
    void restart(bool lose_data) {
        kill9();
        if (lose_data) ++generation_;
        start();
    }

private:
    void start() {
        const std::string data = dir_ + "/data" + std::to_string(generation_);
        const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
        const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
        const std::string cluster = "default=" + peer;
        const std::string log = dir_ + "/etcd.log";
        pid_ = ::fork();
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (FILE* f = std::freopen(log.c_str(), "a", stderr)) (void)f;
            ::execlp("etcd", "etcd", "--data-dir", data.c_str(), "--listen-client-urls",
                     client.c_str(), "--advertise-client-urls", client.c_str(),
                     "--listen-peer-urls", peer.c_str(), "--initial-advertise-peer-urls",
                     peer.c_str(), "--initial-cluster", cluster.c_str(), "--log-level", "error",
                     static_cast<char*>(nullptr));
            ::_exit(127);
        }
        // Ready when the gateway answers a range request; give up after 20 s.
        net::HttpClient c({"127.0.0.1", std::to_string(client_port_), ""});
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < until) {
            net::HttpRequest req;
            req.path = "/v3/kv/range";
            req.body = R"({"key":"AA=="})";
            req.timeout_ms = 1000;
            auto r = net::fetch(c, req);
            if (r.is_ok() && r->status == 200) {
                ready_ = true;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }

    std::string dir_;
    int client_port_ = -1;
    int peer_port_ = -1;
    int generation_ = 0;
    pid_t pid_ = -1;
    bool ready_ = false;
};

}  // namespace dsi::membership::testing

// `dsinfer cluster up`: a whole cluster on this machine with one command (issue 18):
// a directory (etcd when the etcd binary is there, else a membership file), N engines
// (`serve --role both`, or --prefill N --decode M disaggregated ones) and the router,
// each a process of this binary. Prints the
// router's address; Ctrl-C (or SIGTERM) drains and stops everything, etcd last. The
// same topology across hosts is in docs/cluster.md (start the same commands there).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "membership/registry.h"
#include "net/ports.h"

namespace dsi {
namespace {

struct ClusterFlags {
    int engines = 2;
    // Disaggregated (both > 0): prefill and decode engines instead of `engines` of role
    // both; the decode engines take the prompts' KV from the prefill engines (KV hand-over).
    int prefill = 0;
    int decode = 0;
    std::string store;  // --kv-store of every engine and the router ('' = none)
    std::string etcd;   // host:port of an existing etcd ('' = --membership or start one)
    int port = 8080;
    std::string host = "127.0.0.1";
    std::string membership;  // "" = start etcd (or use a file when there is no etcd)
    std::string model;
    int threads = 0;  // per engine; 0: cores / engines
    std::string run_dir;  // "" = a temp dir (logs of every process)
    int64_t lease_ttl_s = 5;
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct Child {
    std::string name;
    pid_t pid = -1;
    std::string log;
};

// Starts `argv` with stdout+stderr to `log`. -1 on failure.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
    // What this process printed must not be printed again by the child's freopen.
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    ::setpgid(0, 0);  // Ctrl-C reaches the parent only; it stops the children in order
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out == nullptr || ::dup2(::fileno(stdout), 2) < 0) ::_exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
}

// The port a `serve` / `router` child prints ("listening on http://HOST:PORT"), waiting
// up to `seconds`; -1 when it exits or never says.
int wait_listening(const Child& c, int seconds) {
    for (int i = 0; i < seconds * 10 && !g_stop; ++i) {
        std::ifstream f(c.log);
        std::stringstream ss;
        ss << f.rdbuf();
        const std::string text = ss.str();
        const size_t at = text.find("listening on http://");
        if (at != std::string::npos) {
            const size_t colon = text.find(':', at + 20);
            if (colon != std::string::npos) return std::atoi(text.c_str() + colon + 1);
        }
        if (::waitpid(c.pid, nullptr, WNOHANG) == c.pid) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
}

bool have_program(const char* name) {
    const char* path = std::getenv("PATH");
    std::stringstream ss(path != nullptr ? path : "/usr/bin:/bin");
    for (std::string dir; std::getline(ss, dir, ':');) {
        if (::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    }
    return false;
}

void stop_all(std::vector<Child>& children) {
    // Router first (no new work), then the engines drain, then the directory.
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
        if (it->pid > 0) ::kill(it->pid, SIGTERM);
    }
    for (auto& c : children) {
        if (c.pid <= 0) continue;
        for (int i = 0; i < 600 && ::waitpid(c.pid, nullptr, WNOHANG) == 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (::waitpid(c.pid, nullptr, WNOHANG) == 0) {
            ::kill(c.pid, SIGKILL);
            ::waitpid(c.pid, nullptr, 0);
        }
        c.pid = -1;
    }
}

int run_cluster_up(const ClusterFlags& f) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string run = f.run_dir;
    if (run.empty()) {
        char tmpl[] = "/tmp/dsinfer-cluster-XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) {
            std::fprintf(stderr, "dsinfer cluster up: cannot make a temp dir\n");
            return 1;
        }
        run = tmpl;
    }
    std::filesystem::create_directories(run);
    ::signal(SIGINT, on_signal);
    ::signal(SIGTERM, on_signal);
    // Children are started in this order and stopped in reverse: etcd, engines, router.
    std::vector<Child> children;
    auto fail = [&](const std::string& why) {
        std::fprintf(stderr, "dsinfer cluster up: %s (logs in %s)\n", why.c_str(), run.c_str());
        stop_all(children);
        return 1;
    };

    if ((f.prefill > 0) != (f.decode > 0)) {
        return fail("--prefill and --decode go together (a disaggregated cluster needs both)");
    }
    if (!f.etcd.empty() && !f.membership.empty()) return fail("--etcd or --membership, not both");
    std::string membership =
        f.etcd.empty() ? f.membership : "etcd://" + f.etcd + "/dsinfer/members/";
    if (membership.empty() && have_program("etcd")) {
        const int client = net::free_loopback_port();
        const int peer = net::free_loopback_port();
        const std::string c = "http://127.0.0.1:" + std::to_string(client);
        const std::string p = "http://127.0.0.1:" + std::to_string(peer);
        Child etcd{"etcd", -1, run + "/etcd.log"};
        etcd.pid = spawn({"etcd", "--data-dir", run + "/etcd", "--listen-client-urls", c,
                          "--advertise-client-urls", c, "--listen-peer-urls", p,
                          "--initial-advertise-peer-urls", p, "--initial-cluster",
                          "default=" + p, "--log-level", "error"},
                         etcd.log);
        children.push_back(etcd);
        membership = "etcd://127.0.0.1:" + std::to_string(client) + "/dsinfer/members/";
        // Ready when it answers a listing (within a second or two).
        auto registry = membership::open_registry(membership);
        bool ready = false;
        for (int i = 0; i < 200 && !g_stop && !ready; ++i) {
            ready = registry.is_ok() && (*registry)->list().is_ok();
            if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (!ready) return fail("etcd did not start");
    } else if (membership.empty()) {
        membership = "file://" + run + "/members.json";
    }
    // The engines: (name, role), in start order.
    std::vector<std::pair<std::string, std::string>> engines;
    if (f.prefill > 0) {
        for (int i = 0; i < f.prefill; ++i) engines.emplace_back("prefill-" + std::to_string(i), "prefill");
        for (int i = 0; i < f.decode; ++i) engines.emplace_back("decode-" + std::to_string(i), "decode");
    } else {
        for (int i = 0; i < f.engines; ++i) engines.emplace_back("engine-" + std::to_string(i), "both");
    }
    const int num_engines = static_cast<int>(engines.size());
    const int threads = f.threads > 0 ? f.threads
                                      : std::max(1, Env::default_env()->num_cpus() / num_engines);
    std::vector<std::string> model_args;
    if (!f.model.empty()) model_args = {"--model", f.model};
    if (!f.store.empty()) model_args.insert(model_args.end(), {"--kv-store", f.store});
    for (size_t i = 0; i < engines.size() && !g_stop; ++i) {
        Child e{engines[i].first, -1, run + "/" + engines[i].first + ".log"};
        std::vector<std::string> argv = {self, "serve", "--role", engines[i].second, "--membership",
                                         membership, "--node-id", e.name, "--port", "0",
                                         "--threads", std::to_string(threads), "--lease-ttl-s",
                                         std::to_string(f.lease_ttl_s)};
        argv.insert(argv.end(), model_args.begin(), model_args.end());
        e.pid = spawn(argv, e.log);
        children.push_back(e);
        const int port = wait_listening(e, 600);
        if (port < 0) return fail(e.name + " did not start");
        std::printf("dsinfer cluster up: %s on 127.0.0.1:%d\n", e.name.c_str(), port);
    }
    Child router{"router", -1, run + "/router.log"};
    std::vector<std::string> argv = {self, "router", "--membership", membership, "--host", f.host,
                                     "--port", std::to_string(f.port), "--lease-ttl-s",
                                     std::to_string(f.lease_ttl_s)};
    argv.insert(argv.end(), model_args.begin(), model_args.end());
    if (!g_stop) {
        router.pid = spawn(argv, router.log);
        children.push_back(router);
        const int port = wait_listening(router, 600);
        if (port < 0) return fail("the router did not start");
        std::printf("dsinfer cluster up: %d engine(s), directory %s, logs in %s\n", num_engines,
                    membership.c_str(), run.c_str());
        std::printf("dsinfer cluster up: listening on http://%s:%d (Ctrl-C stops everything)\n",
                    f.host.c_str(), port);
        std::fflush(stdout);
    }
    while (!g_stop) {
        for (auto& c : children) {
            int status = 0;
            if (c.pid > 0 && ::waitpid(c.pid, &status, WNOHANG) == c.pid) {
                std::fprintf(stderr, "dsinfer cluster up: %s exited (status %d); see %s\n",
                             c.name.c_str(), status, c.log.c_str());
                c.pid = -1;
                if (c.name == "router" || c.name == "etcd") g_stop = 1;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    stop_all(children);
    std::printf("dsinfer cluster up: stopped\n");
    if (f.run_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(run, ec);
    }
    return 0;
}

}  // namespace

void register_cluster_commands(CLI::App& app) {
    CLI::App* cluster = app.add_subcommand("cluster", "a cluster on this machine");
    cluster->require_subcommand(1);
    auto f = std::make_shared<ClusterFlags>();
    CLI::App* up = cluster->add_subcommand(
        "up", "etcd (or a membership file) + N engines + the router; Ctrl-C stops them");
    add_setting(*up, "--engines", f->engines, "engine processes (serve --role both)")
        ->check(CLI::Range(1, 64));
    add_setting(*up, "--prefill", f->prefill,
                "prefill engines of a disaggregated cluster (with --decode; replaces --engines)")
        ->check(CLI::Range(0, 64));
    add_setting(*up, "--decode", f->decode,
                "decode engines of a disaggregated cluster (they receive the prompts' KV)")
        ->check(CLI::Range(0, 64));
    add_setting(*up, "--store", f->store,
                "KV block store of every engine and the router (--kv-store URI; '' = none)");
    add_setting(*up, "--etcd", f->etcd, "host:port of an existing etcd ('' = start one here)");
    add_setting(*up, "--host", f->host, "the router's listen address");
    add_setting(*up, "--port", f->port, "the router's port (0: any free port, printed)");
    add_setting(*up, "--membership", f->membership,
                "an existing directory (etcd://host:port[/prefix] or file:///path); '' = start "
                "etcd here (a membership file when etcd is not installed)");
    add_setting(*up, "--model", f->model, "checkpoint for every process ('' = the default model)");
    add_setting(*up, "--threads", f->threads, "threads per engine (0: cores / engines)");
    add_setting(*up, "--run-dir", f->run_dir, "logs of every process ('' = a temp dir, removed)");
    add_setting(*up, "--lease-ttl-s", f->lease_ttl_s, "membership lease of every process")
        ->check(CLI::Range(2, 3600));
    up->callback([f] { throw CLI::RuntimeError(run_cluster_up(*f)); });
}

}  // namespace dsi

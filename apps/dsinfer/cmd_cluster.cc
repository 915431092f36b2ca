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
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/settings.h"
#include "cluster/autoscaler.h"
#include "membership/registry.h"
#include "net/http_client.h"
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
    // --autoscale (disaggregated only): cluster::Autoscaler decides, this process starts
    // and drains engine processes within [min, max] per role.
    bool autoscale = false;
    cluster::AutoscalerSettings scale = [] {
        cluster::AutoscalerSettings s;
        s.prefill_missed_tokens_per_s_per_instance = 2000;  // a CPU engine, not a GPU rank
        s.decode_requests_per_instance = 8;
        s.max_prefill = 4;
        s.max_decode = 4;
        s.max_step_instances = 1;
        s.spare_pool_target = 0;  // one machine: no spare pool
        return s;
    }();
    double scale_out_interval_s = 10;
    double scale_in_interval_s = 60;
    int64_t autoscale_period_ms = 1000;
    int port = 8080;
    std::string host = "127.0.0.1";
    std::string membership;  // "" = start etcd (or use a file when there is no etcd)
    std::string model;
    int threads = 0;  // per engine; 0: cores / engines
    std::string run_dir;  // "" = a temp dir (logs of every process)
    int64_t lease_ttl_s = 5;
    std::string kv_transport = "tcp";  // every engine's --kv-transport
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct Child {
    std::string name;
    pid_t pid = -1;
    std::string log;
    std::string role;       // engines: prefill | decode | both
    int port = -1;          // engines: their API port once listening
    bool leaving = false;   // drained by the autoscaler (SIGTERM sent)
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

// One engine's /metrics as name -> value (lines without labels); empty when it does not
// answer within a second.
std::map<std::string, double> scrape_metrics(int port) {
    std::map<std::string, double> m;
    net::HttpClient client({"127.0.0.1", std::to_string(port), ""});
    net::HttpRequest req;
    req.method = "GET";
    req.path = "/metrics";
    req.timeout_ms = 1000;
    Result<net::HttpResponse> r = net::fetch(client, req);
    if (!r.is_ok() || r->status != 200) return m;
    std::stringstream ss(r->body);
    for (std::string line; std::getline(ss, line);) {
        if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
        const size_t sp = line.find(' ');
        if (sp == std::string::npos) continue;
        m[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
    }
    return m;
}

// The local provisioner of `cluster up --autoscale` (S-DEPLOY): each period it reads
// the engines' /metrics, turns them into the Autoscaler's input (the rate of prompt
// tokens the prefill engines computed, the requests running on decode engines, each
// role's utilisation of its capacity) and applies the decision: new engines are started,
// surplus ones drained (SIGTERM: they leave the directory, finish their streams and
// exit). The policy is cluster::Autoscaler, unchanged (pure, clock passed in).
class LocalAutoscaler {
public:
    explicit LocalAutoscaler(const cluster::AutoscalerSettings& s) : policy_(s), settings_(s) {}

    struct Plan {
        int start_prefill = 0, start_decode = 0, drain_prefill = 0, drain_decode = 0;
    };

    Plan tick(const std::vector<Child>& children, int64_t now_ns) {
        cluster::AutoscalerInput in;
        double computed = 0;
        for (const Child& c : children) {
            if (c.pid <= 0 || c.port < 0 || c.leaving || c.role.empty()) continue;
            const std::map<std::string, double> m = scrape_metrics(c.port);
            if (c.role == "prefill") {
                ++in.online_prefill;
                const double t = value(m, "dsinfer_engine_prompt_tokens_total") -
                                 value(m, "dsinfer_prefix_hit_tokens_total");
                double& last = last_computed_[c.name];
                if (t > last) computed += t - last;
                last = t;
            } else if (c.role == "decode") {
                ++in.online_decode;
                in.running_decode_requests +=
                    static_cast<int64_t>(value(m, "dsinfer_requests_running"));
            }
        }
        const double dt = last_ns_ > 0 ? static_cast<double>(now_ns - last_ns_) * 1e-9 : 0;
        last_ns_ = now_ns;
        in.missed_tokens_per_s = dt > 0 ? computed / dt : 0;
        if (in.online_prefill > 0) {
            in.prefill_quota_utilisation =
                std::min(1.0, in.missed_tokens_per_s /
                                  (in.online_prefill *
                                   settings_.prefill_missed_tokens_per_s_per_instance));
        }
        if (in.online_decode > 0) {
            in.decode_quota_utilisation =
                std::min(1.0, static_cast<double>(in.running_decode_requests) /
                                  (in.online_decode * settings_.decode_requests_per_instance));
        }
        const cluster::ScaleDecision d = policy_.decide(in, now_ns);
        Plan p;
        p.start_prefill = std::max(0, d.prefill.delta);
        p.drain_prefill = std::max(0, -d.prefill.delta);
        p.start_decode = std::max(0, d.decode.delta);
        p.drain_decode = std::max(0, -d.decode.delta);
        if (d.prefill.delta != 0 || d.decode.delta != 0) {
            std::printf("dsinfer cluster up: autoscaler: %.0f computed prompt tokens/s, %lld "
                        "running decode requests -> prefill %d -> %d, decode %d -> %d\n",
                        in.missed_tokens_per_s,
                        static_cast<long long>(in.running_decode_requests), in.online_prefill,
                        d.prefill.target, in.online_decode, d.decode.target);
            std::fflush(stdout);
        }
        return p;
    }

private:
    static double value(const std::map<std::string, double>& m, const char* name) {
        auto it = m.find(name);
        return it == m.end() ? 0.0 : it->second;
    }
    cluster::Autoscaler policy_;
    const cluster::AutoscalerSettings settings_;
    std::map<std::string, double> last_computed_;  // per engine
    int64_t last_ns_ = 0;
};

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
    cluster::AutoscalerSettings scale = f.scale;
    scale.scale_out_interval_ns = static_cast<int64_t>(f.scale_out_interval_s * 1e9);
    scale.scale_in_interval_ns = static_cast<int64_t>(f.scale_in_interval_s * 1e9);
    if (f.autoscale) {
        if (f.prefill == 0) return fail("--autoscale needs --prefill and --decode");
        if (Status v = scale.validate(); !v.is_ok()) return fail(v.to_string());
        if (f.prefill < f.scale.min_prefill || f.prefill > f.scale.max_prefill ||
            f.decode < f.scale.min_decode || f.decode > f.scale.max_decode) {
            return fail("--prefill / --decode must lie within the autoscaler's bounds");
        }
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
    // Starts one engine; false when it did not come up.
    auto start_engine = [&](const std::string& name, const std::string& role) {
        Child e{name, -1, run + "/" + name + ".log", role};
        std::vector<std::string> argv = {self, "serve", "--role", role, "--membership",
                                         membership, "--node-id", e.name, "--port", "0",
                                         "--threads", std::to_string(threads), "--lease-ttl-s",
                                         std::to_string(f.lease_ttl_s), "--kv-transport",
                                         f.kv_transport};
        argv.insert(argv.end(), model_args.begin(), model_args.end());
        e.pid = spawn(argv, e.log);
        e.port = wait_listening(e, 600);
        children.push_back(e);
        if (e.port < 0) return false;
        std::printf("dsinfer cluster up: %s on 127.0.0.1:%d\n", e.name.c_str(), e.port);
        std::fflush(stdout);
        return true;
    };
    for (size_t i = 0; i < engines.size() && !g_stop; ++i) {
        if (!start_engine(engines[i].first, engines[i].second)) {
            return fail(engines[i].first + " did not start");
        }
    }
    int next_engine[2] = {f.prefill, f.decode};  // names of engines the autoscaler adds
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
    std::unique_ptr<LocalAutoscaler> scaler;
    if (f.autoscale) scaler = std::make_unique<LocalAutoscaler>(scale);
    int64_t next_tick_ns = 0;
    while (!g_stop) {
        for (auto& c : children) {
            int status = 0;
            if (c.pid > 0 && ::waitpid(c.pid, &status, WNOHANG) == c.pid) {
                std::fprintf(stderr, "dsinfer cluster up: %s exited (status %d)%s; see %s\n",
                             c.name.c_str(), status, c.leaving ? " after its drain" : "",
                             c.log.c_str());
                c.pid = -1;
                if (c.name == "router" || c.name == "etcd") g_stop = 1;
            }
        }
        const int64_t now = Env::default_env()->now_ns();
        if (scaler && now >= next_tick_ns && !g_stop) {
            next_tick_ns = now + f.autoscale_period_ms * 1'000'000;
            const LocalAutoscaler::Plan p = scaler->tick(children, now);
            for (int role = 0; role < 2; ++role) {
                const std::string r = role == 0 ? "prefill" : "decode";
                for (int i = 0; i < (role == 0 ? p.start_prefill : p.start_decode); ++i) {
                    const std::string name = r + "-" + std::to_string(next_engine[role]++);
                    if (!start_engine(name, r)) {
                        std::fprintf(stderr, "dsinfer cluster up: %s did not start\n",
                                     name.c_str());
                    }
                }
                // Drain the newest engines of the role first.
                int drain = role == 0 ? p.drain_prefill : p.drain_decode;
                for (auto it = children.rbegin(); it != children.rend() && drain > 0; ++it) {
                    if (it->role != r || it->pid <= 0 || it->leaving) continue;
                    ::kill(it->pid, SIGTERM);
                    it->leaving = true;
                    --drain;
                    std::printf("dsinfer cluster up: draining %s\n", it->name.c_str());
                    std::fflush(stdout);
                }
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
    add_switch(*up, "--autoscale", f->autoscale,
             "start and drain prefill / decode engines as cluster::Autoscaler decides "
             "(with --prefill / --decode, within the bounds below)");
    add_setting(*up, "--min-prefill", f->scale.min_prefill, "autoscaler: fewest prefill engines");
    add_setting(*up, "--max-prefill", f->scale.max_prefill, "autoscaler: most prefill engines");
    add_setting(*up, "--min-decode", f->scale.min_decode, "autoscaler: fewest decode engines");
    add_setting(*up, "--max-decode", f->scale.max_decode, "autoscaler: most decode engines");
    add_setting(*up, "--prefill-tokens-per-s", f->scale.prefill_missed_tokens_per_s_per_instance,
                "autoscaler: prompt tokens per second one prefill engine computes");
    add_setting(*up, "--decode-requests", f->scale.decode_requests_per_instance,
                "autoscaler: running requests one decode engine serves");
    add_setting(*up, "--scale-out-interval-s", f->scale_out_interval_s,
                "autoscaler: at most one scale-out per role this often")
        ->check(CLI::PositiveNumber);
    add_setting(*up, "--scale-in-interval-s", f->scale_in_interval_s,
                "autoscaler: at most one scale-in (a drain) per role this often")
        ->check(CLI::PositiveNumber);
    add_setting(*up, "--autoscale-period-ms", f->autoscale_period_ms,
                "autoscaler: how often the engines' metrics are read")
        ->check(CLI::Range(int64_t{100}, int64_t{60000}));
    add_setting(*up, "--host", f->host, "the router's listen address");
    add_setting(*up, "--port", f->port, "the router's port (0: any free port, printed)");
    add_setting(*up, "--membership", f->membership,
                "an existing directory (etcd://host:port[/prefix] or file:///path); '' = start "
                "etcd here (a membership file when etcd is not installed)");
    add_setting(*up, "--model", f->model, "checkpoint for every process ('' = the default model)");
    add_setting(*up, "--threads", f->threads, "threads per engine (0: cores / engines)");
    add_setting(*up, "--run-dir", f->run_dir, "logs of every process ('' = a temp dir, removed)");
    add_setting(*up, "--kv-transport", f->kv_transport,
                "KV hand-over transport of every engine: tcp | ucx (serve --kv-transport)")
        ->check(CLI::IsMember({"tcp", "ucx"}));
    add_setting(*up, "--lease-ttl-s", f->lease_ttl_s, "membership lease of every process")
        ->check(CLI::Range(2, 3600));
    up->callback([f] { throw CLI::RuntimeError(run_cluster_up(*f)); });
}

}  // namespace dsi

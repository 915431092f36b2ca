#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "base/mutex.h"
#include "membership/etcd_test_server.h"
#include "membership/registry.h"
#include "net/base64.h"

namespace dsi::membership {
namespace {

using testing::EtcdTestServer;

Member make(std::string id, Role role, uint64_t incarnation = 7) {
    Member m;
    m.id = std::move(id);
    m.role = role;
    m.address = "127.0.0.1:8100";
    m.capacity = 32;
    m.incarnation = incarnation;
    return m;
}

// Waits for an outside process's doing (etcd, a killed peer), polling; false after
// `seconds` (generous: the drills run beside a loaded CI machine).
bool eventually(const std::function<bool()>& pred, int seconds = 30) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < until) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
}

std::vector<std::string> ids(const std::vector<Member>& ms) {
    std::vector<std::string> out;
    for (const Member& m : ms) out.push_back(m.id);
    return out;
}

// Collects watch changes from the registry's thread.
class Recorder {
public:
    Registry::WatchFn fn() {
        return [this](const MemberChange& c) {
            MutexLock l(&mu_);
            changes_.push_back(c);
        };
    }
    bool saw(ChangeKind kind, const std::string& id) {
        MutexLock l(&mu_);
        for (const auto& c : changes_) {
            if (c.kind == kind && c.member.id == id) return true;
        }
        return false;
    }
    void clear() {
        MutexLock l(&mu_);
        changes_.clear();
    }

private:
    Mutex mu_;
    std::vector<MemberChange> changes_ DSI_GUARDED_BY(mu_);
};

RegistryOptions fast_options() {
    RegistryOptions o;
    o.lease_ttl_s = 2;
    o.keepalive_interval_ms = 300;
    o.request_timeout_ms = 1000;
    o.retry_interval_ms = 100;
    o.file_poll_interval_ms = 50;
    return o;
}

TEST(Registry, RejectsBadUrisAndOptions) {
    for (const char* uri : {"zk://127.0.0.1:2181", "etcd://", "etcd://h:0", "file://relative",
                            "file://", "127.0.0.1:2379"}) {
        auto r = open_registry(uri);
        ASSERT_FALSE(r.is_ok()) << uri;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << uri;
    }
    RegistryOptions o;
    o.lease_ttl_s = 1;
    EXPECT_FALSE(open_registry("etcd://127.0.0.1:2379", o).is_ok());
    o = {};
    o.keepalive_interval_ms = 10'000;  // not shorter than the 10 s TTL
    EXPECT_FALSE(open_registry("etcd://127.0.0.1:2379", o).is_ok());
    auto r = open_registry("etcd://127.0.0.1/cluster-a");
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ((*r)->describe(), "etcd://127.0.0.1:2379/cluster-a/");
}

TEST(Registry, FileBackendJoinWatchLeave) {
    const std::string path = std::filesystem::temp_directory_path().string() +
                             "/dsinfer-members-" + std::to_string(::getpid()) + ".json";
    std::filesystem::remove(path);
    auto a = open_registry("file://" + path, fast_options());
    auto b = open_registry("file://" + path, fast_options());
    auto watcher = open_registry("file://" + path, fast_options());
    ASSERT_TRUE(a.is_ok() && b.is_ok() && watcher.is_ok());
    ASSERT_TRUE((*a)->join(make("prefill-0", Role::kPrefill)).is_ok());
    Recorder rec;
    auto snapshot = (*watcher)->watch(rec.fn());
    ASSERT_TRUE(snapshot.is_ok());
    EXPECT_EQ(ids(*snapshot), std::vector<std::string>{"prefill-0"});
    EXPECT_TRUE(rec.saw(ChangeKind::kJoined, "prefill-0"));  // the snapshot came as a join
    EXPECT_EQ((*watcher)->watch(rec.fn()).status().code(), StatusCode::kFailedPrecondition);

    ASSERT_TRUE((*b)->join(make("decode-0", Role::kDecode)).is_ok());
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kJoined, "decode-0"); }));
    ASSERT_TRUE((*a)->join(make("prefill-0", Role::kPrefill, 8)).is_ok());  // restarted
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kRestarted, "prefill-0"); }));
    ASSERT_TRUE((*b)->leave().is_ok());
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kLeft, "decode-0"); }));
    auto listed = (*watcher)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(ids(*listed), std::vector<std::string>{"prefill-0"});

    // A hand-broken record is skipped and counted; a broken file is an error.
    {
        std::ofstream f(path);
        f << R"([{"id":"ok","role":"decode","address":"h:1","incarnation":"3"},)"
          << R"({"id":"bad","role":"decode"}])";
    }
    listed = (*watcher)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(ids(*listed), std::vector<std::string>{"ok"});
    EXPECT_GE((*watcher)->health().num_bad_records, 1);
    {
        std::ofstream f(path);
        f << "{not json";
    }
    EXPECT_EQ((*watcher)->list().status().code(), StatusCode::kInvalidArgument);
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".lock");
}

TEST(Registry, EtcdUnreachableIsUnavailable) {
    const int port = testing::free_loopback_port();  // nothing listens there
    auto r = open_registry("etcd://127.0.0.1:" + std::to_string(port), fast_options());
    ASSERT_TRUE(r.is_ok());
    Status s = (*r)->join(make("decode-0", Role::kDecode));
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
    EXPECT_FALSE((*r)->health().joined);
    EXPECT_EQ((*r)->list().status().code(), StatusCode::kUnavailable);
    Member bad = make("decode-0", Role::kDecode);
    bad.address = "nowhere";
    EXPECT_EQ((*r)->join(bad).code(), StatusCode::kInvalidArgument);
}

TEST(Registry, EtcdJoinListLeaveAndBadRecords) {
    EtcdTestServer etcd;
    ASSERT_TRUE(etcd.ready());
    auto a = open_registry(etcd.uri("/t1"), fast_options());
    auto b = open_registry(etcd.uri("/t1"), fast_options());
    auto other = open_registry(etcd.uri("/t2"), fast_options());
    ASSERT_TRUE(a.is_ok() && b.is_ok() && other.is_ok());
    ASSERT_TRUE((*b)->join(make("decode-1", Role::kDecode)).is_ok());
    ASSERT_TRUE((*a)->join(make("decode-0", Role::kDecode)).is_ok());
    ASSERT_TRUE((*other)->join(make("elsewhere", Role::kPrefill)).is_ok());
    auto listed = (*a)->list();
    ASSERT_TRUE(listed.is_ok()) << listed.status().message();
    EXPECT_EQ(ids(*listed), (std::vector<std::string>{"decode-0", "decode-1"}));

    Member bigger = make("decode-0", Role::kDecode);
    bigger.capacity = 99;
    ASSERT_TRUE((*a)->join(bigger).is_ok());
    listed = (*b)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ((*listed)[0].capacity, 99);

    // A record that is not ours is skipped and counted.
    net::HttpClient raw({"127.0.0.1", std::to_string(etcd.port()), ""});
    net::HttpRequest put;
    put.path = "/v3/kv/put";
    put.body = std::string(R"({"key":")") + net::base64_encode("/t1/junk") + R"(","value":")" +
               net::base64_encode("{\"id\":") + "\"}";
    auto answer = net::fetch(raw, put);
    ASSERT_TRUE(answer.is_ok() && answer->status == 200);
    listed = (*b)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(listed->size(), 2u);
    EXPECT_EQ((*b)->health().num_bad_records, 1);

    ASSERT_TRUE((*a)->leave().is_ok());  // revokes: gone at once
    listed = (*b)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(ids(*listed), std::vector<std::string>{"decode-1"});
    EXPECT_TRUE((*a)->leave().is_ok());
}

TEST(Registry, EtcdWatchSeesAKilledProcessLeave) {
    EtcdTestServer etcd;
    ASSERT_TRUE(etcd.ready());
    // The child joins and then dies by SIGKILL: it never revokes its lease; the
    // watcher must learn of the death when the lease runs out.
    int ready_pipe[2];
    ASSERT_EQ(::pipe(ready_pipe), 0);
    const pid_t child = ::fork();
    if (child == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a failed test
        ::close(ready_pipe[0]);
        auto r = open_registry(etcd.uri(), fast_options());
        const bool ok = r.is_ok() && (*r)->join(make("decode-7", Role::kDecode)).is_ok();
        const char byte = ok ? 'y' : 'n';
        (void)!::write(ready_pipe[1], &byte, 1);
        for (;;) ::pause();
    }
    ::close(ready_pipe[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready_pipe[0], &byte, 1), 1);
    ::close(ready_pipe[0]);
    ASSERT_EQ(byte, 'y');

    auto watcher = open_registry(etcd.uri(), fast_options());
    ASSERT_TRUE(watcher.is_ok());
    Recorder rec;
    auto snapshot = (*watcher)->watch(rec.fn());
    ASSERT_TRUE(snapshot.is_ok()) << snapshot.status().message();
    EXPECT_EQ(ids(*snapshot), std::vector<std::string>{"decode-7"});
    EXPECT_TRUE(rec.saw(ChangeKind::kJoined, "decode-7"));  // the snapshot came as a join
    auto live = open_registry(etcd.uri(), fast_options());
    ASSERT_TRUE(live.is_ok());
    ASSERT_TRUE((*live)->join(make("decode-8", Role::kDecode)).is_ok());
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kJoined, "decode-8"); }));

    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kLeft, "decode-7"); }));
    // The live one kept its lease through the TTL that ended the dead one.
    EXPECT_FALSE(rec.saw(ChangeKind::kLeft, "decode-8"));
    auto listed = (*watcher)->list();
    ASSERT_TRUE(listed.is_ok());
    EXPECT_EQ(ids(*listed), std::vector<std::string>{"decode-8"});
}

TEST(Registry, EtcdRestartWithDataLossRejoinsAndRelists) {
    EtcdTestServer etcd;
    ASSERT_TRUE(etcd.ready());
    auto engine = open_registry(etcd.uri(), fast_options());
    auto watcher = open_registry(etcd.uri(), fast_options());
    ASSERT_TRUE(engine.is_ok() && watcher.is_ok());
    ASSERT_TRUE((*engine)->join(make("prefill-0", Role::kPrefill)).is_ok());
    Recorder rec;
    ASSERT_TRUE((*watcher)->watch(rec.fn()).is_ok());

    etcd.kill9();
    EXPECT_TRUE(eventually([&] { return (*engine)->health().num_keepalive_failures > 0; }));
    EXPECT_FALSE((*engine)->health().lease_ok);
    etcd.restart(/*lose_data=*/true);
    ASSERT_TRUE(etcd.ready());
    // The engine finds its lease gone and publishes again; the watcher relists, then
    // follows the new etcd's stream.
    EXPECT_TRUE(eventually([&] { return (*engine)->health().num_rejoins >= 1; }));
    EXPECT_TRUE((*engine)->health().lease_ok);
    EXPECT_TRUE(eventually([&] {
        auto l = (*watcher)->list();
        return l.is_ok() && ids(*l) == std::vector<std::string>{"prefill-0"};
    }));
    EXPECT_TRUE(eventually([&] { return (*watcher)->health().num_watch_restarts >= 1; }));
    rec.clear();
    auto late = open_registry(etcd.uri(), fast_options());
    ASSERT_TRUE(late.is_ok());
    ASSERT_TRUE((*late)->join(make("decode-0", Role::kDecode)).is_ok());
    EXPECT_TRUE(eventually([&] { return rec.saw(ChangeKind::kJoined, "decode-0"); }));
}

}  // namespace
}  // namespace dsi::membership

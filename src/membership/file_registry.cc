// The static-file backend of Registry (registry.h): a JSON array of member records.
// Writers (join / leave) rewrite the file atomically (Env::write_file: temp + rename)
// under an flock on `<path>.lock`, so processes on one host can share it.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/mutex.h"
#include "membership/internal/backends.h"

namespace dsi::membership::internal {

namespace {

using nlohmann::json;

// Holds an exclusive flock on a lock file for its lifetime.
class FileLock {
public:
    explicit FileLock(const std::string& path) {
        fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
        if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
            ::close(fd_);
            fd_ = -1;
        }
    }
    ~FileLock() {
        if (fd_ >= 0) ::close(fd_);  // releases the flock
    }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;
    bool ok() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

class FileRegistry final : public Registry {
public:
    FileRegistry(std::string path, const RegistryOptions& options, Env* env)
        : path_(std::move(path)), options_(options), env_(env) {}

    ~FileRegistry() override {
        {
            MutexLock l(&mu_);
            stop_ = true;
            cv_.notify_all();
        }
        if (poller_.joinable()) poller_.join();
        (void)leave();
    }

    Status join(const Member& self) override {
        DSI_RETURN_IF_ERROR(validate(self));
        DSI_RETURN_IF_ERROR(rewrite([&](std::vector<json>* records) {
            std::erase_if(*records, [&](const json& r) { return same_id(r, self.id); });
            records->push_back(json::parse(to_json(self)));
        }));
        MutexLock l(&mu_);
        self_id_ = self.id;
        health_.joined = true;
        health_.lease_ok = true;
        return Status::ok();
    }

    Status leave() override {
        std::string id;
        {
            MutexLock l(&mu_);
            if (self_id_.empty()) return Status::ok();
            id = self_id_;
            self_id_.clear();
            health_.joined = false;
            health_.lease_ok = false;
        }
        return rewrite([&](std::vector<json>* records) {
            std::erase_if(*records, [&](const json& r) { return same_id(r, id); });
        });
    }

    Result<std::vector<Member>> list() override {
        DSI_ASSIGN_OR_RETURN(std::vector<json> records, read_records());
        std::vector<Member> out;
        for (const json& r : records) {
            auto m = member_from_json(r.dump());
            if (!m.is_ok()) {
                MutexLock l(&mu_);
                ++health_.num_bad_records;
                health_.last_error = path_ + ": " + m.status().message();
                continue;
            }
            out.push_back(std::move(*m));
        }
        std::sort(out.begin(), out.end(),
                  [](const Member& a, const Member& b) { return a.id < b.id; });
        return out;
    }

    Result<std::vector<Member>> watch(WatchFn fn) override {
        DSI_ASSIGN_OR_RETURN(std::vector<Member> members, list());
        MutexLock l(&mu_);
        if (fn_) return failed_precondition("membership: one watch per registry");
        for (const MemberChange& c : table_.reset(members)) fn(c);  // joins first
        fn_ = std::move(fn);
        poller_ = std::thread([this] { poll(); });
        return members;
    }

    RegistryHealth health() const override {
        MutexLock l(&mu_);
        return health_;
    }

    std::string describe() const override { return "file://" + path_; }

private:
    static bool same_id(const json& r, const std::string& id) {
        return r.is_object() && r.contains("id") && r["id"].is_string() &&
               r["id"].get_ref<const std::string&>() == id;
    }

    // The file's records; an absent file is an empty directory.
    Result<std::vector<json>> read_records() {
        if (!env_->file_exists(path_)) return std::vector<json>{};
        DSI_ASSIGN_OR_RETURN(std::string text, env_->read_file(path_));
        json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_array()) {
            return invalid_argument(path_ + ": membership file must be a JSON array of member "
                                            "records");
        }
        return j.get<std::vector<json>>();
    }

    template <class Edit>
    Status rewrite(Edit edit) {
        FileLock lock(path_ + ".lock");
        if (!lock.ok()) return unavailable(path_ + ".lock: cannot lock the membership file");
        DSI_ASSIGN_OR_RETURN(std::vector<json> records, read_records());
        edit(&records);
        return env_->write_file(path_, json(records).dump(2) + "\n");
    }

    void poll() {
        MutexLock l(&mu_);
        while (!stop_) {
            cv_.wait_for(&mu_, std::chrono::milliseconds(options_.file_poll_interval_ms));
            if (stop_) break;
            WatchFn fn = fn_;
            mu_.unlock();
            auto members = list();
            std::vector<MemberChange> changes;
            if (members.is_ok()) {
                changes = table_.reset(*members);
            }
            for (const MemberChange& c : changes) fn(c);
            mu_.lock();
            if (!members.is_ok()) health_.last_error = members.status().message();
        }
    }

    const std::string path_;
    const RegistryOptions options_;
    Env* const env_;
    MemberTable table_;  // poller thread only (after watch() set it up)

    mutable Mutex mu_;
    CondVar cv_;
    bool stop_ DSI_GUARDED_BY(mu_) = false;
    std::string self_id_ DSI_GUARDED_BY(mu_);
    WatchFn fn_ DSI_GUARDED_BY(mu_);
    RegistryHealth health_ DSI_GUARDED_BY(mu_);
    std::thread poller_;
};

}  // namespace

std::unique_ptr<Registry> make_file_registry(std::string path, const RegistryOptions& options,
                                             Env* env) {
    return std::make_unique<FileRegistry>(std::move(path), options, env);
}

}  // namespace dsi::membership::internal

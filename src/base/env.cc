#include "base/env.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace dsi {
namespace {

std::string errno_text(const std::string& what, const std::string& path) {
    return what + " '" + path + "': " + std::strerror(errno);
}

class PosixEnv final : public Env {
public:
    int64_t now_ns() override {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    int64_t wall_ns() override {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
            .count();
    }
    void sleep_ns(int64_t ns) override {
        std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
    }

    Result<std::string> read_file(const std::string& path) override {
        std::ifstream in(path, std::ios::binary);
        if (!in) return not_found(errno_text("cannot open", path));
        std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (in.bad()) return data_loss(errno_text("cannot read", path));
        return data;
    }

    Status write_file(const std::string& path, std::string_view data) override {
        std::string tmp = path + ".tmp";
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            if (!out) return not_found(errno_text("cannot create", tmp));
            out.write(data.data(), static_cast<std::streamsize>(data.size()));
            if (!out) return data_loss(errno_text("cannot write", tmp));
        }
        if (std::rename(tmp.c_str(), path.c_str()) != 0) {
            return data_loss(errno_text("cannot rename to", path));
        }
        return Status::ok();
    }

    bool file_exists(const std::string& path) override {
        struct stat st;
        return ::stat(path.c_str(), &st) == 0;
    }

    Result<uint64_t> file_size(const std::string& path) override {
        struct stat st;
        if (::stat(path.c_str(), &st) != 0) return not_found(errno_text("cannot stat", path));
        return static_cast<uint64_t>(st.st_size);
    }

    Status create_dirs(const std::string& path) override {
        std::error_code ec;
        std::filesystem::create_directories(path, ec);
        if (ec) return invalid_argument("cannot create directory '" + path + "': " + ec.message());
        return Status::ok();
    }

    Result<MappedFile> map_file(const std::string& path) override {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return not_found(errno_text("cannot open", path));
        struct stat st;
        if (::fstat(fd, &st) != 0) {
            ::close(fd);
            return data_loss(errno_text("cannot stat", path));
        }
        size_t size = static_cast<size_t>(st.st_size);
        if (size == 0) {
            ::close(fd);
            return MappedFile(nullptr, 0, path);
        }
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) return data_loss(errno_text("cannot mmap", path));
        return MappedFile(p, size, path);
    }

    int num_cpus() override {
        unsigned n = std::thread::hardware_concurrency();
        return n == 0 ? 1 : static_cast<int>(n);
    }

    std::thread start_thread(std::function<void()> fn) override { return std::thread(std::move(fn)); }

    uint64_t random_seed() override {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
};

}  // namespace

MappedFile::~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
    other.data_ = nullptr;
    other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
        data_ = other.data_;
        size_ = other.size_;
        path_ = std::move(other.path_);
        other.data_ = nullptr;
        other.size_ = 0;
    }
    return *this;
}

Env* Env::default_env() {
    static PosixEnv* env = new PosixEnv();
    return env;
}

double SplitMix64::next_normal() {
    double u1 = next_double();
    double u2 = next_double();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace dsi

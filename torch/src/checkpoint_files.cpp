#include "checkpoint_files.hpp"

#include <fcntl.h>
#include <torch/serialize/input-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <utility>
#include <vector>

#include "idist/idist.hpp"

namespace idist::checkpoint_files {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw std::runtime_error(what + " " + path.string() + ": " + std::strerror(error));
}

class Fd {
 public:
  Fd(const fs::path& path, int flags) : fd_(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail("cannot open", path, errno);
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void close(const fs::path& path) {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail("cannot write", path, errno);
  }

 private:
  int fd_;
};

std::string name_of(const std::string& prefix, std::int64_t step) { return prefix + "_" + std::to_string(step) + ".pt"; }

// The step of <prefix>_<step>.pt, else nullopt.
std::optional<std::int64_t> step_of(const std::string& name, const std::string& prefix) {
  const auto head = prefix + "_";
  if (name.size() <= head.size() + 3 || name.rfind(head, 0) != 0 || !name.ends_with(".pt")) return std::nullopt;
  const auto digits = name.substr(head.size(), name.size() - head.size() - 3);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  try {
    return std::stoll(digits);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The checkpoints in dir, newest first.
std::vector<std::pair<std::int64_t, fs::path>> listed(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (const auto step = step_of(entry.path().filename().string(), prefix)) found.emplace_back(*step, entry.path());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

}  // namespace

void make_directory(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw std::runtime_error("cannot create the directory " + dir.string() + ": " + error.message());
}

void write(const fs::path& dir, const std::string& prefix, std::int64_t step, torch::serialize::OutputArchive& archive) {
  const auto final_path = dir / name_of(prefix, step);
  const auto temporary = dir / ("." + name_of(prefix, step) + ".tmp");
  Fd file(temporary, O_WRONLY | O_CREAT | O_TRUNC);
  archive.save_to([&](const void* data, std::size_t size) {
    for (std::size_t done = 0; done < size;) {
      const auto n = ::write(file.get(), static_cast<const char*>(data) + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot write", temporary, errno);
      done += static_cast<std::size_t>(n);
    }
    return size;
  });
  if (::fsync(file.get()) != 0) fail("cannot write", temporary, errno);
  file.close(temporary);
  if (::rename(temporary.c_str(), final_path.c_str()) != 0) fail("cannot rename to", final_path, errno);
  Fd directory(dir, O_RDONLY | O_DIRECTORY);
  ::fsync(directory.get());  // the rename itself on disk; a file system that cannot is no failure
}

void keep_newest(const fs::path& dir, const std::string& prefix, std::size_t keep) {
  const auto found = listed(dir, prefix);
  std::error_code error;
  for (std::size_t i = keep; i < found.size(); ++i) fs::remove(found[i].second, error);
}

std::optional<Found> newest_loadable(const fs::path& dir, const std::string& prefix) {
  for (const auto& [step, path] : listed(dir, prefix)) {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      if (!in.good() && !in.eof()) throw std::runtime_error(std::strerror(errno));
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      return Found{path, std::move(bytes)};
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "[idist rank %d/%d] checkpoint: skipping %s, which does not load (%s)\n", get_rank(),
                   get_world_size(), path.c_str(), what.substr(0, what.find('\n')).c_str());
    }
  }
  return std::nullopt;
}

}  // namespace idist::checkpoint_files

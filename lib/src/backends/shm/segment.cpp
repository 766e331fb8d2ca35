#include "backends/shm/segment.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "common/duration.hpp"
#include "store/store.hpp"

namespace idist::detail::shm {
namespace {

constexpr std::uint64_t kMagic = 0x6d68732d74736469;  // "idist-shm"
// "what: the error; hint" (the hint tells what to do instead).
std::string errno_text(const std::string& what, const std::string& hint = "") {
  return what + ": " + std::strerror(errno) + (hint.empty() ? "" : "; " + hint);
}
constexpr const char* kUseTcp = "IDIST_INTRANODE=off runs gloo over TCP instead";

std::uint64_t random_nonce() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

}  // namespace

struct Segment::Header {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint32_t members;
  Word attached;  // members attached so far
  Word departed;  // members that have left (depart): while 0, departed() reads nothing else
  Word aborted;   // 1 + the member that aborted the group first (abort), 0 while none has
  // Then the members' pids (pids()), then their departure words (departures()).
};

Segment::Header& Segment::header() const { return *reinterpret_cast<Header*>(base_); }
pid_t* Segment::pids() const { return reinterpret_cast<pid_t*>(base_ + sizeof(Header)); }
Word* Segment::departures() const {
  return reinterpret_cast<Word*>(base_ + round_up(sizeof(Header) + members_ * sizeof(pid_t), alignof(Word)));
}

Segment::Segment(const BackendInit& init, std::size_t data_bytes, Clock::time_point deadline) {
  const auto n = static_cast<std::size_t>(init.size);
  members_ = n;
  const std::size_t header_bytes =
      round_up(round_up(sizeof(Header) + n * sizeof(pid_t), alignof(Word)) + n * sizeof(Word), kPage);
  bytes_ = header_bytes + round_up(data_bytes, kPage);
  const std::string key = init.key_prefix + "shm/segment";
  int fd = -1;
  std::uint64_t nonce = 0;
  if (init.rank == 0) {
    fd = ::memfd_create("idist-shm", MFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error(errno_text("memfd_create", kUseTcp));
    // Sparse: pages cost memory only once touched (the p2p rings of a big group mostly never are).
    if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      ::close(fd);
      throw std::runtime_error(errno_text("ftruncate of a " + std::to_string(bytes_) + "-byte shared segment"));
    }
    nonce = random_nonce();
  } else {
    const auto where = init.store.get(key);
    std::istringstream in(std::string(where.begin(), where.end()));
    long pid = 0;
    int their_fd = -1;
    in >> pid >> their_fd >> nonce;
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(their_fd);
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      throw std::runtime_error(errno_text("cannot open group rank 0's shared memory (" + path + ")",
                                          "did it exit, is it not dumpable (PR_SET_DUMPABLE), or does it run in "
                                          "another pid namespace? " +
                                              std::string(kUseTcp)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes_) {
      ::close(fd);
      throw std::runtime_error("group rank 0's shared memory (" + path + ") is not the size this rank expects (" +
                               std::to_string(bytes_) + " bytes): do all ranks run the same idist?");
    }
  }
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const auto why = errno_text("mmap of a " + std::to_string(bytes_) + "-byte shared segment");
    ::close(fd);
    throw std::runtime_error(why);
  }
  base_ = static_cast<char*>(p);
  data_ = base_ + header_bytes;
  data_bytes_ = bytes_ - header_bytes;
  auto& h = header();
  try {
    if (init.rank == 0) {
      h.magic = kMagic;
      h.nonce = nonce;
      h.members = static_cast<std::uint32_t>(n);
      const auto text = std::to_string(::getpid()) + " " + std::to_string(fd) + " " + std::to_string(nonce);
      init.store.set(key, std::vector<char>(text.begin(), text.end()));
    } else if (h.magic != kMagic || h.nonce != nonce || h.members != n) {
      throw std::runtime_error("the shared memory found through the store is not this group's");
    }
    pids()[init.rank] = ::getpid();
    post_add(h.attached, 1);
    wait_attached(init, deadline, key);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::munmap(base_, bytes_);
    throw;
  }
  ::close(fd);  // rank 0: everyone has attached, the mapping keeps the memory
  pidfds_.assign(n, kSelf);
  for (std::size_t r = 0; r < n; ++r) {
    if (pids()[r] == ::getpid()) continue;
    const auto fd = static_cast<int>(::syscall(SYS_pidfd_open, pids()[r], 0));
    pidfds_[r] = fd >= 0 ? fd : errno == ESRCH ? kGone : kUnknown;
  }
}

void Segment::wait_attached(const BackendInit& init, Clock::time_point deadline, const std::string& key) {
  auto& h = header();
  const auto n = static_cast<std::uint32_t>(init.size);
  wait_for(h.attached, WaitPolicy{.oversubscribed = true}, [n](std::uint32_t v) { return v >= n; }, [&] {
    if (init.superseded != nullptr && init.superseded->load())
      throw PeerLostFailure(-1, "attaching to the shared memory (" + key + "): the job re-formed again meanwhile");
    if (Clock::now() < deadline) return;
    std::string missing;
    for (std::uint32_t r = 0; r < n; ++r)
      if (pids()[r] == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(name_of(init, static_cast<int>(r)));
    auto word = member_word(init);
    if (missing.find(',') != std::string::npos) word = word.substr(0, word.size() - 1) + "s ";
    throw TimeoutFailure(timed_out("attaching to the shared memory (" + key + ")", init.timeout, "waiting for " + word + missing));
  });
}

void Segment::depart(int me) {
  if (base_ == nullptr) return;
  // Release: a peer that sees the departure sees every arrival made before it.
  departures()[me].value.store(1, std::memory_order_release);
  post_add(header().departed, 1);
  if (words_)
    for (auto* w : words_()) wake_now(*w);
}

void Segment::abort(int me, const std::string& why) {
  if (base_ == nullptr) return;
  {
    std::lock_guard lock(abort_mu_);
    try {
      if (abort_reason_.empty()) abort_reason_ = why;
    } catch (...) {
      // Out of memory: this rank's waits end without the words.
    }
  }
  std::uint32_t none = 0;
  header().aborted.value.compare_exchange_strong(none, static_cast<std::uint32_t>(me) + 1, std::memory_order_acq_rel);
  if (words_)
    for (auto* w : words_()) wake_now(*w);
}

int Segment::aborted_by() const {
  return static_cast<int>(header().aborted.value.load(std::memory_order_acquire)) - 1;
}

std::string Segment::abort_reason() const {
  std::lock_guard lock(abort_mu_);
  return abort_reason_;
}

bool Segment::departed(int r) const {
  if (header().departed.value.load(std::memory_order_acquire) == 0) return false;
  return departures()[r].value.load(std::memory_order_acquire) != 0;
}

void Segment::watch(std::function<std::vector<Word*>()> words) {
  words_ = words;
  std::vector<pollfd> fds;
  for (int fd : pidfds_)
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  if (fds.empty()) return;  // threads as ranks: nobody can exit alone
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) return;  // the naps still find a dead peer, a little later
  fds.push_back({stop_fd_, POLLIN, 0});
  exits_seen_ = std::make_shared<std::atomic<int>>(0);
  watcher_ = std::thread([fds = std::move(fds), words = std::move(words), exits = exits_seen_]() mutable {
    for (;;) {
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds.back().revents != 0) return;  // stop
      for (std::size_t i = 0; i + 1 < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        fds[i].fd = -1;  // poll skips it from now on
        exits->fetch_add(1, std::memory_order_seq_cst);
        for (auto* w : words()) wake_now(*w);
      }
    }
  });
}

Segment::~Segment() {
  if (watcher_.joinable()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(stop_fd_, &one, sizeof(one));
    // The watcher may itself drop the last owner (words() locks the mailboxes, which own us).
    if (watcher_.get_id() == std::this_thread::get_id()) {
      watcher_.detach();
    } else {
      watcher_.join();
    }
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

bool Segment::exited(int r) const {
  const int fd = pidfds_[static_cast<std::size_t>(r)];
  if (fd == kGone) return true;
  if (fd < 0) return false;
  if (exits_seen_ && exits_seen_->load(std::memory_order_seq_cst) == 0) return false;
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace idist::detail::shm

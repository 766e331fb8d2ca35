#pragma once
// The memory the ranks of one host share: one mapping per group.
//
// Group rank 0 makes it with memfd_create and publishes "<pid> <fd> <nonce>" in the store; the
// others open /proc/<pid>/fd/<fd>, which reopens that very file, and map it. The file has no
// name in any file system, so a job killed at any moment leaves nothing behind in /dev/shm
// (shm_open's names survive a kill -9 between open and unlink); the memory goes with the last
// mapping. Rank 0 keeps its descriptor only until every member has attached.
//
// Every member writes its pid into the segment as it attaches, so that a wait on a peer can
// ask the kernel whether that peer still lives (a pidfd, immune to pid reuse).

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "backends/shm/sync.hpp"

namespace idist::detail::shm {

inline constexpr std::size_t kPage = 4096;
inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

class Segment {
 public:
  // Collective over the group's members; `data_bytes` for the backend's own use, after the
  // segment's header. Throws TimeoutFailure naming the members that never attached by
  // `deadline`, std::runtime_error when the memory cannot be made or mapped.
  Segment(const BackendInit& init, std::size_t data_bytes, Clock::time_point deadline);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  char* data() const { return data_; }
  std::size_t data_bytes() const { return data_bytes_; }

  // Whether member r has exited (its pidfd is readable). False for members that share our
  // process (threads as ranks in tests) and when the kernel cannot tell.
  bool exited(int r) const;

  // This member leaves the group (finalize, or the group's end): it makes no more calls, so
  // a peer that waits for it in a step it has not reached fails now rather than at its
  // timeout. Wakes the sleepers as an exit does.
  void depart(int me);
  // Whether member r has left (depart). A plain read of one shared word while nobody has.
  bool departed(int r) const;
  // Backend::abort: every member's waits end now (the sleepers are woken) and ask
  // aborted_by() between their naps: the member that aborted the group first, or -1.
  // `why` stays in this process, for its own waits' words (abort_reason()).
  void abort(int me, const std::string& why);
  int aborted_by() const;
  std::string abort_reason() const;

  // Wakes every sleeper on the words `words()` names as soon as a member exits, so that a wait
  // on a dead peer ends now rather than at its next nap (a launcher stops the survivors within
  // milliseconds; they should have said whom they lost by then). A thread blocked in poll() on
  // the members' pidfds; nothing runs while they live. Once, after construction.
  void watch(std::function<std::vector<Word*>()> words);

 private:
  struct Header;
  Header& header() const;
  pid_t* pids() const;
  Word* departures() const;  // per member: 1 once it has left; after the pids
  void wait_attached(const BackendInit& init, Clock::time_point deadline, const std::string& key);

  char* base_ = nullptr;
  std::size_t bytes_ = 0;
  char* data_ = nullptr;
  std::size_t data_bytes_ = 0;
  // Per member: a pidfd; kSelf for members in our own process (threads as ranks), kGone for
  // one that had exited before we looked, kUnknown where the kernel would not say.
  std::vector<int> pidfds_;
  static constexpr int kSelf = -1;
  static constexpr int kGone = -2;
  static constexpr int kUnknown = -3;
  int stop_fd_ = -1;         // eventfd that ends the watcher
  std::thread watcher_;
  // Members the watcher saw exit: while none did, exited() needs no system call, so waits can
  // ask before every sleep. Shared with the watcher, which may outlive us (see ~Segment).
  std::shared_ptr<std::atomic<int>> exits_seen_;
  std::function<std::vector<Word*>()> words_;  // what the watcher wakes, for depart() and abort() too
  mutable std::mutex abort_mu_;
  std::string abort_reason_;
  std::size_t members_ = 0;
};

}  // namespace idist::detail::shm

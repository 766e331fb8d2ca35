#pragma once
// Point-to-point through the segment: one ring per ordered pair of ranks (sender -> receiver),
// carrying messages as a 16-byte header (tag, length) followed by the data, streamed through
// the ring whatever their size. A message that fits in the ring completes without the
// receiver (MPI's eager sends); a larger one waits for it to read, within the deadline.
//
// The Backend contract: transfers between two ranks with the same tag match in posting order,
// and completions may run on any thread. So each send takes a ticket when posted and writes
// when its turn comes; each receive takes a ticket per (source, tag), and whichever completion
// reads the ring hands each message to the receive it belongs to, keeping messages of other
// tags (or later tickets) aside until their receive asks.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/segment.hpp"
#include "backends/shm/sync.hpp"

namespace idist::detail::shm {

class Mailboxes : public std::enable_shared_from_this<Mailboxes> {
 public:
  struct Options {
    int rank = 0;
    int size = 2;
    std::size_t ring_bytes = 0;  // a power of two
    std::chrono::milliseconds timeout{};
    WaitPolicy policy;
    std::string word;  // "rank " or "group rank ", for messages
    std::vector<int> names;  // BackendInit::names
  };
  // `rings` points into `segment`, size * size rings of Options::ring_bytes plus their header.
  Mailboxes(std::shared_ptr<Segment> segment, char* rings, Options options);

  static std::size_t bytes_needed(int size, std::size_t ring_bytes);
  // The words this rank may sleep on: the tails (incoming) and heads (outgoing) of the rings
  // to the peers it has posted transfers with. Only those: waking a ring never used would
  // touch its page, n^2 of them on a big host.
  std::vector<Word*> words_slept_on() const;

  std::function<void()> send(const void* data, std::size_t bytes, int dst, std::uint32_t tag);
  std::function<void()> recv(void* data, std::size_t bytes, int src, std::uint32_t tag);
  // Backend::cancel_transfers: this side of every ring posts nothing more. A peer's transfer
  // that only we could have ended (its receive, with no send of ours pending; its send, with
  // no receive of ours pending) then fails at once, and ours likewise once the peer closes.
  void close();

  struct Ring;

 private:
  struct Outbox {
    std::mutex mu;
    std::condition_variable turn_changed;
    std::uint64_t tickets = 0;  // taken by posted sends
    std::uint64_t turn = 0;     // the ticket that writes next
    std::string broken;         // a write failed half-way: the ring is out of step
  };
  struct Inbox {
    std::mutex mu;
    std::condition_variable changed;
    std::map<std::uint32_t, std::uint64_t> tickets;  // per tag, taken by posted receives
    std::map<std::uint32_t, std::uint64_t> arrived;  // per tag, messages read off the ring
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<char>> kept;  // read, not yet asked for
    bool reading = false;  // a completion is reading the ring
    std::string broken;
  };

  Ring& ring(int src, int dst) const;
  void write(Ring& ring, const char* data, std::size_t bytes, int dst, Clock::time_point deadline);
  // out == nullptr drains.
  void read(Ring& ring, char* out, std::size_t bytes, int src, Clock::time_point deadline);
  void complete_send(const char* data, std::size_t bytes, int dst, std::uint32_t tag, std::uint64_t ticket);
  void complete_recv(char* data, std::size_t bytes, int src, std::uint32_t tag, std::uint64_t ticket);
  static void forget_if_idle(Inbox& box, std::uint32_t tag);
  [[noreturn]] void give_up(int peer, const std::string& what, bool timeout) const;
  void check_aborted() const;  // Segment::abort: PeerLostFailure
  std::atomic<std::uint32_t>& closed(int r) const;
  bool nobody_sends(int src, Ring& r) const;
  bool nobody_reads(int dst, Ring& r) const;
  std::string peer(int r) const {
    return options_.word + std::to_string(options_.names.empty() ? r : options_.names[static_cast<std::size_t>(r)]);
  }

  std::shared_ptr<Segment> segment_;
  char* rings_;
  Options options_;
  std::vector<std::unique_ptr<Outbox>> out_;
  std::vector<std::unique_ptr<Inbox>> in_;
  std::unique_ptr<std::atomic<bool>[]> used_;  // per peer: a transfer was posted with it
};

}  // namespace idist::detail::shm

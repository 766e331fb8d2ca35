#include "backends/shm/p2p.hpp"

#include <cstring>
#include <stdexcept>

#include "common/duration.hpp"
#include "in_step_error.hpp"
#include "store/store.hpp"

namespace idist::detail::shm {
namespace {

struct MessageHeader {
  std::uint32_t tag;
  std::uint32_t reserved;
  std::uint64_t length;
};

}  // namespace

// Counters of bytes, wrapping at 2^32; the ring's size divides 2^32, so `counter % size` is the
// position either side of a wrap. Only the sender writes `tail`, only the receiver `head`.
struct Mailboxes::Ring {
  Word tail;  // bytes written
  Word head;  // bytes read
  // The transfers on this ring that its sender and its receiver have posted and not yet seen
  // end. With each rank's closed word (close()), a wait gives up when the other side's group
  // has ended with nothing pending that could end it: a receive nobody will send to, a send
  // nobody will read. A line each: each side writes its own at every transfer, the other
  // reads it only at a group's end.
  alignas(64) std::atomic<std::uint32_t> sends{0};
  alignas(64) std::atomic<std::uint32_t> recvs{0};
  char* bytes() { return reinterpret_cast<char*>(this + 1); }
};
static_assert(sizeof(Mailboxes::Ring) % 64 == 0, "the ring's bytes start on a cache line");

namespace {

// Ends a posted transfer's count on its ring when its completion returns or throws. A
// completion dropped unrun (a group broken by an earlier failure skips it) leaves it counted:
// the peer's wait then ends at its timeout, as it would have anyway. (Releasing it there too
// took a shared allocation per transfer: +10% on an 8 B send_recv.)
struct Pending {
  std::atomic<std::uint32_t>& count;
  ~Pending() { count.fetch_sub(1, std::memory_order_acq_rel); }
};

// A rank's word saying that its group has ended here (Mailboxes::close), one cache line each,
// after the rings: a wait on a ring reads only its peer's.
struct Closed {
  alignas(64) std::atomic<std::uint32_t> value{0};
};

}  // namespace

std::size_t Mailboxes::bytes_needed(int size, std::size_t ring_bytes) {
  const auto n = static_cast<std::size_t>(size);
  return n * n * (sizeof(Ring) + ring_bytes) + n * sizeof(Closed);
}

std::atomic<std::uint32_t>& Mailboxes::closed(int r) const {
  const auto n = static_cast<std::size_t>(options_.size);
  auto* words = reinterpret_cast<Closed*>(rings_ + n * n * (sizeof(Ring) + options_.ring_bytes));
  return words[r].value;
}

Mailboxes::Mailboxes(std::shared_ptr<Segment> segment, char* rings, Options options)
    : segment_(std::move(segment)),
      rings_(rings),
      options_(std::move(options)),
      used_(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(options_.size))) {
  for (int r = 0; r < options_.size; ++r) {
    out_.push_back(std::make_unique<Outbox>());
    in_.push_back(std::make_unique<Inbox>());
  }
}

std::vector<Word*> Mailboxes::words_slept_on() const {
  std::vector<Word*> words;
  for (int r = 0; r < options_.size; ++r) {
    if (r == options_.rank || !used_[static_cast<std::size_t>(r)].load(std::memory_order_acquire)) continue;
    words.push_back(&ring(r, options_.rank).tail);
    words.push_back(&ring(options_.rank, r).head);
  }
  return words;
}

Mailboxes::Ring& Mailboxes::ring(int src, int dst) const {
  const auto index = static_cast<std::size_t>(src) * static_cast<std::size_t>(options_.size) + static_cast<std::size_t>(dst);
  return *reinterpret_cast<Ring*>(rings_ + index * (sizeof(Ring) + options_.ring_bytes));
}

void Mailboxes::give_up(int r, const std::string& what, bool timeout) const {
  if (!timeout) throw std::runtime_error("connection to " + peer(r) + " lost: it exited (" + what + ")");
  throw TimeoutFailure(timed_out(what, options_.timeout, "no progress from " + peer(r)));
}

void Mailboxes::check_aborted() const {
  const int by = segment_->aborted_by();
  if (by < 0) return;
  if (by == options_.rank) throw AbortedFailure(-1, "this rank aborted the group: " + segment_->abort_reason());
  throw PeerLostFailure(-1, peer(by) + " aborted the group while this rank waited for a transfer (shared memory)", by);
}

// One word, not one per ring: the n^2 rings' pages stay untouched where never used. The
// peers' waits look at it between their naps.
void Mailboxes::close() { closed(options_.rank).store(1, std::memory_order_release); }

// The other side's group has ended with nothing pending that could end this wait (read in
// that order: its count drops only after what its transfer wrote or read).
bool Mailboxes::nobody_sends(int src, Ring& r) const {
  return closed(src).load(std::memory_order_acquire) != 0 && r.sends.load(std::memory_order_acquire) == 0;
}
bool Mailboxes::nobody_reads(int dst, Ring& r) const {
  return closed(dst).load(std::memory_order_acquire) != 0 && r.recvs.load(std::memory_order_acquire) == 0;
}

void Mailboxes::write(Ring& ring, const char* data, std::size_t bytes, int dst, Clock::time_point deadline) {
  const auto size = static_cast<std::uint32_t>(options_.ring_bytes);
  std::uint32_t tail = ring.tail.value.load(std::memory_order_relaxed);
  while (bytes > 0) {
    const std::uint32_t used = tail - ring.head.value.load(std::memory_order_acquire);
    if (used == size) {
      wait_for(ring.head, options_.policy, [&](std::uint32_t head) { return tail - head < size; }, [&] {
        check_aborted();
        if (segment_->exited(dst) && tail - ring.head.value.load(std::memory_order_acquire) == size)
          give_up(dst, "while sending to it", false);
        if (Clock::now() > deadline) give_up(dst, "send to " + peer(dst) + " (the receiver did not take the message)", true);
        if (nobody_reads(dst, ring) && tail - ring.head.value.load(std::memory_order_acquire) == size)
          throw std::runtime_error("send to " + peer(dst) + ": its group there has ended (finalize) with no receive "
                                   "from this rank pending: nothing will take the rest of the message");
      });
      continue;
    }
    const std::uint32_t at = tail % size;
    const std::size_t n = std::min<std::size_t>({bytes, size - used, size - at});
    std::memcpy(ring.bytes() + at, data, n);
    tail += static_cast<std::uint32_t>(n);
    post(ring.tail, tail);
    data += n;
    bytes -= n;
  }
}

void Mailboxes::read(Ring& ring, char* out, std::size_t bytes, int src, Clock::time_point deadline) {
  const auto size = static_cast<std::uint32_t>(options_.ring_bytes);
  std::uint32_t head = ring.head.value.load(std::memory_order_relaxed);
  while (bytes > 0) {
    const std::uint32_t ready = ring.tail.value.load(std::memory_order_acquire) - head;
    if (ready == 0) {
      wait_for(ring.tail, options_.policy, [&](std::uint32_t tail) { return tail != head; }, [&] {
        check_aborted();
        // Looked at again after the exit: what it wrote before exiting is still to be read.
        if (segment_->exited(src) && ring.tail.value.load(std::memory_order_acquire) == head)
          give_up(src, "before sending all it was to send", false);
        if (Clock::now() > deadline) give_up(src, "recv from " + peer(src), true);
        if (nobody_sends(src, ring) && ring.tail.value.load(std::memory_order_acquire) == head)
          throw std::runtime_error("recv from " + peer(src) + ": its group there has ended (finalize) with no send "
                                   "to this rank pending: nothing will match this receive");
      });
      continue;
    }
    const std::uint32_t at = head % size;
    const std::size_t n = std::min<std::size_t>({bytes, ready, size - at});
    if (out != nullptr) {
      std::memcpy(out, ring.bytes() + at, n);
      out += n;
    }
    head += static_cast<std::uint32_t>(n);
    post(ring.head, head);
    bytes -= n;
  }
}

std::function<void()> Mailboxes::send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) {
  auto& box = *out_[static_cast<std::size_t>(dst)];
  used_[static_cast<std::size_t>(dst)].store(true, std::memory_order_release);
  std::uint64_t ticket = 0;
  {
    std::lock_guard lock(box.mu);
    ticket = box.tickets++;
  }
  auto& count = ring(options_.rank, dst).sends;
  count.fetch_add(1, std::memory_order_acq_rel);
  return [self = shared_from_this(), data, bytes, dst, tag, ticket, &count] {
    const Pending pending{count};
    self->complete_send(static_cast<const char*>(data), bytes, dst, tag, ticket);
  };
}

std::function<void()> Mailboxes::recv(void* data, std::size_t bytes, int src, std::uint32_t tag) {
  auto& box = *in_[static_cast<std::size_t>(src)];
  used_[static_cast<std::size_t>(src)].store(true, std::memory_order_release);
  std::uint64_t ticket = 0;
  {
    std::lock_guard lock(box.mu);
    ticket = box.tickets[tag]++;
  }
  auto& count = ring(src, options_.rank).recvs;
  count.fetch_add(1, std::memory_order_acq_rel);
  return [self = shared_from_this(), data, bytes, src, tag, ticket, &count] {
    const Pending pending{count};
    self->complete_recv(static_cast<char*>(data), bytes, src, tag, ticket);
  };
}

void Mailboxes::complete_send(const char* data, std::size_t bytes, int dst, std::uint32_t tag, std::uint64_t ticket) {
  const auto deadline = Clock::now() + options_.timeout;
  auto& box = *out_[static_cast<std::size_t>(dst)];
  {
    std::unique_lock lock(box.mu);
    if (!box.turn_changed.wait_until(lock, deadline, [&] { return box.turn == ticket || !box.broken.empty(); }))
      give_up(dst, "send to " + peer(dst) + " (behind earlier sends to it)", true);
    if (!box.broken.empty()) throw std::runtime_error("an earlier send to " + peer(dst) + " failed: " + box.broken);
  }
  try {
    const MessageHeader header{tag, 0, bytes};
    auto& r = ring(options_.rank, dst);
    write(r, reinterpret_cast<const char*>(&header), sizeof(header), dst, deadline);
    write(r, data, bytes, dst, deadline);
  } catch (const std::exception& e) {
    std::lock_guard lock(box.mu);
    box.broken = e.what();
    box.turn_changed.notify_all();
    throw;
  }
  std::lock_guard lock(box.mu);
  ++box.turn;
  box.turn_changed.notify_all();
}

// A tag whose every posted receive has its message, none kept aside: its counts start again
// from 0 on both sides of the match, so a program that uses a fresh tag per message does not
// grow the maps. With the inbox's lock held.
void Mailboxes::forget_if_idle(Inbox& box, std::uint32_t tag) {
  const auto posted = box.tickets.find(tag);
  const auto came = box.arrived.find(tag);
  if (posted == box.tickets.end() || came == box.arrived.end() || posted->second != came->second) return;
  const auto kept = box.kept.lower_bound({tag, 0});
  if (kept != box.kept.end() && kept->first.first == tag) return;
  box.tickets.erase(posted);
  box.arrived.erase(came);
}

void Mailboxes::complete_recv(char* data, std::size_t bytes, int src, std::uint32_t tag, std::uint64_t ticket) {
  const auto deadline = Clock::now() + options_.timeout;
  auto& box = *in_[static_cast<std::size_t>(src)];
  auto mismatch = [&](std::uint64_t length) {
    return InStepError(peer(src) + " sent " + std::to_string(length) + " bytes (tag " + std::to_string(tag) +
                       ") but the receive buffer holds " + std::to_string(bytes) +
                       "; pass a buffer of the sender's length");
  };
  std::unique_lock lock(box.mu);
  for (;;) {
    if (!box.broken.empty()) throw std::runtime_error("an earlier receive from " + peer(src) + " failed: " + box.broken);
    if (const auto it = box.kept.find({tag, ticket}); it != box.kept.end()) {
      const auto message = std::move(it->second);
      box.kept.erase(it);
      forget_if_idle(box, tag);
      lock.unlock();
      if (message.size() != bytes) throw mismatch(message.size());
      std::memcpy(data, message.data(), bytes);
      return;
    }
    if (box.reading) {
      // Another completion reads the ring; it hands over what it finds.
      if (box.changed.wait_until(lock, deadline) == std::cv_status::timeout) give_up(src, "recv from " + peer(src), true);
      continue;
    }
    // Read the next message off the ring: ours goes straight into `data`, another is kept.
    box.reading = true;
    lock.unlock();
    MessageHeader header{};
    bool mine = false;
    try {
      auto& r = ring(src, options_.rank);
      read(r, reinterpret_cast<char*>(&header), sizeof(header), src, deadline);
      std::uint64_t index = 0;
      {
        std::lock_guard guard(box.mu);
        index = box.arrived[header.tag]++;
      }
      mine = header.tag == tag && index == ticket;
      if (mine) {
        read(r, header.length == bytes ? data : nullptr, header.length, src, deadline);
      } else {
        std::vector<char> message(header.length);
        read(r, message.data(), message.size(), src, deadline);
        std::lock_guard guard(box.mu);
        box.kept[{header.tag, index}] = std::move(message);
      }
    } catch (const std::exception& e) {
      std::lock_guard guard(box.mu);
      box.reading = false;
      box.broken = e.what();
      box.changed.notify_all();
      throw;
    }
    lock.lock();
    box.reading = false;
    box.changed.notify_all();
    if (mine) {
      forget_if_idle(box, tag);
      if (header.length != bytes) throw mismatch(header.length);
      return;
    }
  }
}

}  // namespace idist::detail::shm

// The shm backend: collectives among the ranks of one host through one shared segment.
//
// Segment layout (after Segment's own header):
//   gen, count           the barrier: steps completed, arrivals at the current one
//   arrived[size]        each rank's last step, to name who is missing when a wait fails
//   boxes[size][2]       groups of up to 4 only: each rank's two boxes for tiny all_reduces
//   slots[size][2]       each rank's two halves of `half_` bytes
//   rings[size][size]    point-to-point (p2p.hpp)
//
// Every collective is a sequence of steps (barriers) with data in the slots between them. The
// rule that makes one barrier per step enough: between steps t-1 and t, a rank writes only
// halves t % 2 and reads only halves (t-1) % 2. Passing step t-1 means every rank has arrived
// there, so every rank is done reading what it read from halves t % 2 (between t-2 and t-1):
// a half is never written while someone still reads it, and no "done reading" round is needed.
// Data larger than a half goes through in rounds, a step each.
//
// Rooted calls take one-sided steps: in a broadcast or scatter only the receivers wait (for the
// root), in a reduce or gather only the root waits (for the senders); everyone still posts its
// arrival. The rule then needs one wait of its own: before writing halves for step t, a rank
// that passed a one-sided step since the last full one waits until every rank has arrived at
// t-1 (usually long done). So a root returns as soon as its data is in, as MPI's does, and runs
// at most one step ahead of the slowest receiver.
//
// Every step carries the caller's call (what, how many bytes, root, dtype and op, its number)
// beside its arrival (Word::note); whoever waits on a rank compares that note with its own
// before it reads anything the rank wrote. Ranks in different collectives (a skipped barrier,
// another count or root) fail the call, naming both calls, instead of reducing one call's bytes
// into another's: always on, as the note sits in the cache line the wait reads anyway.
//
// A tiny all_reduce on a small group (Box below) skips the halves: each rank writes its data,
// its call note and the step into a box of its own, a few cache lines that each carry the
// step beside their bytes, and its peers spin on those lines. A step through the halves is two
// dependent cache-line transfers (the peer's arrival word, then its half), a box one, as Open
// MPI's shared-memory "fast box" and NCCL's LL protocol do it. Boxes alternate by step parity,
// by the halves' rule. The rank still posts its arrival (and its note) as every step does, so a
// wait that outlasts the spin, a dead peer, a mismatch or a late deadline all go the usual way.
//
// all_reduce and reduce: small buffers (on 2 ranks, up to 128 KiB) are reduced whole by every
// rank that needs the result, in rank order, so all ranks get the same bits; larger ones split
// the work: each rank reduces its slice of every rank's chunk into its other half, then every
// rank copies the slices out (reduce-scatter, then all-gather, in the segment).

#include "backends/shm/shm_backend.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/shm/box.hpp"
#include "backends/shm/call_note.hpp"
#include "backends/shm/p2p.hpp"
#include "backends/shm/segment.hpp"
#include "backends/shm/sync.hpp"
#include "common/duration.hpp"
#include "idist/common/host.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

using shm::BoxLine;
using shm::CallNote;
using shm::Clock;
using shm::kOpNames;
using shm::Op;
using shm::Word;
using shm::box_bytes;
using shm::box_lines;
using shm::kBoxBytes;
using shm::kBoxLines;
using shm::kBoxNoteBytes;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// Sizes, by group size: halves large enough to stream at memory speed, small enough that a
// group of hundreds of ranks maps tens of MiB, not GiB. Rings likewise; their pages are touched
// only by pairs that talk. 512 KiB rather than 1 MiB: a round's working set (a rank's half and
// its chunk, and its peers' halves) then stays in a 1 MiB L2 (AMD EPYC, 2 ranks: all_reduce and
// all_gather 0.75-0.90 of 1 MiB halves' time from 1 to 64 MiB, docs/BENCHMARKS.md); 256 KiB
// was no faster, 64-128 KiB slower (a step per round starts to show).
std::size_t half_bytes(int size) {
  const auto share = (8 * MiB / static_cast<std::size_t>(size)) / (4 * KiB) * (4 * KiB);
  return std::clamp<std::size_t>(share, 64 * KiB, 512 * KiB);
}
std::size_t ring_bytes(int size) {
  if (size <= 8) return 1 * MiB;
  if (size <= 32) return 256 * KiB;
  return 64 * KiB;
}
// Below this, reducing the whole buffer on every rank beats splitting it (one step instead of
// two, no copy back).
constexpr std::size_t kWholeReduceBytes = 16 * KiB;
// On 2 ranks, up to here: each rank's read of its peer's half costs the same either way, and
// splitting adds a step; from here the split's halved reduction and copies win (1 MiB: 104-114
// us split against 144-159 whole, Open MPI 104-115; 512 KiB: 50-53 against 72-79; 256 KiB
// even; 2026-11-30, issue 48, docs/BENCHMARKS.md item 17). Each round of a split on 2 ranks
// starts with a step of its own, so that neither rank copies a round in while the other still
// copies the last one out: a step more, and 0.66-0.74x the time from 128 KiB to 64 MiB (1 MiB:
// 84 us against 128; at 256 KiB, one round, the reduction fell from 30% of the samples to
// 12%; item 19). all_gather's rounds gained nothing from it.
constexpr std::size_t kSplitTwoFrom = 128 * KiB;

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const BackendInit& init)
      : rank_(init.rank),
        size_(init.size),
        timeout_(init.timeout),
        word_(member_word(init)),
        names_(init.names),
        half_(half_bytes(init.size)) {
    for (int h : init.hosts)
      if (h != init.hosts.front())
        throw InStepError("the shm backend needs every rank of the group on one host");
    const int cores = common::host_cores();
    // More of the job's ranks on this machine than cores (fake hosts) is common/cpus_shared.hpp's.
    policy_.oversubscribed = size_ > cores;
    // Every member must step the same way: decided from what all of them see alike (the group's
    // size, the host's processors), not from their LOCAL_WORLD_SIZE, which a user may set.
    watch_peers_ = size_ <= kWatchPeersUpTo && size_ <= cores;
    const auto n = static_cast<std::size_t>(size_);
    // Boxes whatever the cores: a box wait past its spin is a wait on each peer's arrival, as
    // watch_peers_' steps are, which costs a little more than a generation only where ranks
    // sleep (more ranks than cores), and tiny calls rarely sleep.
    const std::size_t boxes = size_ <= kBoxesUpTo ? n * 2 * kBoxLines * sizeof(BoxLine) : 0;
    const std::size_t words = shm::round_up((2 + n) * sizeof(Word) + boxes, shm::kPage);
    const std::size_t slots = n * 2 * half_;
    const auto ring = ring_bytes(size_);
    segment_ = std::make_shared<shm::Segment>(init, words + slots + shm::Mailboxes::bytes_needed(size_, ring),
                                              Clock::now() + timeout_);
    auto* w = reinterpret_cast<Word*>(segment_->data());
    gen_ = &w[0];
    count_ = &w[1];
    arrived_ = &w[2];
    if (boxes) boxes_ = reinterpret_cast<BoxLine*>(&w[2 + n]);
    slots_ = segment_->data() + words;
    mailboxes_ = std::make_shared<shm::Mailboxes>(
        segment_, slots_ + slots,
        shm::Mailboxes::Options{.rank = rank_, .size = size_, .ring_bytes = ring, .timeout = timeout_, .policy = policy_,
                                .word = word_, .names = names_});
    // The watcher may outlive us (completions keep the mailboxes and the segment): it holds the
    // mailboxes weakly and the barrier word, which lives in the segment, by address.
    segment_->watch([mailboxes = std::weak_ptr<shm::Mailboxes>(mailboxes_), gen = gen_, arrived = arrived_,
                     n = size_] {
      std::vector<Word*> words{gen};
      for (int r = 0; r < n; ++r) words.push_back(&arrived[r]);
      if (auto m = mailboxes.lock()) {
        const auto more = m->words_slept_on();
        words.insert(words.end(), more.begin(), more.end());
      }
      return words;
    });
  }

  std::string_view name() const override { return "shm"; }
  // AVG: each chunk's sum is divided while it is still in cache (no pass of its own).
  // The group's wait work (Backend::before_wait): a barrier and a boxed all_reduce run it once
  // they have arrived, every other call at its start.
  BackendTraits traits() const override { return {.native_avg = true, .runs_before_wait = true}; }

  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<ShmBackend>(group.init);
  }

  void barrier() override {
    begin({.op = Op::barrier}, kAfterArrival);
    step();
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    begin({.op = Op::broadcast, .bytes = bytes, .root = src});
    auto* p = static_cast<char*>(data);
    for (std::size_t at = 0; at < bytes; at += half_) {
      const auto n = std::min(half_, bytes - at);
      if (rank_ == src) std::memcpy(writable_half(), p + at, n);
      step_from(src);
      if (rank_ != src) std::memcpy(p + at, half(src), n);
    }
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    begin({.op = Op::all_gather, .bytes = bytes_per_rank});
    gather_rounds(in, out, bytes_per_rank, -1);
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    begin({.op = Op::gather, .bytes = bytes_per_rank, .root = root});
    gather_rounds(in, out, bytes_per_rank, root);
  }

  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    std::uint64_t total = 0;
    for (auto b : bytes_per_rank) total += b;
    begin({.op = Op::all_gather_v, .bytes = total});
    const auto most = *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end());
    const auto mine = bytes_per_rank[static_cast<std::size_t>(rank_)];
    const auto* src = static_cast<const char*>(in);
    for (std::size_t at = 0; at < most; at += half_) {
      char* to = writable_half();
      if (at < mine) std::memcpy(to, src + at, std::min(half_, mine - at));
      step();
      auto* dst = static_cast<char*>(out);
      for (int r = 0; r < size_; ++r) {
        const auto theirs = bytes_per_rank[static_cast<std::size_t>(r)];
        if (at < theirs) std::memcpy(dst + at, half(r), std::min(half_, theirs - at));
        dst += theirs;
      }
    }
  }

  // root writes each rank's block into that rank's own half; no one else writes. The root is
  // the one writer of every half here, so it alone needs the others past the previous step.
  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    begin({.op = Op::scatter, .bytes = bytes_per_rank, .root = root});
    const auto* src = static_cast<const char*>(in);
    for (std::size_t at = 0; at < bytes_per_rank; at += half_) {
      const auto n = std::min(half_, bytes_per_rank - at);
      if (rank_ == root) {
        writable_half();
        for (int r = 0; r < size_; ++r)
          std::memcpy(next_half(r), src + static_cast<std::size_t>(r) * bytes_per_rank + at, n);
      }
      step_from(root);
      std::memcpy(static_cast<char*>(out) + at, half(rank_), n);
    }
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const bool boxed = boxes_ && count * dtype_size(dtype) <= kBoxBytes;
    begin(reduction(Op::all_reduce, count, dtype, op, -1), boxed ? kAfterArrival : kAtStart);
    if (boxed) return boxed_all_reduce(data, count, dtype, op);
    reduce_rounds(data, count, dtype, op, -1);
  }

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    begin(reduction(Op::reduce, count, dtype, op, root));
    reduce_rounds(data, count, dtype, op, root);
  }

  // Each rank puts its piece of every block in its half; rank r reduces the r-th pieces.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    begin(reduction(Op::reduce_scatter, count, dtype, op, -1));
    const auto fn = reduce_kernel(dtype, summed(op));
    const auto element = dtype_size(dtype);
    const auto n = static_cast<std::size_t>(size_);
    const std::size_t per_round = std::max<std::size_t>(1, half_ / n / element);  // elements of each block
    if (per_round * n * element > half_) throw InStepError("reduce_scatter: the group is too large for shm's slots");
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    for (std::size_t at = 0; at < count; at += per_round) {
      const auto len = std::min(per_round, count - at);
      char* mine = writable_half();
      for (std::size_t b = 0; b < n; ++b) std::memcpy(mine + b * per_round * element, src + (b * count + at) * element, len * element);
      step();
      const auto piece = static_cast<std::size_t>(rank_) * per_round * element;
      fn(dst + at * element, half(0) + piece, half(1) + piece, len);
      for (int r = 2; r < size_; ++r) fn(dst + at * element, dst + at * element, half(r) + piece, len);
      if (op == ReduceOp::AVG) divide(dst + at * element, len, dtype, size_);
    }
  }

  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    return mailboxes_->send(data, bytes, dst, tag);
  }
  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    return mailboxes_->recv(data, bytes, src, tag);
  }
  void cancel_transfers() override {
    mailboxes_->close();
    if (finalizing()) segment_->depart(rank_);
  }
  void abort(const std::string& why) noexcept override {
    try {
      segment_->abort(rank_, why);
    } catch (...) {
      // Out of memory for the words: the peers' waits end at their timeout.
    }
  }

 private:
  // Halves by step parity (see the top of this file): written before step t in halves t % 2,
  // read after it.
  char* slot(int r, std::uint64_t step) const {
    return slots_ + (static_cast<std::size_t>(r) * 2 + (step & 1u)) * half_;
  }
  char* next_half(int r) const { return slot(r, step_ + 1); }
  char* half(int r) const { return slot(r, step_); }

  // The deadline is read from the clock only once a wait has to sleep: a call that never does
  // (most small ones) skips a clock read, which costs as much as the call. It is then a spin
  // (microseconds) later than the call's start.
  // `wait_work`: when the call runs the group's wait work (Backend::before_wait); a call that
  // says kAfterArrival reaches arrive() before any wait but settle_one_sided's, which runs it.
  enum WaitWorkAt { kAtStart, kAfterArrival };
  void begin(CallNote call, WaitWorkAt wait_work = kAtStart) {
    // ProcessGroup answers a group of one itself; the algorithms below read a second rank's half.
    if (size_ == 1)
      throw std::logic_error(std::string("shm: ") + kOpNames[static_cast<std::size_t>(call.op)] +
                             " reached a group of one");
    op_ = kOpNames[static_cast<std::size_t>(call.op)];
    call.number = ++calls_;
    note_ = call.words();
    deadline_.reset();
    if (wait_work == kAtStart) before_wait();
  }

  static CallNote reduction(Op op, std::size_t count, DType dtype, ReduceOp reduce_op, int root) {
    return {.op = op,
            .bytes = count * dtype_size(dtype),
            .root = root,
            .dtype = static_cast<int>(dtype),
            .reduce_op = static_cast<int>(reduce_op)};
  }

  int name(int r) const { return names_.empty() ? r : names_[static_cast<std::size_t>(r)]; }

  // Step numbers: 64 bits here, so that the notes' slot (step % 3) never skips at a wrap; the
  // words in the segment carry the low 32 bits, compared with wrap-around (shm::reached).
  using Step = std::uint64_t;
  static std::uint32_t word_of(Step s) { return static_cast<std::uint32_t>(s); }

  // My half for the next step, once every rank is done reading what the step before the last
  // left there (see the top of this file: only needed after a one-sided step).
  // The notes of that step are compared here too: a rank that did not wait in it (a root)
  // learns that the others made another call (another root), one call late but not never.
  char* writable_half() {
    settle_one_sided();
    return next_half(rank_);
  }
  void settle_one_sided() {
    if (one_sided_) {
      before_wait();
      wait_all(step_, posted_);
      one_sided_ = false;
    }
  }

  // Every other rank's arrival at step s, each with the note `expected` (or a mismatch).
  void wait_all(Step s, const CallNote::Words& expected) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) {
        wait_arrival(r, s, expected);
        if (note_of(r, s) != expected) [[unlikely]]
          throw_mismatch(r, s, expected);
      }
  }

  // Posts this rank's arrival at step s, with its call's note beside it.
  void arrive(Step s) {
    auto& note = arrived_[rank_].note[s % 3];
    note[0].store(note_[0], std::memory_order_relaxed);
    note[1].store(note_[1], std::memory_order_relaxed);
    posted_ = note_;
    shm::post(arrived_[rank_], word_of(s));  // releases the note with the arrival
    before_wait();  // while the arrival's line travels to the peers
  }

  // `expected`: the note r must have at s (this call's, or the previous call's in writable_half).
  void wait_arrival(int r, Step s, const CallNote::Words& expected) {
    shm::wait_for(arrived_[r], policy_, [s = word_of(s)](std::uint32_t a) { return shm::reached(a, s); },
                  [&] { check_missing(s, r, expected); });
  }
  void wait_arrival(int r, Step s) { wait_arrival(r, s, note_); }

  // Rank r's note for step s, read once its arrival there was seen. r writes that slot again
  // at step s + 3, which it cannot post before this rank has posted s + 1: its own waits (a
  // full step, a root's writable_half) stop it at s + 1 or s + 2.
  CallNote::Words note_of(int r, Step s) const {
    const auto& note = arrived_[r].note[s % 3];
    return {note[0].load(std::memory_order_relaxed), note[1].load(std::memory_order_relaxed)};
  }

  // Before reading what rank r wrote for step s: r must be in the same call.
  void check_note(int r, Step s) const {
    if (note_of(r, s) != note_) [[unlikely]]
      throw_mismatch(r, s, note_);
  }

  [[noreturn]] void throw_mismatch(int r, Step s, const CallNote::Words& my_note) const {
    const auto mine = CallNote::from(my_note);
    const auto theirs = CallNote::from(note_of(r, s));
    // The numbers only when they differ: the ranks made the same calls, but not equally many.
    const bool numbered = mine.number != theirs.number;
    throw std::runtime_error("the ranks' calls do not match: this rank called " + mine.text(shown(mine.root), numbered) +
                             ", " + word_ + std::to_string(name(r)) + " called " +
                             theirs.text(shown(theirs.root), numbered) +
                             " (shared memory); every rank of a group must make the same collective calls, in the "
                             "same order, with the same sizes and roots");
  }
  int shown(int root) const { return root >= 0 && root < size_ ? name(root) : root; }

  // A barrier over the group. A few ranks with a core each watch each other's arrival words:
  // one cache line crosses each way, where a shared counter takes a line back and forth per
  // arrival plus the generation's (8 B all_reduce at 2 ranks: 0.22 us against MPI's 0.20 with
  // the counter). Otherwise the last rank to arrive starts the next generation, which wakes
  // every sleeper at once instead of one peer's word after another; it compares every note
  // with its own first and puts the verdict beside the generation.
  void step() {
    // After a one-sided step, its notes are compared here too (a root that did not wait there).
    if (one_sided_) writable_half();
    const Step s = ++step_;
    arrive(s);
    if (watch_peers_) return wait_all(s, note_);
    auto& verdict = gen_->note[s % 3][0];
    if (count_->value.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size_)) {
      count_->value.store(0, std::memory_order_relaxed);
      int odd = -1;
      for (int r = 0; r < size_ && odd < 0; ++r)
        if (r != rank_ && note_of(r, s) != note_) odd = r;
      verdict.store(odd < 0 ? 0 : 1, std::memory_order_relaxed);
      shm::post(*gen_, word_of(s));
      if (odd >= 0) throw_mismatch(odd, s, note_);
      return;
    }
    shm::wait_for(*gen_, policy_, [w = word_of(s)](std::uint32_t g) { return shm::reached(g, w); },
                  [&] { check_missing(s, -1, note_); });
    if (verdict.load(std::memory_order_relaxed) != 0) [[unlikely]]
      for (int r = 0; r < size_; ++r)
        if (r != rank_) check_note(r, s);
  }

  // A step in which only the ranks that read `src`'s data wait, and only for src.
  void step_from(int src) {
    const Step s = ++step_;
    one_sided_ = true;
    arrive(s);
    if (rank_ == src) return;
    wait_arrival(src, s);
    check_note(src, s);
  }

  // A step in which only `dst` waits, for every other rank.
  void step_to(int dst) {
    const Step s = ++step_;
    one_sided_ = true;
    arrive(s);
    if (rank_ == dst) wait_all(s, note_);
  }

  // Between naps in a wait at step s (for rank `only`, or for the whole step when -1): a rank
  // waited for that has exited fails the wait now, as does one that arrived in another call;
  // past the deadline, the missing ranks are named.
  void check_missing(Step s, int only, const CallNote::Words& expected) {
    std::string missing;
    int listed = 0;
    auto at = [&](int r) { return arrived_[r].value.load(std::memory_order_acquire); };
    auto here = [&](int r) { return shm::reached(at(r), word_of(s)); };
    auto lost = [&](int r) {
      return PeerLostFailure(r, "connection to " + word_ + std::to_string(name(r)) +
                                    " lost: it exited while this rank waited for it in " + op_ + " (shared memory)");
    };
    auto left = [&](int r) {
      return PeerLostFailure(r, word_ + std::to_string(name(r)) + " left the group (finalize) while this rank waited for it in " +
                                    op_ + " (shared memory): the ranks ran different numbers of steps (uneven data? see "
                                          "idist::join)");
    };
    if (const int by = segment_->aborted_by(); by == rank_) [[unlikely]]
      throw AbortedFailure(-1, "this rank aborted the group: " + segment_->abort_reason());
    else if (by >= 0) [[unlikely]]
      throw PeerLostFailure(-1, word_ + std::to_string(name(by)) + " aborted the group while this rank waited in " + op_ +
                                    " (shared memory)",
                            by);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (only >= 0 && r != only)) continue;
      // A rank at this very step in another call: the calls do not match (the step would
      // never complete: another call takes other steps).
      if (at(r) == word_of(s) && note_of(r, s) != expected) throw_mismatch(r, s, expected);
      if (here(r)) continue;
      // Looked at again after the exit: a rank that arrived, then exited, is not lost.
      if (segment_->exited(r) && !here(r)) throw lost(r);
      if (segment_->departed(r) && !here(r)) throw left(r);
      if (++listed <= 8) missing += (missing.empty() ? "" : ", ") + std::to_string(name(r));
    }
    // Everyone arrived, yet the step did not complete: the last to arrive died between its
    // arrival and starting the next generation.
    if (listed == 0)
      for (int r = 0; r < size_; ++r)
        if (segment_->exited(r)) throw lost(r);
    if (!deadline_) deadline_ = call_deadline(timeout_);
    if (Clock::now() < *deadline_) return;
    const auto who = listed == 1 ? word_ : word_.substr(0, word_.size() - 1) + "s ";
    throw TimeoutFailure(timed_out(op_, timeout_, "waiting for " + who + missing + (listed > 8 ? ", ..." : "") +
                                                      " (shared memory)"));
  }

  // all_gather (root < 0) or gather to root.
  void gather_rounds(const void* in, void* out, std::size_t bytes_per_rank, int root) {
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    for (std::size_t at = 0; at < bytes_per_rank; at += half_) {
      const auto n = std::min(half_, bytes_per_rank - at);
      std::memcpy(writable_half(), src + at, n);
      if (root < 0) {
        step();
      } else {
        step_to(root);
        if (rank_ != root) continue;
      }
      for (int r = 0; r < size_; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * bytes_per_rank + at, half(r), n);
    }
  }

  // all_reduce (root < 0) or reduce to root; non-root buffers of reduce stay as they were.
  void reduce_rounds(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
    const auto fn = reduce_kernel(dtype, summed(op));
    const bool average = op == ReduceOp::AVG;
    const auto element = dtype_size(dtype);
    const std::size_t per_round = half_ / element;
    auto* p = static_cast<char*>(data);
    const bool wants = root < 0 || rank_ == root;
    // The last step of a round: everyone reads after it (all_reduce), or the root alone.
    auto last_step = [&] {
      if (root < 0)
        step();
      else
        step_to(root);
    };
    for (std::size_t at = 0; at < count; at += per_round) {
      const auto len = std::min(per_round, count - at);
      char* mine = p + at * element;
      // 2 ranks splitting: both done copying the last round out first (see kSplitTwoFrom).
      if (root < 0 && size_ == 2 && len * element >= kSplitTwoFrom) step();
      std::memcpy(writable_half(), mine, len * element);
      if ((size_ == 2 && len * element < kSplitTwoFrom) || len * element <= kWholeReduceBytes) {
        last_step();
        if (wants) reduce_all(fn, mine, len);
        if (wants && average) divide(mine, len, dtype, size_);
        continue;
      }
      step();
      // My slice of this round, reduced into my other half (written before the next step).
      const auto n = static_cast<std::size_t>(size_);
      const auto from = len * static_cast<std::size_t>(rank_) / n;
      const auto to = len * static_cast<std::size_t>(rank_ + 1) / n;
      if (to > from) {
        char* result = writable_half() + from * element;
        const auto offset = from * element;
        fn(result, half(0) + offset, half(1) + offset, to - from);
        for (int r = 2; r < size_; ++r) fn(result, result, half(r) + offset, to - from);
        if (average) divide(result, to - from, dtype, size_);
      }
      last_step();
      if (!wants) continue;
      for (int r = 0; r < size_; ++r) {
        const auto a = len * static_cast<std::size_t>(r) / n;
        const auto b = len * static_cast<std::size_t>(r + 1) / n;
        std::memcpy(mine + a * element, half(r) + a * element, (b - a) * element);
      }
    }
  }

  BoxLine* box(int r, Step s) const {
    return boxes_ + (static_cast<std::size_t>(r) * 2 + (s & 1u)) * kBoxLines;
  }
  // Whether rank r has written its step-s box (every line of it): loads every line each time,
  // with no early exit, so that the lines' transfers overlap.
  bool box_ready(int r, Step s, std::size_t lines) const {
    const BoxLine* b = box(r, s);
    bool ready = true;
    for (std::size_t i = 0; i < lines; ++i) ready &= b[i].step.load(std::memory_order_acquire) == s;
    return ready;
  }
  bool box_matches(int r, Step s) const {
    CallNote::Words note;
    std::memcpy(note.data(), box(r, s)[0].bytes, kBoxNoteBytes);
    return note == note_;
  }
  // all_reduce of at most kBoxBytes through the boxes (see the top of this file); the same
  // reduction, in rank order, as reduce_rounds.
  void boxed_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto fn = reduce_kernel(dtype, summed(op));
    const auto bytes = count * dtype_size(dtype);
    const auto lines = box_lines(bytes);
    settle_one_sided();  // the box of two steps ago may still be read after a one-sided step
    const Step s = ++step_;
    BoxLine* mine = box(rank_, s);
    std::memcpy(mine[0].bytes, note_.data(), kBoxNoteBytes);
    box_bytes(mine, static_cast<char*>(data), bytes, true);
    for (std::size_t i = 0; i < lines; ++i) mine[i].step.store(s, std::memory_order_release);
    arrive(s);
    // Every peer's box, spun on at once; past the spin, or a box from another call, the usual
    // wait on each peer's arrival, whose note says what that peer called.
    unsigned pending = ((1u << size_) - 1) & ~(1u << rank_);
    auto all_in = [&] {
      for (unsigned left = pending; left; left &= left - 1) {
        const int r = std::countr_zero(left);
        if (box_ready(r, s, lines)) pending &= ~(1u << r);
      }
      return pending == 0;
    };
    const int first = std::countr_zero(pending);
    bool boxed = shm::spin_for(arrived_[first], policy_, all_in);
    for (int r = 0; r < size_ && boxed; ++r)
      if (r != rank_ && !box_matches(r, s)) boxed = false;
    if (!boxed)
      for (int r = 0; r < size_; ++r)
        if (r != rank_) {
          wait_arrival(r, s);
          check_note(r, s);
          if (!box_ready(r, s, lines))
            throw std::logic_error("shm: rank " + std::to_string(name(r)) + " arrived in all_reduce without its box");
        }
    alignas(64) char in[kBoxesUpTo][kBoxBytes];
    for (int r = 0; r < size_; ++r)
      if (r == rank_)
        std::memcpy(in[r], data, bytes);
      else
        box_bytes(box(r, s), in[r], bytes, false);
    fn(data, in[0], in[1], count);
    for (int r = 2; r < size_; ++r) fn(data, data, in[r], count);
    if (op == ReduceOp::AVG) divide(data, count, dtype, size_);
  }

  // AVG is a SUM, divided chunk by chunk.
  static ReduceOp summed(ReduceOp op) { return op == ReduceOp::AVG ? ReduceOp::SUM : op; }

  // Every rank's chunk, reduced in rank order into `out`.
  void reduce_all(ReduceFn fn, char* out, std::size_t len) const {
    fn(out, half(0), half(1), len);
    for (int r = 2; r < size_; ++r) fn(out, out, half(r), len);
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string word_;
  std::vector<int> names_;  // BackendInit::names
  std::size_t half_;
  shm::WaitPolicy policy_;
  bool watch_peers_ = false;  // step() by arrival words (small groups), else by generation
  static constexpr int kWatchPeersUpTo = 4;
  static constexpr int kBoxesUpTo = 4;
  std::shared_ptr<shm::Segment> segment_;
  Word* gen_ = nullptr;
  Word* count_ = nullptr;
  Word* arrived_ = nullptr;
  BoxLine* boxes_ = nullptr;  // groups of up to kBoxesUpTo only
  char* slots_ = nullptr;
  std::shared_ptr<shm::Mailboxes> mailboxes_;
  std::uint64_t step_ = 0;
  bool one_sided_ = false;  // a one-sided step since the last full one (see writable_half)
  std::uint64_t calls_ = 0;
  CallNote::Words note_{};    // this call's (CallNote::words)
  CallNote::Words posted_{};  // the note of this rank's last arrival
  const char* op_ = "";
  std::optional<Clock::time_point> deadline_;  // set by the first nap of a call
};

}  // namespace

std::unique_ptr<Backend> make_shm_backend(const BackendInit& init) { return std::make_unique<ShmBackend>(init); }

}  // namespace idist::detail

#pragma once
// The flight recorder's memory, as a rank writes it and its idist-run reads it: the last
// kSlots collectives and point-to-point calls of each ring the rank wrote, each with its group,
// its number in that group, what it was (op, dtype, count, root or peer) and whether it has
// ended. idist-run makes one per rank (a memfd, IDIST_RECORDER_FD in the rank) and reads it
// while the rank runs, is frozen or spins: no call into the rank, no file anywhere. Like the
// env contract, a format both halves agree on; plain data and atomics, no code of either half.
//
// Rings, because an 8-byte shared-memory all_reduce costs about 0.2 us and the recorder may
// add 2% of that, a dozen cycles: no atomic read-modify-write, no string copy. A group's
// collectives run one after another, so a group that owns a ring writes it with plain stores.
// Ring 0 is shared (slots claimed with an atomic add): point-to-point calls, which any thread
// may make at once, and the groups beyond the owned rings.

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "idist/common/rank_metrics.hpp"

namespace idist::common::recorder {

inline constexpr std::uint64_t kMagic = 0x3552434552445349ull;  // "ISDRECR5" in memory
inline constexpr std::uint32_t kSlots = 64;                      // per ring
inline constexpr std::uint32_t kRings = 8;                       // ring 0 shared, 7 for groups
inline constexpr std::uint32_t kGroups = 64;                     // Segment::groups
inline constexpr std::uint32_t kLives = 64;                      // Segment::life_pids
// Segment::count_calls. 1 is the older "count": a libidist and an idist-run of other builds
// then still agree that --metrics counts every call.
inline constexpr std::int32_t kCountCalls = 1;
inline constexpr std::int32_t kTimeWork = 2;

enum class State : std::uint8_t { empty = 0, entered = 1, completed = 2, failed = 3 };
// A point-to-point call has no number shared by the group: its slot's `seq` is its tag,
// `root` its peer (a group rank) and `count` its bytes.
// A `member` record is no call: a group the rank belongs to (Segment::groups), as the reader
// lists it beside the calls.
enum class Kind : std::uint8_t { collective = 0, p2p = 1, member = 2 };

// The calls by number: the rank writes one byte, the reader names it.
enum class Op : std::uint8_t {
  none,
  all_reduce,
  reduce,
  reduce_scatter,
  all_gather,
  gather,
  scatter,
  broadcast,
  barrier,
  send,
  recv,
  isend,
  irecv,
};
inline constexpr std::array<std::string_view, 13> kOpNames = {
    "?", "all_reduce", "reduce", "reduce_scatter", "all_gather", "gather", "scatter",
    "broadcast", "barrier", "send", "recv", "isend", "irecv"};
static_assert(kOpNames.size() == static_cast<std::size_t>(Op::irecv) + 1, "a name for every Op");
static_assert(kOpNames.size() == kOps, "counters for every Op");
constexpr std::string_view op_name(Op op) {
  const auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : kOpNames[0];
}

// One cache line: a call costs the rank one line of stores.
struct alignas(64) Slot {
  // Even when the slot is whole; odd while the rank writes it (a reader copies and retries).
  std::atomic<std::uint32_t> version{0};
  std::atomic<std::uint8_t> state{0};  // State
  std::uint8_t op = 0;                 // Op
  std::uint8_t dtype = 0;              // idist::DType
  std::uint8_t kind = 0;               // Kind
  // Which process of the rank (high 16 bits: a rank's script may run several programs in turn,
  // each numbering its calls from 0) and which init() of that process (low 16: numbers restart
  // with each). Alike on every rank for the same program's same init().
  std::uint32_t epoch = 0;
  std::int32_t group = -1;             // -1: the world; else new_group's number
  std::int32_t root = -1;
  std::uint8_t reduce = 0;             // idist::ReduceOp (SUM where the call has none)
  std::uint64_t seq = 0;               // the collective's number in its group, as on every member
  std::uint64_t count = 0;
  // The ring's count of slots claimed before this one: with the ring, an id. Atomic, as a
  // thread ending a call in the shared ring checks the slot is still its call's.
  std::atomic<std::uint64_t> number{0};
  // The process's calls entered before this one, over all rings: orders calls of different
  // rings. Counted without a locked add, so where threads enter calls at once, numbers repeat
  // or, for a few calls, run backwards: "the newest call" of a rank whose threads call at once
  // is a guess. It only orders; it never identifies a call.
  std::uint64_t order = 0;
  // The group's calls up to this one folded together (fold_call): equal on two ranks at the
  // same number only if every call of theirs matched so far, so that a mismatch is seen even
  // once the call itself has left the ring. 0 for point-to-point calls.
  std::uint64_t history = 0;
  // No time: a clock read costs a tenth of an 8-byte shared-memory all_reduce. The reader dates
  // calls itself, by when it first saw the rings' `next` at their present values (the metrics
  // time a sample of calls: rank_metrics.hpp).
};

static_assert(sizeof(Slot) == 64);

struct alignas(64) Ring {
  std::atomic<std::int32_t> owner{0};  // the pid whose group writes it alone (never ring 0); 0: free
  // Slots claimed so far; the newest is (next - 1) % kSlots. Counted before the slot is
  // written, so that a reader who sees a new call also sees `next` moved (and dates it anew).
  std::atomic<std::uint64_t> next{0};
  Slot slots[kSlots];
};

// A group the rank belongs to, written when the group is made, so that a rank that never
// called into it is still known as a member (and named as the one missing). A group that
// writes the shared ring also keeps its latest call's number and history here, which a flood
// of other calls in that ring cannot push out: a mismatch of its calls is still seen at the
// job's end. Entry (group + 1) % kGroups: another group 64 numbers apart takes it over.
struct alignas(32) GroupEntry {
  std::atomic<std::uint32_t> version{0};  // as Slot::version
  std::uint32_t epoch = 0;                 // as Slot::epoch; 0: unused
  std::int32_t group = -1;
  std::uint8_t has_call = 0;  // op, seq and history hold its latest call (shared-ring groups only)
  std::uint8_t op = 0;        // an Op
  std::uint64_t seq = 0;
  std::uint64_t history = 0;
};

struct Segment {
  std::uint64_t magic = kMagic;
  std::int32_t rank = -1;
  std::int32_t pid = 0;
  std::int32_t tracer = 0;  // idist-run's pid: the rank lets it attach gdb (PR_SET_PTRACER)
  std::atomic<std::uint32_t> lives{0};  // processes that have recorded here (see Slot::epoch)
  // Life L's process as L << 32 | pid, at L % kLives: a call left open by a program that has
  // ended (killed mid-call, then the rank's script went on) is no wait.
  std::atomic<std::uint64_t> life_pids[kLives] = {};
  alignas(64) std::atomic<std::uint64_t> order{0};  // see Slot::order
  // Live recovery's heartbeat (issue 46): a rank that opted in (InitOptions::recovery) stamps
  // now_ns() here every kBeatEvery, from a thread of its own, beat_pid the process that beats;
  // both are cleared when it stops on purpose and by every new process that maps the segment.
  // idist-run stops a rank whose stamp has not moved for --heartbeat-timeout, by its own clock
  // (frozen: SIGSTOP, a process not scheduled). 0: no heartbeat to watch.
  alignas(64) std::atomic<std::int64_t> beat_ns{0};
  std::atomic<std::int32_t> beat_pid{0};
  // The process that admits replacements at step boundaries (idist::will_admit_replacements(),
  // which idist::Recovery calls), cleared as beat_pid is: idist-run starts a rank in a lost
  // one's place only where every running rank said so. In the padding before `rings`.
  std::atomic<std::int32_t> admits_pid{0};
  // What the rank keeps in `stats` (rank_metrics.hpp): kTimeWork, a sample of its calls timed
  // and the work between them (straggler reports, on by default); kCountCalls, every call
  // counted by op and bytes too (--metrics serves them); 0, nothing: a call costs what the
  // recorder alone costs.
  std::atomic<std::int32_t> count_calls{0};
  // 1: idist-run writes a trace (--trace), and the memfd holds a TraceArea after this Segment
  // (trace_area.hpp), where the rank dates each call; 0: no area, no clock read.
  std::atomic<std::int32_t> traced{0};
  Ring rings[kRings];
  GroupEntry groups[kGroups];
  // The metrics (rank_metrics.hpp): ring r's counters at stats[r], and the program's steps.
  RingStats stats[kRings];
  StepStats steps;
};

// Slot::history after one more call: what the ranks must agree on (op, dtype, count, root,
// reduction).
constexpr std::uint64_t fold_call(std::uint64_t history, Op op, std::uint8_t dtype, std::uint64_t count,
                                  std::int32_t root, std::uint8_t reduce) {
  const std::uint64_t word = static_cast<std::uint64_t>(op) | static_cast<std::uint64_t>(dtype) << 8 |
                             static_cast<std::uint64_t>(static_cast<std::uint32_t>(root)) << 16 |
                             static_cast<std::uint64_t>(reduce) << 48;
  // One multiply (a few cycles of the recorder's dozen): odd, so a difference in the word
  // survives it, and a difference in the count is carried by the next call's multiply.
  return ((history ^ word) * 0x9e3779b97f4a7c15ull ^ count) + 1;
}

// Calls entered so far, over all rings: changes whenever the rank enters a call.
inline std::uint64_t entered(const Segment& s) {
  std::uint64_t n = 0;
  for (const auto& ring : s.rings) n += ring.next.load(std::memory_order_acquire);
  return n;
}

inline constexpr std::int64_t kBeatEvery = 100'000'000;  // ns

// The reader's clock: coarse (a few ms) and cheap, which is all a stall needs.
inline std::int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// The writers' clock, precise, for what is timed (metrics, the trace): the same on a host's
// ranks and idist-run, so their times line up.
inline std::int64_t precise_ns() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace idist::common::recorder

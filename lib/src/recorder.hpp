#pragma once
// This process's flight recorder: every collective a group runs is entered here before it
// starts and marked when it ends, in the memory idist-run reads (IDIST_RECORDER_FD), so that a
// stall can be reported from outside the rank even while it is frozen.
//
// enter() and leave() are inline and take no lock, no atomic read-modify-write on an owned
// ring and, but for a sample, no clock: they run on every collective (see flight_recorder.hpp
// and rank_metrics.hpp for the budget). Under --metrics they also count the call by op and
// bytes, and for the metrics or the straggler reports they time a sample of calls.
// A group on shared memory makes the entry once the call has posted its part
// (Backend::before_wait): the stores then overlap the peers' latency instead of delaying the
// post, and a timed call's clock starts there.

#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "idist/common/flight_recorder.hpp"
#include "idist/common/trace_area.hpp"
#include "idist/types.hpp"

namespace idist::detail {

// idist-run's memory for this rank's recorder (IDIST_RECORDER_FD), or null where there is
// none (a rank started without idist-run, or IDIST_FLIGHT_RECORDER=0): where a heartbeat goes.
common::recorder::Segment* launcher_segment();

// idist::mark_step() in the metrics (common/rank_metrics.hpp's StepStats).
void record_step() noexcept;

// A DType's size, inline: dtype_size() is a call into the library on every collective. Each
// size's log2 in a nibble, in DType's order (1, 1, 4, 8, 2, 2, 4, 8 bytes): shifts in
// registers, where a table indexed by the dtype was built on the stack and read back a byte at
// a time (a stalled load on every call, measured).
constexpr std::uint64_t element_bytes(DType d) {
  constexpr std::uint32_t kLog2Sizes = 0x32113200;
  return std::uint64_t{1} << ((kLog2Sizes >> (4 * (static_cast<std::uint32_t>(d) & 7))) & 0xf);
}
static_assert(element_bytes(DType::uint8) == 1 && element_bytes(DType::int8) == 1 && element_bytes(DType::int32) == 4 &&
              element_bytes(DType::int64) == 8 && element_bytes(DType::float16) == 2 &&
              element_bytes(DType::bfloat16) == 2 && element_bytes(DType::float32) == 4 &&
              element_bytes(DType::float64) == 8);

// The metrics' index of a backend: its place in env::kBackendNames, else the last.
std::uint8_t stat_backend(std::string_view name);

// A writer's ring: its own when one was free (its calls must then come one at a time, as a
// group's collectives do), else the shared ring 0. Empty with IDIST_FLIGHT_RECORDER=0.
class RecorderRing {
 public:
  // The metrics' timing of an owned ring's calls (rank_metrics.hpp), kept in the ring's writer:
  // its calls come one at a time. A countdown of small calls picks the sampled ones, so that a
  // call that is not timed costs one decrement; a call of kTimedBytes or more is timed each.
  struct Timing {
    common::recorder::OpStats* stats = nullptr;  // the call being timed
    common::recorder::WorkStats* work = nullptr;
    const std::atomic<std::int64_t>* last_mark = nullptr;  // StepStats::last_mark_ns: 0 before this program's first
    std::int64_t start_ns = 0;
    std::int64_t last_end_ns = 0;  // the last timed call's end: the next call closes the gap
    std::uint32_t weight = 1;      // of the call being timed
    std::uint32_t countdown = 1;   // small calls until one is timed (1 while a gap is open)
    std::uint32_t every = 1;       // 1 or kSampleEvery, from the last sampled call's time
    std::uint32_t resume = 1;      // the countdown once the open gap is closed
    bool sampled = false;          // the call being timed was picked by the countdown
  };

  // Where a call was entered, for leave().
  struct Mark {
    common::recorder::Slot* slot = nullptr;
    std::uint64_t number = 0;
    const common::recorder::Ring* shared = nullptr;  // the ring, where others write it too
    Timing* timing = nullptr;                        // the call is timed (--metrics)
    common::recorder::TraceEntry* traced = nullptr;  // the call's entry in the trace (--trace)
    std::uint64_t trace_number = 0;                  // the entry's number while it is this call's
  };

  // A ring of its own when one is free, else the shared one, for the collectives of group
  // `group` (-1: the world) made by init() number `epoch`; the group is entered as this
  // rank's in Segment::groups.
  // `backend`: stat_backend() of the group's.
  static RecorderRing own(std::uint32_t epoch, std::int32_t group, std::uint8_t backend);
  // The shared ring, for writers that may run on several threads at once.
  static RecorderRing shared(std::uint8_t backend);

  RecorderRing() = default;
  RecorderRing(RecorderRing&& other) noexcept
      : segment_(other.segment_), ring_(other.ring_), entry_(other.entry_), stats_(other.stats_),
        trace_(other.trace_), extras_(other.extras_), counts_(other.counts_), timing_(other.timing_), life_(other.life_), backend_(other.backend_),
        owned_(other.owned_) {
    other.ring_ = nullptr;
    other.entry_ = nullptr;
    other.owned_ = false;
  }
  RecorderRing& operator=(RecorderRing&&) = delete;
  RecorderRing(const RecorderRing&) = delete;
  // Freed only by its owner: a child forked without exec that runs its destructors must not
  // free its parent's ring (a second writer there would mix slots).
  ~RecorderRing() {
    if (!owned_) return;
    auto me = static_cast<std::int32_t>(::getpid());
    ring_->owner.compare_exchange_strong(me, 0, std::memory_order_release);
  }

  // Whether calls are recorded at all (not with IDIST_FLIGHT_RECORDER=0, nor for a group of one).
  bool active() const noexcept { return ring_ != nullptr; }

  // `bytes`: what the call passes, for the metrics, where `count` elements of `dtype` do not say
  // (~0: they do; 0 where count is ~0 too).
  Mark enter(std::uint32_t epoch, std::int32_t group, std::uint64_t seq, common::recorder::Op op, DType dtype,
             std::uint64_t count, std::int32_t root, ReduceOp reduce, std::uint64_t history, std::uint64_t bytes,
             common::recorder::Kind kind = common::recorder::Kind::collective) noexcept {
    Mark mark;  // NRVO
    enter_into(mark, epoch, group, seq, op, dtype, count, root, reduce, history, bytes, kind);
    return mark;
  }
  // enter(), into a Mark the caller holds (default-made): a temporary copied out read back its
  // fields' separate stores as wide loads, which stalled each call (measured).
  [[gnu::always_inline]] void enter_into(Mark& mark, std::uint32_t epoch, std::int32_t group, std::uint64_t seq,
                                         common::recorder::Op op, DType dtype, std::uint64_t count, std::int32_t root,
                                         ReduceOp reduce, std::uint64_t history, std::uint64_t bytes,
                                         common::recorder::Kind kind = common::recorder::Kind::collective) noexcept {
    namespace rec = common::recorder;
    if (ring_ == nullptr) return;
    std::uint64_t n = 0;
    rec::Slot* claimed = nullptr;
    std::uint32_t v = 0;
    if (owned_) {
      n = ring_->next.load(std::memory_order_relaxed);
      ring_->next.store(n + 1, std::memory_order_relaxed);
      claimed = &ring_->slots[n % rec::kSlots];
      v = claimed->version.load(std::memory_order_relaxed);
      claimed->version.store(v | 1, std::memory_order_relaxed);
    } else if ((claimed = claim_shared(n, v)) == nullptr) {
      return;
    }
    auto& slot = *claimed;
    std::atomic_thread_fence(std::memory_order_release);
    slot.number.store(n, std::memory_order_relaxed);  // first: see leave()
    // Plain load and store: see Slot::order.
    const auto order = segment_->order.load(std::memory_order_relaxed);
    segment_->order.store(order + 1, std::memory_order_relaxed);
    slot.state.store(static_cast<std::uint8_t>(rec::State::entered), std::memory_order_relaxed);
    slot.op = static_cast<std::uint8_t>(op);
    slot.dtype = static_cast<std::uint8_t>(dtype);
    if (!owned_) [[unlikely]] {  // an owned ring's slots hold its group's, written when it took the ring
      slot.kind = static_cast<std::uint8_t>(kind);
      slot.epoch = life_ | (epoch & 0xffff);
      slot.group = group;
    }
    slot.root = root;
    slot.reduce = static_cast<std::uint8_t>(reduce);
    slot.seq = seq;
    slot.count = count;
    slot.order = order;
    slot.history = history;
    slot.version.store((v | 1) + 1, std::memory_order_release);
    if (entry_ != nullptr) write_entry(*entry_, life_ | (epoch & 0xffff), group, true, op, seq, history);
    mark.slot = &slot;
    mark.number = n;
    mark.shared = owned_ ? nullptr : ring_;
    if (!extras_) return;  // no metrics, straggler reports or trace: the recorder alone
    if (bytes == ~std::uint64_t{0}) bytes = count != ~std::uint64_t{0} ? count * element_bytes(dtype) : 0;
    if (trace_ != nullptr) [[unlikely]]
      trace_enter(mark, slot, bytes);
    if (stats_ != nullptr) {
      auto& st = stats_->ops[backend_][static_cast<std::size_t>(op)];  // an Op: below kOps
      if (!owned_) {  // several threads: counted, not timed
        if (counts_) {
          st.calls.fetch_add(1, std::memory_order_relaxed);
          st.bytes.fetch_add(bytes, std::memory_order_relaxed);
        }
      } else {
        if (counts_) {
          st.calls.store(st.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
          st.bytes.store(st.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
        }
        if (bytes >= common::recorder::kTimedBytes || --timing_.countdown == 0) mark.timing = start_timing(st, bytes);
      }
    }
    return;
  }

  // No clock read here either, but for a timed call: the next call's entry dates this one's
  // end closely enough. Any thread may end the call (an isend's waiter does).
  static void leave(const Mark& mark, bool ok) noexcept {
    namespace rec = common::recorder;
    if (mark.slot == nullptr) return;
    if ((reinterpret_cast<std::uintptr_t>(mark.timing) | reinterpret_cast<std::uintptr_t>(mark.traced)) != 0) [[unlikely]] {
      if (mark.timing != nullptr) time_call(*mark.timing);
      if (mark.traced != nullptr) trace_leave(mark, ok);
    }
    // Only the shared ring can have written over it since (when every slot was an open call).
    if (mark.shared != nullptr && mark.slot->number.load(std::memory_order_relaxed) != mark.number) return;
    mark.slot->state.store(static_cast<std::uint8_t>(ok ? rec::State::completed : rec::State::failed),
                           std::memory_order_release);
  }

  // A group's entry in Segment::groups. Groups 64 numbers apart share one: a writer that finds
  // the other writing leaves it.
  static void write_entry(common::recorder::GroupEntry& e, std::uint32_t epoch, std::int32_t group, bool has_call,
                          common::recorder::Op op, std::uint64_t seq, std::uint64_t history) noexcept {
    auto v = e.version.load(std::memory_order_relaxed);
    if ((v & 1) != 0 || !e.version.compare_exchange_strong(v, v | 1, std::memory_order_relaxed)) return;
    std::atomic_thread_fence(std::memory_order_release);
    e.epoch = epoch;
    e.group = group;
    e.has_call = has_call ? 1 : 0;
    e.op = static_cast<std::uint8_t>(op);
    e.seq = seq;
    e.history = history;
    e.version.store((v | 1) + 1, std::memory_order_release);
  }

 private:
  static void label_slots(common::recorder::Ring& ring, std::uint32_t epoch, std::int32_t group) noexcept;
  static std::int64_t clock_ns() noexcept { return common::recorder::precise_ns(); }
  static std::int64_t& thread_last_end_ns() noexcept {
    thread_local std::int64_t end = 0;
    return end;
  }
  static void add(std::atomic<std::uint64_t>& c, std::uint64_t v) noexcept {
    c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }

  // A call that is large or that the countdown reached: the gap since the last timed call's end
  // closed (the countdown was 1 for that: the small calls' count goes on where it was), and the
  // call timed. Null where it only closed the gap.
  [[gnu::noinline]] Timing* start_timing(common::recorder::OpStats& st, std::uint64_t bytes) noexcept {
    namespace rec = common::recorder;
    auto& t = timing_;
    const auto now = clock_ns();
    const bool large = bytes >= rec::kTimedBytes;
    if (t.last_end_ns != 0) {
      // From the later of this ring's last timed end and this thread's: the calls of another
      // group in between are not this rank's work (with steps every call is timed, so the
      // thread's gaps add up to its work whatever the groups).
      const auto from = std::max(t.last_end_ns, thread_last_end_ns());
      add(t.work->gaps, 1);
      add(t.work->gap_ns, static_cast<std::uint64_t>(now > from ? now - from : 0));
      t.last_end_ns = 0;
      t.countdown = large ? t.resume : t.resume - 1;  // a small call is one of the count
      if (!large && t.countdown != 0) return nullptr;
    }
    t.sampled = !large;
    t.weight = large ? 1 : t.every;
    t.stats = &st;
    t.start_ns = now;
    return &t;
  }

  [[gnu::noinline]] static void time_call(Timing& t) noexcept {
    namespace rec = common::recorder;
    const auto end = clock_ns();
    const auto ns = end > t.start_ns ? end - t.start_ns : 0;
    add(t.stats->ns, static_cast<std::uint64_t>(ns) * t.weight);
    add(t.stats->buckets[rec::bucket_of(ns)], t.weight);
    // Each call while the program marks steps: its calls are few a step, and the work between
    // them is what straggler reports compare (every gap of a step, not a sample).
    if (const bool stepping = t.last_mark->load(std::memory_order_relaxed) != 0; t.sampled || stepping) {
      t.every = stepping || ns >= rec::kTimedNs ? 1u : static_cast<std::uint32_t>(rec::kSampleEvery);
      t.countdown = t.every;
    }
    // The next call closes the gap: the countdown is 1 for it, and goes on from `resume` after.
    t.last_end_ns = end;
    thread_last_end_ns() = end;
    t.resume = t.countdown;
    t.countdown = 1;
  }

  // The call's entry in the trace, from the slot just written, dated now.
  [[gnu::noinline]] void trace_enter(Mark& mark, const common::recorder::Slot& slot, std::uint64_t bytes) noexcept {
    namespace rec = common::recorder;
    std::uint64_t n = 0;
    if (owned_) {
      n = trace_->next.load(std::memory_order_relaxed);
      trace_->next.store(n + 1, std::memory_order_relaxed);
    } else {
      n = trace_->next.fetch_add(1, std::memory_order_relaxed);
    }
    auto& e = trace_->entries[n % rec::kTraceEntries];
    if (!hold_entry(e, n + 1)) return;  // another thread's, for now: this call goes untraced
    std::atomic_thread_fence(std::memory_order_release);
    e.end_ns.store(0, std::memory_order_relaxed);
    e.state.store(static_cast<std::uint8_t>(rec::State::entered), std::memory_order_relaxed);
    e.seq = slot.seq;
    e.bytes = bytes;
    e.epoch = slot.epoch;
    e.group = slot.group;
    e.root = slot.root;
    e.op = slot.op;
    e.kind = slot.kind;
    e.start_ns = clock_ns();
    e.number.store(n + 1, std::memory_order_release);
    mark.traced = &e;
    mark.trace_number = n + 1;
  }

  // Held as trace_enter holds it: an entry the shared ring has since given to another call
  // (8,192 calls during this one) is left alone.
  [[gnu::noinline]] static void trace_leave(const Mark& mark, bool ok) noexcept {
    namespace rec = common::recorder;
    auto& e = *mark.traced;
    auto held = mark.trace_number;
    if (!e.number.compare_exchange_strong(held, held | rec::kTraceBusy, std::memory_order_acquire)) return;
    std::atomic_thread_fence(std::memory_order_release);
    e.state.store(static_cast<std::uint8_t>(ok ? rec::State::completed : rec::State::failed), std::memory_order_relaxed);
    e.end_ns.store(clock_ns(), std::memory_order_relaxed);
    e.number.store(mark.trace_number, std::memory_order_release);
  }

  // Marks `e` busy for call `number`: with a plain store in an owned ring (one writer), else by
  // a compare-exchange from a value no writer holds. False where another writer holds it.
  bool hold_entry(common::recorder::TraceEntry& e, std::uint64_t number) noexcept {
    namespace rec = common::recorder;
    if (owned_) {
      e.number.store(number | rec::kTraceBusy, std::memory_order_relaxed);
      return true;
    }
    auto seen = e.number.load(std::memory_order_relaxed);
    return (seen & rec::kTraceBusy) == 0 &&
           e.number.compare_exchange_strong(seen, number | rec::kTraceBusy, std::memory_order_acquire);
  }

  // A slot of the shared ring, claimed for writing (its version made odd), and its number `n`;
  // nullptr when none could be had. It passes over slots other threads are writing and slots
  // whose call is still open: a flood of other calls must not push out the one a rank waits
  // in. When every slot is an open call, the oldest claimed goes.
  common::recorder::Slot* claim_shared(std::uint64_t& n, std::uint32_t& v) noexcept {
    namespace rec = common::recorder;
    for (std::uint32_t tries = 0; tries <= rec::kSlots; ++tries) {
      n = ring_->next.fetch_add(1, std::memory_order_relaxed);
      auto& slot = ring_->slots[n % rec::kSlots];
      v = slot.version.load(std::memory_order_relaxed);
      if ((v & 1) != 0) continue;
      if (tries < rec::kSlots &&
          slot.state.load(std::memory_order_relaxed) == static_cast<std::uint8_t>(rec::State::entered))
        continue;
      if (slot.version.compare_exchange_strong(v, v | 1, std::memory_order_relaxed)) return &slot;
    }
    return nullptr;
  }

  RecorderRing(common::recorder::Segment* segment, common::recorder::Ring* ring, std::uint32_t life, bool owned,
               std::uint8_t backend)
      : segment_(segment), ring_(ring),
        stats_(segment->count_calls.load(std::memory_order_relaxed) != 0 ? &segment->stats[ring - segment->rings] : nullptr),
        trace_(segment->traced.load(std::memory_order_relaxed) != 0
                   ? &common::recorder::trace_area(segment)->rings[ring - segment->rings]
                   : nullptr),
        extras_(stats_ != nullptr || trace_ != nullptr),
        counts_(segment->count_calls.load(std::memory_order_relaxed) == common::recorder::kCountCalls),
        timing_{.work = stats_ != nullptr ? &stats_->work : nullptr, .last_mark = &segment->steps.last_mark_ns},
        life_(life << 16),
        backend_(backend % common::recorder::kStatBackends), owned_(owned) {}

  common::recorder::Segment* segment_ = nullptr;
  common::recorder::Ring* ring_ = nullptr;
  common::recorder::GroupEntry* entry_ = nullptr;  // a group's in the shared ring: its latest call kept there
  common::recorder::RingStats* stats_ = nullptr;   // the ring's counters; null: the rank keeps no metrics
  common::recorder::TraceRing* trace_ = nullptr;   // the ring's trace; null: no --trace
  bool extras_ = false;  // stats_ or trace_: one test on the path of a call with neither
  bool counts_ = false;  // every call counted by op and bytes (--metrics), not only a sample timed
  Timing timing_;
  std::uint32_t life_ = 0;  // this process's number in the segment, as Slot::epoch's high bits
  std::uint8_t backend_ = 0;  // stat_backend()
  bool owned_ = false;
};

}  // namespace idist::detail

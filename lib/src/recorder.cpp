#include "recorder.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <thread>

#include "idist/common/flight_recorder.hpp"
#include "idist/env_contract.hpp"

namespace idist::detail {
namespace {

namespace rec = common::recorder;

// Memory of our own where idist-run gave us none (a rank started by hand, by mpirun, by srun).
rec::Segment private_segment;

// This process's number among those that recorded in the segment (see Slot::epoch).
std::uint32_t life = 0;

// idist-run's memfd when it gave us one (mapped shared, so it reads what we write), else
// memory of our own: the recording costs the same either way.
rec::Segment* map_segment() {
  if (const char* text = std::getenv(std::string(env::kRecorderFd).c_str())) {
    char* end = nullptr;
    const long fd = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && fd >= 0) {
      // The whole memfd: under --trace it holds the trace's area after the Segment.
      struct stat st {};
      const auto size = ::fstat(static_cast<int>(fd), &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
      void* p = size >= sizeof(rec::Segment)
                    ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(fd), 0)
                    : MAP_FAILED;
      if (p != MAP_FAILED) {
        auto* segment = static_cast<rec::Segment*>(p);
        if (segment->magic == rec::kMagic) {
          if (size < rec::traced_size()) segment->traced.store(0, std::memory_order_relaxed);  // no area to write in
          segment->rank = -1;
          segment->pid = static_cast<std::int32_t>(::getpid());
          // An earlier process's heartbeat (killed, or ended without finalize) is not ours.
          segment->beat_pid.store(0, std::memory_order_relaxed);
          segment->admits_pid.store(0, std::memory_order_relaxed);
          segment->beat_ns.store(0, std::memory_order_release);
          segment->steps.last_mark_ns.store(0, std::memory_order_relaxed);  // an earlier program's last step
          life = segment->lives.fetch_add(1, std::memory_order_relaxed) + 1;
          segment->life_pids[life % rec::kLives].store(std::uint64_t{life} << 32 | static_cast<std::uint32_t>(::getpid()),
                                                      std::memory_order_release);
          // idist-run's stall report takes our stack with a gdb it starts: where Yama allows
          // ptrace only of descendants, a rank may name its tracer (and the tracer's
          // descendants). No effect elsewhere.
          // idist-run, which need not be our parent (a rank's script may run us as its child).
          const pid_t tracer = segment->tracer > 0 ? segment->tracer : ::getppid();
          ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(tracer), 0, 0, 0);
          return segment;
        }
        ::munmap(p, size);
      }
    }
  }
  new (&private_segment) rec::Segment();  // in a forked child: not the parent's calls
  private_segment.pid = static_cast<std::int32_t>(::getpid());
  life = 1;
  return &private_segment;
}

// IDIST_FLIGHT_RECORDER=0: nothing recorded (to measure what recording costs). A bad value
// fails init() (read_contract); here, before or without init, it leaves the recorder on.
bool enabled() {
  const char* v = std::getenv(std::string(env::kFlightRecorder).c_str());
  try {
    return v == nullptr || env::parse_flag(env::kFlightRecorder, v);
  } catch (const std::exception&) {
    return true;
  }
}

// The process's recorder, looked for on first use: null when it is off. A child that
// idist::spawn forks runs a rank of its own, with its own IDIST_RECORDER_FD, so a fork makes the
// child look again (and a lock held by another thread of the parent means nothing in the child:
// hence a flag it can clear, not a mutex).
std::atomic<bool> looked{false};
std::atomic_flag looking = ATOMIC_FLAG_INIT;
rec::Segment* found = nullptr;  // written before `looked` is set

void look_again_in_child() {
  found = nullptr;
  life = 0;
  looked.store(false, std::memory_order_relaxed);
  looking.clear(std::memory_order_relaxed);
}

rec::Segment* segment() {
  if (looked.load(std::memory_order_acquire)) return found;
  while (looking.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  if (!looked.load(std::memory_order_relaxed)) {
    static const bool registered = ::pthread_atfork(nullptr, nullptr, look_again_in_child) == 0;
    (void)registered;
    found = enabled() ? map_segment() : nullptr;
    looked.store(true, std::memory_order_release);
  }
  looking.clear(std::memory_order_release);
  return found;
}

}  // namespace

common::recorder::Segment* launcher_segment() {
  auto* s = segment();
  return s == &private_segment ? nullptr : s;
}

std::uint8_t stat_backend(std::string_view name) {
  const auto* at = std::find(std::begin(env::kBackendNames), std::end(env::kBackendNames), name);
  return static_cast<std::uint8_t>(std::min<std::size_t>(at - std::begin(env::kBackendNames), rec::kStatBackends - 1));
}

// A ring just taken by a group (an owned ring holds only its collectives; point-to-point calls
// go to the shared ring): every slot emptied, as the last owner's calls are no calls of this
// group, and given the group's epoch, number and kind, which its calls then need not store (a
// store is a share of an 8-byte call: BENCHMARKS.md, item 18). The last owner's calls are gone
// at once rather than one by one, so a mismatch among them that idist-run's half-second reads
// had not seen yet is not reported at the job's end: that check was and stays best effort.
void RecorderRing::label_slots(rec::Ring& ring, std::uint32_t epoch, std::int32_t group) noexcept {
  for (auto& slot : ring.slots) {
    const auto v = slot.version.load(std::memory_order_relaxed);
    slot.version.store(v | 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot.state.store(static_cast<std::uint8_t>(rec::State::empty), std::memory_order_relaxed);
    slot.kind = static_cast<std::uint8_t>(rec::Kind::collective);
    slot.epoch = epoch;
    slot.group = group;
    slot.version.store((v | 1) + 1, std::memory_order_release);
  }
}

RecorderRing RecorderRing::own(std::uint32_t epoch, std::int32_t group, std::uint8_t backend) {
  auto* s = segment();
  if (s == nullptr) return {};
  auto& entry = s->groups[static_cast<std::uint32_t>(group + 1) % rec::kGroups];
  write_entry(entry, life << 16 | (epoch & 0xffff), group, false, rec::Op::none, 0, 0);
  const auto me = static_cast<std::int32_t>(::getpid());
  for (std::uint32_t i = 1; i < rec::kRings; ++i) {
    auto owner = s->rings[i].owner.load(std::memory_order_relaxed);
    // A ring left owned by a program of this rank that has ended without finalize() (the rank
    // runs programs in turn) is free again.
    if (owner != 0 && (owner == me || ::kill(owner, 0) == 0 || errno != ESRCH)) continue;
    if (s->rings[i].owner.compare_exchange_strong(owner, me, std::memory_order_acquire)) {
      label_slots(s->rings[i], life << 16 | (epoch & 0xffff), group);
      return {s, &s->rings[i], life, true, backend};
    }
  }
  RecorderRing shared{s, &s->rings[0], life, false, backend};
  shared.entry_ = &entry;
  return shared;
}

RecorderRing RecorderRing::shared(std::uint8_t backend) {
  auto* s = segment();
  if (s == nullptr) return {};
  return {s, &s->rings[0], life, false, backend};
}

// Atomic adds: two auto_models' backwards may mark steps at once, and a step is no hot path.
void record_step() noexcept {
  auto* s = launcher_segment();
  if (s == nullptr) return;
  const bool counting = s->count_calls.load(std::memory_order_relaxed) != 0;
  const bool traced = s->traced.load(std::memory_order_relaxed) != 0;
  if (!counting && !traced) return;
  const auto now = rec::precise_ns();
  if (traced) {  // --trace: the mark, dated (trace_area.hpp)
    auto& steps = rec::trace_area(s)->steps;
    const auto n = steps.next.fetch_add(1, std::memory_order_relaxed);
    auto& mark = steps.marks[n % rec::kTraceSteps];
    mark.number.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    mark.at_ns.store(now, std::memory_order_relaxed);
    mark.number.store(n + 1, std::memory_order_release);
  }
  if (!counting) return;
  auto& st = s->steps;
  const auto last = st.last_mark_ns.exchange(now, std::memory_order_relaxed);
  if (last != 0 && now > last) {
    st.step_ns.fetch_add(static_cast<std::uint64_t>(now - last), std::memory_order_relaxed);
    st.last_step_ns.store(now - last, std::memory_order_relaxed);
    std::uint64_t work = 0;
    for (const auto& ring : s->stats) work += ring.work.gap_ns.load(std::memory_order_relaxed);
    st.version.fetch_add(1, std::memory_order_acq_rel);  // odd: steps and work_ns change together
    st.work_ns.store(work, std::memory_order_relaxed);
    st.steps.fetch_add(1, std::memory_order_relaxed);
    st.version.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace idist::detail

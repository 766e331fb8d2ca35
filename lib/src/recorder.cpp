#include "recorder.hpp"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "idist/common/flight_recorder.hpp"
#include "idist/env_contract.hpp"

namespace idist::detail {
namespace {

namespace rec = common::recorder;

// idist-run's memfd when it gave us one (mapped shared, so it reads what we write), else
// memory of our own: the recording costs the same either way.
rec::Segment* map_segment() {
  if (const char* text = std::getenv(std::string(env::kRecorderFd).c_str())) {
    char* end = nullptr;
    const long fd = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && fd >= 0) {
      void* p = ::mmap(nullptr, sizeof(rec::Segment), PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(fd), 0);
      if (p != MAP_FAILED) {
        auto* segment = static_cast<rec::Segment*>(p);
        if (segment->magic == rec::kMagic) {
          segment->rank = -1;
          segment->pid = static_cast<std::int32_t>(::getpid());
          // idist-run's stall report takes our stack with a gdb it starts: where Yama allows
          // ptrace only of descendants, a rank may name its tracer (and the tracer's
          // descendants). No effect elsewhere.
          ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(::getppid()), 0, 0, 0);
          return segment;
        }
        ::munmap(p, sizeof(rec::Segment));
      }
    }
  }
  static rec::Segment own;
  own.pid = static_cast<std::int32_t>(::getpid());
  return &own;
}

rec::Segment& segment() {
  static rec::Segment* s = map_segment();
  return *s;
}

// IDIST_FLIGHT_RECORDER=0: nothing recorded (to measure what recording costs). A bad value
// fails init() (read_contract); here, before or without init, it leaves the recorder on.
bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv(std::string(env::kFlightRecorder).c_str());
    try {
      return v == nullptr || env::parse_flag(env::kFlightRecorder, v);
    } catch (const std::exception&) {
      return true;
    }
  }();
  return on;
}

}  // namespace

Recorder::Mark Recorder::enter(std::uint32_t epoch, std::int32_t group, std::uint64_t seq, std::string_view op, DType dtype,
                               std::uint64_t count, std::int32_t root, rec::Kind kind) noexcept {
  if (!enabled()) return 0;
  auto& s = segment();
  const auto mark = s.next.fetch_add(1, std::memory_order_relaxed);
  auto& slot = s.slots[mark % rec::kSlots];
  const auto v = slot.version.load(std::memory_order_relaxed);
  slot.version.store(v | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.state.store(static_cast<std::uint8_t>(rec::State::entered), std::memory_order_relaxed);
  slot.dtype = static_cast<std::uint8_t>(dtype);
  slot.kind = static_cast<std::uint8_t>(kind);
  const auto n = std::min(op.size(), sizeof(slot.op) - 1);
  std::memcpy(slot.op, op.data(), n);
  slot.op[n] = '\0';
  slot.epoch = epoch;
  slot.group = group;
  slot.root = root;
  slot.seq = seq;
  slot.count = count;
  slot.version.store((v | 1) + 1, std::memory_order_release);
  return mark;
}

void Recorder::leave(Mark mark, bool ok) noexcept {
  if (!enabled()) return;
  auto& s = segment();
  if (s.next.load(std::memory_order_relaxed) - mark > rec::kSlots) return;  // written over since
  auto& slot = s.slots[mark % rec::kSlots];
  // No clock read here: the next call's entry dates this one's end closely enough for a stall
  // report, and a clock read is a tenth of a shared-memory all_reduce of 8 bytes.
  slot.state.store(static_cast<std::uint8_t>(ok ? rec::State::completed : rec::State::failed), std::memory_order_release);
}

Recorder& recorder() {
  static Recorder r;
  return r;
}

}  // namespace idist::detail

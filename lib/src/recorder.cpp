#include "recorder.hpp"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
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
  static rec::Segment private_segment;
  private_segment.pid = static_cast<std::int32_t>(::getpid());
  return &private_segment;
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

RecorderRing RecorderRing::own() {
  if (!enabled()) return {};
  auto& s = segment();
  for (std::uint32_t i = 1; i < rec::kRings; ++i) {
    std::uint32_t free = 0;
    if (s.rings[i].owned.compare_exchange_strong(free, 1, std::memory_order_acquire)) return {&s, &s.rings[i], true};
  }
  return {&s, &s.rings[0], false};
}

RecorderRing RecorderRing::shared() {
  if (!enabled()) return {};
  auto& s = segment();
  return {&s, &s.rings[0], false};
}

}  // namespace idist::detail

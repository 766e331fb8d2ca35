#pragma once
// The trace's memory (`idist-run --trace FILE`, issue 47): each call's start and end, which the
// rings (flight_recorder.hpp) do not keep, for a timeline of the job. Only under --trace: the
// rank's memfd then holds this area after its Segment (at trace_offset()), Segment::traced is
// 1, and every call reads the clock twice (about 50 ns). Without it a call costs what the
// recorder costs.
//
// Entries are numbered densely per ring (TraceRing::next: plain stores in an owned ring, an
// atomic add in the shared one), so idist-run, reading every few ms, knows each call it has not
// yet taken and each it lost to a ring that went round faster than it read (it says how many).

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "idist/common/flight_recorder.hpp"

namespace idist::common::recorder {

inline constexpr std::uint32_t kTraceEntries = 8192;  // per ring: 4 ms of 8-byte all_reduces, seconds of training
static_assert((kTraceEntries & (kTraceEntries - 1)) == 0, "a power of two");

// TraceEntry::number with this bit: a writer holds the entry (its call being entered or
// ended); a reader retries. In the shared ring writers take it with a compare-exchange, so
// that a call ending after 8,192 others began never writes into the entry of a newer one.
inline constexpr std::uint64_t kTraceBusy = std::uint64_t{1} << 63;

struct alignas(64) TraceEntry {
  // The entry's number + 1 while it is whole; with kTraceBusy while a writer holds it (a
  // reader copies the entry, then checks the number again); 0: never written.
  std::atomic<std::uint64_t> number{0};
  std::int64_t start_ns = 0;             // CLOCK_MONOTONIC, as idist-run's clock on this host
  std::atomic<std::int64_t> end_ns{0};   // 0 while the call is open
  std::uint64_t seq = 0;                 // as Slot::seq
  std::uint64_t bytes = 0;               // what this rank passes
  std::uint32_t epoch = 0;               // as Slot::epoch
  std::int32_t group = -1;
  std::int32_t root = -1;                // the root, or a point-to-point call's peer
  std::uint8_t op = 0;                   // an Op
  std::uint8_t kind = 0;                 // a Kind
  std::atomic<std::uint8_t> state{0};    // a State, set before end_ns
};
static_assert(sizeof(TraceEntry) == 64);

struct alignas(64) TraceRing {
  std::atomic<std::uint64_t> next{0};  // entries claimed so far
  TraceEntry entries[kTraceEntries];
};

// The program's steps (idist::mark_step(); auto_model marks each backward), each dated: the
// trace shows them as marks on the rank's track. Written by whichever thread marks.
inline constexpr std::uint32_t kTraceSteps = 1024;
struct TraceStep {
  std::atomic<std::uint64_t> number{0};  // the mark's number + 1 once `at_ns` is written; 0 while it is
  std::atomic<std::int64_t> at_ns{0};     // CLOCK_MONOTONIC
};
struct alignas(64) TraceSteps {
  std::atomic<std::uint64_t> next{0};
  TraceStep marks[kTraceSteps];
};

struct TraceArea {
  TraceRing rings[kRings];
  TraceSteps steps;
};

// Where the area starts in the memfd: after the Segment, page-aligned.
constexpr std::size_t trace_offset() { return (sizeof(Segment) + 4095) / 4096 * 4096; }
constexpr std::size_t traced_size() { return trace_offset() + sizeof(TraceArea); }

inline TraceArea* trace_area(Segment* s) {
  return reinterpret_cast<TraceArea*>(reinterpret_cast<char*>(s) + trace_offset());
}
inline const TraceArea* trace_area(const Segment* s) {
  return reinterpret_cast<const TraceArea*>(reinterpret_cast<const char*>(s) + trace_offset());
}

}  // namespace idist::common::recorder

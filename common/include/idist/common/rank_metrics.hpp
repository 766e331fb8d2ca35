#pragma once
// A rank's metrics (issue 47), in its flight recorder's memory (flight_recorder.hpp): what
// `idist-run --metrics` serves. The rank counts, idist-run reads whenever it is scraped. Only
// under --metrics (Segment::count_calls): otherwise a call costs what the recorder alone does.
//
// The budget is the recorder's: on an 8-byte shared-memory all_reduce (about 0.2 us) the
// recorder and the metrics together may cost 2%, a few ns, and a clock read costs 23 ns here.
// So a call counts itself with two plain adds, and is timed only where timing costs under
// 0.5% of it: every call of an op whose last timed call took 10 us or more (a training's
// calls, or anything of 64 KiB and more), else one in kSampleEvery, which then counts
// kSampleEvery times in the histogram and the seconds. The figures are exact where calls are
// long, and estimates from thousands of samples a second where they are short.
//
// Counters live per ring (each ring has one writer at a time, see Ring::owner; ring 0 adds
// with atomics), so that two threads never add to the same counter with plain stores, and a
// counter never goes backwards (Prometheus would read that as a restart).

#include <atomic>
#include <cstdint>

namespace idist::common::recorder {

inline constexpr std::uint32_t kOps = 13;          // Op's values, none included
inline constexpr std::uint32_t kStatBackends = 4;  // env::kBackendNames ("gloo", "nccl", "mpi"), then any other
inline constexpr std::uint64_t kTimedBytes = 64 * 1024;
inline constexpr std::int64_t kTimedNs = 10'000;
inline constexpr std::uint64_t kSampleEvery = 256;  // a power of two
// The histogram's upper bounds in ns (Prometheus' `le`), a decade each from 1 us; the last
// bucket is +Inf.
inline constexpr std::uint32_t kBuckets = 9;
inline constexpr std::int64_t kBucketBoundNs[kBuckets - 1] = {1'000,       10'000,        100'000,       1'000'000,
                                                             10'000'000,  100'000'000,   1'000'000'000, 10'000'000'000};

constexpr std::uint32_t bucket_of(std::int64_t ns) {
  std::uint32_t b = 0;
  while (b + 1 < kBuckets && ns > kBucketBoundNs[b]) ++b;
  return b;
}

// The rank's own work: the time from the end of one call to the start of the next, measured
// where both were timed.
struct alignas(64) WorkStats {
  std::atomic<std::uint64_t> gaps{0};
  std::atomic<std::uint64_t> gap_ns{0};
};

// One op on one backend, in one ring. Counts of timed calls are weighted (see above).
struct alignas(64) OpStats {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> bytes{0};  // this rank's: what it passes (a gather's root, what it receives)
  std::atomic<std::uint64_t> ns{0};     // the calls' time, weighted
  std::atomic<std::uint64_t> buckets[kBuckets] = {};  // weighted timed calls by time, not cumulative
  // 1 or kSampleEvery: how often a call is timed (and the weight of one that is), from the
  // last timed call's time. Starts at 1: an op's first call is timed.
  std::atomic<std::uint32_t> every{1};
};

// One ring's counters: each op on each backend, and the rank's own work between its calls.
struct RingStats {
  OpStats ops[kStatBackends][kOps];
  WorkStats work;
};

// The program's steps (idist::mark_step(); auto_model's backward marks them), written by the
// thread that marks them.
struct alignas(64) StepStats {
  std::atomic<std::uint64_t> steps{0};
  std::atomic<std::uint64_t> step_ns{0};  // summed over every step after the first mark
  std::atomic<std::int64_t> last_mark_ns{0};
  std::atomic<std::int64_t> last_step_ns{0};  // the latest step's time
};

}  // namespace idist::common::recorder

#pragma once
// A rank's metrics (issue 47), in its flight recorder's memory (flight_recorder.hpp): what
// `idist-run --metrics` serves. The rank counts, idist-run reads whenever it is scraped. Every
// call is counted by op and bytes only under --metrics (Segment::count_calls, kCountCalls);
// straggler reports alone (kTimeWork, the default) time the sample below and nothing more.
//
// The budget is the recorder's: on an 8-byte shared-memory all_reduce (about 0.2 us) the
// recorder and the metrics together may cost 2%, a few ns, and a clock read costs 23 ns here.
// So a call counts itself with two plain adds and a decrement, and is timed only where timing
// costs under 0.5% of it: each call of 64 KiB and more, and of the smaller ones each while the
// last sampled one took 10 us or more (a training's calls, a wait for a straggler) or the
// program marks steps (a few calls a step; their gaps are its work), else one in kSampleEvery, which then counts kSampleEvery times in the histogram and the seconds. The
// figures are exact where calls are long, and estimates from thousands of samples a second
// where they are short. Groups beyond the rings of their own (ring 0) and point-to-point calls,
// which threads make at once, are counted and not timed.
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

// The rank's own work: the time from the end of a timed call to the start of the ring's next.
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
};

// One ring's counters: each op on each backend, and the rank's own work between its calls.
struct RingStats {
  OpStats ops[kStatBackends][kOps];
  WorkStats work;
};

// The program's steps (idist::mark_step(); auto_model's backward marks them), written by the
// thread that marks them.
struct alignas(64) StepStats {
  std::atomic<std::uint64_t> steps{0};    // timed: from each mark to the next, within one program
  std::atomic<std::uint64_t> step_ns{0};  // their time
  std::atomic<std::int64_t> last_mark_ns{0};
  std::atomic<std::int64_t> last_step_ns{0};  // the latest step's time
  // The rank's work (WorkStats::gap_ns over its rings) at its last mark: read with `steps`, a
  // reader compares whole steps, whatever part of one the rank is in.
  std::atomic<std::uint64_t> work_ns{0};
  std::atomic<std::uint64_t> version{0};  // odd while a mark writes steps and work_ns
};

}  // namespace idist::common::recorder

#pragma once
// The flight recorder's memory, as a rank writes it and its idist-run reads it: the last
// kSlots collectives and point-to-point calls the rank entered, each with its group, its number
// in that group, what it was (op, dtype, count, root or peer) and whether it has ended. idist-run makes one per rank
// (a memfd, IDIST_RECORDER_FD in the rank) and reads it while the rank runs, is frozen or
// spins: no call into the rank, no file anywhere. Like the env contract, a format both halves
// agree on; plain data and atomics, no code of either half.

#include <time.h>

#include <atomic>
#include <cstdint>

namespace idist::common::recorder {

inline constexpr std::uint64_t kMagic = 0x3152434552445349ull;  // "IDSRECR1"
inline constexpr std::uint32_t kSlots = 64;

enum class State : std::uint8_t { empty = 0, entered = 1, completed = 2, failed = 3 };
// A point-to-point call has no number shared by the group: its slot's `seq` is its tag,
// `root` its peer (a group rank) and `count` its bytes.
enum class Kind : std::uint8_t { collective = 0, p2p = 1 };

struct Slot {
  // Even when the slot is whole; odd while the rank writes it (a reader copies and retries).
  std::atomic<std::uint32_t> version{0};
  std::atomic<std::uint8_t> state{0};  // State
  std::uint8_t dtype = 0;              // idist::DType
  char op[17] = {};                    // "all_reduce", NUL-terminated
  std::uint8_t kind = 0;               // Kind
  std::uint32_t epoch = 0;             // which init() of the process (numbers restart with each)
  std::int32_t group = -1;             // -1: the world; else new_group's number
  std::int32_t root = -1;
  std::uint64_t seq = 0;               // the collective's number in its group, as on every member
  std::uint64_t count = 0;
  // No time: a clock read costs a tenth of an 8-byte shared-memory all_reduce. The reader dates
  // calls itself, by when it first saw the segment's `next` at its present value.
};

struct Segment {
  std::uint64_t magic = kMagic;
  std::int32_t rank = -1;
  std::int32_t pid = 0;
  std::atomic<std::uint64_t> next{0};  // slots written so far; the newest is (next - 1) % kSlots
  Slot slots[kSlots];
};

// The reader's clock: coarse (a few ms) and cheap, which is all a stall needs.
inline std::int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace idist::common::recorder

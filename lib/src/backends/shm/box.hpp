#pragma once
// The boxes of the shm backend's tiny all_reduces (shm_backend.cpp, at its top): each rank's
// few cache lines that carry the step beside their bytes.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace idist::detail::shm {

// One cache line of a box: bytes, then the step they are for, stored last (release). A reader
// that sees the step in every line of a box has all its bytes: the lines travel at once,
// not one after another as they would behind a single flag.
struct alignas(64) BoxLine {
  unsigned char bytes[56];
  std::atomic<std::uint64_t> step;
};
static_assert(sizeof(BoxLine) == 64, "a box line is one cache line");
constexpr std::size_t kBoxLines = 5;
constexpr std::size_t kBoxNoteBytes = 16;  // CallNote::Words, first in line 0
// 264: 8 B to 256 B all_reduce, where the halves' two transfers showed (docs/BENCHMARKS.md;
// with 3 lines, 256 B took 0.19 us against Open MPI's 0.17, with 5 0.165-0.185 against 0.180-0.201).
constexpr std::size_t kBoxBytes = kBoxLines * sizeof(BoxLine::bytes) - kBoxNoteBytes;

// How many lines a box of `bytes` (after the note) takes.
inline std::size_t box_lines(std::size_t bytes) {
  return (kBoxNoteBytes + bytes + sizeof(BoxLine::bytes) - 1) / sizeof(BoxLine::bytes);
}

// Copies `bytes` between a flat buffer and box b's lines, after the note.
inline void box_bytes(BoxLine* b, char* flat, std::size_t bytes, bool into_box) {
  std::size_t at = kBoxNoteBytes, done = 0;
  for (std::size_t i = 0; done < bytes; ++i, at = 0) {
    const auto n = std::min(bytes - done, sizeof(BoxLine::bytes) - at);
    if (into_box)
      std::memcpy(b[i].bytes + at, flat + done, n);
    else
      std::memcpy(flat + done, b[i].bytes + at, n);
    done += n;
  }
}

}  // namespace idist::detail::shm

#pragma once
// Scratch space kept between calls and grown to the largest asked for, the one way the
// backends keep it: a fresh buffer costs its page faults on every call (glibc maps blocks over
// 32 MiB afresh each time), and a fresh 256 MiB copy took 130 ms more than a copy into memory
// already mapped, next to about 300 ms for the all_reduce itself (gloo). A group's collectives
// run one at a time, so a backend's buffer serves them all.

#include <cstddef>
#include <vector>

namespace idist::detail {

// `buffer`'s memory, at least `bytes` of it; what it held is not kept (no copy on growing).
inline char* grown_scratch(std::vector<char>& buffer, std::size_t bytes) {
  if (buffer.size() < bytes) {
    buffer.clear();
    buffer.shrink_to_fit();
    buffer.resize(bytes);
  }
  return buffer.data();
}

}  // namespace idist::detail

#pragma once
// A call as the shm backend's step notes carry it (shm_backend.cpp): two words beside each
// arrival, equal on every member for the same call, so that a wait compares the calls before
// it reads anything a peer wrote, and a mismatch names both calls.

#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "idist/types.hpp"

namespace idist::detail::shm {

enum class Op : std::uint8_t { barrier, broadcast, all_gather, gather, all_gather_v, scatter, all_reduce, reduce, reduce_scatter };
inline constexpr const char* kOpNames[] = {"barrier", "broadcast",  "all_gather", "gather",        "all_gather_v",
                                    "scatter", "all_reduce", "reduce",     "reduce_scatter"};

// A call as its step notes carry it: two words (Word::note), equal on every member for the
// same call.
struct CallNote {
  Op op = Op::barrier;
  std::uint64_t bytes = 0;  // the call's size argument: per rank, or all of all_gather_v
  int root = -1;
  int dtype = -1;  // reductions only
  int reduce_op = -1;
  std::uint64_t number = 0;  // the member's calls on this group so far (its low 24 bits)

  using Words = std::array<std::uint64_t, 2>;
  Words words() const {
    return {bytes, static_cast<std::uint64_t>(op) | static_cast<std::uint64_t>(static_cast<std::uint8_t>(dtype)) << 8 |
                       static_cast<std::uint64_t>(static_cast<std::uint8_t>(reduce_op)) << 16 |
                       static_cast<std::uint64_t>(static_cast<std::uint16_t>(root)) << 24 |
                       (number & 0xffffff) << 40};
  }
  static CallNote from(const Words& w) {
    CallNote c;
    c.bytes = w[0];
    c.op = static_cast<Op>(w[1] & 0xff);
    c.dtype = static_cast<std::int8_t>((w[1] >> 8) & 0xff);
    c.reduce_op = static_cast<std::int8_t>((w[1] >> 16) & 0xff);
    c.root = static_cast<std::int16_t>((w[1] >> 24) & 0xffff);
    c.number = w[1] >> 40;
    return c;
  }
  // "all_reduce (float32 SUM, 8 bytes)", and " as its call #5" with `numbered`; `shown_root`:
  // the root as the user knows it.
  std::string text(int shown_root, bool numbered) const {
    const auto o = static_cast<std::size_t>(op);
    std::string out = o < std::size(kOpNames) ? kOpNames[o] : "an unknown call";
    std::vector<std::string> parts;
    if (dtype >= 0)
      parts.push_back(std::string(to_string(static_cast<DType>(dtype))) + " " +
                      std::string(to_string(static_cast<ReduceOp>(reduce_op))));
    if (op != Op::barrier) parts.push_back(std::to_string(bytes) + " bytes");
    if (root >= 0) parts.push_back("root " + std::to_string(shown_root));
    if (!parts.empty()) {
      out += " (";
      for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
      out += ")";
    }
    return numbered ? out + " as its call #" + std::to_string(number) + " here" : out;
  }
};

}  // namespace idist::detail::shm

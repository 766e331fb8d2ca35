#pragma once
// The ucx backend's collectives, built on its transport (comm.hpp) from non-blocking sends and
// receives: UCX has no collectives of its own (UCC would, but is not packaged here). One file
// per family, as Gloo keeps one per algorithm:
//   ring.cpp    reduce-scatter and all-gather over a ring, in pipelined segments (large
//               all_reduce, reduce_scatter)
//   tree.cpp    recursive doubling (small all_reduce), binomial trees (reduce, broadcast), the
//               dissemination barrier
//   direct.cpp  every block straight to where it goes (all_gather, gather, scatter)

#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "backends/ucx/comm.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail::ucx {

// One collective call's transfers: the group's transport, the call's tag, its deadline, and its
// name for errors. A receive's tag is the sender's (from()).
struct Call {
  Comm& comm;
  std::uint64_t tag;
  Clock::time_point deadline;
  std::string_view what;

  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  Op send(const void* data, std::size_t bytes, int peer) const { return comm.send(data, bytes, peer, tag); }
  Op recv(void* data, std::size_t bytes, int peer) const { return comm.recv(data, bytes, peer, from(tag, peer)); }
  void wait(std::span<Op> ops) const { comm.wait(ops, deadline, what); }
  void wait(Op& op) const { comm.wait({&op, 1}, deadline, what); }
};

// Block i of n over `count` elements: offsets and lengths, in elements.
struct Blocks {
  std::size_t count;
  int n;
  std::size_t offset(int i) const {
    const auto base = count / static_cast<std::size_t>(n), extra = count % static_cast<std::size_t>(n);
    const auto u = static_cast<std::size_t>(i);
    return u * base + std::min(u, extra);
  }
  std::size_t length(int i) const {
    return count / static_cast<std::size_t>(n) + (static_cast<std::size_t>(i) < count % static_cast<std::size_t>(n) ? 1 : 0);
  }
};

// --- ring.cpp ---
// Ring reduce-scatter over n blocks: at step s this rank sends block (me - s + shift) to the
// right and reduces block (me - s - 1 + shift) from the left into its own, segment by
// segment, each reduced segment going on to the right at once (the pipeline). It ends
// holding block (me + 1 + shift) reduced over every rank. `tmp`: scratch kept between calls.
void ring_reduce_scatter(const Call& call, char* data, Blocks blocks, DType dtype, ReduceFn fn, int shift,
                         std::vector<char>& tmp);
// The all-gather half: this rank starts with block (me + 1 + shift) and forwards each
// block's segments as they arrive.
void ring_all_gather(const Call& call, char* data, Blocks blocks, DType dtype, int shift);

// --- tree.cpp ---
// Recursive doubling (reduce/recursive_doubling.hpp) over `count` elements of `data`.
void recursive_doubling(const Call& call, char* data, std::size_t count, DType dtype, ReduceFn fn,
                        std::vector<char>& tmp);
// Binomial tree towards the root; a non-root rank reduces into `acc`, so its buffer stays.
void binomial_reduce(const Call& call, void* data, std::size_t count, DType dtype, ReduceFn fn, int root,
                     std::vector<char>& acc, std::vector<char>& tmp);
// Binomial tree from src.
void binomial_broadcast(const Call& call, void* data, std::size_t bytes, int src);
// Dissemination: ceil(log2 n) rounds of empty messages.
void dissemination_barrier(const Call& call);

// --- direct.cpp ---
// Every block straight to every peer (all_gather, all_gather_v): as many bytes leave each rank
// as on a ring, in one round instead of n-1.
void exchange(const Call& call, const void* in, void* out, std::span<const std::size_t> sizes);
void direct_gather(const Call& call, const void* in, void* out, std::size_t bytes_per_rank, int root);
void direct_scatter(const Call& call, const void* in, void* out, std::size_t bytes_per_rank, int root);

}  // namespace idist::detail::ucx

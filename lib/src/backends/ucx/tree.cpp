// The tree-shaped collectives (algorithms.hpp): recursive doubling, binomial reduce and
// broadcast, the dissemination barrier.

#include <cstring>

#include "backends/ucx/algorithms.hpp"
#include "common/scratch.hpp"
#include "reduce/recursive_doubling.hpp"

namespace idist::detail::ucx {

void recursive_doubling(const Call& call, char* data, std::size_t count, DType dtype, ReduceFn fn,
                        std::vector<char>& scratch) {
  const auto bytes = count * dtype_size(dtype);
  char* tmp = grown_scratch(scratch, bytes);
  detail::recursive_doubling(
      call.rank(), call.size(), data, tmp, count, fn,
      [&](int peer, const char* from_here) {
        Op s = call.send(from_here, bytes, peer);
        call.wait(s);
      },
      [&](int peer, char* into) {
        Op r = call.recv(into, bytes, peer);
        call.wait(r);
      },
      [&](int peer, const char* from_here, char* into) {
        Op ops[] = {call.recv(into, bytes, peer), call.send(from_here, bytes, peer)};
        call.wait(ops);
      });
}

void binomial_reduce(const Call& call, void* data, std::size_t count, DType dtype, ReduceFn fn, int root,
                     std::vector<char>& acc_scratch, std::vector<char>& tmp_scratch) {
  const auto bytes = count * dtype_size(dtype);
  const int n = call.size(), me = call.rank();
  char* acc = static_cast<char*>(data);
  if (me != root) {
    acc = grown_scratch(acc_scratch, bytes);
    std::memcpy(acc, data, bytes);
  }
  char* tmp = grown_scratch(tmp_scratch, bytes);
  const int v = (me - root + n) % n;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      Op s = call.send(acc, bytes, (v - mask + root) % n);
      call.wait(s);
      break;
    }
    if (v + mask < n) {
      Op r = call.recv(tmp, bytes, (v + mask + root) % n);
      call.wait(r);
      fn(acc, acc, tmp, count);
    }
  }
}

void binomial_broadcast(const Call& call, void* data, std::size_t bytes, int src) {
  const int n = call.size();
  const int v = (call.rank() - src + n) % n;
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if (v & mask) {
      Op r = call.recv(data, bytes, (v - mask + src) % n);
      call.wait(r);
      break;
    }
  }
  std::vector<Op> ops;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) ops.push_back(call.send(data, bytes, (v + mask + src) % n));
  call.wait(ops);
}

void dissemination_barrier(const Call& call) {
  const int n = call.size(), me = call.rank();
  for (int k = 1; k < n; k <<= 1) {
    Op ops[] = {call.recv(nullptr, 0, (me - k + n) % n), call.send(nullptr, 0, (me + k) % n)};
    call.wait(ops);
  }
}

}  // namespace idist::detail::ucx

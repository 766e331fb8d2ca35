#pragma once
// Recursive doubling, the schedule of a small all_reduce: log2(p) exchanges of whole messages,
// where p is the largest power of two in the group; ranks past p first fold into a partner
// (Rabenseifner's small-message half) and get the result back at the end. Each pair reduces
// the lower rank's data first, so every rank computes the same tree and gets the same bits.
// The transport is the caller's (the ucx and mpi backends), given as three calls that post a
// transfer and wait for it:
//   send(peer, bytes)          sends `bytes` to peer
//   recv(peer, into)           receives peer's message into `into`
//   exchange(peer, bytes, into) both at once

#include <cstddef>

#include "reduce/kernels.hpp"

namespace idist::detail {

template <class Send, class Recv, class Exchange>
void recursive_doubling(int me, int n, char* data, char* tmp, std::size_t count, ReduceFn fn, Send&& send, Recv&& recv,
                        Exchange&& exchange) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  int v = me - rem;  // this rank's place among the p, or -1 where it folded
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      send(me + 1, data);
      v = -1;
    } else {
      recv(me - 1, tmp);
      fn(data, tmp, data, count);
      v = me / 2;
    }
  }
  if (v >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      const int pv = v ^ mask;
      const int peer = pv < rem ? pv * 2 + 1 : pv + rem;
      exchange(peer, data, tmp);
      if (pv < v) fn(data, tmp, data, count);
      else fn(data, data, tmp, count);
    }
  }
  if (me < 2 * rem) {
    if (me % 2 == 1) send(me - 1, data);
    else recv(me + 1, data);
  }
}

}  // namespace idist::detail

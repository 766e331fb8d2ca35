// The ring halves (algorithms.hpp): reduce-scatter and all-gather, each block in segments
// forwarded as soon as they are ready.

#include <algorithm>

#include "backends/ucx/algorithms.hpp"
#include "common/scratch.hpp"

namespace idist::detail::ucx {
namespace {

// A ring step's block travels in segments of this size, each forwarded as soon as it is
// reduced, so that reducing one segment overlaps receiving the next.
constexpr std::size_t kSegment = 1024 * 1024;

}  // namespace

void ring_reduce_scatter(const Call& call, char* data, Blocks blocks, DType dtype, ReduceFn fn, int shift,
                         std::vector<char>& scratch) {
  const int n = call.size(), me = call.rank();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  const auto es = dtype_size(dtype);
  const auto seg_elems = std::max<std::size_t>(1, kSegment / es);
  const auto block_at = [&](int s) { return ((me - s + shift) % n + n) % n; };
  char* tmp = grown_scratch(scratch, blocks.length(0) * es);
  std::vector<Op> sends;
  const auto send_block = [&](int b) {
    for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
      sends.push_back(
          call.send(data + (blocks.offset(b) + off) * es, std::min(seg_elems, blocks.length(b) - off) * es, right));
  };
  send_block(block_at(0));
  std::vector<Op> recvs;
  for (int s = 0; s + 1 < n; ++s) {
    const int b = block_at(s + 1);
    recvs.clear();
    for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
      recvs.push_back(call.recv(tmp + off * es, std::min(seg_elems, blocks.length(b) - off) * es, left));
    std::size_t off = 0;
    for (auto& r : recvs) {
      call.wait(r);
      const auto len = std::min(seg_elems, blocks.length(b) - off);
      char* at = data + (blocks.offset(b) + off) * es;
      fn(at, tmp + off * es, at, len);
      if (s + 2 < n) sends.push_back(call.send(at, len * es, right));
      off += seg_elems;
    }
  }
  call.wait(sends);
}

void ring_all_gather(const Call& call, char* data, Blocks blocks, DType dtype, int shift) {
  const int n = call.size(), me = call.rank();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  const auto es = dtype_size(dtype);
  const auto seg_elems = std::max<std::size_t>(1, kSegment / es);
  const int own = ((me + 1 + shift) % n + n) % n;
  std::vector<Op> sends;
  for (std::size_t off = 0; off < blocks.length(own); off += seg_elems)
    sends.push_back(
        call.send(data + (blocks.offset(own) + off) * es, std::min(seg_elems, blocks.length(own) - off) * es, right));
  std::vector<Op> recvs;
  for (int s = 0; s + 1 < n; ++s) {
    const int b = ((own - s - 1) % n + n) % n;
    recvs.clear();
    for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
      recvs.push_back(
          call.recv(data + (blocks.offset(b) + off) * es, std::min(seg_elems, blocks.length(b) - off) * es, left));
    std::size_t off = 0;
    for (auto& r : recvs) {
      call.wait(r);
      const auto len = std::min(seg_elems, blocks.length(b) - off);
      if (s + 2 < n) sends.push_back(call.send(data + (blocks.offset(b) + off) * es, len * es, right));
      off += seg_elems;
    }
  }
  call.wait(sends);
}

}  // namespace idist::detail::ucx

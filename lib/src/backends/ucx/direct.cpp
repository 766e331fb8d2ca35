// The direct collectives (algorithms.hpp): every block straight to where it goes.

#include <cstring>

#include "backends/ucx/algorithms.hpp"

namespace idist::detail::ucx {

void exchange(const Call& call, const void* in, void* out, std::span<const std::size_t> sizes) {
  const int n = call.size(), me = call.rank();
  std::vector<std::size_t> offsets(static_cast<std::size_t>(n), 0);
  for (int r = 1; r < n; ++r)
    offsets[static_cast<std::size_t>(r)] = offsets[static_cast<std::size_t>(r - 1)] + sizes[static_cast<std::size_t>(r - 1)];
  const auto mine = sizes[static_cast<std::size_t>(me)];
  auto* bytes = static_cast<char*>(out);
  std::vector<Op> ops;
  for (int k = 1; k < n; ++k) {
    const int r = (me - k + n) % n;  // from the nearest on the left first, as a ring would
    if (sizes[static_cast<std::size_t>(r)] > 0)
      ops.push_back(call.recv(bytes + offsets[static_cast<std::size_t>(r)], sizes[static_cast<std::size_t>(r)], r));
  }
  for (int k = 1; k < n && mine > 0; ++k) ops.push_back(call.send(in, mine, (me + k) % n));
  if (mine > 0) std::memmove(bytes + offsets[static_cast<std::size_t>(me)], in, mine);
  call.wait(ops);
}

void direct_gather(const Call& call, const void* in, void* out, std::size_t bytes_per_rank, int root) {
  std::vector<Op> ops;
  if (call.rank() == root) {
    for (int r = 0; r < call.size(); ++r)
      if (r != root)
        ops.push_back(call.recv(static_cast<char*>(out) + bytes_per_rank * static_cast<std::size_t>(r), bytes_per_rank, r));
    std::memmove(static_cast<char*>(out) + bytes_per_rank * static_cast<std::size_t>(root), in, bytes_per_rank);
  } else {
    ops.push_back(call.send(in, bytes_per_rank, root));
  }
  call.wait(ops);
}

void direct_scatter(const Call& call, const void* in, void* out, std::size_t bytes_per_rank, int root) {
  std::vector<Op> ops;
  if (call.rank() == root) {
    for (int r = 0; r < call.size(); ++r)
      if (r != root)
        ops.push_back(
            call.send(static_cast<const char*>(in) + bytes_per_rank * static_cast<std::size_t>(r), bytes_per_rank, r));
    std::memmove(out, static_cast<const char*>(in) + bytes_per_rank * static_cast<std::size_t>(root), bytes_per_rank);
  } else {
    ops.push_back(call.recv(out, bytes_per_rank, root));
  }
  call.wait(ops);
}

}  // namespace idist::detail::ucx

// A program written for GPU nodes (it asks for nccl), smoke-tested on a CPU-only CI runner:
//
//   idist-run -n 2 --backend gloo ./smoke
//
// IDIST_BACKEND (from --backend) overrides the program's choice with a one-line notice, and
// every collective the program uses runs over gloo with host buffers and is checked against
// its closed form. On a GPU node the same binary, run without --backend, uses nccl.
#include <idist/idist.hpp>

#include <cstdio>
#include <numeric>

#include "print.hpp"

int main() try {
  idist::init({.backend = "nccl"});
  const int r = idist::get_rank();
  const int n = idist::get_world_size();
  int wrong = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "rank %d: %s is wrong\n", r, what), ++wrong;
  };

  std::vector<float> grads(1000, static_cast<float>(r + 1));
  idist::all_reduce(grads);
  expect(grads.front() == static_cast<float>(n * (n + 1) / 2) && grads.back() == grads.front(), "all_reduce");

  std::vector<std::int64_t> total = {r};
  idist::reduce(total, {.dst = 0});
  if (r == 0) expect(total[0] == n * (n - 1) / 2, "reduce");

  const auto ranks = idist::all_gather(r);
  std::vector<int> want(static_cast<std::size_t>(n));
  std::iota(want.begin(), want.end(), 0);
  expect(ranks == want, "all_gather");

  const auto gathered = idist::gather(r * 10, {.dst = n - 1});
  if (r == n - 1) expect(gathered.size() == static_cast<std::size_t>(n) && gathered.back() == r * 10, "gather");

  std::vector<int> parts(static_cast<std::size_t>(n));
  std::iota(parts.begin(), parts.end(), 100);
  std::vector<int> mine(1);
  idist::scatter(parts, mine, {.src = 0});
  expect(mine[0] == 100 + r, "scatter");

  std::vector<double> weights(8, r == 0 ? 0.5 : -1.0);
  idist::broadcast(weights, {.src = 0});
  expect(weights[7] == 0.5, "broadcast");

  std::vector<float> blocks(static_cast<std::size_t>(n) * 2, 1.0f);
  const auto block = idist::reduce_scatter(blocks);
  expect(block.size() == 2 && block[0] == static_cast<float>(n), "reduce_scatter");

  if (n > 1) {  // a ring of send/recv, as pipeline stages do
    std::vector<int> token = {r};
    if (r % 2 == 0) {
      idist::send(token, (r + 1) % n);
      idist::recv(token, (r + n - 1) % n);
    } else {
      std::vector<int> got(1);
      idist::recv(got, (r + n - 1) % n);
      idist::send(token, (r + 1) % n);
      token = got;
    }
    expect(token[0] == (r + n - 1) % n, "send/recv");
  }
  idist::barrier();

  examples::say("smoke: rank " + std::to_string(r) + "/" + std::to_string(n) + " on " + idist::backend() + ": " +
                (wrong == 0 ? "every collective right" : std::to_string(wrong) + " wrong"));
  idist::finalize();
  return wrong == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

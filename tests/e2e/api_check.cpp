// Exercises the public, typed API on whatever world idist-run (or nothing) gives it, and
// checks every result against closed-form values. Exit 0 and one summary line per rank.
#include <idist/idist.hpp>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>

namespace {

int failures = 0;
int checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: FAILED %s\n", idist::get_rank(), what.c_str());
  }
}

}  // namespace

int main() try {
  idist::init();
  const int r = idist::get_rank();
  const int n = idist::get_world_size();
  const char* ws = std::getenv("WORLD_SIZE");
  expect(n == (ws ? std::atoi(ws) : 1), "world size matches WORLD_SIZE");
  expect(idist::get_nproc_per_node() * idist::get_nnodes() == n, "nproc_per_node * nnodes");
  expect(idist::backend() == "gloo", "backend");

  // all_reduce on vectors, spans and scalars, every op.
  std::vector<std::int32_t> v = {r, r + 1, 2};
  idist::all_reduce(v);
  expect(v == std::vector<std::int32_t>{n * (n - 1) / 2, n * (n + 1) / 2, 2 * n}, "all_reduce SUM");
  std::vector<double> d = {static_cast<double>(r), -static_cast<double>(r)};
  idist::all_reduce(std::span<double>(d), idist::ReduceOp::MAX);
  expect(d == std::vector<double>{n - 1.0, 0.0}, "all_reduce MAX");
  expect(idist::all_reduce(std::int64_t{r + 1}, idist::ReduceOp::PRODUCT) ==
             [&] { std::int64_t f = 1; for (int i = 1; i <= n; ++i) f *= i; return f; }(),
         "all_reduce PRODUCT scalar");
  expect(idist::all_reduce(static_cast<float>(r), idist::ReduceOp::MIN) == 0.0f, "all_reduce MIN scalar");

  // all_gather: scalars, buffers of different sizes (rank 1 sends none), strings.
  const auto scalars = idist::all_gather(2.0 * r);
  expect(scalars.size() == static_cast<std::size_t>(n), "all_gather scalar size");
  for (int i = 0; i < n && i < static_cast<int>(scalars.size()); ++i) expect(scalars[static_cast<std::size_t>(i)] == 2.0 * i, "all_gather scalar value");
  std::vector<std::int64_t> mine(r == 1 ? 0 : static_cast<std::size_t>(r + 1), r);
  std::vector<std::int64_t> want;
  for (int i = 0; i < n; ++i)
    if (i != 1) want.insert(want.end(), static_cast<std::size_t>(i + 1), i);
  expect(idist::all_gather(mine) == want, "all_gather unequal sizes");
  const auto names = idist::all_gather("rank-" + std::to_string(r));
  for (int i = 0; i < n; ++i) expect(names.at(static_cast<std::size_t>(i)) == "rank-" + std::to_string(i), "all_gather string");

  // all_gather into a buffer of the caller's: equal lengths, no lengths exchanged first.
  const std::vector<std::int32_t> block = {r, 10 * r};
  std::vector<std::int32_t> gathered(2 * static_cast<std::size_t>(n), -1);
  idist::all_gather(std::span<const std::int32_t>(block), std::span<std::int32_t>(gathered));
  std::vector<std::int32_t> blocks;
  for (int i = 0; i < n; ++i) {
    blocks.push_back(i);
    blocks.push_back(10 * i);
  }
  expect(gathered == blocks, "all_gather into a buffer");
  // A bad argument is an idist::Error with the site prefix, raised before anything is sent on
  // every rank alike, and the world stays usable.
  std::string refusal;
  try {
    std::vector<std::int32_t> small(1);
    idist::all_gather(std::span<const std::int32_t>(block), std::span<std::int32_t>(small));
  } catch (const idist::Error& e) {
    refusal = e.what();
  }
  expect(refusal.rfind("[idist rank " + std::to_string(r) + "/" + std::to_string(n) + "] all_gather(gloo): output holds 1 ",
                       0) == 0,
         "all_gather into a buffer of the wrong size is refused with idist::Error: " + refusal);
  expect(idist::all_reduce(std::int32_t{1}) == n, "all_reduce after the refusal");

  // broadcast from the last rank: buffer, scalar, string.
  const int src = n - 1;
  std::vector<float> b(4, static_cast<float>(r));
  idist::broadcast(b, src);
  expect(b == std::vector<float>(4, static_cast<float>(src)), "broadcast buffer");
  expect(idist::broadcast(static_cast<std::int8_t>(r), src) == src, "broadcast scalar");
  expect(idist::broadcast(std::string(static_cast<std::size_t>(r), 'x'), src) == std::string(static_cast<std::size_t>(src), 'x'),
         "broadcast string");

  idist::barrier();
  idist::finalize();

  // init() again after finalize(), in quick succession: every rank must reach rank 0's new
  // store, never its dying old one (which used to reset the hello now and then).
  for (int round = 1; round <= 10; ++round) {
    idist::init();
    std::vector<int> one = {1};
    idist::all_reduce(one);
    expect(one[0] == n, "all_reduce after init number " + std::to_string(round + 1));
    idist::finalize();
  }
  std::printf("api_check rank %d/%d: %d checks, %d failed\n", r, n, checks, failures);
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

// The smallest real user of an installed libidist: an all_reduce checked against its closed
// form, and one of ignite's helpers, so both public headers are exercised.
#include <idist/helpers.hpp>
#include <idist/idist.hpp>

#include <cstdio>

int main() try {
  idist::init();
  const int n = idist::get_world_size();
  std::vector<std::int64_t> v = {idist::get_rank(), 1};
  idist::all_reduce(v);
  const bool ok = v[0] == n * (n - 1) / 2 && v[1] == n;
  idist::one_rank_only([&] { std::printf("consumer: %d ranks, all_reduce %s\n", n, ok ? "right" : "WRONG"); });
  idist::finalize();
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

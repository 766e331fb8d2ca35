// What the launch-cost comparison starts under idist-run: initialise, one barrier, exit. Its
// wall time through `idist-run -n N` is the price of starting a job of N ranks.
#include <idist/idist.hpp>

#include <cstdio>

int main() try {
  idist::init();
  idist::barrier();
  idist::finalize();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

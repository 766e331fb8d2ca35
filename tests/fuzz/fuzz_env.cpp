// libFuzzer entry for idist::fuzz::env (tests/fuzz/targets.hpp); built and run by run.sh.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  idist::fuzz::env({reinterpret_cast<const char*>(data), size});
  return 0;
}

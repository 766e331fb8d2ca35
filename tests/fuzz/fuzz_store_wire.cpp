// libFuzzer entry for idist::fuzz::store_wire (tests/fuzz/targets.hpp); built and run by run.sh.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  idist::fuzz::store_wire({reinterpret_cast<const char*>(data), size});
  return 0;
}

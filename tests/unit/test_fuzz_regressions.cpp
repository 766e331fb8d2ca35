// Replays the fuzz targets' seed corpus and every input that once found a bug
// (tests/fuzz/regressions/<target>/) through the same target code, built with g++: the bugs
// stay fixed even where clang and libFuzzer are missing.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "targets.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kFuzzDir = IDIST_FUZZ_DIR;

int replay(const std::string& target, const std::function<void(std::string_view)>& run) {
  int inputs = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const auto dir = kFuzzDir / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes(std::istreambuf_iterator<char>(in), {});
      INFO("input: " << entry.path().string());
      CHECK_NOTHROW(run(bytes));
      ++inputs;
    }
  }
  return inputs;
}

}  // namespace

TEST_CASE("store_wire: seeds and regressions") { CHECK(replay("store_wire", idist::fuzz::store_wire) > 0); }
TEST_CASE("hostlist: seeds and regressions") { CHECK(replay("hostlist", idist::fuzz::hostlist) > 0); }
TEST_CASE("env: seeds and regressions") { CHECK(replay("env", idist::fuzz::env) > 0); }

TEST_CASE("the add overflow the store_wire target catches is refused, not undefined") {
  // regressions/store_wire/add_overflow: a counter at INT64_MAX plus 1 was signed overflow.
  std::vector<char> slot = {'9', '2', '2', '3', '3', '7', '2', '0', '3', '6', '8', '5', '4', '7', '7', '5', '8', '0', '7'};
  CHECK_THROWS_AS(idist::detail::add_to_counter(slot, 1), std::out_of_range);
  CHECK(idist::detail::add_to_counter(slot, -7) == 9223372036854775800);
}

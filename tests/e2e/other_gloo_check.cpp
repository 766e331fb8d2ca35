// init() with the gloo backend in a process where another copy of gloo comes first (see
// other_gloo.cpp): it must refuse in one line naming that copy, not mix the two gloos. Exits 0
// when it refused as it should.
#include <idist/idist.hpp>

#include <cstdio>
#include <string>

int main() {
  try {
    idist::init({.backend = "gloo"});
  } catch (const idist::Error& e) {
    const std::string text = e.what();
    std::printf("%s\n", e.what());
    const bool right = text.find("another copy of gloo") != std::string::npos && text.find("other_gloo") != std::string::npos &&
                       text.find('\n') == std::string::npos;
    return right ? 0 : 1;
  }
  std::printf("other_gloo_check: init() did not refuse\n");
  idist::finalize();
  return 1;
}

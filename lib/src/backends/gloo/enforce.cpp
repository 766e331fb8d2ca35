#include "backends/gloo/enforce.hpp"

#include <gloo/common/logging.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

namespace idist::detail::gloo_enforce {
namespace {

std::atomic<const char*> current{nullptr};
std::atomic<int> rank{-1};
std::atomic<int> world{0};
std::terminate_handler previous = nullptr;

// "...op.preamble.length <= op.nbytes. 20 vs 16" -> {"20", "16"}; empty when not that enforce.
std::pair<std::string, std::string> sizes_of(const std::string& text) {
  const auto at = text.find("op.preamble.length <= op.nbytes");
  if (at == std::string::npos) return {};
  const auto vs = text.find(" vs ", at);
  if (vs == std::string::npos) return {"?", "?"};
  auto begin = text.rfind(' ', vs - 1);
  begin = begin == std::string::npos ? 0 : begin + 1;
  auto end = text.find_first_not_of("0123456789", vs + 4);
  return {text.substr(begin, vs - begin), text.substr(vs + 4, end == std::string::npos ? end : end - vs - 4)};
}

[[noreturn]] void on_terminate() {
  if (const auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const ::gloo::EnforceNotMet& x) {
      const auto [sent, holds] = sizes_of(x.what());
      if (!sent.empty()) {
        const char* op = current.load(std::memory_order_relaxed);
        op = op != nullptr ? op : "a collective";
        std::fprintf(stderr,
                     "[idist rank %d/%d] %s(gloo): a peer sent %s bytes where this rank's call holds %s: the ranks "
                     "called %s with different sizes (IDIST_DEBUG=1 makes every rank name both calls)\n",
                     rank.load(), world.load(), op, sent.c_str(), holds.c_str(), op);
        std::fflush(stderr);
        std::abort();
      }
    } catch (...) {
      // Not ours to name.
    }
  }
  if (previous != nullptr) previous();
  std::abort();
}

}  // namespace

void install(int r, int w) {
  rank.store(r);
  world.store(w);
  static std::once_flag once;
  std::call_once(once, [] { previous = std::set_terminate(on_terminate); });
}

void calling(const char* op) noexcept { current.store(op, std::memory_order_relaxed); }

}  // namespace idist::detail::gloo_enforce

#pragma once
// Threads as ranks: N ProcessGroups in one process, bootstrapped from a shared in-memory
// store, over the backend IDIST_TEST_BACKEND names: gloo (real TCP connections on loopback,
// the default) or shm (a real shared segment; every rank on one host). ctest runs the
// collective and point-to-point tests once per backend (tests/CMakeLists.txt). Errors name
// "gloo" either way, as they do when the runtime puts shm under gloo. Assertions from rank
// threads are collected and reported on the test thread (doctest's checks are not thread-safe).

#include <doctest/doctest.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "backend.hpp"
#include "process_group.hpp"
#include "store/memory_store.hpp"

namespace test {

class Failures {
 public:
  void add(int rank, const std::string& what) {
    std::lock_guard lock(mu_);
    if (list_.size() < 20) list_.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  const std::vector<std::string>& list() const { return list_; }

 private:
  std::mutex mu_;
  std::vector<std::string> list_;
};

// The backend under test: IDIST_TEST_BACKEND, gloo when unset.
inline std::string backend_under_test() {
  const char* name = std::getenv("IDIST_TEST_BACKEND");
  return name != nullptr && *name != '\0' ? name : "gloo";
}

// Runs body(group, failures) on `size` threads, one rank each.
template <class Body>
void run_ranks(int size, Body body, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  idist::detail::MemoryStore store(timeout);
  idist::env::Contract contract;
  contract.master_addr = "127.0.0.1";
  contract.master_port = 1;  // only used to find the loopback route
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = idist::detail::make_backend(
            backend_under_test(), idist::detail::BackendInit{r, size, store, "test/", timeout, contract,
                                                             std::vector<int>(static_cast<std::size_t>(size), 0)});
        idist::detail::ProcessGroup group(
            std::move(backend),
            idist::detail::ProcessGroupOptions{.rank = r, .size = size, .site = idist::ErrorSite{r, size, "", "gloo"}});
        body(group, failures);
      } catch (const std::exception& e) {
        failures.add(r, std::string("threw: ") + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures.list()) FAIL_CHECK(f);
}

}  // namespace test

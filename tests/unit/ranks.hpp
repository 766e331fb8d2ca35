#pragma once
// Threads as ranks: N ProcessGroups in one process, bootstrapped from a shared in-memory
// store, over the backend IDIST_TEST_BACKEND names: gloo (real TCP connections on loopback,
// the default), shm (a real shared segment; every rank on one host) or hierarchical (both, on
// the fake hosts IDIST_TEST_HOSTS describes) or ucx (its plugin found through IDIST_PLUGIN_PATH;
// IDIST_INTERHOST chooses what carries one-rank-per-host groups, as for a job). ctest runs the
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

// Which host each of `size` ranks runs on, as IDIST_TEST_HOSTS says: "pairs" (0,0,1,1,...),
// "cyclic" (0,1,0,1,...: a host's ranks are not neighbours), "distinct" (0,1,2,...); all on
// host 0 when unset. Threads all share memory, so any map can be faked in one process.
inline std::vector<int> hosts_under_test(int size) {
  const char* how = std::getenv("IDIST_TEST_HOSTS");
  const std::string map = how != nullptr ? how : "";
  std::vector<int> hosts(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    if (map == "pairs") hosts[static_cast<std::size_t>(r)] = r / 2;
    if (map == "cyclic") hosts[static_cast<std::size_t>(r)] = r % 2;
    if (map == "distinct") hosts[static_cast<std::size_t>(r)] = r;
  }
  return hosts;
}

// Runs body(group, failures) on `size` threads, one rank each.
template <class Body>
void run_ranks(int size, Body body, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  idist::detail::MemoryStore store(timeout);
  idist::env::Contract contract;
  contract.master_addr = "127.0.0.1";
  contract.master_port = 1;  // only used to find the loopback route
  // The transport and thresholds the test's environment asks for (ctest's ENVIRONMENT).
  const auto given = idist::env::read_contract();
  contract.interhost = given.interhost;
  contract.tuning = given.tuning;
  // gloo by name is gloo as IDIST_INTRANODE=off has it (gloo, or ucx between hosts as
  // IDIST_INTERHOST says): shm and hierarchical are tested by their names.
  if (backend_under_test() == "gloo") contract.intranode = "off";
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = idist::detail::make_backend(
            backend_under_test(),
            idist::detail::BackendInit{r, size, store, "test/", timeout, contract, hosts_under_test(size)});
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

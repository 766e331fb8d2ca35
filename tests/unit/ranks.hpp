#pragma once
// Threads as ranks: N ProcessGroups in one process, bootstrapped from a shared in-memory
// store, over the backend a configuration names (configurations.hpp): gloo (real TCP
// connections on loopback), shm (a real shared segment; every rank on one host), hierarchical
// (both, on the configuration's fake hosts) or ucx. Errors name "gloo" either way, as they do
// when the runtime puts shm under gloo. Assertions from rank threads are collected and
// reported on the test thread (doctest's checks are not thread-safe).

#include <doctest/doctest.h>

#include <mutex>
#include <sstream>
#include <thread>

#include "backend.hpp"
#include "configurations.hpp"
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

// Runs body(group, failures) on `size` threads, one rank each, as `config` says.
template <class Body>
void run_ranks(const Config& config, int size, Body body, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  idist::detail::MemoryStore store(timeout);
  idist::env::Contract contract;
  contract.master_addr = "127.0.0.1";
  contract.master_port = 1;  // only used to find the loopback route
  contract.interhost = std::string(config.interhost);
  contract.tuning = config.tuning;
  // gloo by name is gloo as IDIST_INTRANODE=off has it (gloo, or ucx between hosts as
  // interhost says): shm and hierarchical are tested by their names.
  if (config.backend == "gloo") contract.intranode = "off";
  const auto hosts = hosts_of(config, size);
  Failures failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = idist::detail::make_backend(
            config.backend, idist::detail::BackendInit{r, size, store, "test/", timeout, contract, hosts});
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

#pragma once
// What init() builds: the contract it read, the store (served by rank 0), and the world group.
// The library's one piece of global mutable state is the default Runtime (runtime.cpp).

#include <chrono>
#include <memory>

#include "idist/env_contract.hpp"
#include "idist/idist.hpp"
#include "process_group.hpp"
#include "store/store.hpp"
#include "store/tcp_store_server.hpp"

namespace idist::detail {

class Runtime {
 public:
  // Joins the rendezvous and connects the world group; throws idist::Error (op "init").
  Runtime(const env::Contract& contract, const InitOptions& options);
  ~Runtime();

  const env::Contract& contract() const { return contract_; }
  ProcessGroup& world() { return *world_; }
  Store& store() { return *store_; }

  // Waits (bounded) until every rank has reached finalize, so rank 0 does not take the store
  // away from a rank that still needs it, then tears down.
  void finalize();

 private:
  // Every rank announces itself before the backend connects, so that ranks which never come
  // are named (with their node) rather than surfacing as the backend's anonymous timeout.
  void join(std::chrono::steady_clock::time_point deadline);

  env::Contract contract_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::unique_ptr<Store> store_;
  std::unique_ptr<ProcessGroup> world_;
};

// The default runtime; throws idist::Error naming `op` when init() has not run.
Runtime& runtime(std::string_view op);
// nullptr before init().
Runtime* runtime_if_initialized();

}  // namespace idist::detail

#include "runtime.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>

#include "store/memory_store.hpp"
#include "store/tcp_store.hpp"

namespace idist::detail {
namespace {

// The library's single piece of global mutable state.
std::unique_ptr<Runtime>& default_runtime() {
  static std::unique_ptr<Runtime> instance;
  return instance;
}

constexpr const char* kWorldPrefix = "idist/world/";

std::string choose_backend(const env::Contract& contract, const InitOptions& options) {
  if (contract.backend.empty() || contract.backend == options.backend) return options.backend;
  // The launcher's choice wins so a GPU program can be smoke-tested on CPU; say so once.
  if (contract.rank == 0)
    std::cerr << "idist: IDIST_BACKEND=" << contract.backend << " overrides the backend '" << options.backend
              << "' the program asked for\n";
  return contract.backend;
}

// "node 1 (ranks 4-7)", "rank 5 (node 1)": the missing ranks, by node where the layout tells
// them (every node holding local_world_size ranks, as idist-run and torchrun place them).
std::string describe_missing(const std::vector<bool>& present, const env::Contract& c) {
  const int per_node = c.local_world_size;
  const bool by_node = static_cast<long long>(c.nnodes) * per_node == c.world_size && c.nnodes > 1;
  std::vector<std::string> items;
  int missing = 0;
  for (int r = 0; r < c.world_size; ++r) {
    if (present[static_cast<std::size_t>(r)]) continue;
    ++missing;
    if (!by_node) {
      items.push_back("rank " + std::to_string(r));
      continue;
    }
    const int node = r / per_node;
    const int first = node * per_node;
    const int last = first + per_node - 1;
    bool whole = true;
    for (int q = first; q <= last; ++q) whole = whole && !present[static_cast<std::size_t>(q)];
    if (!whole) {
      items.push_back("rank " + std::to_string(r) + " (node " + std::to_string(node) + ")");
    } else if (r == first) {
      items.push_back("node " + std::to_string(node) +
                      (per_node == 1 ? " (rank " + std::to_string(first) + ")"
                                     : " (ranks " + std::to_string(first) + "-" + std::to_string(last) + ")"));
    }
  }
  if (missing == 0) return "every rank has joined by now";
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < kShown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > kShown) out += " and " + std::to_string(items.size() - kShown) + " more";
  return out + " never joined";
}

}  // namespace

void Runtime::join() {
  const std::string prefix = std::string(kWorldPrefix) + "joined/";
  std::vector<std::string> keys;
  for (int r = 0; r < contract_.world_size; ++r) keys.push_back(prefix + std::to_string(r));
  store_->set(keys[static_cast<std::size_t>(contract_.rank)], {});
  try {
    store_->wait(keys, contract_.timeout);
  } catch (const TimeoutFailure& e) {
    const std::string waited = fmt::format("timed out after {:g}s waiting for all {} ranks to join: ",
                                           static_cast<double>(contract_.timeout.count()) / 1000, contract_.world_size);
    std::vector<bool> present;
    try {
      // The timed-out connection is closed; a fresh one asks who is there.
      TcpStore probe(TcpStoreOptions{contract_.master_addr, contract_.master_port, contract_.job_token,
                                     std::chrono::seconds(2)});
      present = probe.check(keys);
    } catch (const std::exception&) {
      throw TimeoutFailure(waited + e.what());
    }
    throw TimeoutFailure(waited + describe_missing(present, contract_) +
                         " (IDIST_TIMEOUT bounds the wait; check that every node started with the same --nnodes, "
                         "--master-addr and --master-port)");
  }
}

Runtime::Runtime(const env::Contract& contract, const InitOptions& options) : contract_(contract) {
  const std::string backend = choose_backend(contract_, options);
  ErrorSite site{contract_.rank, contract_.world_size, "init", backend};
  try {
    if (contract_.world_size == 1) {
      store_ = std::make_unique<MemoryStore>(contract_.timeout);
    } else {
      if (contract_.rank == 0)
        server_ = std::make_unique<TcpStoreServer>(
            StoreServerOptions{contract_.master_addr, contract_.master_port, contract_.job_token});
      store_ = std::make_unique<TcpStore>(
          TcpStoreOptions{contract_.master_addr, contract_.master_port, contract_.job_token, contract_.timeout});
      join();
    }
    auto impl = make_backend(backend, BackendInit{contract_.rank, contract_.world_size, *store_, kWorldPrefix,
                                                  contract_.timeout, contract_});
    world_ = std::make_unique<ProcessGroup>(contract_.rank, contract_.world_size, std::move(impl), site);
  } catch (const Error&) {
    throw;
  } catch (const TimeoutFailure& e) {
    throw TimeoutError(site, e.what());
  } catch (const std::exception& e) {
    throw Error(site, e.what());
  }
}

Runtime::~Runtime() {
  // Connections first, then the store client, then (rank 0) the server they came through.
  world_.reset();
  store_.reset();
  server_.reset();
}

void Runtime::finalize() {
  if (contract_.world_size == 1 || !store_) return;
  try {
    const std::string key = std::string(kWorldPrefix) + "finalized/";
    store_->set(key + std::to_string(contract_.rank), {});
    if (contract_.rank == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < contract_.world_size; ++r) keys.push_back(key + std::to_string(r));
      store_->wait(keys, contract_.timeout);
    }
  } catch (const std::exception& e) {
    // finalize() must not hang or throw at exit; a peer that never arrived is worth a warning.
    spdlog::warn("[idist rank {}/{}] finalize: not every rank arrived ({}); tearing down anyway", contract_.rank,
                 contract_.world_size, e.what());
  }
}

Runtime& runtime(std::string_view op) {
  auto& rt = default_runtime();
  if (!rt) throw Error(ErrorSite{-1, 0, std::string(op), ""}, "call idist::init() first");
  return *rt;
}

Runtime* runtime_if_initialized() { return default_runtime().get(); }

}  // namespace idist::detail

namespace idist {

void init(const InitOptions& options) {
  auto& rt = detail::default_runtime();
  if (rt) throw Error(rt->world().site("init"), "already initialized; call finalize() first");
  env::Contract contract;
  try {
    contract = env::read_contract();
  } catch (const env::ContractError& e) {
    throw Error(ErrorSite{-1, 0, "init", ""}, std::string("bad environment: ") + e.what());
  }
  rt = std::make_unique<detail::Runtime>(contract, options);
}

void finalize() {
  auto& rt = detail::default_runtime();
  if (!rt) return;
  rt->finalize();
  rt.reset();
}

bool is_initialized() { return detail::runtime_if_initialized() != nullptr; }

}  // namespace idist

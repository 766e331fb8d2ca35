#pragma once
// The one abstract backend. Implementations live one per folder under backends/ and see only
// type-erased buffers: (void*, count, DType, ReduceOp) or raw bytes. Argument checks, the
// world-of-one and empty-buffer shortcuts, and error wrapping happen once, above them, in
// ProcessGroup; a backend may assume count > 0 and world size > 1 for every call.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "idist/env_contract.hpp"
#include "idist/types.hpp"
#include "store/store.hpp"

namespace idist::detail {

struct BackendInit {
  int rank = 0;
  int size = 1;
  Store& store;              // bootstrap (and, for some backends, out-of-band exchange)
  std::string key_prefix;    // every group bootstraps under its own prefix
  std::chrono::milliseconds timeout;
  const env::Contract& contract;  // backend settings: GLOO_SOCKET_IFNAME, MASTER_ADDR
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // In place, element-wise over ranks.
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) = 0;
  // Every rank contributes `bytes_per_rank` bytes; out holds size * bytes_per_rank.
  virtual void all_gather(const void* in, void* out, std::size_t bytes_per_rank) = 0;
  // Rank r contributes bytes_per_rank[r] bytes (zero allowed); out holds their sum, in rank order.
  virtual void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) = 0;
  // In place: src's bytes overwrite everyone else's.
  virtual void broadcast(void* data, std::size_t bytes, int src) = 0;
  virtual void barrier() = 0;

  // Point-to-point. Posts the transfer now and returns its completion, which blocks until the
  // transfer is done (TimeoutFailure after the timeout) and may run on another thread. Between
  // two ranks, transfers with the same tag match in the order they were posted; the buffer
  // must stay valid until the completion has returned.
  using Completion = std::function<void()>;
  virtual Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) = 0;
  virtual Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) = 0;
};

// The backends built into this library, by name.
std::string_view built_in_backends();
// Creates the backend named `name` ("gloo", ...); throws std::runtime_error for a backend that
// is unknown or not built in, naming the ones that are.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init);

}  // namespace idist::detail

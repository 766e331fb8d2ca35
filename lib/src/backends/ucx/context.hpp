#pragma once
// UCX's context, one per process (made on first use, kept: UCX keeps state and threads past any
// point we could release it), and what the transport needs to know of this host: whether it
// has RDMA, and the address TCP lanes listen on.

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "idist/env_contract.hpp"

namespace idist::detail::ucx {

class Context {
 public:
  explicit Context(ucp_context_h handle) : handle_(handle) {}
  ucp_context_h handle() const { return handle_; }

 private:
  ucp_context_h handle_;
};

// The process's context, made on first use with the first contract's interface; null, with
// `why`, where UCX cannot start here. Never cleaned up.
std::shared_ptr<Context> shared_context(const env::Contract& contract, std::string& why);

// Whether this host has an RDMA device (InfiniBand, RoCE, iWARP: all under
// /sys/class/infiniband). Without one, UCX reaches other hosts over TCP alone.
bool rdma_present();

// The address a TCP lane listens on: that of the interface UCX was given (UCX_NET_DEVICES,
// where it names a network interface rather than an RDMA port), else of the one we give it;
// else the address towards MASTER_ADDR.
std::string lane_address(const env::Contract& contract);

}  // namespace idist::detail::ucx

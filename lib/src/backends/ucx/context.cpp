// UCX's context and what it is given of this host (context.hpp).

#include "backends/ucx/context.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>

#include "idist/common/addresses.hpp"

namespace idist::detail::ucx {
namespace {

// The interface other hosts reach us on, as gloo chooses it: GLOO_SOCKET_IFNAME, else the
// one towards MASTER_ADDR. UCX would otherwise offer every interface it finds, loopback
// included, and a peer in another network namespace (or behind another route) would try
// addresses it cannot reach. Empty: leave UCX's own choice (UCX_NET_DEVICES, or all).
std::string interface_towards(const env::Contract& contract) {
  if (!contract.gloo_socket_ifname.empty()) return contract.gloo_socket_ifname;
  common::AddressesTried tried;
  const auto address = common::local_address_towards(contract.master_addr, contract.master_port, tried);
  if (address.empty()) return {};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (auto* a = list; a != nullptr && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    char host[NI_MAXHOST];
    const socklen_t len = a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) == 0 && address == host)
      name = a->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

}  // namespace

bool rdma_present() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// The interface given is interface_towards's where UCX_NET_DEVICES names none.
std::string lane_address(const env::Contract& contract) {
  std::string device;
  if (const char* given = std::getenv("UCX_NET_DEVICES"); given != nullptr && std::string_view(given) != "all") {
    device = std::string(given).substr(0, std::string(given).find(','));
    if (device.find(':') != std::string::npos) device.clear();
  }
  if (device.empty()) device = interface_towards(contract);
  std::string address;
  ifaddrs* list = nullptr;
  if (!device.empty() && ::getifaddrs(&list) == 0) {
    for (auto* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || device != a->ifa_name) continue;
      const auto family = a->ifa_addr->sa_family;
      if (family != AF_INET && !(family == AF_INET6 && address.empty())) continue;
      char host[NI_MAXHOST];
      const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (::getnameinfo(a->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) == 0) address = host;
      if (family == AF_INET) break;  // IPv4 first, as the route towards the master would be
    }
    ::freeifaddrs(list);
  }
  if (!address.empty()) return address;
  common::AddressesTried tried;
  return common::local_address_towards(contract.master_addr, contract.master_port, tried);
}


std::shared_ptr<Context> shared_context(const env::Contract& contract, std::string& why) {
  static std::mutex mu;
  static std::shared_ptr<Context> context;
  static std::string failure;
  const std::lock_guard lock(mu);
  if (context || !failure.empty()) {
    why = failure;
    return context;
  }
  ucp_config_t* config = nullptr;
  if (const auto status = ::ucp_config_read(nullptr, nullptr, &config); status != UCS_OK) {
    failure = std::string("cannot read UCX's configuration: ") + ::ucs_status_string(status);
    why = failure;
    return nullptr;
  }
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    const auto device = interface_towards(contract);
    if (!device.empty()) ::ucp_config_modify(config, "NET_DEVICES", device.c_str());
  }
  // Over TCP alone, large messages go eagerly rather than by UCX's rendezvous: its handshake
  // (a request, then a grant) waits behind the data already queued on the link, which on a
  // shaped or busy one stalls every segment of the ring (1 Gbit/s: 70-81% of line rate from
  // 4 MiB, against 84-96% eager; docs/BENCHMARKS.md). With RDMA the rendezvous is UCX's
  // zero-copy path, and stays. UCX_RNDV_THRESH, set, is the user's.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && !rdma_present()) ::ucp_config_modify(config, "RNDV_THRESH", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;  // threads as ranks (tests), groups used from several threads
  ucp_context_h handle = nullptr;
  const auto status = ::ucp_init(&params, config, &handle);
  ::ucp_config_release(config);
  if (status != UCS_OK) {
    failure = std::string("ucp_init failed: ") + ::ucs_status_string(status);
    why = failure;
    return nullptr;
  }
  context = std::make_shared<Context>(handle);
  return context;
}

}  // namespace idist::detail::ucx

#pragma once
// The one loop over getaddrinfo's answers: the rendezvous store's client, Gloo's route
// lookup, the PMI client and idist-run's port reservation each try the addresses of
// host:port in order until one works.

#include <netdb.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace idist::common {

struct AddressesTried {
  bool ok = false;        // an attempt succeeded
  bool resolved = false;  // getaddrinfo answered; when false, `error` is its message
  std::string error;      // why not: the resolver's message, or the last attempt's reason
};

// Resolves host:service for `socktype` (SOCK_STREAM, SOCK_DGRAM; any family) and calls
// `attempt` on each answer in turn until one returns true. A failing attempt closes what it
// opened and may set `why`, which is kept as the error when no address works.
AddressesTried try_addresses(std::string_view host, std::string_view service, int socktype,
                             const std::function<bool(const addrinfo& address, std::string& why)>& attempt);

// The address, as text, of this host's interface that routes towards host:port: what peers
// can reach us at ("127.0.0.1" when host is loopback). A UDP connect sends nothing; it only
// asks the kernel for a route. Empty when there is none; `tried` says why.
std::string local_address_towards(std::string_view host, int port, AddressesTried& tried);

// Polls fd for `events` until `deadline` (EINTR retried): false when the deadline came first.
bool wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline);

// A TCP connection to one of try_addresses' answers, made without blocking past `deadline`:
// the socket (non-blocking, close-on-exec, TCP_NODELAY), or -1 with `why` (strerror's text;
// "Connection timed out" at the deadline).
int connect_within(const addrinfo& address, std::chrono::steady_clock::time_point deadline, std::string& why);

}  // namespace idist::common

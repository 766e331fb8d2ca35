#include "idist/launchers/spawn_plan.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

namespace idist::launchers {

PortReservation::PortReservation(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "0", &hints, &list); rc != 0)
    throw std::runtime_error("cannot resolve --master-addr '" + host + "': " + ::gai_strerror(rc));
  std::string error = "no address";
  for (auto* ai = list; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                               : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      fd_ = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (fd_ < 0) throw std::runtime_error("cannot reserve a port on '" + host + "': " + error);
}

PortReservation::~PortReservation() {
  if (fd_ >= 0) ::close(fd_);
}

std::string random_token(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const auto n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

LaunchPlan make_spawn_plan(const SpawnOptions& options) {
  LaunchPlan plan;
  plan.command = options.command;
  plan.local_count = options.nproc_per_node;
  auto& job = plan.job;
  job.world_size = options.nproc_per_node;
  job.local_world_size = options.nproc_per_node;
  job.nnodes = 1;
  job.node_rank = 0;
  job.master_addr = options.master_addr;
  if (options.master_port) {
    job.master_port = *options.master_port;
  } else {
    plan.port_reservation = std::make_shared<PortReservation>(options.master_addr);
    job.master_port = plan.port_reservation->port();
  }
  job.backend = options.backend;
  job.launcher = "spawn";
  job.run_id = random_token(6);
  job.job_token = random_token();
  job.restart_count = 0;
  return plan;
}

std::vector<std::string> rank_environment(const LaunchPlan& plan, int local_rank, char** base_environ) {
  env::Contract c = plan.job;
  c.local_rank = local_rank;
  c.rank = plan.first_rank + local_rank;

  std::map<std::string, std::string> vars;
  for (char** e = base_environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
  }
  // A value inherited from an outer job must not leak into ours.
  for (auto name : {env::kJobToken, env::kRunId, env::kLauncher})
    vars.erase(std::string(name));
  for (auto& [name, value] : env::to_variables(c)) vars[name] = value;
  // Ranks share the cores; without this every OpenMP runtime starts one thread per core.
  if (!vars.count(std::string(env::kOmpNumThreads))) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    vars[std::string(env::kOmpNumThreads)] = std::to_string(std::max(1u, cores / static_cast<unsigned>(plan.local_count)));
  }
  std::vector<std::string> out;
  out.reserve(vars.size());
  for (auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

}  // namespace idist::launchers

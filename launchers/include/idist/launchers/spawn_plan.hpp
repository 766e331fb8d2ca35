#pragma once
// Spawn mode: idist-run creates the job itself, starting --nproc-per-node local ranks.
// A LaunchPlan says who every local rank is and what environment it gets (the env contract).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::launchers {

struct SpawnOptions {
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;  // unset: a free port, reserved without a race
  std::string backend;             // empty: the program's own choice
  std::vector<std::string> command;  // program (already resolved to a path) and its arguments
};

// Holds a port so that nothing else on this host is handed it until rank 0 listens on it.
// The socket is bound with SO_REUSEADDR but never listens: the kernel skips it when it picks
// ephemeral ports, while rank 0 (also SO_REUSEADDR) may still bind and listen on it.
class PortReservation {
 public:
  // Reserves a free port on `host`; throws std::runtime_error when it cannot.
  explicit PortReservation(const std::string& host);
  ~PortReservation();
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct LaunchPlan {
  env::Contract job;  // job-wide values (job.launcher says where they came from); rank fields are per rank
  int first_rank = 0;
  int local_count = 1;
  std::vector<std::string> command;
  std::shared_ptr<PortReservation> port_reservation;  // kept for the job's lifetime
};

LaunchPlan make_spawn_plan(const SpawnOptions& options);

// The environment of one local rank: the launcher's own environment with the contract's
// variables set (and OMP_NUM_THREADS only when unset), as "NAME=value" strings.
std::vector<std::string> rank_environment(const LaunchPlan& plan, int local_rank, char** base_environ);

// A fresh secret for the store (128 bits from the OS's random source, hex).
std::string random_token(std::size_t bytes = 16);

}  // namespace idist::launchers

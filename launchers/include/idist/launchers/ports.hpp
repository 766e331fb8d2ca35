#pragma once
// Where rank 0's store listens: a port reserved on this host (spawn mode), or one that every
// rank of an outer launcher's job computes alike from the job's identity (SLURM, MPI).

#include <cstdint>
#include <string>
#include <string_view>

namespace idist::launchers {

// torch's default, for jobs that give nothing to derive a port from (as torchrun does).
inline constexpr int kDefaultMasterPort = 29500;

// Ports that derived master ports fall in. The default stays below Linux's ephemeral range
// (32768-60999) so that a derived port is not already some connection's local port.
struct PortRange {
  int first = 20000;
  int last = 32767;
};

// Parses "LO-HI" (1 <= LO <= HI <= 65535); throws std::invalid_argument naming `what`.
PortRange parse_port_range(std::string_view what, std::string_view text);

// A port in `range` that every rank derives alike from the job's identity. Steps of one job
// (same `job`, consecutive `step`) get consecutive ports, so they never collide with each
// other; different jobs are spread by a hash of `job`. (ignite and Lightning use 15000 + the
// last 4 digits of the job id: two steps of one job collide there.)
int derived_port(std::string_view job, std::uint64_t step, PortRange range);

// Holds a port so that nothing else on this host is handed it until rank 0 listens on it.
// The socket is bound with SO_REUSEADDR but never listens: the kernel skips it when it picks
// ephemeral ports, while rank 0 (also SO_REUSEADDR) may still bind and listen on it.
class PortReservation {
 public:
  // Reserves a free port on `host`; throws std::runtime_error when it cannot, UsageError when
  // `host` does not resolve. `named_by`: where `host` came from, for those errors
  // ("--rdzv-conf local_addr"): the user must recognise what they gave.
  explicit PortReservation(const std::string& host, std::string_view named_by = "--master-addr");
  ~PortReservation();
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace idist::launchers

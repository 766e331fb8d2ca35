#pragma once
// A PMI-1 client, just enough to learn what MPICH's Hydra (and Intel MPI's, which is Hydra)
// keeps in its PMI server rather than in the environment: the job's name (the kvsname, unique
// per job: "kvs_<mpiexec pid>_<pg>_<random>_<host>") and, with `mpiexec -pmi-port`, this
// process's rank and the world size.
//
// The wire protocol is text: one "cmd=NAME key=value ..." line per message, each answered by
// one line (Flux RFC 13; MPICH's src/pmi/simple is the reference client). Two ways in:
//   PMI_FD=N                    an inherited socket (Hydra's default mode); PMI_RANK/PMI_SIZE
//                               are in the environment too;
//   PMI_PORT=host:port PMI_ID=N a connection we open; `cmd=initack pmiid=N` comes first and
//                               the server answers with size, rank and debug.
// Measured with Debian's MPICH 4.0.2: once a process has sent any command on its PMI_FD,
// Hydra's proxy treats a close without `cmd=finalize` as a crash and SIGKILLs the job's other
// processes; after `cmd=finalize` it closes its end of PMI_FD. So the client always finalizes,
// and a program that speaks PMI itself (an MPICH program) cannot reuse PMI_FD after idist-run
// has asked it (see detect.cpp for how --master-port/--rdzv-id avoid asking). With PMI_PORT
// every connection is its own session, and the program may connect again after us.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace idist::launchers {

// Where this process's PMI server is, as the environment says.
struct PmiEndpoint {
  int fd = -1;        // PMI_FD, or -1
  std::string host;   // PMI_PORT's host, when fd is -1
  int port = 0;       // PMI_PORT's port
  int id = -1;        // PMI_ID (with PMI_PORT)
  std::string from;   // the variables, for messages: "PMI_FD=6", "PMI_PORT=vm:36411 PMI_ID=2"
};

struct PmiAnswer {
  std::string kvsname;      // the job's name in the PMI server
  std::optional<int> rank;  // from initack (PMI_PORT mode only)
  std::optional<int> size;
};

// How long the server has to answer each message: it is on this host (the proxy) or the
// launcher's, so seconds mean it is gone.
inline constexpr std::chrono::seconds kPmiTimeout{30};

// Asks the server, then finalizes the PMI session. Throws DetectError naming `endpoint.from`
// and what went wrong. The answer is remembered: a second call for the same endpoint in this
// process returns it without asking again (PMI_FD is closed after the first).
PmiAnswer ask_pmi_server(const PmiEndpoint& endpoint);

// The function detect() calls; tests pass a fake.
using PmiClient = std::function<PmiAnswer(const PmiEndpoint&)>;

}  // namespace idist::launchers

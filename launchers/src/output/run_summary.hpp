#pragma once
// What happened to a supervised job, kept as it happens: every attempt, every rank's pid,
// times and wait status. The supervisor prints it as the console summary and writes it as
// --log-dir's summary.json, so both say the same thing.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace idist::launchers::detail {

using WallClock = std::chrono::system_clock;

struct RankRecord {
  int rank = 0;
  pid_t pid = -1;             // -1: never started
  std::optional<int> status;  // wait status once reaped
  bool collateral = false;    // stopped by us, not failed on its own
  bool oom_killed = false;    // its SIGKILL came from the kernel's OOM killer (oom.hpp)
  // Its heartbeat stopped this long before idist-run stopped it (heartbeat_watch.hpp).
  std::optional<std::chrono::duration<double>> frozen_for;
  WallClock::time_point start, end;
  std::uint64_t out_log_lost = 0, err_log_lost = 0;  // bytes its --log-dir files could not take
};

struct AttemptRecord {
  int index = 0;  // IDIST_RESTART_COUNT of its ranks
  int master_port = 0;
  WallClock::time_point start, end;
  std::vector<RankRecord> ranks;
  std::optional<std::size_t> first_failure;  // index into ranks
  // A job over several nodes: what ended the attempt for every node ("rank 3 on node 1 (hostb)
  // exited with code 3", "node 2 (hostc) stopped answering ..."); empty when nothing did.
  std::string ended_by;
  int node_rank = -1;  // this node's, in a job over several nodes
  // Stall reports (stall_report.hpp) made during the attempt, line by line.
  std::vector<std::string> stall;
  // Straggler lines (stall/straggler.hpp) said during the attempt.
  std::vector<std::string> stragglers;
  // --stall-action kill ended it: the rank its report pointed at.
  std::optional<int> stalled_rank;
  // Live recovery: each loss the survivors went on from, in one line ("rank 2 was killed by
  // SIGKILL at 1.2 s; world 4 -> 3"). Not failures: the attempt goes on.
  std::vector<std::string> reforms;
  // How long each took where this idist-run timed it (it hosts the generations' store), by
  // index into reforms: from the loss said (or the replacement ready) to every member's word
  // that it joined.
  std::map<std::size_t, double> reform_seconds;
};

// Output the console did not show (it stalled, or its reader went away).
struct Dropped {
  std::uint64_t lines = 0, bytes = 0;
};

struct RunRecord {
  std::string run_id;
  std::string host;
  std::vector<AttemptRecord> attempts;
  std::string outcome;  // one line: "succeeded", "rank 1 exited with code 3", "timed out after 5s", ...
  int exit_code = 0;
  std::uint64_t log_bytes_lost = 0;      // every attempt's, every rank's
  Dropped stdout_dropped, stderr_dropped;  // by the console
};

std::string signal_name(int sig);                  // "SIGTERM"
std::string describe(int status);                  // "exited with code 3", "was killed by SIGSEGV (core dumped)"
// The same for a rank, with what we know beyond its status: "was killed by SIGKILL (the
// kernel's OOM killer: out of memory)".
std::string describe(const RankRecord& rank);
bool succeeded(int status);
int exit_code_of(int status);                      // the code, or 128 + signal
std::string iso8601(WallClock::time_point time);   // UTC, milliseconds: 2024-05-01T12:00:00.123Z

// "; stopped rank(s) 0, 2", or "" when the attempt stopped nobody.
std::string collateral_list(const AttemptRecord& attempt);

// summary.json: one object, documented in --help.
std::string summary_json(const RunRecord& run);

}  // namespace idist::launchers::detail

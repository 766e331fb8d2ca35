#pragma once
// The supervisor's decisions, as pure functions over what it recorded: whom to blame among
// ranks that fail together, whether an attempt is followed by another, and how the job ended
// (its exit code, its outcome, its closing line). No process and no event loop: the unit
// tests (tests/unit/test_supervise_policy.cpp) feed them records, as torch's elastic agent
// tests its decisions with a fake agent.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "idist/launchers/coordinator.hpp"
#include "output/run_summary.hpp"

namespace idist::launchers::supervision {

// Who is to blame when ranks fail at about the same time. A rank killed by a signal that we
// did not send (kill -9, the OOM killer) or that crashed (SIGSEGV, SIGBUS, SIGILL, SIGFPE) is a
// root cause. A rank that exits non-zero, aborts or dies of SIGPIPE may be one too, but is
// also what a survivor does moments after a peer's death: its collective sees the broken
// connection and gives up. The survivor can even be reaped first: a dying process's sockets
// close before its parent hears of its death. So when we stop the others at the first
// failure, a rank already exiting is not one we stopped (teardown), and once reaped it takes
// the blame if it weighs more; among equals the first one seen keeps it. A rank we began to
// stop while it was alive (collateral) weighs nothing, whatever it then died of.
enum class Blame { none, consequence, root_cause };
Blame blame_of(const detail::RankRecord& r);

// The rank that `lines` (a failed rank's last stderr lines) say it lost its connection to, in
// libidist's words ("connection to rank 2 lost: did it exit or crash?").
std::optional<int> lost_peer(const std::vector<std::string>& lines);

// Why the job stopped before its ranks all ended on their own. coordination: the job's
// rendezvous refused or lost this node, or the job failed elsewhere before this node's ranks
// started.
enum class Stop { none, interrupted, timed_out, spawn_error, coordination };

// After an attempt of a job on one node (no coordinator): whether another follows, and the
// words that end the failure's line ("; restarting every rank (attempt 2 of at most 3)").
struct LocalNext {
  bool restart = false;
  std::string then;
};
LocalNext after_local_attempt(bool failed, Stop stop, int index, int max_restarts);

// The tail of the job-wide line for a verdict of the rendezvous ("; restarting every node
// (attempt 1, 2 restarts left)", "; the job ends: no restart left (--max-restarts 2)", "; the
// job ends: too few nodes left for another attempt").
std::string verdict_then(const RemoteVerdict& v, Stop stop, int max_restarts);

// What the supervisor knows when the job is over.
struct OutcomeFacts {
  Stop stop = Stop::none;
  const detail::AttemptRecord* last = nullptr;  // the last attempt (there is always one)
  std::optional<RemoteVerdict> job_failure;     // the rendezvous' failure verdict
  std::string coordination_error;
  std::optional<int> interrupted_by;
  std::optional<std::chrono::milliseconds> timeout;
  bool mismatched = false;  // the last attempt's ranks called different collectives somewhere
  int restarts = 0;         // attempts that followed a failure (spent from --max-restarts)
  int reforms = 0;          // attempts that followed a re-form of an elastic job (free)
};

struct Outcome {
  int exit_code = 0;
  std::string outcome;  // JobResult::outcome
  std::string error;    // the closing line at error level; "" for none
  std::string warning;  // the closing line at warning level; "" for none
  // The last attempt's first failure is the job's (JobResult::first_failure).
  bool first_failure_is_the_jobs = false;
};
// `stopped`: the ranks stopped because of it (", stopped rank(s) 1, 2"), for the closing line.
Outcome decide_outcome(const OutcomeFacts& facts, const std::string& stopped);

}  // namespace idist::launchers::supervision

namespace idist::launchers::supervision {

// Two ranks that both exit non-zero weigh the same (Blame), and the reaping order cannot tell
// which went first: a dying process's sockets close before its parent hears of its death, and
// children reaped together come oldest first. A rank that failed because it lost its
// connection to another says so on stderr (libidist names the rank); once every rank's output
// is in, the blame follows that, to a rank that failed on its own; around a circle (two ranks
// that each say they lost the other) it stops where the circle closes. `tails[i]`: rank i's last
// stderr lines. Returns the index of the rank to blame, starting from `first`.
std::size_t follow_lost_connections(const std::vector<detail::RankRecord>& ranks,
                                    const std::vector<std::vector<std::string>>& tails, std::size_t first);

}  // namespace idist::launchers::supervision

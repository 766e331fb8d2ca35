#pragma once
// Starts the local ranks and watches them until the job ends.
//
// Built on fork/exec and one Boost.Asio event loop woken by SIGCHLD (no polling), because a
// supervisor has to be exact about exit statuses (DESIGN.md §4: Boost.Process is not).
//  - Each rank runs in its own process group, with PR_SET_PDEATHSIG so that a kill -9 of
//    idist-run takes the ranks with it. idist-run is a child subreaper: whatever a rank forks
//    and leaves behind is re-parented to us, and killed and reaped when its attempt ends.
//  - The first rank to fail (non-zero exit or a signal) makes us SIGTERM the others, then
//    SIGKILL them after the grace period. Exit code: that rank's code, or 128+signal. The
//    summary names it (pid, host, how it ended), the ranks we stopped, and its last stderr lines.
//    Ranks failing together are weighed: one killed or crashed by a signal we did not send is
//    named before one that exited non-zero, aborted or died of SIGPIPE, which is what survivors
//    do moments after a peer's death (Blame in supervise/policy.hpp).
//  - With max_restarts, a failed attempt is followed by a new one: every local rank again,
//    with IDIST_RESTART_COUNT incremented (the caller makes each attempt's processes). With a
//    Coordinator (a job over several nodes, rendezvous.hpp) the attempts are the job's: each
//    starts once the nodes are in, a failure on any node ends it on every node, and the
//    coordinator's verdict (not max_restarts) says whether another follows.
//  - SIGINT, SIGTERM, SIGHUP, SIGQUIT tear the job down the same way (a second one kills at
//    once; exit code 128+signal); the forwarded signals (SIGUSR1/SIGUSR2 by default) go to
//    every rank and the job goes on. A teardown signal that is also in the forwarded list is
//    forwarded instead; SIGUSR1, SIGUSR2 and SIGALRM, when not forwarded, stop the job like
//    SIGTERM (their default action would kill idist-run without a summary).
//  - A timeout for the whole job (all attempts) tears it down with exit code 124.
//  - Output is forwarded line by line (see LineForwarder), optionally tagged "[rank N] ", and
//    with a log directory also copied byte for byte to per-rank files, next to a summary.json.
//    The console is written without ever blocking supervision (see Console): a slow reader
//    holds the ranks back, a stalled or vanished one has lines dropped (told once at the end,
//    recorded in summary.json; the exit status stays the job's). A log file that cannot take
//    every byte (a full disk) is named with the bytes it lacks, and a job that succeeded
//    otherwise exits kLogLossExit.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idist/launchers/coordinator.hpp"
#include "idist/launchers/process_spec.hpp"

namespace idist::launchers {

struct SuperviseOptions {
  bool tag_output = false;
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // SIGTERM -> SIGKILL
  std::optional<std::chrono::milliseconds> timeout;            // the whole job, every attempt
  int max_restarts = 0;
  std::vector<int> forward_signals = {SIGUSR1, SIGUSR2};
  // Non-empty: DIR/<run_id>/attempt_<k>/rank_<r>.{out,err} and DIR/<run_id>/summary.json.
  std::string log_dir;
  std::string run_id;
  // Print the first failure and its last stderr lines (idist-run does). idist::spawn puts
  // them in the exception it throws instead.
  bool report_failure = true;
  // Set: the job's attempts are decided with other nodes (see Coordinator).
  std::shared_ptr<Coordinator> coordinator;
  // A rank waiting in one collective this long gets a stall report (stall_report.hpp); 0: none.
  std::chrono::milliseconds stall_timeout{0};
  // A rank that beats a heartbeat (InitOptions::recovery) and has not for this long is frozen:
  // stopped with SIGKILL and named (heartbeat_watch.hpp); 0: never.
  std::chrono::milliseconds heartbeat_timeout{0};
  // Live recovery (--recovery auto; supervise/recovery.hpp): a lost rank whose peers all opted
  // in (InitOptions::recovery) is re-formed around, not the end of the attempt. One node only
  // (no coordinator) for now.
  bool recovery = false;
  int min_world = 1;  // the fewest ranks a re-form may leave (--min-world)
  // After a stall report: keep waiting (report), or end the attempt as a failure of the rank
  // the report points at (kill; the restarts apply, and the job exits kStallExit).
  enum class StallAction { report, kill };
  StallAction stall_action = StallAction::report;
  // Answer `idist-run --status` while the job runs (status_socket.hpp).
  bool status_socket = false;
  // Serve the ranks' metrics at [HOST:]PORT (--metrics; supervise/metrics.hpp); "": none.
  std::string metrics;
  // Name a rank whose work exceeds the others' median by this share (--straggler-threshold; 0: off).
  double straggler_threshold = 0;
  // Write the ranks' calls to this file as a Chrome/Perfetto trace at the job's end (--trace;
  // output/trace_file.hpp); "": none.
  std::string trace;
  // Stall reports carry the suspects' stacks (gdb, from a thread of ours: only for a caller
  // whose ranks are exec'd, as idist-run's are, never forked from a running program).
  bool stacks = false;
};

// How a job ended, for a caller that reports it itself.
struct JobResult {
  int exit_code = 0;    // idist-run's exit code for it (see supervise)
  std::string outcome;  // one line: "succeeded", "rank 1 exited with code 3", "timed out after 5s"
  struct Failure {
    int rank = 0;
    pid_t pid = -1;
    std::string host;
    std::optional<int> exit_code;  // it exited with this code
    std::optional<int> signal;     // it was killed by this signal
    std::string how;               // "exited with code 3", "was killed by SIGSEGV (core dumped)"
    std::vector<int> stopped;      // the ranks stopped because of it
    std::vector<std::string> last_stderr;  // its last stderr lines, oldest first
  };
  std::optional<Failure> first_failure;  // of the last attempt
};

inline constexpr int kTimeoutExit = 124;  // as timeout(1)
// --stall-action kill ended the job: a failure of idist-run's own finding, as a rank's would be.
inline constexpr int kStallExit = 1;
// Every rank succeeded, but --log-dir lost output (a full disk) or summary.json could not be
// written: the record the user asked for is incomplete, so the run must not look like a clean
// success. 1, idist-run's own failure as when it cannot start every rank; the lines before it
// name each file and how many bytes it lacks.
inline constexpr int kLogLossExit = 1;

// Runs attempts until one succeeds, restarts run out, a signal or the timeout stops the job;
// returns idist-run's exit code. The process's signal dispositions and child-subreaper flag
// are as they were before when it returns, so a program may supervise jobs of its own
// (idist::spawn) and go on.
int supervise(const MakeAttempt& make_attempt, const SuperviseOptions& options);
JobResult supervise_job(const MakeAttempt& make_attempt, const SuperviseOptions& options);

// Every process below this one, zombies included: what supervise() would reap and stop as left
// behind by the ranks. A caller with processes of its own checks this first (idist::spawn).
std::vector<pid_t> processes_below_us();

}  // namespace idist::launchers

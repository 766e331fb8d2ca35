// The supervisor's parts (launchers/src/supervise): its decisions as pure functions (policy),
// its phase table, and the two invariants it keeps in every phase, checked on real processes:
// SIGTERM ends supervise_job within --grace + 1 s, and --timeout ends it on time. The phases
// that need other nodes (waiting to join, for a verdict, for the other nodes to hear the end)
// are reached with a coordinator that never answers: what a frozen or lost rendezvous looks
// like from here, which no real one can be made to do on demand.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idist/launchers/supervisor.hpp"
#include "heartbeat_watch.hpp"
#include "oom.hpp"
#include "phase.hpp"
#include "policy.hpp"

using namespace idist::launchers;
using namespace idist::launchers::supervision;
using namespace std::chrono_literals;

namespace {

detail::RankRecord ended(int rank, int status, bool collateral = false) {
  detail::RankRecord r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.status = status;
  r.collateral = collateral;
  return r;
}
int exited(int code) { return code << 8; }
int killed(int sig) { return sig; }

}  // namespace

TEST_CASE("blame: a crash or a kill we did not send outweighs a non-zero exit; collateral weighs nothing") {
  CHECK(blame_of(ended(0, exited(0))) == Blame::none);
  CHECK(blame_of(ended(0, exited(3))) == Blame::consequence);
  CHECK(blame_of(ended(0, killed(SIGPIPE))) == Blame::consequence);
  CHECK(blame_of(ended(0, killed(SIGABRT))) == Blame::consequence);
  CHECK(blame_of(ended(0, killed(SIGKILL))) == Blame::root_cause);
  CHECK(blame_of(ended(0, killed(SIGSEGV))) == Blame::root_cause);
  CHECK(blame_of(ended(0, killed(SIGKILL), true)) == Blame::none);
}

TEST_CASE("lost_peer reads libidist's words, the last such line first") {
  CHECK(lost_peer({"connection to rank 2 lost: did it exit or crash?"}) == 2);
  CHECK(lost_peer({"connection to rank 1 lost: x", "connection to rank 3 lost: y"}) == 3);
  CHECK_FALSE(lost_peer({"connection to rank two lost"}).has_value());
  CHECK_FALSE(lost_peer({"connection to rank 2 refused"}).has_value());
  CHECK_FALSE(lost_peer({}).has_value());
}

TEST_CASE("the blame follows lost connections to a rank that failed on its own, never in a circle") {
  std::vector<detail::RankRecord> ranks{ended(0, exited(1)), ended(1, exited(1)), ended(2, exited(7))};
  std::vector<std::vector<std::string>> tails{{"connection to rank 1 lost: x"}, {"connection to rank 2 lost: y"}, {}};
  CHECK(follow_lost_connections(ranks, tails, 0) == 2);
  tails[2] = {"connection to rank 0 lost: z"};  // a circle: it stops where it closes
  CHECK(follow_lost_connections(ranks, tails, 0) == 2);
  ranks[2] = ended(2, exited(0));  // the peer succeeded: nothing to follow to
  tails[2].clear();
  CHECK(follow_lost_connections(ranks, tails, 0) == 1);
}

TEST_CASE("after an attempt on one node: restart while the budget lasts, say when it is spent") {
  auto next = after_local_attempt(true, Stop::none, 0, 2);
  CHECK(next.restart);
  CHECK(next.then == "; restarting every rank (attempt 1 of at most 3)");
  next = after_local_attempt(true, Stop::none, 2, 2);
  CHECK_FALSE(next.restart);
  CHECK(next.then == "; no restarts left (--max-restarts 2)");
  CHECK_FALSE(after_local_attempt(true, Stop::interrupted, 0, 2).restart);  // a signal is not a failure to retry
  CHECK_FALSE(after_local_attempt(false, Stop::none, 0, 2).restart);
  CHECK(after_local_attempt(true, Stop::none, 0, 0).then.empty());
}

TEST_CASE("a verdict's words") {
  RemoteVerdict v;
  v.then = RemoteVerdict::Then::restart;
  v.next_attempt = 1;
  v.restarts_left = 1;
  CHECK(verdict_then(v, Stop::none, 2) == "; restarting every node (attempt 1, 1 restart left)");
  v.then = RemoteVerdict::Then::failure;
  v.ended_by = RemoteVerdict::End::restarts_spent;
  CHECK(verdict_then(v, Stop::none, 2) == "; the job ends: no restart left (--max-restarts 2)");
  CHECK(verdict_then(v, Stop::none, 0) == "; the job ends");
  // Restarts left, but fewer nodes than --nnodes MIN: the budget is not why.
  v.ended_by = RemoteVerdict::End::too_few_nodes;
  CHECK(verdict_then(v, Stop::none, 2) == "; the job ends: too few nodes left for another attempt");
  v.ended_by = RemoteVerdict::End::other;  // node 0 left, a rendezvous timed out: the cause says it
  CHECK(verdict_then(v, Stop::none, 2) == "; the job ends");
  CHECK(verdict_then(v, Stop::interrupted, 2).empty());
}

TEST_CASE("the job's outcome: exit code and words for each way it ends") {
  detail::AttemptRecord last;
  last.index = 2;
  last.ranks = {ended(0, exited(0)), ended(1, exited(0))};
  OutcomeFacts f;
  f.last = &last;

  SUBCASE("success; re-forms of an elastic job are not counted as restarts") {
    CHECK(decide_outcome(f, "").exit_code == 0);
    CHECK(decide_outcome(f, "").warning.empty());
    f.restarts = 1;
    f.reforms = 1;
    const auto o = decide_outcome(f, "");
    CHECK(o.outcome == "succeeded");
    CHECK(o.warning == "succeeded on attempt 2 after 1 restart and 1 re-form (not counted as restarts)");
    f.restarts = 0;
    CHECK(decide_outcome(f, "").warning == "succeeded on attempt 2 after 1 re-form (not counted as restarts)");
  }
  SUBCASE("a rank's failure is the job's code") {
    last.ranks[1] = ended(1, exited(3));
    last.first_failure = 1;
    const auto o = decide_outcome(f, "");
    CHECK(o.exit_code == 3);
    CHECK(o.outcome == "rank 1 exited with code 3");
    CHECK(o.first_failure_is_the_jobs);
  }
  SUBCASE("an OOM kill says so") {
    last.ranks[1] = ended(1, killed(SIGKILL));
    last.ranks[1].oom_killed = true;
    last.first_failure = 1;
    const auto o = decide_outcome(f, "");
    CHECK(o.exit_code == 137);
    CHECK(o.outcome == "rank 1 was killed by SIGKILL (the kernel's OOM killer: out of memory)");
  }
  SUBCASE("a rank stopped as frozen says so") {
    last.ranks[1] = ended(1, killed(SIGKILL));
    last.ranks[1].frozen_for = std::chrono::milliseconds(3140);
    last.first_failure = 1;
    CHECK(decide_outcome(f, "").outcome == "rank 1 was killed by SIGKILL (idist-run stopped it: frozen, no heartbeat for 3.1s)");
  }
  SUBCASE("timeout, interruption, a rank that could not start, a stall kill") {
    f.stop = Stop::timed_out;
    f.timeout = 1500ms;
    CHECK(decide_outcome(f, "; stopped rank(s) 0").exit_code == kTimeoutExit);
    CHECK(decide_outcome(f, "; stopped rank(s) 0").error == "timed out after 1.5s; stopped rank(s) 0");
    f.stop = Stop::interrupted;
    f.interrupted_by = SIGINT;
    CHECK(decide_outcome(f, "").exit_code == 130);
    CHECK(decide_outcome(f, "").outcome == "interrupted by SIGINT");
    f.stop = Stop::spawn_error;
    CHECK(decide_outcome(f, "").exit_code == 1);
    f.stop = Stop::none;
    last.stalled_rank = 1;
    last.stall = {"stall: all_reduce #4: rank 1 never entered it"};
    CHECK(decide_outcome(f, "").exit_code == kStallExit);
    CHECK(decide_outcome(f, "").outcome == "stalled (--stall-action kill): all_reduce #4: rank 1 never entered it");
  }
  SUBCASE("every rank exited 0 but their collectives did not match: not a success") {
    f.mismatched = true;
    CHECK(decide_outcome(f, "").exit_code == 1);
  }
  SUBCASE("the rendezvous' verdict is the same on every node, whatever failed here") {
    RemoteVerdict v;
    v.cause = "rank 3 on node 1 (hostb) exited with code 9";
    v.exit_code = 9;
    f.job_failure = v;
    CHECK(decide_outcome(f, "").exit_code == 9);
    CHECK(decide_outcome(f, "").error == "the job failed: rank 3 on node 1 (hostb) exited with code 9");
    f.stop = Stop::coordination;
    f.coordination_error = "lost the rendezvous";
    CHECK(decide_outcome(f, "").outcome == "lost the rendezvous");
  }
}

TEST_CASE("frozen: a stamp that has not moved for the timeout, by the watcher's clock") {
  using idist::launchers::supervision::BeatSeen;
  using idist::launchers::supervision::frozen_for;
  constexpr std::int64_t s = 1'000'000'000;
  BeatSeen seen;
  CHECK_FALSE(frozen_for(seen, 0, 10 * s, 3000ms));   // beats no heartbeat
  CHECK_FALSE(frozen_for(seen, 5, 20 * s, 3000ms));   // a first stamp: silence counts from now
  CHECK_FALSE(frozen_for(seen, 5, 23 * s, 3000ms));   // exactly the timeout: not yet
  CHECK_FALSE(frozen_for(seen, 6, 24 * s, 3000ms));   // it moved: counted afresh
  CHECK_FALSE(frozen_for(seen, 6, 26 * s, 3000ms));
  const auto silent = frozen_for(seen, 6, 28 * s, 3000ms);
  REQUIRE(silent);
  CHECK(silent->count() == doctest::Approx(4.0));
  CHECK_FALSE(frozen_for(seen, 6, 99 * s, 0ms));      // --heartbeat-timeout 0: never
  // A stamp far in the past or the future (another clock) means nothing: only its moving does.
  BeatSeen other;
  CHECK_FALSE(frozen_for(other, -1000 * s, 50 * s, 1000ms));
  CHECK_FALSE(frozen_for(other, -1000 * s, 50 * s + s / 2, 1000ms));
}

TEST_CASE("began: a rank's process begins to beat, said once per process") {
  using idist::launchers::supervision::began_beating;
  using idist::launchers::supervision::BeatSeen;
  using idist::launchers::supervision::frozen_for;
  BeatSeen seen;
  CHECK_FALSE(began_beating(seen, 0));  // not opted in (yet)
  CHECK(began_beating(seen, 42));       // init() with recovery
  CHECK_FALSE(began_beating(seen, 42));
  CHECK_FALSE(frozen_for(seen, 7, 1, 1000ms));  // the stamp's reading keeps it
  CHECK_FALSE(began_beating(seen, 42));
  CHECK_FALSE(began_beating(seen, 0));  // finalize(): it stopped
  CHECK(began_beating(seen, 42));       // and a new init() in the same process
  CHECK(began_beating(seen, 43));       // another program of the rank's script
}

TEST_CASE("the phase table") {
  CHECK(may_enter(Phase::starting, Phase::running));
  CHECK(may_enter(Phase::running, Phase::stopping));
  CHECK(may_enter(Phase::running, Phase::cleaning));
  CHECK(may_enter(Phase::stopping, Phase::awaiting_verdict));
  CHECK(may_enter(Phase::awaiting_verdict, Phase::starting));
  CHECK(may_enter(Phase::cleaning, Phase::starting));
  CHECK(may_enter(Phase::finishing, Phase::done));
  for (const Phase p : {Phase::starting, Phase::running, Phase::stopping, Phase::cleaning, Phase::awaiting_verdict})
    CHECK(may_enter(p, Phase::finishing));
  CHECK_FALSE(may_enter(Phase::finishing, Phase::starting));
  CHECK_FALSE(may_enter(Phase::done, Phase::finishing));
  CHECK_FALSE(may_enter(Phase::awaiting_verdict, Phase::running));
  CHECK_FALSE(may_enter(Phase::starting, Phase::awaiting_verdict));
}

TEST_CASE("the OOM killer's count, in cgroup v2's and v1's words") {
  CHECK(oom_kill_count("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\noom_group_kill 0\n") == 2u);
  CHECK(oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n") == 7u);
  CHECK_FALSE(oom_kill_count("").has_value());
}

// --- the invariants, phase by phase -----------------------------------------------------------

namespace {

// A rendezvous that answers only what it is told to: `join`, `over` with `verdict`, `finish`.
class FakeCoordinator final : public Coordinator {
 public:
  bool answer_join = true, answer_over = true, answer_finish = true;
  RemoteVerdict verdict = success();
  static RemoteVerdict success() {
    RemoteVerdict v;
    v.then = RemoteVerdict::Then::success;
    return v;
  }

  void start(boost::asio::io_context& io, Events) override { io_ = &io; }
  void join(int, std::function<void(const std::optional<RemoteVerdict>&)> joined) override {
    if (answer_join) boost::asio::post(*io_, [joined] { joined(std::nullopt); });
    else held_join_ = std::move(joined);
  }
  int attempt() const override { return 0; }
  void failed(int, const LocalFailure&) override {}
  void over(int, const std::optional<LocalFailure>&, std::function<void(const RemoteVerdict&)> done) override {
    if (answer_over) boost::asio::post(*io_, [done, v = verdict] { done(v); });
    else held_over_ = std::move(done);
  }
  void finish(const std::string&, std::function<void()> done) override {
    if (answer_finish) boost::asio::post(*io_, done);
    else held_finish_ = std::move(done);
  }
  void detach() override {
    held_join_ = nullptr;
    held_over_ = nullptr;
    held_finish_ = nullptr;
  }

 private:
  boost::asio::io_context* io_ = nullptr;
  std::function<void(const std::optional<RemoteVerdict>&)> held_join_;
  std::function<void(const RemoteVerdict&)> held_over_;
  std::function<void()> held_finish_;
};

struct Scenario {
  std::string script;  // the one rank's `sh -c` script
  SuperviseOptions options;
  std::shared_ptr<FakeCoordinator> coordinator;
};

struct Ending {
  int exit_code = -1;
  double seconds = 0;  // from the SIGTERM (or the start, without one) to the end
};

// Runs the scenario's supervise_job in a child (its signals and its hang, if any, stay there);
// SIGTERM to it after each of `terms` in turn. The child is killed after 20 s: a hang.
Ending run(Scenario s, std::vector<std::chrono::milliseconds> terms) {
  s.options.report_failure = false;
  if (s.coordinator) s.options.coordinator = s.coordinator;
  const auto start = std::chrono::steady_clock::now();
  // The child's guardian (process_tree.hpp) exits through exit(): what our stdio holds unwritten
  // would be written twice.
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    const MakeAttempt make = [&](int) {
      Attempt a;
      ProcessSpec p;
      p.path = "/bin/sh";
      p.argv = {"sh", "-c", s.script};
      for (char** e = environ; *e != nullptr; ++e) p.env.emplace_back(*e);
      a.processes.push_back(p);
      return a;
    };
    ::_exit(supervise(make, s.options));
  }
  auto from = start;
  for (const auto wait : terms) {
    std::this_thread::sleep_for(wait);
    ::kill(child, SIGTERM);
    from = std::chrono::steady_clock::now();
  }
  int status = 0;
  for (;;) {
    if (::waitpid(child, &status, WNOHANG) == child) break;
    if (std::chrono::steady_clock::now() - start > 20s) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return {};
    }
    std::this_thread::sleep_for(10ms);
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count()};
}

Scenario in_phase(const std::string& phase) {
  Scenario s;
  s.options.grace = 1s;
  s.script = "exec sleep 1000";
  if (phase == "running") return s;
  if (phase == "stopping") {
    s.script = "trap '' TERM; sleep 1000";  // SIGTERM ignored: stopping lasts until --grace's SIGKILL
    return s;
  }
  if (phase == "cleaning") {
    s.options.grace = 10s;  // the leftover would hold the job's end this long
    // Ignored before the fork, so inherited: a subshell that ignored it itself could still be
    // on its way to the trap when the supervisor's SIGTERM came (a busy CI machine: the job
    // ended at once, exit 0, before the test's SIGTERM).
    s.script = "trap '' TERM; sleep 1000 & exit 0";
    return s;
  }
  s.coordinator = std::make_shared<FakeCoordinator>();
  s.script = "exit 0";
  if (phase == "starting") s.coordinator->answer_join = false;
  if (phase == "awaiting_verdict") s.coordinator->answer_over = false;
  if (phase == "finishing") s.coordinator->answer_finish = false;  // node 0 whose rendezvous never drains
  return s;
}

}  // namespace

TEST_CASE("SIGTERM ends supervise within --grace + 1 s in every phase") {
  for (const std::string phase : {"starting", "running", "stopping", "cleaning", "awaiting_verdict", "finishing"}) {
    CAPTURE(phase);
    const Scenario s = in_phase(phase);
    const Ending e = run(s, {700ms});
    CHECK(e.exit_code != -1);  // -1: still running 20 s on, killed
    CHECK(e.seconds < std::chrono::duration<double>(s.options.grace).count() + 1.0);
    if (phase == "finishing")
      CHECK(e.exit_code == 0);  // the job had succeeded; only the leave-taking was cut short
    else
      CHECK(e.exit_code == 128 + SIGTERM);
  }
}

TEST_CASE("--timeout ends supervise on time in every phase") {
  for (const std::string phase : {"starting", "running", "stopping", "cleaning", "awaiting_verdict", "finishing"}) {
    CAPTURE(phase);
    Scenario s = in_phase(phase);
    s.options.timeout = 1500ms;
    const Ending e = run(s, {});
    CHECK(e.exit_code != -1);
    // Stopping takes --grace after the timeout's SIGTERM when the rank ignores it.
    const double bound = 1.5 + (phase == "stopping" ? 1.0 : 0.0) + 1.0;
    CHECK(e.seconds < bound);
    CHECK(e.seconds > 1.4);
    CHECK(e.exit_code == (phase == "finishing" ? 0 : kTimeoutExit));
  }
}

TEST_CASE("a second SIGTERM ends the leave-taking that the first began") {
  // The first SIGTERM leaves the join; node 0's rendezvous would then drain for up to 15 s.
  Scenario s = in_phase("starting");
  s.coordinator->answer_finish = false;
  const Ending e = run(s, {700ms, 500ms});
  CHECK(e.exit_code == 128 + SIGTERM);
  CHECK(e.seconds < 1.0);
}

TEST_CASE("one SIGTERM delivered twice (a wrapper forwarding it) does not cut the leave-taking short") {
  Scenario s = in_phase("starting");
  s.coordinator->answer_finish = false;
  const Ending e = run(s, {700ms, 50ms});
  CHECK(e.exit_code == 128 + SIGTERM);
  CHECK(e.seconds > 10.0);  // the second is the same stop: the 15 s bound ends the wait
}

// The supervisor's lifecycle: one event loop, one phase at a time (phase.hpp), and the
// events that move it. What it starts and reaps is the process context's (rank_process.hpp),
// what it decides is policy.hpp's, stall watching and reporting are parts of their own
// (stall_watch.hpp, job_report.hpp), and a job over several nodes is decided through the
// rendezvous interface (coordinator.hpp).
#include "idist/launchers/supervisor.hpp"

#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "idist/common/duration.hpp"
#include "idist/common/host.hpp"
#include "job_report.hpp"
#include "oom.hpp"
#include "output/console.hpp"
#include "output/run_summary.hpp"
#include "phase.hpp"
#include "policy.hpp"
#include "process_tree.hpp"
#include "rank_process.hpp"
#include "recovery.hpp"
#include "signal_list.hpp"
#include "heartbeat_watch.hpp"
#include "insight.hpp"
#include "stall_watch.hpp"
#include "status_socket.hpp"
#include "timings.hpp"

namespace idist::launchers {
namespace {

using namespace supervision;
using detail::WallClock;

class Supervisor {
 public:
  Supervisor(const MakeAttempt& make_attempt, const SuperviseOptions& options)
      : make_attempt_(make_attempt), options_(options), host_(common::host_name("localhost")) {
    for (const int sig : options_.forward_signals) forward_signals_.add(sig);
    for (const int sig : detail::kTeardownSignals)
      if (std::ranges::find(options_.forward_signals, sig) == options_.forward_signals.end()) teardown_signals_.add(sig);
    detail::attach_log(&console_);
  }
  ~Supervisor() { detail::attach_log(nullptr); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  JobResult run() {
    // A rank's closed pipe must not kill us; and the console may go away before we finish.
    ::signal(SIGPIPE, SIG_IGN);
    detail::start_guardian();  // before become_subreaper: it must not be ours
    if (!detail::become_subreaper())
      spdlog::warn("cannot become a child subreaper ({}): processes the ranks leave behind may outlive the job",
                   std::strerror(errno));
    arm_outside_ends();
    // Also without stall reports: the reading dates the ranks' calls, which --status shows.
    if (options_.stall_timeout.count() > 0 || options_.status_socket)
      watch_.start([this] { return phase_ == Phase::running ? &current() : nullptr; },
                   [this](detail::StallReport report) { on_stall(std::move(report)); });
    beats_.start([this] { return phase_ == Phase::running ? &current() : nullptr; },
                 [this](Rank& r, pid_t pid, auto silent) { stop_frozen(r, pid, silent, options_.heartbeat_timeout); },
                 [this](LiveAttempt& a, Rank& r) { recovery_.began(a, r); });
    if (options_.status_socket)
      status_ = std::make_unique<detail::StatusServer>(
          io_, [this] { return watch_.status_text(started()) + recovery_.status_text(); });
    // Before the nodes meet: a --metrics port taken ends this node at once.
    insight_.start({.running = [this] { return phase_ == Phase::running ? &current() : nullptr; },
                    .started = [this] { return started() != nullptr; }, .attempts = &attempts_, .restarts = &restarts_});
    if (auto& c = options_.coordinator) {
      Coordinator::Events events{.end_attempt = [this](const std::string& cause) { on_remote_end(cause); },
                                 .lost = [this](const std::string& why) { on_lost(why); },
                                 .views = [this] { return watch_.job_views(started()); },
                                 .report = [this](const std::vector<std::string>& lines) { on_job_report(lines); },
                                 .reformed = {}, .replace = {}, .members_ended = {},  // LiveRecovery's: hear()
                                 .stragglers = [this](const auto& lines, const auto& named) {
                                   insight_.heard_stragglers(lines, named);
                                 }};
      c->start(io_, recovery_.hear(std::move(events), [this] { return started(); }));
    }
    recovery_.allow_replacements(
        options_.max_restarts, [this](Rank& r) { return procs_.start(r, attempt_log_dir(current().record.index)); },
        [this] { asio::post(io_, [this, n = attempts_.size()] { if (n == attempts_.size()) check_ranks_gone(); }); });
    start_attempt(0);
    io_.run();  // until done(): the job, then the console's last lines
    watch_.close();  // a gdb thread still at work posts nothing to io_ from now on
    if (options_.coordinator) options_.coordinator->detach();  // before io_ goes
    procs_.kill_leftovers_now(nullptr);  // normally none: each attempt cleaned up after itself
    detail::attach_log(nullptr);  // the console is closed: straight to stderr from here
    const auto* c = options_.coordinator.get();
    // A trace asked for and not written is a record lost, as a log's bytes are.
    if (!insight_.write_trace(c ? c->assignment().node_rank : 0, c ? c->assignment().nnodes : 1) && run_.exit_code == 0)
      run_.exit_code = kLogLossExit;
    report_.finish(run_);
    result_.exit_code = run_.exit_code;
    result_.outcome = run_.outcome;
    return result_;
  }

 private:
  LiveAttempt& current() { return *attempts_.back(); }
  // The current attempt once its ranks exist (not while the nodes meet).
  LiveAttempt* started() { return attempts_.empty() || phase_ == Phase::starting ? nullptr : &current(); }

  void enter(Phase to) {
    if (!may_enter(phase_, to))
      spdlog::warn("internal: the supervisor went from {} to {}, which its phase table does not allow",
                   phase_name(phase_), phase_name(to));
    spdlog::debug("phase: {} -> {}", phase_name(phase_), phase_name(to));
    phase_ = to;
  }

  void arm_outside_ends() {
    child_signal_.async_wait([this](auto ec, int) { on_child_signal(ec); });
    teardown_signals_.async_wait([this](auto ec, int sig) { on_teardown_signal(ec, sig); });
    forward_signals_.async_wait([this](auto ec, int sig) { on_forward_signal(ec, sig); });
    if (!options_.timeout) return;
    timeout_timer_.expires_after(*options_.timeout);
    timeout_timer_.async_wait([this](auto ec) { on_timeout(ec); });
  }

  // --- starting ---------------------------------------------------------------------------

  void start_attempt(int index) {
    if (!attempts_.empty()) enter(Phase::starting);  // the first attempt starts in it
    watch_.new_attempt();
    auto& live = *attempts_.emplace_back(std::make_unique<LiveAttempt>());
    live.record.index = index;
    live.record.start = WallClock::now();
    if (!options_.coordinator) return launch(index);
    // A job over several nodes: the ranks start once every node is in.
    options_.coordinator->join(index, [this, generation = attempts_.size()](const std::optional<RemoteVerdict>& ended) {
      if (generation != attempts_.size() || phase_ != Phase::starting) return;
      if (ended) {
        // The job ended (or cannot start) before this node's ranks did: its word, its code.
        job_failure_ = *ended;
        if (stop_ == Stop::none) stop_ = Stop::coordination;
        coordination_error_ = ended->cause;
        return end_job();
      }
      current().record.start = WallClock::now();
      current().record.index = options_.coordinator->attempt();
      launch(current().record.index);
    });
  }

  void launch(int index) {
    LiveAttempt& a = current();
    try {
      a.attempt = make_attempt_(index);
    } catch (const std::exception& e) {
      spdlog::error("cannot start attempt {}: {}", index, e.what());
      stop_ = Stop::spawn_error;
    }
    recovery_.offer(a.attempt);
    a.record.master_port = a.attempt.master_port;
    a.record.node_rank = a.attempt.node_rank;
    recovery_.make_room(a);
    for (std::size_t i = 0; i < a.ranks.size(); ++i) {
      a.ranks[i].spec = &a.attempt.processes[i];
      a.ranks[i].record = &a.record.ranks[i];
      a.record.ranks[i].rank = a.attempt.processes[i].rank;
    }
    enter(Phase::running);
    const std::string log_dir = stop_ == Stop::none ? attempt_log_dir(index) : "";
    for (auto& rank : a.ranks) {
      if (phase_ != Phase::running || stop_ != Stop::none) break;  // a spawn failed: start nothing more
      if (auto error = procs_.start(rank, log_dir)) spawn_failed(*rank.spec, *error);
    }
    if (phase_ == Phase::running) recovery_.started(a);
    check_ranks_gone();
    maybe_finish();
  }

  // A directory we cannot make stops the job before it starts: the user asked for logs, and
  // running without them would lose output.
  std::string attempt_log_dir(int index) {
    const auto dir = make_attempt_log_dir(options_.log_dir, options_.run_id, index);
    if (!dir) stop_ = Stop::spawn_error;
    return dir.value_or("");
  }

  void spawn_failed(const ProcessSpec& spec, const std::string& why) {
    spdlog::error("cannot start rank {}: {}", spec.rank, why);
    if (stop_ == Stop::none) stop_ = Stop::spawn_error;
    teardown(SIGTERM);
  }

  // --- running: exits, and who is to blame ----------------------------------------------------

  void on_child_signal(const boost::system::error_code& ec) {
    if (ec || phase_ == Phase::done) return;
    reap_children();
    if (cleaning_ && (!has_children() || detail::descendants_of(::getpid()).empty())) end_cleaning();
    maybe_finish();
    if (phase_ != Phase::finishing && phase_ != Phase::done)
      child_signal_.async_wait([this](auto e, int) { on_child_signal(e); });
  }

  // Every exited child. All statuses are recorded before any is judged, so that ranks that
  // ended on their own at the same moment as the first failure are not called collateral; and
  // the heaviest of the batch is judged first, so that its weight decides.
  void reap_children() {
    auto exited = procs_.reap(attempts_.empty() ? nullptr : &current());
    for (Rank* rank : exited) oom_.explain(*rank->record);
    std::stable_sort(exited.begin(), exited.end(),
                     [](const Rank* x, const Rank* y) { return blame_of(*x->record) > blame_of(*y->record); });
    for (Rank* rank : exited) judge(*rank);
    check_ranks_gone();
  }

  // Makes `rank`, just reaped, the attempt's first failure if it is one (Blame); stops the rest.
  void judge(Rank& rank) {
    auto& a = current();
    const Blame blame = blame_of(*rank.record);
    if (blame == Blame::none && phase_ == Phase::running) recovery_.ended(a, rank);
    if (blame == Blame::none) return;
    const auto index = static_cast<std::size_t>(&rank - a.ranks.data());
    if (!a.record.first_failure) {
      // Stopped by a signal, the timeout or another node: not a failure of its own. Except a
      // rank that was already ending on its own when another node's end came (not collateral):
      // it may be the cause that node's failure answers (a peer that lost its connection to
      // it), and the rendezvous can only follow that blame to it if it hears of it.
      if (phase_ == Phase::stopping && !(a.ended_remotely && !rank.record->collateral)) return;
      if (phase_ == Phase::running && recovery_.take_loss(a, rank, blame == Blame::root_cause)) return;
      const auto loss = blame == Blame::consequence ? recovery_.recent_loss(a) : std::nullopt;
      a.record.first_failure = loss.value_or(index);
      if (options_.coordinator) options_.coordinator->failed(a.record.index, JobReport::local_failure(rank));
      if (blame == Blame::root_cause || loss) return teardown(SIGTERM);
      // A non-zero exit may be a survivor's answer to a peer that is still on its way out: a
      // rank in exit() closes its connections in static destructors, then runs the rest of
      // them. Stopped now, that peer would count as collateral and its own exit code be lost,
      // so it gets a moment to end of its own accord (those that only wait are stopped after).
      settle_timer_.expires_after(kSettleTime);
      settle_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
        if (!ec && generation == attempts_.size() && phase_ == Phase::running) teardown(SIGTERM);
      });
      return;
    }
    const Rank& blamed = a.ranks[*a.record.first_failure];
    if (blame <= blame_of(*blamed.record)) return;
    spdlog::debug("rank {} {}: the cause of rank {}'s failure, not a consequence of it", rank.spec->rank,
                  detail::describe(*rank.record), blamed.spec->rank);
    a.record.first_failure = index;
  }

  // --- stopping ---------------------------------------------------------------------------

  // SIGTERM (or `sig`) to every running rank, SIGKILL after --grace.
  void teardown(int sig) {
    recovery_.stand_down();
    if (phase_ == Phase::running) {
      enter(Phase::stopping);
      kill_timer_.expires_after(options_.grace);
      kill_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
        if (!ec && generation == attempts_.size()) ProcessContext::signal(current(), SIGKILL);
      });
    }
    if (phase_ != Phase::stopping) return;  // no rank of ours runs
    // A rank already exiting (not yet reaped) ends of its own accord, not of ours: see Blame.
    for (auto& r : current().ranks)
      if (r.running() && !detail::is_exiting(r.record->pid)) r.record->collateral = true;
    ProcessContext::signal(current(), sig);
  }

  // --- cleaning: what the ranks left behind -----------------------------------------------------

  // Once every rank of the attempt is reaped, what they left behind goes too: at once when
  // the attempt is being torn down, else SIGTERM and SIGKILL after the grace period.
  void check_ranks_gone() {
    if (attempts_.empty() || phase_ == Phase::starting) return;  // no rank yet: none can be gone
    auto& a = current();
    if (a.ranks_gone || recovery_.awaiting_replacement() || std::ranges::any_of(a.ranks, &Rank::running)) return;
    a.ranks_gone = true;
    kill_timer_.cancel();
    const auto left = has_children() ? detail::descendants_of(::getpid()) : std::vector<pid_t>();
    if (left.empty()) return start_drain();
    if (phase_ != Phase::running) {
      procs_.kill_leftovers_now(&a);
      return start_drain();
    }
    spdlog::debug("every rank has exited; stopping {} process(es) they left behind", left.size());
    detail::signal_descendants(SIGTERM);
    enter(Phase::cleaning);
    cleaning_ = true;
    cleaning_since_ = std::chrono::steady_clock::now();
    wait_for_leftovers(std::min<std::chrono::milliseconds>(kLeftoverNotice, options_.grace));
  }

  // A helper that ignores SIGTERM holds the job's end for --grace: said once the wait shows,
  // and again with what was killed.
  void wait_for_leftovers(std::chrono::milliseconds wait) {
    leftover_timer_.expires_after(wait);
    leftover_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
      if (ec || generation != attempts_.size() || !cleaning_) return;
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - cleaning_since_);
      if (waited < options_.grace) {
        const auto left = describe_processes(detail::descendants_of(::getpid()));
        spdlog::warn("every rank has ended, but {} left behind by the ranks did not end on SIGTERM; killing "
                     "{} in {} (--grace)",
                     fmt::join(left, ", "), left.size() == 1 ? "it" : "them", common::measured_duration_text(options_.grace - waited));
        return wait_for_leftovers(options_.grace - waited);
      }
      kill_leftovers("--grace " + common::duration_text(options_.grace) + " after SIGTERM");
    });
  }

  void kill_leftovers(const std::string& when) {
    const auto killed = procs_.kill_leftovers_now(&current());
    if (!killed.empty()) spdlog::warn("killed {} left behind by the ranks ({})", fmt::join(killed, ", "), when);
    end_cleaning();
  }

  void end_cleaning() {
    if (!cleaning_) return;
    cleaning_ = false;
    leftover_timer_.cancel();
    start_drain();
    maybe_finish();
  }

  void start_drain() {
    drain_timer_.expires_after(kDrainTime);
    drain_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
      if (ec || generation != attempts_.size()) return;
      // A stream held back for a slow console has output left, not an EOF that never comes.
      if (ProcessContext::held(current())) return start_drain();
      procs_.close_streams(current());
      maybe_finish();
    });
  }

  // --- signals and the timeout: every phase answers them --------------------------------------

  void on_teardown_signal(const boost::system::error_code& ec, int sig) {
    if (ec || phase_ == Phase::done) return;
    const bool same_stop = interrupted_by_ && std::chrono::steady_clock::now() - interrupted_at_ < kSameSignal;
    switch (phase_) {
      case Phase::finishing:
        // One Ctrl-C delivered twice (see on_stop_signal) must not cut the end short: node 0
        // would stop telling the other nodes that this one left.
        if (same_stop) break;
        spdlog::info("{}: leaving now", detail::signal_name(sig));
        return done();
      case Phase::starting:
      case Phase::awaiting_verdict:  // no rank of ours runs
        if (!interrupted_by_) interrupted(sig);
        spdlog::info("{}: leaving the job's rendezvous", detail::signal_name(sig));
        end_job();
        break;  // armed again: a second signal ends the leave-taking
      case Phase::cleaning:
        if (!interrupted_by_) interrupted(sig);
        spdlog::info("{}: killing what the ranks left behind", detail::signal_name(sig));
        kill_leftovers(detail::signal_name(sig));
        break;
      default:
        on_stop_signal(sig);
    }
    teardown_signals_.async_wait([this](auto e, int s) { on_teardown_signal(e, s); });
  }

  void interrupted(int sig) {
    interrupted_by_ = sig;
    interrupted_at_ = std::chrono::steady_clock::now();
    if (stop_ == Stop::none) stop_ = Stop::interrupted;
  }

  // A stop signal while ranks run: SIGTERM them; a second one kills at once.
  void on_stop_signal(int sig) {
    if (interrupted_by_ && std::chrono::steady_clock::now() - interrupted_at_ < kSameSignal) {
      // One Ctrl-C reaches us twice when a wrapper forwards it too (timeout; a script's trap,
      // maybe as SIGTERM): the terminal sends it to the whole foreground group.
      spdlog::debug("{} within {} ms of the first: the same stop, delivered twice", detail::signal_name(sig),
                    kSameSignal.count());
    } else if (interrupted_by_) {
      spdlog::warn("{} again: killing every rank now", detail::signal_name(sig));
      ProcessContext::signal(current(), SIGKILL);
      detail::signal_descendants(SIGKILL);
    } else {
      interrupted(sig);
      spdlog::info("{}: stopping every rank", detail::signal_name(sig));
      teardown(detail::is_stop_signal(sig) ? sig : SIGTERM);
    }
  }

  void on_forward_signal(const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("forwarding {} to every rank", detail::signal_name(sig));
    if (started() != nullptr) ProcessContext::signal(current(), sig);
    forward_signals_.async_wait([this](auto e, int s) { on_forward_signal(e, s); });
  }

  void on_timeout(const boost::system::error_code& ec) {
    if (ec || phase_ == Phase::done) return;
    if (phase_ == Phase::finishing) {
      // The job's outcome is decided and said; only the leave-taking is left, and it may not
      // outlast --timeout (node 0 waiting for nodes that will never hear the verdict).
      spdlog::warn("timeout: leaving now, while {}", options_.coordinator
                                                         ? "the job's end was still being told to the other nodes"
                                                         : "the console still held output");
      return done();
    }
    if (stop_ == Stop::none) stop_ = Stop::timed_out;
    switch (phase_) {
      case Phase::starting:
      case Phase::awaiting_verdict: return end_job();
      case Phase::cleaning: return kill_leftovers("--timeout");
      default:
        spdlog::info("timeout: stopping every rank");
        teardown(SIGTERM);
    }
  }

  // --- stalls -------------------------------------------------------------------------------

  // A stall report: said, kept for summary.json, the suspects' stacks added where gdb can get
  // them; then, with --stall-action kill, the attempt ends as a failure of the suspect.
  void on_stall(detail::StallReport report) {
    say_stall(report.lines);
    // Over several nodes, what this node sees may be half the story: ask for the whole.
    if (options_.coordinator) options_.coordinator->stalled(current().record.index);
    watch_.inspect_stacks(report.to_inspect, [this, generation = attempts_.size(), suspect = report.suspect](auto lines) {
      if (generation != attempts_.size()) return;
      say_stall(lines);
      if (options_.stall_action == SuperviseOptions::StallAction::kill && phase_ == Phase::running &&
          !current().ranks_gone)
        stall_kill(suspect);
    });
  }

  void stall_kill(int suspect) {
    auto& a = current();
    a.record.stalled_rank = suspect;
    if (a.record.ended_by.empty())
      a.record.ended_by = fmt::format("stalled: rank {} on {} (--stall-action kill)", suspect, host_);
    spdlog::error("--stall-action kill: stopping every rank (the report points at rank {})", suspect);
    if (options_.coordinator) options_.coordinator->failed(a.record.index, stall_failure(a));
    teardown(SIGTERM);
  }

  LocalFailure stall_failure(const LiveAttempt& a) const {
    LocalFailure f;
    f.rank = *a.record.stalled_rank;
    f.how = "stalled (see the stall report)";
    f.exit_code = kStallExit;
    f.root_cause = true;
    return f;
  }

  void on_job_report(const std::vector<std::string>& lines) {
    if (started() != nullptr && phase_ != Phase::finishing && phase_ != Phase::done) say_stall(lines);
  }

  // A stall report's lines: on the console, and kept for summary.json.
  void say_stall(const std::vector<std::string>& lines) {
    for (const auto& line : lines) spdlog::error("{}", line);
    auto& stall = current().record.stall;
    stall.insert(stall.end(), lines.begin(), lines.end());
  }

  // --- other nodes ----------------------------------------------------------------------------

  // Another node failed or vanished: this attempt ends here too.
  void on_remote_end(const std::string& cause) {
    if (phase_ != Phase::running && phase_ != Phase::stopping && phase_ != Phase::cleaning) return;
    auto& a = current();
    if (a.record.ended_by.empty()) a.record.ended_by = cause;
    if (phase_ != Phase::running || a.ranks_gone) return;
    spdlog::error("attempt {}: {}; stopping the ranks here", a.record.index, cause);
    a.ended_remotely = true;
    teardown(SIGTERM);
  }

  // The rendezvous is gone (or refused us): nothing can decide the next attempt. Waiting to
  // join or for a verdict, the coordinator's answer to that wait says so.
  void on_lost(const std::string& why) {
    if (phase_ == Phase::finishing || phase_ == Phase::done) return;
    if (stop_ == Stop::none) stop_ = Stop::coordination;
    coordination_error_ = why;
    if (phase_ == Phase::running && !current().ranks_gone) {
      spdlog::error("{}; stopping the ranks here", why);
      teardown(SIGTERM);
    }
  }

  // --- the attempt's end, and what follows ------------------------------------------------------

  void maybe_finish() {
    if (phase_ != Phase::running && phase_ != Phase::stopping && phase_ != Phase::cleaning) return;
    if (cleaning_) return;
    const auto& a = current();
    if (!a.ranks_gone || ProcessContext::output_open(a)) return;
    finish_attempt();
  }

  void finish_attempt() {
    auto& a = current();
    a.record.end = WallClock::now();
    for (auto& r : a.ranks) {
      if (r.out) r.record->out_log_lost = r.out->output.log().lost();
      if (r.err) r.record->err_log_lost = r.err->output.log().lost();
    }
    kill_timer_.cancel();
    settle_timer_.cancel();
    drain_timer_.cancel();
    leftover_timer_.cancel();
    // The ranks are gone but their recorders are still here: a job too short for the periodic
    // check, whose ranks called different collectives, must not end looking right.
    watch_.check_mismatches(a, false);
    mismatched_ = watch_.mismatched();
    if (!a.record.first_failure) a.record.first_failure = recovery_.unrecovered(a);
    if (a.record.first_failure) {
      std::vector<std::vector<std::string>> tails;
      for (const auto& r : a.ranks) tails.push_back(r.last_stderr());
      a.record.first_failure = follow_lost_connections(a.record.ranks, tails, *a.record.first_failure);
    }
    // A node stopped here (a signal, the timeout, a rank it could not start, a lost rendezvous)
    // leaves the job: its closed connection ends the attempt on the other nodes.
    if (options_.coordinator && stop_ == Stop::none) return ask_verdict(a);
    const bool failed = a.record.first_failure || a.record.stalled_rank;
    const LocalNext next = after_local_attempt(failed, stop_, a.record.index, options_.max_restarts);
    if (a.record.first_failure && options_.report_failure) {
      report_.failure(a, next.then);
    } else if (a.record.stalled_rank && options_.report_failure) {
      spdlog::error("{}stalled (see the stall report above){}{}",
                    options_.max_restarts > 0 ? "attempt " + std::to_string(a.record.index) + ": " : "",
                    detail::collateral_list(a.record), next.then);
    }
    if (!next.restart) return end_job();
    ++restarts_;
    start_attempt(a.record.index + 1);
  }

  // Every node's ranks are gone: the rendezvous says what follows, the same for every node.
  void ask_verdict(LiveAttempt& a) {
    enter(Phase::awaiting_verdict);
    std::optional<LocalFailure> failure;
    if (a.record.first_failure) {
      failure = JobReport::local_failure(a.ranks[*a.record.first_failure]);
    } else if (a.record.stalled_rank) {
      failure = stall_failure(a);
    }
    options_.coordinator->over(a.record.index, failure, [this, generation = attempts_.size()](const RemoteVerdict& v) {
      if (generation == attempts_.size() && phase_ == Phase::awaiting_verdict) on_verdict(v);
    });
  }

  void on_verdict(const RemoteVerdict& v) {
    auto& a = current();
    using Then = RemoteVerdict::Then;
    // The verdict's cause, not what this node heard first (a rank here failing because a peer
    // elsewhere died first): summary.json says what the console says, the same on every node.
    if (v.then != Then::success) a.record.ended_by = v.cause;
    if (v.then == Then::success) recovery_.forgive(a, a.record.first_failure);
    // One line for the job, the same on every node; the named rank's own lines where it ran.
    if (v.then != Then::success)
      spdlog::error("attempt {} ended: {}{}", a.record.index, v.cause, verdict_then(v, stop_, options_.max_restarts));
    if (a.record.first_failure && options_.report_failure) {
      const auto& mine = a.record.ranks[*a.record.first_failure];
      if (mine.rank == v.rank) {
        report_.stderr_tail(a);
      } else {
        spdlog::info("here, rank {} {} after that{}", mine.rank, detail::describe(mine),
                     detail::collateral_list(a.record));
      }
    }
    if (v.then == Then::failure) job_failure_ = v;
    if (v.then != Then::restart || stop_ != Stop::none) return end_job();
    ++(v.counted ? restarts_ : reforms_);
    start_attempt(v.next_attempt);
  }

  // --- finishing ------------------------------------------------------------------------------

  // The job is over: its outcome said, then the console's last lines and (node 0) the other
  // nodes' verdicts, bounded. The signal handlers and the timeout stay armed until done().
  void end_job() {
    if (phase_ == Phase::finishing || phase_ == Phase::done) return;
    enter(Phase::finishing);
    boost::system::error_code ignored;
    child_signal_.cancel(ignored);
    forward_signals_.cancel(ignored);
    watch_.stop();
    beats_.stop();
    insight_.stop();
    status_.reset();  // its pending accepts would keep the event loop going
    conclude();
    finish_timer_.expires_after(kFinishBound);
    finish_timer_.async_wait([this](auto ec) {
      if (ec || phase_ == Phase::done) return;
      spdlog::warn("the job's end took over {}: leaving now", common::duration_text(kFinishBound));
      done();
    });
    // The console gets what it still holds, the summary included, while it keeps taking bytes.
    auto release = [this] { console_.close([this] { done(); }); };
    if (options_.coordinator) return options_.coordinator->finish(run_.outcome, release);
    release();
  }

  // The outcome, its exit code and its closing lines (policy.hpp's words), at the end of the
  // last attempt: the lines queue behind the ranks' output.
  void conclude() {
    run_.run_id = options_.run_id;
    run_.host = host_;
    for (const auto& a : attempts_) run_.attempts.push_back(a->record);
    const OutcomeFacts facts{.stop = stop_,
                             .last = &run_.attempts.back(),
                             .job_failure = job_failure_,
                             .coordination_error = coordination_error_,
                             .interrupted_by = interrupted_by_,
                             .timeout = options_.timeout,
                             .mismatched = mismatched_,
                             .restarts = restarts_,
                             .reforms = reforms_};
    const Outcome o = decide_outcome(facts, detail::collateral_list(run_.attempts.back()));
    run_.exit_code = o.exit_code;
    run_.outcome = o.outcome;
    if (!o.error.empty()) spdlog::error("{}", o.error);
    if (!o.warning.empty()) spdlog::warn("{}", o.warning);
    if (o.first_failure_is_the_jobs) result_.first_failure = report_.failure_record(current());
    report_.log_loss(attempts_, run_);
  }

  // Nothing is left to wait for: the event loop ends now, whatever is still queued on it (a
  // rendezvous that never drains, a console gone), so that no phase can outlive its bound.
  void done() {
    if (phase_ == Phase::done) return;
    if (phase_ != Phase::finishing) end_job();
    enter(Phase::done);
    console_.abandon();
    boost::system::error_code ignored;
    teardown_signals_.cancel(ignored);
    child_signal_.cancel(ignored);
    timeout_timer_.cancel();
    finish_timer_.cancel();
    io_.stop();
  }

  const MakeAttempt& make_attempt_;
  SuperviseOptions options_;
  std::string host_;
  asio::io_context io_;  // first, so that it outlives every object that uses it
  detail::Console console_{io_};  // before the attempts: their output goes to it
  ProcessContext procs_{io_, console_, options_.tag_output, Insight::recorder(options_), [this] { maybe_finish(); }};
  StallWatch watch_{io_, options_, host_};
  HeartbeatWatch beats_{io_, options_.heartbeat_timeout};
  LiveRecovery recovery_{io_, options_.recovery, options_.min_world, options_.coordinator.get()};
  JobReport report_{options_, host_, console_};
  Insight insight_{io_, options_, host_};  // after the process context: it reads the ranks
  OomWatch oom_;
  asio::signal_set child_signal_{io_, SIGCHLD};
  asio::signal_set teardown_signals_{io_};
  asio::signal_set forward_signals_{io_};
  asio::steady_timer kill_timer_{io_};      // SIGTERM -> SIGKILL
  asio::steady_timer settle_timer_{io_};    // first failure a non-zero exit -> SIGTERM
  asio::steady_timer leftover_timer_{io_};  // leftovers: SIGTERM -> SIGKILL
  asio::steady_timer drain_timer_{io_};
  asio::steady_timer timeout_timer_{io_};
  asio::steady_timer finish_timer_{io_};
  std::unique_ptr<detail::StatusServer> status_;
  // Every attempt stays until the end: its handlers may still be queued, and the summary needs it.
  std::vector<std::unique_ptr<LiveAttempt>> attempts_;
  Phase phase_ = Phase::starting;
  bool cleaning_ = false;  // leftovers of ranks that ended on their own are being stopped
  std::chrono::steady_clock::time_point cleaning_since_;
  // Facts for the outcome (policy.hpp's OutcomeFacts).
  Stop stop_ = Stop::none;
  std::optional<int> interrupted_by_;
  std::chrono::steady_clock::time_point interrupted_at_;
  std::optional<RemoteVerdict> job_failure_;
  std::string coordination_error_;
  bool mismatched_ = false;
  int restarts_ = 0, reforms_ = 0;
  detail::RunRecord run_;  // by conclude()
  JobResult result_;
};

}  // namespace

JobResult supervise_job(const MakeAttempt& make_attempt, const SuperviseOptions& options) {
  const ProcessState restored_at_return;
  return Supervisor(make_attempt, options).run();
}

std::vector<pid_t> processes_below_us() { return detail::descendants_of(::getpid()); }

int supervise(const MakeAttempt& make_attempt, const SuperviseOptions& options) {
  return supervise_job(make_attempt, options).exit_code;
}

}  // namespace idist::launchers

#include "idist/launchers/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "console.hpp"
#include "idist/common/flight_recorder.hpp"
#include "idist/common/host.hpp"
#include "idist/env_contract.hpp"
#include "process_tree.hpp"
#include "rank_output.hpp"
#include "run_summary.hpp"
#include "signal_list.hpp"
#include "spawn.hpp"
#include "stall_report.hpp"
#include "status_socket.hpp"

namespace idist::launchers {
namespace {

namespace asio = boost::asio;
using detail::AttemptRecord;
using detail::Channel;
using detail::RankOutput;
using detail::WallClock;

// Lines of a failing rank's stderr shown in the summary.
constexpr std::size_t kTailLines = 10;

// Whether we have any child, exited or not, without reaping it. As a child subreaper we adopt
// every orphan in our tree, so a process the ranks left behind is always a child of ours or
// below one: without children there is nothing to look for, and the /proc scan that finds
// descendants (a file read per process on the machine, a few milliseconds) can be skipped.
// That scan ran twice at the end of every job, most of what `idist-run -n 1 /bin/true` cost
// over `/bin/true` (docs/BENCHMARKS.md).
bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

// How long the other ranks may take to end on their own after a first failure that may be a
// consequence (a non-zero exit) before they are stopped; see judge().
constexpr auto kSettleTime = std::chrono::milliseconds(250);

// How long output may keep coming once every rank and leftover is gone (a process outside our
// tree may hold a pipe); after that we stop reading rather than wait forever.
constexpr auto kDrainTime = std::chrono::seconds(2);

// The run id as a directory name: an id taken from the environment may hold a '/'.
std::string run_dir_name(std::string id) {
  std::replace(id.begin(), id.end(), '/', '_');
  return id.empty() || id == "." || id == ".." ? "run" : id;
}

std::string this_host() { return common::host_name("localhost"); }

// One rank's output stream (stdout or stderr) on its way to ours.
struct Stream {
  Stream(asio::io_context& io, int fd, detail::Console& console, Channel channel, std::string prefix,
         detail::LogFile log, bool keep_tail)
      : pipe(io, fd), channel(channel), output(console, channel, std::move(prefix), std::move(log), keep_tail) {}
  asio::posix::stream_descriptor pipe;
  Channel channel;
  RankOutput output;
  std::array<char, 64 * 1024> buffer{};
  bool open = true;
  bool held = false;  // not read while the console holds all it may for a slow reader
};

// A rank's flight recorder, as idist-run maps it (the rank maps the same memfd).
class RecorderMemory {
 public:
  // The memory and the descriptor to hand the rank; nullptr where memfds cannot be had.
  static std::unique_ptr<RecorderMemory> make() {
    const int fd = ::memfd_create("idist-flight-recorder", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (::ftruncate(fd, sizeof(common::recorder::Segment)) != 0) {
      ::close(fd);
      return nullptr;
    }
    void* p = ::mmap(nullptr, sizeof(common::recorder::Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return nullptr;
    }
    auto* segment = new (p) common::recorder::Segment();
    segment->tracer = static_cast<std::int32_t>(::getpid());  // gdb, for stall reports
    auto memory = std::unique_ptr<RecorderMemory>(new RecorderMemory(fd, segment));
    return memory;
  }
  ~RecorderMemory() {
    if (fd_ >= 0) ::close(fd_);
    ::munmap(segment_, sizeof(common::recorder::Segment));
  }
  RecorderMemory(const RecorderMemory&) = delete;
  RecorderMemory& operator=(const RecorderMemory&) = delete;
  int fd() const { return fd_; }
  void close_fd() {  // once the rank has its own copy of it
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // The process that records, where it is not the rank's own (a script that runs the program
  // as its child): one of the rank's process group, as a child of the rank is unless it moved.
  // The rank itself otherwise, and once that process has ended (its pid may be another's).
  pid_t recording(pid_t rank) const {
    const pid_t pid = segment_->pid;
    return pid > 0 && pid != rank && ::getpgid(pid) == rank ? pid : rank;
  }

  // The rank's calls, each dated by when we first saw the recorder as it is now (the rank
  // reads no clock). A call entered while we read moves the count: it is dated now, not by
  // the count we saw before it (which could be a long computation ago: a false stall).
  std::vector<detail::Recorded> read() {
    const auto before = common::recorder::entered(*segment_);
    if (before != seen_entered_ || since_ns_ == 0) {
      seen_entered_ = before;
      since_ns_ = common::recorder::now_ns();
    }
    auto calls = detail::read_recorder(*segment_, since_ns_);
    if (const auto after = common::recorder::entered(*segment_); after != before) {
      seen_entered_ = after;
      since_ns_ = common::recorder::now_ns();
      for (auto& c : calls) c.entered_ns = since_ns_;
    }
    // An open call keeps the date it was first seen open: the calls entered after it (another
    // thread's sends while this one waits in a collective) move the count, not its wait.
    std::map<std::pair<std::uint32_t, std::uint64_t>, std::int64_t> open;
    for (auto& c : calls) {
      if (c.state != common::recorder::State::entered || c.kind == common::recorder::Kind::member) continue;
      const std::pair key(c.epoch, c.id);
      if (const auto seen = open_since_.find(key); seen != open_since_.end())
        c.entered_ns = std::min(c.entered_ns, seen->second);
      open.emplace(key, c.entered_ns);
    }
    open_since_ = std::move(open);
    return calls;
  }

 private:
  RecorderMemory(int fd, common::recorder::Segment* segment) : fd_(fd), segment_(segment) {}
  int fd_;
  common::recorder::Segment* segment_;
  std::uint64_t seen_entered_ = 0;
  std::int64_t since_ns_ = 0;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::int64_t> open_since_;  // (epoch, id): first seen open
};

// A stop signal within this of the first is the same stop delivered twice (a Ctrl-C reaches
// the whole foreground group: a wrapper such as timeout, or a script's trap, forwards it to us
// as well), not a second Ctrl-C: no hand presses twice in 0.2 s.
constexpr auto kSameSignal = std::chrono::milliseconds(200);

// How often the recorders are read for stalls: often enough that a stall is reported within a
// second of its timeout, rarely enough to cost nothing.
constexpr auto kStallCheck = std::chrono::milliseconds(500);

struct Rank {
  const ProcessSpec* spec = nullptr;
  detail::RankRecord* record = nullptr;  // in the attempt's record, which does not move
  std::unique_ptr<Stream> out, err;
  std::unique_ptr<RecorderMemory> recorder;
  bool running() const { return record->pid > 0 && !record->status; }
};

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

Blame blame_of(const detail::RankRecord& r) {
  if (!r.status || detail::succeeded(*r.status) || r.collateral) return Blame::none;
  if (!WIFSIGNALED(*r.status)) return Blame::consequence;
  switch (WTERMSIG(*r.status)) {
    case SIGKILL: case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: return Blame::root_cause;
    default: return Blame::consequence;
  }
}

// The rank that `lines` (a failed rank's last stderr lines) say it lost its connection to, in
// libidist's words ("connection to rank 2 lost: did it exit or crash?").
std::optional<int> lost_peer(const std::vector<std::string>& lines) {
  static constexpr std::string_view kWords = "connection to rank ";
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    const auto at = line->find(kWords);
    if (at == std::string::npos) continue;
    const char* digits = line->c_str() + at + kWords.size();
    char* end = nullptr;
    const long peer = std::strtol(digits, &end, 10);
    if (end != digits && std::string_view(end).starts_with(" lost") && peer >= 0 && peer <= INT32_MAX)
      return static_cast<int>(peer);
  }
  return std::nullopt;
}

struct LiveAttempt {
  Attempt attempt;
  AttemptRecord record;
  std::vector<Rank> ranks;
  bool ranks_gone = false;  // every rank reaped, leftovers dealt with
};

// coordination: the job's rendezvous refused or lost this node, or the job failed elsewhere
// before this node's ranks started.
enum class Stop { none, interrupted, timed_out, spawn_error, coordination };

class Supervisor {
 public:
  Supervisor(const MakeAttempt& make_attempt, const SuperviseOptions& options)
      : make_attempt_(make_attempt), options_(options), host_(this_host()) {
    for (const int sig : options_.forward_signals) forward_signals_.add(sig);
    for (const int sig : detail::kTeardownSignals)
      if (std::find(options_.forward_signals.begin(), options_.forward_signals.end(), sig) ==
          options_.forward_signals.end())
        teardown_signals_.add(sig);
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
    child_signal_.async_wait([this](auto ec, int) { on_child_signal(ec); });
    teardown_signals_.async_wait([this](auto ec, int sig) { on_teardown_signal(ec, sig); });
    forward_signals_.async_wait([this](auto ec, int sig) { on_forward_signal(ec, sig); });
    if (options_.timeout) {
      timeout_timer_.expires_after(*options_.timeout);
      timeout_timer_.async_wait([this](auto ec) { on_timeout(ec); });
    }
    // Also without stall reports: the reading dates the ranks' calls, which --status shows.
    if (options_.stall_timeout.count() > 0 || options_.status_socket) check_stalls();
    if (options_.status_socket)
      status_ = std::make_unique<detail::StatusServer>(io_, [this] { return status_text(); });
    if (auto& c = options_.coordinator)
      c->start(io_, {.end_attempt = [this](const std::string& cause) { on_remote_end(cause); },
                     .lost = [this](const std::string& why) { on_lost(why); },
                     .views = [this] { return job_views(); },
                     .report = [this](const std::vector<std::string>& lines) { on_job_report(lines); }});
    start_attempt(0);
    io_.run();             // the job, then the console's last lines (see finish_attempt)
    if (options_.coordinator) options_.coordinator->detach();  // before io_ goes
    kill_leftovers_now();  // normally none: each attempt cleaned up after itself
    finish_run();
    result_.exit_code = run_.exit_code;
    result_.outcome = run_.outcome;
    return result_;
  }

 private:
  LiveAttempt& current() { return *attempts_.back(); }

  void start_attempt(int index) {
    tearing_down_ = false;
    ended_remotely_ = false;
    stalls_reported_.clear();
    mismatches_reported_.clear();
    mismatches_held_.clear();
    mismatched_ = false;
    auto live = std::make_unique<LiveAttempt>();
    live->record.index = index;
    live->record.start = WallClock::now();
    attempts_.push_back(std::move(live));
    if (!options_.coordinator) return launch(index);
    // A job over several nodes: the ranks start once every node is in.
    joining_ = true;
    options_.coordinator->join(index, [this, generation = attempts_.size()](const std::optional<RemoteVerdict>& ended) {
      if (generation != attempts_.size() || !joining_) return;
      joining_ = false;
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
    a.record.master_port = a.attempt.master_port;
    a.record.node_rank = a.attempt.node_rank;
    a.record.ranks.resize(a.attempt.processes.size());
    a.ranks.resize(a.attempt.processes.size());
    for (std::size_t i = 0; i < a.ranks.size(); ++i) {
      a.ranks[i].spec = &a.attempt.processes[i];
      a.ranks[i].record = &a.record.ranks[i];
      a.record.ranks[i].rank = a.attempt.processes[i].rank;
    }
    const std::string log_dir = stop_ == Stop::none ? attempt_log_dir(index) : "";
    for (auto& rank : a.ranks) {
      if (tearing_down_ || stop_ != Stop::none) break;  // a signal arrived or a spawn failed: start nothing more
      spawn(rank, log_dir);
    }
    check_ranks_gone();
    maybe_finish();
  }

  // DIR/<run-id>/attempt_<k>, created; "" without --log-dir. A directory we cannot make stops
  // the job before it starts: the user asked for logs, and running without them would lose output.
  std::string attempt_log_dir(int index) {
    if (options_.log_dir.empty()) return "";
    const auto dir = std::filesystem::path(options_.log_dir) / run_dir_name(options_.run_id) / ("attempt_" + std::to_string(index));
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      spdlog::error("--log-dir: cannot create {}: {}", dir.string(), ec.message());
      stop_ = Stop::spawn_error;
      return "";
    }
    return dir.string();
  }

  // The rank's log file; no file without --log-dir, or when it cannot be opened (said so).
  detail::LogFile open_log(const std::string& dir, int rank, const char* suffix) {
    if (dir.empty()) return {};
    const std::string path = dir + "/rank_" + std::to_string(rank) + suffix;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      spdlog::error("--log-dir: cannot open {}: {}", path, std::strerror(errno));
      return {};
    }
    return {fd, path};
  }

  void spawn(Rank& rank, const std::string& log_dir) {
    const ProcessSpec& spec = *rank.spec;
    detail::LogFile out_log = open_log(log_dir, spec.rank, ".out");
    detail::LogFile err_log = open_log(log_dir, spec.rank, ".err");
    if (!log_dir.empty() && (out_log.path().empty() || err_log.path().empty()))
      return spawn_failed(spec, "cannot open its log files");
    detail::SpawnedRank spawned;
    rank.record->start = WallClock::now();
    // The rank's flight recorder: a memfd it inherits, which we read for stall reports.
    ProcessSpec with_recorder = spec;
    rank.recorder = RecorderMemory::make();
    if (rank.recorder) {
      with_recorder.env.push_back(std::string(env::kRecorderFd) + "=" + std::to_string(rank.recorder->fd()));
      with_recorder.pass_fds.push_back(rank.recorder->fd());
    }
    try {
      spawned = detail::spawn_rank(with_recorder);
    } catch (const std::system_error& e) {
      return spawn_failed(spec, e.what());
    }
    if (rank.recorder) rank.recorder->close_fd();
    rank.record->pid = spawned.pid;
    spdlog::debug("started rank {} as pid {}", spec.rank, spawned.pid);

    const std::string prefix = options_.tag_output ? "[rank " + std::to_string(spec.rank) + "] " : "";
    rank.out = std::make_unique<Stream>(io_, spawned.out_fd, console_, Channel::out, prefix, std::move(out_log), false);
    rank.err = std::make_unique<Stream>(io_, spawned.err_fd, console_, Channel::err, prefix, std::move(err_log), true);
    read_more(*rank.out);
    read_more(*rank.err);
  }

  void spawn_failed(const ProcessSpec& spec, const std::string& why) {
    spdlog::error("cannot start rank {}: {}", spec.rank, why);
    if (stop_ == Stop::none) stop_ = Stop::spawn_error;
    teardown(SIGTERM);
  }

  void read_more(Stream& stream) {
    stream.pipe.async_read_some(asio::buffer(stream.buffer), [this, &stream](auto ec, std::size_t n) {
      if (n > 0) stream.output.feed(stream.buffer.data(), n);
      if (!ec) return read_when_accepted(stream);
      close_stream(stream);
      maybe_finish();
    });
  }

  // Reads on, unless the console holds all it may for a reader that is slow but reading: then
  // the rank waits, blocked on its own write as with a blocking console, and no byte is lost.
  // A console that stalls accepts again at once (it drops what it cannot hold).
  void read_when_accepted(Stream& stream) {
    if (console_.accepting(stream.channel)) return read_more(stream);
    stream.held = true;
    console_.when_accepting(stream.channel, [this, &stream] {
      stream.held = false;
      if (stream.open) read_more(stream);
    });
  }

  void close_stream(Stream& stream) {
    if (!stream.open) return;
    stream.open = false;
    stream.output.finish();
    boost::system::error_code ignored;
    stream.pipe.close(ignored);
  }

  Rank* find_rank(pid_t pid) {
    if (attempts_.empty()) return nullptr;
    for (auto& r : current().ranks)
      if (r.record->pid == pid && !r.record->status) return &r;
    return nullptr;
  }

  // Every exited child: ranks, and whatever they left behind that was re-parented to us.
  // All statuses are recorded before any is judged, so that ranks that ended on their own
  // at the same moment as the first failure are not called collateral.
  void reap_children() {
    std::vector<Rank*> exited;
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR) continue;
      if (pid <= 0) break;
      if (Rank* rank = find_rank(pid)) {
        rank->record->status = status;
        rank->record->end = WallClock::now();
        spdlog::debug("rank {} (pid {}) {}", rank->spec->rank, pid, detail::describe(status));
        exited.push_back(rank);
      } else {
        spdlog::debug("reaped pid {}, left behind by a rank: {}", pid, detail::describe(status));
      }
    }
    // The heaviest of the batch first, so that its weight decides among exits seen together.
    std::stable_sort(exited.begin(), exited.end(),
                     [](const Rank* x, const Rank* y) { return blame_of(*x->record) > blame_of(*y->record); });
    for (Rank* rank : exited) judge(*rank);
    check_ranks_gone();
  }

  // Makes `rank`, just reaped, the attempt's first failure if it is one (see Blame), and
  // stops the others at the first.
  void judge(Rank& rank) {
    auto& a = current();
    const Blame blame = blame_of(*rank.record);
    if (blame == Blame::none) return;
    const auto index = static_cast<std::size_t>(&rank - a.ranks.data());
    if (!a.record.first_failure) {
      // Stopped by a signal, the timeout or another node: not a failure of its own. Except a
      // rank that was already ending on its own when another node's end came (not collateral):
      // it may be the cause that node's failure answers (a peer that lost its connection to
      // it), and the rendezvous can only follow that blame to it if it hears of it.
      if (tearing_down_ && !(ended_remotely_ && !rank.record->collateral)) return;
      a.record.first_failure = index;
      if (options_.coordinator) options_.coordinator->failed(a.record.index, local_failure(rank));
      if (blame == Blame::root_cause) return teardown(SIGTERM);
      // A non-zero exit may be a survivor's answer to a peer that is still on its way out: a
      // rank in exit() closes its connections in static destructors, then runs the rest of
      // them. Stopped now, that peer would count as collateral and its own exit code be lost,
      // so it gets a moment to end of its own accord (those that only wait are stopped after).
      settle_timer_.expires_after(kSettleTime);
      settle_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
        if (!ec && generation == attempts_.size() && !tearing_down_ && !finished_) teardown(SIGTERM);
      });
      return;
    }
    const Rank& blamed = a.ranks[*a.record.first_failure];
    if (blame <= blame_of(*blamed.record)) return;
    spdlog::debug("rank {} {}: the cause of rank {}'s failure, not a consequence of it", rank.spec->rank,
                  detail::describe(*rank.record->status), blamed.spec->rank);
    a.record.first_failure = index;
  }

  void on_child_signal(const boost::system::error_code& ec) {
    if (ec) return;
    reap_children();
    if (cleaning_ && (!has_children() || detail::descendants_of(::getpid()).empty())) end_cleaning();
    maybe_finish();
    if (!finished_) child_signal_.async_wait([this](auto e, int) { on_child_signal(e); });
  }

  // Once every rank of the attempt is reaped, what they left behind goes too: at once when
  // the attempt is being torn down, else SIGTERM and SIGKILL after the grace period.
  void check_ranks_gone() {
    // While the nodes meet the attempt has no rank yet: none can be gone.
    if (attempts_.empty() || joining_) return;
    auto& a = current();
    if (a.ranks_gone || std::any_of(a.ranks.begin(), a.ranks.end(), [](const Rank& r) { return r.running(); }))
      return;
    a.ranks_gone = true;
    kill_timer_.cancel();
    const auto left = has_children() ? detail::descendants_of(::getpid()) : std::vector<pid_t>();
    if (left.empty()) return start_drain();
    if (tearing_down_) {
      kill_leftovers_now();
      return start_drain();
    }
    spdlog::debug("every rank has exited; stopping {} process(es) they left behind", left.size());
    detail::signal_descendants(SIGTERM);
    cleaning_ = true;
    leftover_timer_.expires_after(options_.grace);
    leftover_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
      if (ec || generation != attempts_.size()) return;
      kill_leftovers_now();
      end_cleaning();
    });
  }

  void end_cleaning() {
    if (!cleaning_) return;
    cleaning_ = false;
    leftover_timer_.cancel();
    start_drain();
    maybe_finish();
  }

  // SIGKILL to every descendant until none is left; those re-parented to us are reaped here.
  // Bounded, because a process stuck in the kernel (state D) cannot be hurried.
  void kill_leftovers_now() {
    for (int round = 0; round < 200; ++round) {
      if (!has_children()) return;
      const auto n = detail::signal_descendants(SIGKILL);
      reap_children();
      if (n == 0) return;
      ::usleep(10 * 1000);
    }
    spdlog::warn("processes left behind by the ranks did not die within 2 s of SIGKILL");
  }

  void start_drain() {
    drain_timer_.expires_after(kDrainTime);
    drain_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
      if (ec || generation != attempts_.size()) return;
      // A stream held back for a slow console has output left, not an EOF that never comes.
      const auto held = [](const Rank& r) { return (r.out && r.out->held) || (r.err && r.err->held); };
      if (std::any_of(current().ranks.begin(), current().ranks.end(), held)) return start_drain();
      for (auto& r : current().ranks) {
        if (r.out) close_stream(*r.out);
        if (r.err) close_stream(*r.err);
      }
      maybe_finish();
    });
  }

  void teardown(int sig) {
    if (!tearing_down_) {
      tearing_down_ = true;
      kill_timer_.expires_after(options_.grace);
      kill_timer_.async_wait([this, generation = attempts_.size()](auto ec) {
        if (!ec && generation == attempts_.size()) signal_running(SIGKILL);
      });
    }
    // A rank already exiting (not yet reaped) ends of its own accord, not of ours: see Blame.
    for (auto& r : current().ranks)
      if (r.running() && !detail::is_exiting(r.record->pid)) r.record->collateral = true;
    signal_running(sig);
  }

  void signal_running(int sig) {
    if (attempts_.empty()) return;
    // A stopped rank (SIGSTOP, a frozen one a stall report named) acts on SIGTERM only once
    // continued, as a shell's kill does for a stopped job; else it would wait out --grace.
    const bool wake = sig == SIGTERM || sig == SIGINT || sig == SIGHUP;
    for (auto& r : current().ranks)
      if (r.running()) {
        ::kill(-r.record->pid, sig);
        if (wake) ::kill(-r.record->pid, SIGCONT);
      }
  }

  void on_teardown_signal(const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (finished_) return console_.abandon();  // the job is over: stop waiting for the console
    if (joining_ || awaiting_verdict_) {  // no rank of ours runs
      joining_ = awaiting_verdict_ = false;
      interrupted_by_ = sig;
      stop_ = Stop::interrupted;
      spdlog::info("{}: leaving the job's rendezvous", detail::signal_name(sig));
      return end_job();
    }
    if (interrupted_by_ && std::chrono::steady_clock::now() - interrupted_at_ < kSameSignal) {
      // One Ctrl-C reaches us twice when a wrapper forwards it too (timeout; a script's trap,
      // maybe as SIGTERM): the terminal sends it to the whole foreground group.
      spdlog::debug("{} within {} ms of the first: the same stop, delivered twice", detail::signal_name(sig),
                    kSameSignal.count());
    } else if (interrupted_by_) {
      spdlog::warn("{} again: killing every rank now", detail::signal_name(sig));
      signal_running(SIGKILL);
      detail::signal_descendants(SIGKILL);
    } else {
      interrupted_by_ = sig;
      interrupted_at_ = std::chrono::steady_clock::now();
      if (stop_ == Stop::none) stop_ = Stop::interrupted;
      spdlog::info("{}: stopping every rank", detail::signal_name(sig));
      teardown(detail::is_stop_signal(sig) ? sig : SIGTERM);
    }
    teardown_signals_.async_wait([this](auto e, int s) { on_teardown_signal(e, s); });
  }

  void on_forward_signal(const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("forwarding {} to every rank", detail::signal_name(sig));
    signal_running(sig);
    forward_signals_.async_wait([this](auto e, int s) { on_forward_signal(e, s); });
  }

  void on_timeout(const boost::system::error_code& ec) {
    if (ec || finished_) return;
    if (stop_ == Stop::none) stop_ = Stop::timed_out;
    if (joining_ || awaiting_verdict_) {
      joining_ = awaiting_verdict_ = false;
      return end_job();
    }
    spdlog::info("timeout: stopping every rank");
    teardown(SIGTERM);
  }

  // Reads every running rank's recorder; a rank waiting in one collective longer than
  // --stall-timeout gets the report, once per collective.
  std::vector<detail::RankView> rank_views() {
    std::vector<detail::RankView> views;
    for (auto& r : attempts_.back()->ranks) {
      if (r.record->pid <= 0) continue;
      detail::RankView v;
      v.rank = r.spec->rank;
      v.pid = r.record->pid;
      v.running = r.running();
      if (!v.running && r.record->status) v.ended = detail::describe(*r.record->status);
      if (r.recorder) {
        v.slots = r.recorder->read();
        v.pid = r.recorder->recording(v.pid);
      }
      views.push_back(std::move(v));
    }
    return views;
  }

  // Collectives the ranks' recorders disagree on, each said once. `running`: the ranks may
  // still reach a call some have not (see mismatch_report).
  void check_mismatches(const std::vector<detail::RankView>& views, bool running) {
    for (const auto& line : detail::mismatch_report(views, mismatches_reported_, &mismatches_held_, running))
      spdlog::error("{}", line);
  }

  void check_stalls() {
    if (finished_) return;
    if (!attempts_.empty() && !joining_ && !tearing_down_) {
      const auto views = rank_views();
      if (options_.stall_timeout.count() > 0) {
        check_mismatches(views, true);
        if (auto report = detail::stall_report(views, common::recorder::now_ns(), options_.stall_timeout, stalls_reported_))
          on_stall(std::move(*report));
      }
    }
    stall_timer_.expires_after(kStallCheck);
    stall_timer_.async_wait([this](auto ec) {
      if (!ec) check_stalls();
    });
  }

  // A stall report: said, kept for summary.json, the suspects' stacks added where gdb can get
  // them; then, with --stall-action kill, the attempt ends as a failure of the suspect.
  void on_stall(detail::StallReport report) {
    say_stall(report.lines);
    // Over several nodes, what this node sees may be half the story: ask for the whole.
    if (options_.coordinator) options_.coordinator->stalled(current().record.index);
    const auto generation = attempts_.size();
    inspect_stacks(report.to_inspect, [this, generation, suspect = report.suspect](std::vector<std::string> lines) {
      if (generation != attempts_.size()) return;
      say_stall(lines);
      auto& a = current();
      if (options_.stall_action == SuperviseOptions::StallAction::kill && !tearing_down_ && !finished_ && !a.ranks_gone)
        stall_kill(suspect);
    });
  }

  // The stacks of `ranks` by gdb, off the event loop (attaching takes a second or two), then
  // `done` on it with the lines; at once with none where gdb is not installed.
  void inspect_stacks(const std::vector<std::pair<int, pid_t>>& ranks,
                      std::function<void(std::vector<std::string>)> done) {
    if (ranks.empty() || !options_.stacks || !detail::stack_tool_available()) return done({});
    auto guard = std::make_shared<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
    std::thread([this, ranks, done = std::move(done), guard]() mutable {
      std::vector<std::string> lines;
      for (const auto& [rank, pid] : ranks) {
        const auto stack = detail::stack_of(pid);
        if (stack.empty()) continue;
        lines.push_back(fmt::format("stall: rank {} (pid {}), its threads' stacks (gdb):", rank, pid));
        for (const auto& line : stack) lines.push_back("stall:   | " + line);
      }
      asio::post(io_, [done = std::move(done), lines = std::move(lines), guard]() mutable {
        done(std::move(lines));
        guard->reset();
      });
    }).detach();
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

  // This node's ranks for a job-wide stall report (stall_report.hpp's JSON, under the
  // rendezvous' frame size).
  std::string job_views() {
    if (attempts_.empty() || joining_) return "[]";
    return detail::views_to_json(rank_views(), common::recorder::now_ns(), host_, detail::kViewsBudget);
  }

  void on_job_report(const std::vector<std::string>& lines) {
    if (attempts_.empty() || finished_) return;
    say_stall(lines);
  }

  // A stall report's lines: on the console, and kept for summary.json.
  void say_stall(const std::vector<std::string>& lines) {
    for (const auto& line : lines) spdlog::error("{}", line);
    auto& stall = current().record.stall;
    stall.insert(stall.end(), lines.begin(), lines.end());
  }

  // `idist-run --status`: where this node's ranks are now.
  std::string status_text() {
    std::string out = fmt::format("idist-run {} on {}: ", ::getpid(), host_);
    if (attempts_.empty() || joining_) return out + "waiting for the job's nodes to meet\n";
    auto& a = current();
    const auto running = std::chrono::duration<double>(WallClock::now() - a.record.start).count();
    out += fmt::format("attempt {}, {} rank{} here, running {:.1f} s\n", a.record.index, a.ranks.size(),
                       a.ranks.size() == 1 ? "" : "s", running);
    for (const auto& line : detail::status_table(rank_views(), common::recorder::now_ns())) out += line + "\n";
    if (options_.coordinator) out += "(this node's ranks: each node's idist-run answers for its own)\n";
    return out;
  }

  // Another node failed or vanished: this attempt ends here too.
  void on_remote_end(const std::string& cause) {
    if (finished_ || joining_ || attempts_.empty()) return;
    auto& a = current();
    if (a.record.ended_by.empty()) a.record.ended_by = cause;
    if (tearing_down_ || a.ranks_gone) return;
    spdlog::error("attempt {}: {}; stopping the ranks here", a.record.index, cause);
    ended_remotely_ = true;
    teardown(SIGTERM);
  }

  // The rendezvous is gone (or refused us): nothing can decide the next attempt.
  void on_lost(const std::string& why) {
    if (finished_) return;
    if (stop_ == Stop::none) stop_ = Stop::coordination;
    coordination_error_ = why;
    if (joining_ || attempts_.empty()) return;  // the join's callback hears it
    if (!current().ranks_gone && !tearing_down_) {
      spdlog::error("{}; stopping the ranks here", why);
      teardown(SIGTERM);
    }
  }

  LocalFailure local_failure(const Rank& rank) const {
    LocalFailure f;
    f.rank = rank.spec->rank;
    f.how = detail::describe(*rank.record->status);
    f.exit_code = detail::exit_code_of(*rank.record->status);
    f.root_cause = blame_of(*rank.record) == Blame::root_cause;
    // Its output may not all be in yet at its first report; the final one (over) has it.
    if (rank.err) f.lost_peer = lost_peer(rank.err->output.tail().last_lines(kTailLines));
    return f;
  }

  void maybe_finish() {
    if (finished_ || cleaning_ || awaiting_verdict_ || joining_) return;
    for (const auto& r : current().ranks) {
      if (r.running()) return;
      if ((r.out && r.out->open) || (r.err && r.err->open)) return;
    }
    if (!current().ranks_gone) return;
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
    check_mismatches(rank_views(), false);
    if (!mismatches_reported_.empty()) mismatched_ = true;
    if (a.record.first_failure) follow_lost_connections(a);
    // A node stopped here (a signal, the timeout, a rank it could not start, a lost rendezvous)
    // leaves the job: its closed connection ends the attempt on the other nodes.
    if (options_.coordinator && stop_ == Stop::none) return ask_verdict(a);
    const bool failed = a.record.first_failure || a.record.stalled_rank;
    const bool restart = failed && stop_ == Stop::none && a.record.index < options_.max_restarts;
    if (a.record.first_failure && options_.report_failure) {
      report_failure(a, local_then(a, restart));
    } else if (a.record.stalled_rank && options_.report_failure) {
      spdlog::error("{}stalled (see the stall report above){}{}",
                    options_.max_restarts > 0 ? "attempt " + std::to_string(a.record.index) + ": " : "",
                    detail::collateral_list(a.record), local_then(a, restart));
    }
    if (restart) return start_attempt(a.record.index + 1);
    end_job();
  }

  // Every node's ranks are gone: the rendezvous says what follows, the same for every node.
  void ask_verdict(LiveAttempt& a) {
    awaiting_verdict_ = true;
    std::optional<LocalFailure> failure;
    if (a.record.first_failure) {
      failure = local_failure(a.ranks[*a.record.first_failure]);
    } else if (a.record.stalled_rank) {
      failure = stall_failure(a);
    }
    options_.coordinator->over(a.record.index, failure, [this](const RemoteVerdict& v) {
      awaiting_verdict_ = false;
      auto& a = current();
      using Then = RemoteVerdict::Then;
      if (v.then != Then::success && a.record.ended_by.empty()) a.record.ended_by = v.cause;
      std::string then;
      if (v.then == Then::restart)
        then = fmt::format("; restarting every node (attempt {}, {} restart{} left)", v.next_attempt, v.restarts_left,
                           v.restarts_left == 1 ? "" : "s");
      else if (v.then == Then::failure && stop_ == Stop::none)
        then = options_.max_restarts > 0 ? fmt::format("; the job ends (--max-restarts {})", options_.max_restarts)
                                         : std::string("; the job ends");
      // One line for the job, the same on every node; the named rank's own lines where it ran.
      if (v.then != Then::success) spdlog::error("attempt {} ended: {}{}", a.record.index, v.cause, then);
      if (a.record.first_failure && options_.report_failure) {
        const auto& mine = a.record.ranks[*a.record.first_failure];
        if (mine.rank == v.rank) {
          report_stderr(a);
        } else {
          spdlog::info("here, rank {} {} after that{}", mine.rank, detail::describe(*mine.status),
                       detail::collateral_list(a.record));
        }
      }
      if (v.then == Then::failure) job_failure_ = v;
      if (v.then == Then::restart && stop_ == Stop::none) return start_attempt(v.next_attempt);
      end_job();
    });
  }

  // "; restarting every rank (...)" or "; no restarts left (...)": what follows a local failure.
  std::string local_then(const LiveAttempt& a, bool restart) const {
    if (restart)
      return "; restarting every rank (attempt " + std::to_string(a.record.index + 1) + " of at most " +
             std::to_string(options_.max_restarts + 1) + ")";
    if (options_.max_restarts > 0 && stop_ == Stop::none)
      return "; no restarts left (--max-restarts " + std::to_string(options_.max_restarts) + ")";
    return "";
  }

  void end_job() {
    if (finished_) return;
    finished_ = true;
    boost::system::error_code ignored;
    child_signal_.cancel(ignored);
    forward_signals_.cancel(ignored);
    timeout_timer_.cancel();
    stall_timer_.cancel();
    status_.reset();  // its pending accept would keep the event loop going
    conclude();
    // The console gets what it still holds, the summary included, while it keeps taking bytes;
    // a teardown signal meanwhile stops the wait. Then the event loop has nothing left to do
    // (node 0 hosts the rendezvous until every node has its verdict).
    auto release = [this] {
      console_.close([this] {
        boost::system::error_code e;
        teardown_signals_.cancel(e);
      });
    };
    if (options_.coordinator) return options_.coordinator->finish(run_.outcome, release);
    release();
  }

  // Two ranks that both exit non-zero weigh the same (Blame), and the reaping order cannot
  // tell which went first: a dying process's sockets close before its parent hears of its
  // death, and children reaped together come oldest first. A rank that failed because it
  // lost its connection to another says so on stderr (libidist names the rank); once every
  // rank's output is in, the blame follows that, to a rank that failed on its own.
  void follow_lost_connections(LiveAttempt& a) {
    std::vector<bool> visited(a.ranks.size());
    for (;;) {
      visited[*a.record.first_failure] = true;
      const Rank& blamed = a.ranks[*a.record.first_failure];
      if (!blamed.err) return;
      const auto peer = lost_peer(blamed.err->output.tail().last_lines(kTailLines));
      if (!peer) return;
      const auto cause = std::find_if(a.ranks.begin(), a.ranks.end(),
                                      [&](const Rank& r) { return r.spec->rank == *peer && blame_of(*r.record) != Blame::none; });
      // Two ranks that each say they lost the other: the first seen keeps the blame.
      if (cause == a.ranks.end() || visited[static_cast<std::size_t>(cause - a.ranks.begin())]) return;
      spdlog::debug("rank {} lost its connection to rank {}, which failed on its own: blaming rank {}",
                    blamed.spec->rank, *peer, *peer);
      a.record.first_failure = static_cast<std::size_t>(cause - a.ranks.begin());
    }
  }

  void report_failure(const LiveAttempt& a, const std::string& then) {
    const auto i = *a.record.first_failure;
    const auto& r = a.record.ranks[i];
    const bool restarts = options_.max_restarts > 0;
    spdlog::error("{}rank {} (pid {} on {}) {}{}{}", restarts ? "attempt " + std::to_string(a.record.index) + ": " : "",
                  r.rank, r.pid, host_, detail::describe(*r.status), detail::collateral_list(a.record), then);
    report_stderr(a);
    report_early_exit(a);
  }

  // The rank the failed one lost its connection to had exited 0: no failure of its own to
  // blame, but the cause all the same (it returned while the others still called into the job).
  void report_early_exit(const LiveAttempt& a) const {
    const auto i = *a.record.first_failure;
    if (!a.ranks[i].err) return;
    const auto peer = lost_peer(a.ranks[i].err->output.tail().last_lines(kTailLines));
    if (!peer) return;
    for (const auto& r : a.record.ranks)
      if (r.rank == *peer && r.status && WIFEXITED(*r.status) && WEXITSTATUS(*r.status) == 0)
        spdlog::error("rank {} had exited with code 0 while the others still ran: a rank that returns before a "
                      "collective the others call, or without idist::finalize(), fails them",
                      r.rank);
  }

  // The last lines of the attempt's first failure's stderr.
  void report_stderr(const LiveAttempt& a) {
    const auto i = *a.record.first_failure;
    const auto& r = a.record.ranks[i];
    if (!a.ranks[i].err) return;
    const auto lines = a.ranks[i].err->output.tail().last_lines(kTailLines);
    if (lines.empty()) return;
    spdlog::error("last lines of rank {}'s stderr:", r.rank);
    for (const auto& line : lines) spdlog::error("  | {}", line);
  }

  // The outcome, its exit code and its summary lines, at the end of the last attempt: the
  // lines queue behind the ranks' output.
  void conclude() {
    run_.run_id = options_.run_id;
    run_.host = host_;
    for (const auto& a : attempts_) run_.attempts.push_back(a->record);
    const AttemptRecord& last = run_.attempts.back();
    const std::string stopped = detail::collateral_list(last);
    const double timeout_s = options_.timeout ? static_cast<double>(options_.timeout->count()) / 1000 : 0;
    if (job_failure_ && stop_ == Stop::none) {
      // The job's verdict, the same on every node: its first failure, wherever it was.
      run_.exit_code = job_failure_->exit_code;
      run_.outcome = job_failure_->cause;
      if (last.first_failure) record_failure(*attempts_.back());
      spdlog::error("the job failed: {}", run_.outcome);
    } else if (stop_ == Stop::coordination) {
      run_.exit_code = job_failure_ ? job_failure_->exit_code : 1;
      run_.outcome = coordination_error_;
      spdlog::error("{}{}", run_.outcome, stopped);
    } else if (last.first_failure) {
      const auto& r = last.ranks[*last.first_failure];
      run_.exit_code = detail::exit_code_of(*r.status);
      run_.outcome = "rank " + std::to_string(r.rank) + " " + detail::describe(*r.status);
      record_failure(*attempts_.back());
      if (stop_ == Stop::timed_out) spdlog::error("timed out after {:g}s while stopping the ranks", timeout_s);
    } else if (last.stalled_rank && stop_ == Stop::none) {
      run_.exit_code = kStallExit;
      run_.outcome = fmt::format("stalled (--stall-action kill): {}",
                                 last.stall.empty() ? "see the report" : last.stall.front().substr(std::string_view("stall: ").size()));
      spdlog::error("exit status {}: the job stalled and was stopped{}", kStallExit, stopped);
    } else if (stop_ == Stop::timed_out) {
      run_.exit_code = kTimeoutExit;
      run_.outcome = fmt::format("timed out after {:g}s", timeout_s);
      spdlog::error("{}{}", run_.outcome, stopped);
    } else if (stop_ == Stop::interrupted) {
      run_.exit_code = 128 + *interrupted_by_;
      run_.outcome = "interrupted by " + detail::signal_name(*interrupted_by_);
      spdlog::error("{}{}", run_.outcome, stopped);
    } else if (stop_ == Stop::spawn_error) {
      run_.exit_code = 1;
      run_.outcome = "could not start every rank";
    } else if (mismatched_) {
      // Every rank exited 0, but at least one collective was called differently by different
      // ranks: some results are wrong. The exit status must say so.
      run_.exit_code = 1;
      run_.outcome = "every rank exited 0, but their collectives did not match (see the mismatch lines): results are wrong";
      spdlog::error("exit status 1: {}", run_.outcome);
    } else {
      run_.outcome = "succeeded";
      if (run_.attempts.size() > 1)
        spdlog::warn("succeeded on attempt {} after {} restart(s)", last.index, run_.attempts.size() - 1);
    }
    report_log_loss();
  }

  // The first failure of the last attempt, for supervise_job's caller.
  void record_failure(const LiveAttempt& a) {
    const auto i = *a.record.first_failure;
    const auto& r = a.record.ranks[i];
    JobResult::Failure f;
    f.rank = r.rank;
    f.pid = r.pid;
    f.host = host_;
    if (WIFEXITED(*r.status)) f.exit_code = WEXITSTATUS(*r.status);
    if (WIFSIGNALED(*r.status)) f.signal = WTERMSIG(*r.status);
    f.how = detail::describe(*r.status);
    for (const auto& other : a.record.ranks)
      if (other.collateral) f.stopped.push_back(other.rank);
    if (a.ranks[i].err) f.last_stderr = a.ranks[i].err->output.tail().last_lines(kTailLines);
    result_.first_failure = std::move(f);
  }

  // A line for each log file that could not take every byte, and a job that succeeded
  // otherwise does not exit 0 (kLogLossExit).
  void report_log_loss() {
    for (const auto& a : attempts_)
      for (const auto& r : a->ranks)
        for (const Stream* stream : {r.out.get(), r.err.get()}) {
          if (stream == nullptr || stream->output.log().lost() == 0) continue;
          const auto& log = stream->output.log();
          run_.log_bytes_lost += log.lost();
          spdlog::error("--log-dir: {}: {}: {} bytes lost (the file has the first {} of {})", log.path(),
                        std::strerror(log.error()), log.lost(), log.written(), log.written() + log.lost());
        }
    if (run_.log_bytes_lost == 0 || run_.exit_code != 0) return;
    run_.exit_code = kLogLossExit;
    run_.outcome = fmt::format("every rank succeeded, but {} bytes of their output are missing from --log-dir",
                               run_.log_bytes_lost);
    spdlog::error("exit status {}: every rank succeeded, but their logs under {} lack {} bytes; free space there "
                  "(or pick another --log-dir) and run again",
                  kLogLossExit, run_dir(), run_.log_bytes_lost);
  }

  // After the console is done with: what it dropped, then summary.json, which records it.
  void finish_run() {
    run_.stdout_dropped = console_.dropped(Channel::out);
    run_.stderr_dropped = console_.dropped(Channel::err);
    report_dropped(Channel::out);
    report_dropped(Channel::err);
    if (!options_.log_dir.empty()) write_summary();
  }

  // One line per console stream that dropped output. The exit status stays the job's: the
  // console is a view of the output that its reader chose (a `| head`, a pager left alone),
  // the ranks' answer is not wrong for it, and a `| head` must not turn a good run into a
  // failed one for a scheduler or a restart loop. With --log-dir nothing is lost: the files
  // have every byte. The line says where they are, or that --log-dir keeps them.
  void report_dropped(Channel channel) {
    const detail::Dropped& d = console_.dropped(channel);
    if (d.bytes == 0) return;
    const char* suffix = channel == Channel::out ? "out" : "err";
    const std::string where =
        options_.log_dir.empty() ? std::string("run with --log-dir to keep every byte")
        : run_.log_bytes_lost == 0 ? fmt::format("every byte is in {}/attempt_*/rank_*.{}", run_dir(), suffix)
                                  : fmt::format("{}/attempt_*/rank_*.{} have what the disk took", run_dir(), suffix);
    spdlog::warn("{}: {} line(s), {} bytes not shown: {}; {}", detail::channel_name(channel), d.lines, d.bytes,
                 console_.why_dropped(channel), where);
  }

  // DIR/<run-id>
  std::string run_dir() const {
    return (std::filesystem::path(options_.log_dir) / run_dir_name(options_.run_id)).string();
  }

  // summary.json, whole or not at all: written aside, then renamed. One that cannot be
  // written is part of the logs lost: a job that succeeded otherwise does not exit 0.
  void write_summary() {
    const std::string dir = run_dir();
    const std::string path = dir + "/summary.json";
    const std::string temporary = path + ".tmp";
    std::error_code ignored;
    std::filesystem::create_directories(dir, ignored);
    const std::string text = detail::summary_json(run_);
    int error = 0;
    if (const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); fd < 0) {
      error = errno;
    } else {
      detail::LogFile file(fd, temporary);
      file.write(text);
      error = file.error();
    }
    if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
    if (error != 0) {
      ::unlink(temporary.c_str());
      const bool only_failure = run_.exit_code == 0;
      if (only_failure) run_.exit_code = kLogLossExit;
      return spdlog::error("--log-dir: cannot write {}: {}{}", path, std::strerror(error),
                           only_failure ? fmt::format("; exit status {}, although every rank succeeded", kLogLossExit) : "");
    }
    if (run_.exit_code != 0) spdlog::error("logs and summary.json in {}", dir);
  }

  const MakeAttempt& make_attempt_;
  SuperviseOptions options_;
  std::string host_;
  asio::io_context io_;  // first, so that it outlives every object that uses it
  detail::Console console_{io_};  // before the attempts: their output goes to it
  asio::signal_set child_signal_{io_, SIGCHLD};
  asio::signal_set teardown_signals_{io_};
  asio::signal_set forward_signals_{io_};
  asio::steady_timer kill_timer_{io_};      // SIGTERM -> SIGKILL
  asio::steady_timer settle_timer_{io_};    // first failure a non-zero exit -> SIGTERM
  asio::steady_timer leftover_timer_{io_};  // leftovers: SIGTERM -> SIGKILL
  asio::steady_timer drain_timer_{io_};
  asio::steady_timer timeout_timer_{io_};
  asio::steady_timer stall_timer_{io_};
  std::unique_ptr<detail::StatusServer> status_;
  detail::CallKeys stalls_reported_;      // this attempt's
  detail::CallKeys mismatches_reported_;  // the same
  detail::HeldMismatches mismatches_held_;  // seen before every rank of the group reached them
  bool mismatched_ = false;  // the last attempt's ranks called different collectives somewhere
  // Every attempt stays until the end: its handlers may still be queued, and the summary needs it.
  std::vector<std::unique_ptr<LiveAttempt>> attempts_;
  bool tearing_down_ = false;
  bool ended_remotely_ = false;  // this attempt's teardown came from another node's end
  bool joining_ = false;           // waiting for the other nodes before the attempt's ranks start
  bool awaiting_verdict_ = false;  // this node's ranks are gone; the other nodes' may not be
  std::optional<RemoteVerdict> job_failure_;
  std::string coordination_error_;
  bool cleaning_ = false;  // waiting for leftovers of a successful attempt
  bool finished_ = false;
  Stop stop_ = Stop::none;
  std::optional<int> interrupted_by_;
  std::chrono::steady_clock::time_point interrupted_at_;
  detail::RunRecord run_;  // by conclude()
  JobResult result_;
};

// What supervision changes in the process and puts back afterwards: every signal's
// disposition (Asio's signal sets leave SIG_DFL behind, not what was there) and the
// child-subreaper flag.
class ProcessState {
 public:
  ProcessState() {
    for (int sig = 1; sig < NSIG; ++sig) saved_[sig] = ::sigaction(sig, nullptr, &actions_[sig]) == 0;
    int flag = 0;
    if (::prctl(PR_GET_CHILD_SUBREAPER, &flag) == 0) subreaper_ = flag != 0;
  }
  ~ProcessState() {
    for (int sig = 1; sig < NSIG; ++sig)
      if (saved_[sig] && sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &actions_[sig], nullptr);
    if (subreaper_) ::prctl(PR_SET_CHILD_SUBREAPER, *subreaper_ ? 1 : 0);
  }
  ProcessState(const ProcessState&) = delete;
  ProcessState& operator=(const ProcessState&) = delete;

 private:
  std::array<struct sigaction, NSIG> actions_{};
  std::array<bool, NSIG> saved_{};
  std::optional<bool> subreaper_;
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

#include "rank_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "idist/env_contract.hpp"
#include "process_tree.hpp"
#include "spawn.hpp"

namespace idist::launchers::supervision {

using detail::Channel;
using detail::WallClock;

std::unique_ptr<RecorderMemory> RecorderMemory::make(const RecorderOptions& options) {
  // The trace's 4 MiB cost memory only where a ring writes them (a memfd's pages come when touched).
  const std::size_t size = options.trace ? common::recorder::traced_size() : sizeof(common::recorder::Segment);
  const int fd = detail::memfd_for_ranks("idist-flight-recorder", size);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  auto* segment = new (p) common::recorder::Segment();
  segment->tracer = static_cast<std::int32_t>(::getpid());  // gdb, for stall reports
  segment->count_calls.store(options.count_calls, std::memory_order_relaxed);
  segment->traced.store(options.trace ? 1 : 0, std::memory_order_relaxed);
  // The trace's area stays as the memfd made it: zeros are its empty state, untouched pages.
  return std::unique_ptr<RecorderMemory>(new RecorderMemory(fd, segment, size));
}

RecorderMemory::~RecorderMemory() {
  if (fd_ >= 0) ::close(fd_);
  ::munmap(segment_, size_);
}

void RecorderMemory::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

pid_t RecorderMemory::recording(pid_t rank) const {
  const pid_t pid = segment_->pid;
  return pid > 0 && pid != rank && ::getpgid(pid) == rank ? pid : rank;
}

// A call entered while we read moves the count: it is dated now, not by the count we saw
// before it (which could be a long computation ago: a false stall).
std::vector<detail::Recorded> RecorderMemory::read() {
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

// As a child subreaper we adopt every orphan in our tree, so a process the ranks left behind
// is always a child of ours or below one: without children there is nothing to look for, and
// the /proc scan that finds descendants (a file read per process on the machine, a few
// milliseconds) can be skipped. That scan ran twice at the end of every job, most of what
// `idist-run -n 1 /bin/true` cost over `/bin/true` (docs/BENCHMARKS.md).
bool has_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

std::optional<std::string> make_attempt_log_dir(const std::string& log_dir, const std::string& run_id, int index) {
  if (log_dir.empty()) return "";
  const auto dir = std::filesystem::path(log_dir) / run_dir_name(run_id) / ("attempt_" + std::to_string(index));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) return dir.string();
  spdlog::error("--log-dir: cannot create {}: {}", dir.string(), ec.message());
  return std::nullopt;
}

std::string run_dir_name(std::string id) {
  std::replace(id.begin(), id.end(), '/', '_');
  return id.empty() || id == "." || id == ".." ? "run" : id;
}

std::vector<std::string> describe_processes(const std::vector<pid_t>& pids) {
  std::vector<std::string> out;
  for (const pid_t pid : pids) {
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(comm, name);
    out.push_back(name.empty() ? "pid " + std::to_string(pid) : "pid " + std::to_string(pid) + " (" + name + ")");
  }
  return out;
}

namespace {

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

}  // namespace

ProcessContext::ProcessContext(asio::io_context& io, detail::Console& console, bool tag_output,
                               RecorderOptions recorder, std::function<void()> output_closed)
    : io_(io), console_(console), tag_output_(tag_output), recorder_(recorder),
      output_closed_(std::move(output_closed)) {}

std::optional<std::string> ProcessContext::start(Rank& rank, const std::string& log_dir) {
  const ProcessSpec& spec = *rank.spec;
  detail::LogFile out_log = open_log(log_dir, spec.rank, ".out");
  detail::LogFile err_log = open_log(log_dir, spec.rank, ".err");
  if (!log_dir.empty() && (out_log.path().empty() || err_log.path().empty())) return "cannot open its log files";
  rank.record->start = WallClock::now();
  // The rank's flight recorder: a memfd it inherits, which we read for stall reports.
  ProcessSpec with_recorder = spec;
  rank.recorder = RecorderMemory::make(recorder_);
  if (rank.recorder) {
    with_recorder.env.push_back(std::string(env::kRecorderFd) + "=" + std::to_string(rank.recorder->fd()));
    with_recorder.pass_fds.push_back(rank.recorder->fd());
  }
  detail::SpawnedRank spawned;
  try {
    spawned = detail::spawn_rank(with_recorder);
  } catch (const std::system_error& e) {
    return e.what();
  }
  if (rank.recorder) rank.recorder->close_fd();
  rank.record->pid = spawned.pid;
  spdlog::debug("started rank {} as pid {}", spec.rank, spawned.pid);

  const std::string prefix = tag_output_ ? "[rank " + std::to_string(spec.rank) + "] " : "";
  rank.out = std::make_unique<Stream>(io_, spawned.out_fd, console_, Channel::out, prefix, std::move(out_log), false);
  rank.err = std::make_unique<Stream>(io_, spawned.err_fd, console_, Channel::err, prefix, std::move(err_log), true);
  read_more(*rank.out);
  read_more(*rank.err);
  return std::nullopt;
}

void ProcessContext::read_more(Stream& stream) {
  stream.pipe.async_read_some(asio::buffer(stream.buffer), [this, &stream](auto ec, std::size_t n) {
    if (n > 0) stream.output.feed(stream.buffer.data(), n);
    if (!ec) return read_when_accepted(stream);
    close_stream(stream);
    output_closed_();
  });
}

// Reads on, unless the console holds all it may for a reader that is slow but reading: then
// the rank waits, blocked on its own write as with a blocking console, and no byte is lost.
// A console that stalls accepts again at once (it drops what it cannot hold).
void ProcessContext::read_when_accepted(Stream& stream) {
  if (console_.accepting(stream.channel)) return read_more(stream);
  stream.held = true;
  console_.when_accepting(stream.channel, [this, &stream] {
    stream.held = false;
    if (stream.open) read_more(stream);
  });
}

void ProcessContext::close_stream(Stream& stream) {
  if (!stream.open) return;
  stream.open = false;
  stream.output.finish();
  boost::system::error_code ignored;
  stream.pipe.close(ignored);
}

void ProcessContext::close_streams(LiveAttempt& attempt) {
  for (auto& r : attempt.ranks) {
    if (r.out) close_stream(*r.out);
    if (r.err) close_stream(*r.err);
  }
}

bool ProcessContext::held(const LiveAttempt& attempt) {
  return std::any_of(attempt.ranks.begin(), attempt.ranks.end(),
                     [](const Rank& r) { return (r.out && r.out->held) || (r.err && r.err->held); });
}

bool ProcessContext::output_open(const LiveAttempt& attempt) {
  return std::any_of(attempt.ranks.begin(), attempt.ranks.end(),
                     [](const Rank& r) { return (r.out && r.out->open) || (r.err && r.err->open); });
}

std::vector<Rank*> ProcessContext::reap(LiveAttempt* attempt) {
  std::vector<Rank*> exited;
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;
    Rank* rank = nullptr;
    if (attempt != nullptr)
      for (auto& r : attempt->ranks)
        if (r.record->pid == pid && !r.record->status) rank = &r;
    if (rank == nullptr) {
      spdlog::debug("reaped pid {}, left behind by a rank: {}", pid, detail::describe(status));
      continue;
    }
    rank->record->status = status;
    rank->record->end = WallClock::now();
    spdlog::debug("rank {} (pid {}) {}", rank->spec->rank, pid, detail::describe(status));
    exited.push_back(rank);
  }
  return exited;
}

void ProcessContext::signal(LiveAttempt& attempt, int sig) {
  const bool wake = sig == SIGTERM || sig == SIGINT || sig == SIGHUP;
  for (auto& r : attempt.ranks)
    if (r.running()) {
      ::kill(-r.record->pid, sig);
      if (wake) ::kill(-r.record->pid, SIGCONT);
    }
}

std::vector<std::string> ProcessContext::kill_leftovers_now(LiveAttempt* attempt) {
  std::vector<std::string> killed;
  for (int round = 0; round < 200; ++round) {
    if (!has_children()) break;
    if (round == 0) killed = describe_processes(detail::descendants_of(::getpid()));  // named while they live
    const auto n = detail::signal_descendants(SIGKILL);
    reap(attempt);
    if (n == 0) break;
    if (round == 199) spdlog::warn("processes left behind by the ranks did not die within 2 s of SIGKILL");
    ::usleep(10 * 1000);
  }
  return killed;
}

ProcessState::ProcessState() {
  for (int sig = 1; sig < NSIG; ++sig) saved_[sig] = ::sigaction(sig, nullptr, &actions_[sig]) == 0;
  int flag = 0;
  if (::prctl(PR_GET_CHILD_SUBREAPER, &flag) == 0) subreaper_ = flag != 0;
}

ProcessState::~ProcessState() {
  for (int sig = 1; sig < NSIG; ++sig)
    if (saved_[sig] && sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &actions_[sig], nullptr);
  if (subreaper_) ::prctl(PR_SET_CHILD_SUBREAPER, *subreaper_ ? 1 : 0);
}

}  // namespace idist::launchers::supervision

#pragma once
// The supervisor's process context: it starts one attempt's ranks (each with its pipes, its
// log files and its flight recorder), carries their output to the console, signals them, and
// reaps them and whatever they leave behind. It decides nothing: who failed and what follows
// is the supervisor's (policy.hpp), which hears of exits and closed streams through callbacks.

#include <signal.h>
#include <sys/types.h>

#include <array>
#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idist/common/flight_recorder.hpp"
#include "idist/common/trace_area.hpp"
#include "idist/launchers/supervisor.hpp"
#include "output/console.hpp"
#include "output/rank_output.hpp"
#include "output/run_summary.hpp"
#include "stall/stall_report.hpp"

namespace idist::launchers::supervision {

namespace asio = boost::asio;

// Lines of a failing rank's stderr kept for the summary.
inline constexpr std::size_t kTailLines = 10;

// One rank's output stream (stdout or stderr) on its way to ours.
struct Stream {
  Stream(asio::io_context& io, int fd, detail::Console& console, detail::Channel channel, std::string prefix,
         detail::LogFile log, bool keep_tail)
      : pipe(io, fd), channel(channel), output(console, channel, std::move(prefix), std::move(log), keep_tail) {}
  asio::posix::stream_descriptor pipe;
  detail::Channel channel;
  detail::RankOutput output;
  std::array<char, 64 * 1024> buffer{};
  bool open = true;
  bool held = false;  // not read while the console holds all it may for a slow reader
};

// What the ranks record beyond their calls.
struct RecorderOptions {
  // Segment::count_calls: kCountCalls for --metrics, kTimeWork for straggler reports alone
  std::int32_t count_calls = 0;
  bool trace = false;        // each call's start and end (--trace; common/trace_area.hpp)
};

// A rank's flight recorder, as idist-run maps it (the rank maps the same memfd).
class RecorderMemory {
 public:
  // The memory and the descriptor to hand the rank; nullptr where memfds cannot be had.
  static std::unique_ptr<RecorderMemory> make(const RecorderOptions& options);
  ~RecorderMemory();
  RecorderMemory(const RecorderMemory&) = delete;
  RecorderMemory& operator=(const RecorderMemory&) = delete;
  int fd() const { return fd_; }
  void close_fd();  // once the rank has its own copy of it
  // The process that records, where it is not the rank's own (a script that runs the program
  // as its child): one of the rank's process group, as a child of the rank is unless it moved.
  // The rank itself otherwise, and once that process has ended (its pid may be another's).
  pid_t recording(pid_t rank) const;
  // The rank's calls, each dated by when we first saw the recorder as it is now (the rank
  // reads no clock).
  std::vector<detail::Recorded> read();
  // The rank's last heartbeat (recorder::Segment::beat_ns): 0 where it beats none.
  std::int64_t beat_ns() const { return segment_->beat_ns.load(std::memory_order_acquire); }
  pid_t beat_pid() const { return segment_->beat_pid.load(std::memory_order_acquire); }
  pid_t admits_pid() const { return segment_->admits_pid.load(std::memory_order_acquire); }
  // The rank's metrics are in it (common/rank_metrics.hpp).
  const common::recorder::Segment& segment() const { return *segment_; }
  // The rank's trace (--trace), or null.
  const common::recorder::TraceArea* trace() const {
    return size_ >= common::recorder::traced_size() ? common::recorder::trace_area(segment_) : nullptr;
  }

 private:
  RecorderMemory(int fd, common::recorder::Segment* segment, std::size_t size)
      : fd_(fd), segment_(segment), size_(size) {}
  int fd_;
  common::recorder::Segment* segment_;
  std::size_t size_;  // mapped
  std::uint64_t seen_entered_ = 0;
  std::int64_t since_ns_ = 0;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::int64_t> open_since_;  // (epoch, id): first seen open
};

struct Rank {
  const ProcessSpec* spec = nullptr;
  detail::RankRecord* record = nullptr;  // in the attempt's record, which does not move
  std::unique_ptr<Stream> out, err;
  std::unique_ptr<RecorderMemory> recorder;
  bool running() const { return record->pid > 0 && !record->status; }
  // Its last stderr lines, oldest first.
  std::vector<std::string> last_stderr() const { return err ? err->output.tail().last_lines(kTailLines) : std::vector<std::string>(); }
};

struct LiveAttempt {
  Attempt attempt;
  detail::AttemptRecord record;
  std::vector<Rank> ranks;
  bool ranks_gone = false;      // every rank reaped, leftovers dealt with
  bool ended_remotely = false;  // its teardown came from another node's end
};

// Whether we have any child, exited or not, without reaping it.
bool has_children();

// The run id as a directory name: an id taken from the environment may hold a '/'.
std::string run_dir_name(std::string id);
// DIR/<run-id>/attempt_<k> of --log-dir DIR, created; "" without --log-dir; nothing (the error
// logged) where it cannot be made.
std::optional<std::string> make_attempt_log_dir(const std::string& log_dir, const std::string& run_id, int index);

class ProcessContext {
 public:
  // `output_closed`: a rank's stream reached its end (the attempt may be over). `recorder`:
  // what the ranks keep beside their calls.
  ProcessContext(asio::io_context& io, detail::Console& console, bool tag_output, RecorderOptions recorder,
                 std::function<void()> output_closed);

  // Starts `rank` with its log files in `log_dir` ("" for none); the reason when it cannot.
  std::optional<std::string> start(Rank& rank, const std::string& log_dir);
  // Every exited child reaped: a rank of `attempt` gets its status recorded and is returned;
  // the rest (left behind by ranks, re-parented to us) are only logged.
  std::vector<Rank*> reap(LiveAttempt* attempt);
  // `sig` to the process group of each running rank of `attempt`. A stopped rank (SIGSTOP, a
  // frozen one a stall report named) acts on SIGTERM only once continued, as a shell's kill
  // does for a stopped job; else it would wait out --grace: it gets SIGCONT after.
  static void signal(LiveAttempt& attempt, int sig);
  // SIGKILL to every descendant until none is left (bounded: a process in state D cannot be
  // hurried), reaping them. Returns what it killed ("pid 123 (helper)"), for the record.
  std::vector<std::string> kill_leftovers_now(LiveAttempt* attempt);
  void close_stream(Stream& stream);
  void close_streams(LiveAttempt& attempt);
  // Whether a stream of `attempt` is held back for a slow console (it has output left).
  static bool held(const LiveAttempt& attempt);
  static bool output_open(const LiveAttempt& attempt);

 private:
  void read_more(Stream& stream);
  void read_when_accepted(Stream& stream);

  asio::io_context& io_;
  detail::Console& console_;
  bool tag_output_;
  RecorderOptions recorder_;
  std::function<void()> output_closed_;
};

// What supervision changes in the process and puts back when it is destroyed: every signal's
// disposition (Asio's signal sets leave SIG_DFL behind, not what was there) and the
// child-subreaper flag, so that a program may supervise jobs of its own (idist::spawn) and go on.
class ProcessState {
 public:
  ProcessState();
  ~ProcessState();
  ProcessState(const ProcessState&) = delete;
  ProcessState& operator=(const ProcessState&) = delete;

 private:
  std::array<struct sigaction, NSIG> actions_{};
  std::array<bool, NSIG> saved_{};
  std::optional<bool> subreaper_;
};

// "pid 123 (name)" for each of `pids`, from /proc/PID/comm.
std::vector<std::string> describe_processes(const std::vector<pid_t>& pids);

}  // namespace idist::launchers::supervision

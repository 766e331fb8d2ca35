#pragma once
// Who is stuck where: idist-run reads its ranks' flight recorders
// (idist/common/flight_recorder.hpp) and, when a rank has waited in a collective longer than
// --stall-timeout, says which collective, which ranks wait in it, which never entered it (and
// what their process is doing: stopped, sleeping in user code, exited), and which entered
// another collective at the same number.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "idist/common/flight_recorder.hpp"

namespace idist::launchers::detail {

// A collective as every rank numbers it: (epoch, group, number).
using CallKeys = std::set<std::tuple<std::uint32_t, std::int32_t, std::uint64_t>>;

// A slot as read, whole (a slot being written is retried, then skipped).
struct Recorded {
  common::recorder::State state = common::recorder::State::empty;
  std::string op;
  std::uint8_t dtype = 0;
  std::uint8_t reduce = 0;  // idist::ReduceOp
  std::uint32_t epoch = 0;
  std::int32_t group = -1;
  std::int32_t root = -1;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  // When the reader first saw the rank's recorder as it is now (no call entered since): a
  // call still open has waited at least since then.
  std::int64_t entered_ns = 0;
  std::uint64_t position = 0;  // the rank's calls before this one (the newest has the highest)
  std::uint64_t history = 0;   // the group's calls up to this one, folded (Slot::history)
  bool has_call = false;       // a member record (Kind::member) that holds its group's latest call
  std::uint64_t id = 0;        // which call of the rank: its ring's number (top byte), its number there
  common::recorder::Kind kind = common::recorder::Kind::collective;
};

// What one rank's recorder holds, and its process.
struct RankView {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  std::string ended;  // "exited with code 3" when it is not running
  std::vector<Recorded> slots;
  // A rank of another node (a job-wide report): its host, and its process state as read there
  // (/proc is that node's).
  std::string host;
  std::string process;
};

// The segment's slots; `since_ns`: when its `next` last changed, as the reader saw it.
std::vector<Recorded> read_recorder(const common::recorder::Segment& segment, std::int64_t since_ns);

// "stopped (SIGSTOP or SIGTSTP)", "sleeping (in hrtimer_nanosleep)", "running"...: /proc/PID.
std::string process_state(pid_t pid);

struct StallReport {
  std::vector<std::string> lines;
  // The rank the report points at: the first waiting in the call when some rank completed it
  // (it froze inside, its peers had its data and went on), else the first that never entered
  // it (or entered another, or ended), else the first waiting in it; and the ranks whose stacks
  // are worth a look, that one first.
  int suspect = -1;
  std::vector<std::pair<int, pid_t>> to_inspect;
};

// The report when some rank has waited in one collective for `stall` or longer and that
// (group, number) was not reported before (it is added to `reported`); nullopt otherwise.
std::optional<StallReport> stall_report(const std::vector<RankView>& ranks, std::int64_t now_ns,
                                        std::chrono::milliseconds stall, CallKeys& reported);

// The job-wide report (every node's views gathered by a rendezvous): stall_report's lines, each
// "stall (job-wide): ...", naming the ranks of every node that answered, then one line for
// each node in `silent` (its name) that did not answer within `waited`. nullopt: nothing new.
std::optional<std::vector<std::string>> job_wide_report(std::vector<RankView> views, std::int64_t now_ns,
                                                        std::chrono::milliseconds stall, CallKeys& reported,
                                                        const std::vector<std::string>& silent,
                                                        std::chrono::milliseconds waited);

// The most a node's views take on the rendezvous' wire (its frames are at most 1 MiB).
inline constexpr std::size_t kViewsBudget = 512 * 1024;

// A node's ranks as a job-wide report needs them, for the rendezvous (JSON text): each rank's
// newest calls (as many as keep the text under `budget` bytes), its process state read here,
// and how long ago each call was first seen (not when: the nodes' clocks differ).
std::string views_to_json(const std::vector<RankView>& ranks, std::int64_t now_ns, const std::string& host,
                          std::size_t budget);
// Back, dated on this node's clock (appended to `out`); false when the text is not such a list.
bool views_from_json(const std::string& text, std::int64_t now_ns, std::vector<RankView>& out);

// Whether gdb can be run for stacks (it is in PATH).
bool stack_tool_available();
// The threads' stacks of `pid` by gdb (attach, backtrace, detach: a stopped process stays
// stopped), at most a few dozen lines; empty when gdb failed or took over 10 s.
std::vector<std::string> stack_of(pid_t pid);

// Where every rank is now, one line each, for `idist-run --status`: in which call and for how
// long, or in its own code since its last call ended; its process state.
std::vector<std::string> status_table(const std::vector<RankView>& ranks, std::int64_t now_ns);

// One line per collective number at which the ranks' recorders disagree (another op, dtype,
// count or root in the same group), whether it completed or not: a mismatch that a backend let
// through gives wrong answers without an error. Each (group, number) once. While the ranks run
// (`running`, with `held` kept between reads), a number that some of the group's ranks have not
// reached yet waits for the next read, so that the line names every rank's call; then it is
// said as it stands (a rank that never comes must not hide it), or as it was when held if the
// call has left the recorders since. At the job's end everything is said, the held ones too.
using HeldMismatches = std::map<std::tuple<std::uint32_t, std::int32_t, std::uint64_t>, std::string>;
std::vector<std::string> mismatch_report(const std::vector<RankView>& ranks, CallKeys& reported,
                                         HeldMismatches* held = nullptr, bool running = false);

}  // namespace idist::launchers::detail

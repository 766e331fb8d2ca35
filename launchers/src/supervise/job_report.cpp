#include "job_report.hpp"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "policy.hpp"

namespace idist::launchers::supervision {

using detail::Channel;

void JobReport::failure(const LiveAttempt& a, const std::string& then) const {
  const auto& r = a.record.ranks[*a.record.first_failure];
  const bool restarts = options_.max_restarts > 0;
  spdlog::error("{}rank {} (pid {} on {}) {}{}{}", restarts ? "attempt " + std::to_string(a.record.index) + ": " : "",
                r.rank, r.pid, host_, detail::describe(r), detail::collateral_list(a.record), then);
  stderr_tail(a);
  early_exit(a);
}

// The rank the failed one lost its connection to had exited 0: no failure of its own to
// blame, but the cause all the same (it returned while the others still called into the job).
void JobReport::early_exit(const LiveAttempt& a) const {
  const auto peer = lost_peer(a.ranks[*a.record.first_failure].last_stderr());
  if (!peer) return;
  for (const auto& r : a.record.ranks)
    if (r.rank == *peer && r.status && WIFEXITED(*r.status) && WEXITSTATUS(*r.status) == 0)
      spdlog::error("rank {} had exited with code 0 while the others still ran: a rank that returns before a "
                    "collective the others call, or without idist::finalize(), fails them",
                    r.rank);
}

void JobReport::stderr_tail(const LiveAttempt& a) const {
  const auto i = *a.record.first_failure;
  const auto lines = a.ranks[i].last_stderr();
  if (lines.empty()) return;
  spdlog::error("last lines of rank {}'s stderr:", a.record.ranks[i].rank);
  for (const auto& line : lines) spdlog::error("  | {}", line);
}

JobResult::Failure JobReport::failure_record(const LiveAttempt& a) const {
  const auto i = *a.record.first_failure;
  const auto& r = a.record.ranks[i];
  JobResult::Failure f;
  f.rank = r.rank;
  f.pid = r.pid;
  f.host = host_;
  if (WIFEXITED(*r.status)) f.exit_code = WEXITSTATUS(*r.status);
  if (WIFSIGNALED(*r.status)) f.signal = WTERMSIG(*r.status);
  f.how = detail::describe(r);
  for (const auto& other : a.record.ranks)
    if (other.collateral) f.stopped.push_back(other.rank);
  f.last_stderr = a.ranks[i].last_stderr();
  return f;
}

void JobReport::log_loss(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, detail::RunRecord& run) const {
  for (const auto& a : attempts)
    for (const auto& r : a->ranks)
      for (const Stream* stream : {r.out.get(), r.err.get()}) {
        if (stream == nullptr || stream->output.log().lost() == 0) continue;
        const auto& log = stream->output.log();
        run.log_bytes_lost += log.lost();
        spdlog::error("--log-dir: {}: {}: {} bytes lost (the file has the first {} of {})", log.path(),
                      std::strerror(log.error()), log.lost(), log.written(), log.written() + log.lost());
      }
  if (run.log_bytes_lost == 0 || run.exit_code != 0) return;
  run.exit_code = kLogLossExit;
  run.outcome = fmt::format("every rank succeeded, but {} bytes of their output are missing from --log-dir",
                            run.log_bytes_lost);
  spdlog::error("exit status {}: every rank succeeded, but their logs under {} lack {} bytes; free space there "
                "(or pick another --log-dir) and run again",
                kLogLossExit, run_dir(), run.log_bytes_lost);
}

void JobReport::finish(detail::RunRecord& run) const {
  run.stdout_dropped = console_.dropped(Channel::out);
  run.stderr_dropped = console_.dropped(Channel::err);
  dropped(Channel::out, run);
  dropped(Channel::err, run);
  if (!options_.log_dir.empty()) write_summary(run);
}

// One line per console stream that dropped output. The exit status stays the job's: the
// console is a view of the output that its reader chose (a `| head`, a pager left alone),
// the ranks' answer is not wrong for it, and a `| head` must not turn a good run into a
// failed one for a scheduler or a restart loop. With --log-dir nothing is lost: the files
// have every byte. The line says where they are, or that --log-dir keeps them.
void JobReport::dropped(Channel channel, const detail::RunRecord& run) const {
  const detail::Dropped& d = console_.dropped(channel);
  if (d.bytes == 0) return;
  const char* suffix = channel == Channel::out ? "out" : "err";
  const std::string where =
      options_.log_dir.empty() ? std::string("run with --log-dir to keep every byte")
      : run.log_bytes_lost == 0 ? fmt::format("every byte is in {}/attempt_*/rank_*.{}", run_dir(), suffix)
                                : fmt::format("{}/attempt_*/rank_*.{} have what the disk took", run_dir(), suffix);
  spdlog::warn("{}: {} line(s), {} bytes not shown: {}; {}", detail::channel_name(channel), d.lines, d.bytes,
               console_.why_dropped(channel), where);
}

std::string JobReport::run_dir() const {
  return (std::filesystem::path(options_.log_dir) / run_dir_name(options_.run_id)).string();
}

// Whole or not at all: written aside, then renamed. One that cannot be written is part of the
// logs lost: a job that succeeded otherwise does not exit 0.
void JobReport::write_summary(detail::RunRecord& run) const {
  const std::string dir = run_dir();
  const std::string path = dir + "/summary.json";
  const std::string temporary = path + ".tmp";
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  const std::string text = detail::summary_json(run);
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
    const bool only_failure = run.exit_code == 0;
    if (only_failure) run.exit_code = kLogLossExit;
    return spdlog::error("--log-dir: cannot write {}: {}{}", path, std::strerror(error),
                         only_failure ? fmt::format("; exit status {}, although every rank succeeded", kLogLossExit) : "");
  }
  if (run.exit_code != 0) spdlog::error("logs and summary.json in {}", dir);
}

LocalFailure JobReport::local_failure(const Rank& rank) {
  LocalFailure f;
  f.rank = rank.spec->rank;
  f.how = detail::describe(*rank.record);
  f.exit_code = detail::exit_code_of(*rank.record->status);
  f.root_cause = blame_of(*rank.record) == Blame::root_cause;
  f.lost_peer = lost_peer(rank.last_stderr());
  return f;
}

}  // namespace idist::launchers::supervision

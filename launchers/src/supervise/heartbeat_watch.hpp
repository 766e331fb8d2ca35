#pragma once
// Frozen ranks: a rank that beats a heartbeat (idist::InitOptions::recovery, lib/src/
// heartbeat.hpp) stamps the time in its recorder's memory every kBeatEvery; one whose stamp
// has not moved for --heartbeat-timeout is frozen (SIGSTOP, a process not scheduled), and its
// peers would wait for it until IDIST_TIMEOUT. The watch reads the stamps every
// kHeartbeatCheck and names each frozen rank once; stopping it is stop_frozen's. It also says
// when a rank begins to beat, which is how live recovery learns that a rank opted in.
//
// Silence is measured on idist-run's clock, from when it last saw the stamp move, so that no
// clock is compared across processes, and a pause of the whole job (SLURM's suspend, a frozen
// cgroup, a paused VM: idist-run stops too) starts the count afresh rather than finding every
// rank frozen. Not judged: a stamp whose process is gone (an earlier life of the rank that
// was killed) and a process being traced (a stall report's gdb, a user's debugger).

#include <sys/types.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "rank_process.hpp"

namespace idist::launchers::supervision {

// What the watch last saw of a rank's stamp, and when (idist-run's clock).
struct BeatSeen {
  std::int64_t stamp = 0;
  std::int64_t since_ns = 0;
  pid_t beating = 0;  // the process it last saw beat (Began said of it)
  bool admitting = false;  // it was seen to admit replacements (Began said so too)
};

// Takes the stamp read at `now_ns` into `seen`, and says how long it has not moved where that
// is more than `timeout`; nothing for a rank that beats no heartbeat (0) or with a timeout of 0.
std::optional<std::chrono::duration<double>> frozen_for(BeatSeen& seen, std::int64_t stamp, std::int64_t now_ns,
                                                        std::chrono::milliseconds timeout);

// Takes the beating process read (`pid`, 0: none) into `seen`, and says whether it began to
// beat since the last reading: a rank that opted in, and again after a new init() or another
// program of its script began anew.
bool began_beating(BeatSeen& seen, pid_t pid);

// Says that `rank` (its beating process `pid`) is frozen and stops it: SIGKILL to its process
// group (a stopped process takes SIGKILL too). The attempt then goes on as after any rank's
// death, which names it so.
void stop_frozen(Rank& rank, pid_t pid, std::chrono::duration<double> silent, std::chrono::milliseconds timeout);

class HeartbeatWatch {
 public:
  HeartbeatWatch(asio::io_context& io, std::chrono::milliseconds timeout) : timeout_(timeout), timer_(io) {}
  HeartbeatWatch(const HeartbeatWatch&) = delete;
  HeartbeatWatch& operator=(const HeartbeatWatch&) = delete;

  // From now on while `watched` gives an attempt (nullptr: none running), `frozen` for each
  // running rank found frozen, with its beating process and how long it has been silent.
  // Nothing with a timeout of 0.
  using Frozen = std::function<void(Rank&, pid_t, std::chrono::duration<double>)>;
  // And `began` for each rank whose process began to beat (it opted in, in init(): live
  // recovery's word that the rank takes part), once for each process, also with a timeout of 0;
  // and again once it admits replacements (idist::will_admit_replacements()).
  using Began = std::function<void(LiveAttempt&, Rank&)>;
  void start(std::function<LiveAttempt*()> watched, Frozen frozen, Began began);
  void stop();

 private:
  void check();

  std::chrono::milliseconds timeout_;
  asio::steady_timer timer_;
  std::function<LiveAttempt*()> watched_;
  Frozen frozen_;
  Began began_;
  std::map<const detail::RankRecord*, BeatSeen> seen_;  // records do not move (rank_process.hpp)
  std::int64_t last_check_ns_ = 0;
  bool stopped_ = false;
};

}  // namespace idist::launchers::supervision

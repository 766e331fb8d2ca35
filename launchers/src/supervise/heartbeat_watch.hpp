#pragma once
// Frozen ranks: a rank that beats a heartbeat (idist::InitOptions::recovery, lib/src/
// heartbeat.hpp) stamps the time in its recorder's memory every kBeatEvery; one whose stamp is
// older than --heartbeat-timeout is frozen (SIGSTOP, a process the machine no longer runs),
// and its peers would wait for it until IDIST_TIMEOUT. The watch reads the stamps every
// kHeartbeatCheck and names each frozen rank once; stopping it is the supervisor's.

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include "rank_process.hpp"

namespace idist::launchers::supervision {

// How long a rank stamped at `beat_ns` has been silent at `now_ns`, where that is more than
// `timeout`; nothing for a rank that beats no heartbeat (0) or beat within it.
std::optional<std::chrono::duration<double>> frozen_for(std::int64_t beat_ns, std::int64_t now_ns,
                                                        std::chrono::milliseconds timeout);

// Says that `rank` is frozen and stops it: SIGKILL to its process group (a stopped process
// takes SIGKILL too). The attempt then goes on as after any rank's death, which names it so.
void stop_frozen(Rank& rank, std::chrono::duration<double> silent, std::chrono::milliseconds timeout);

class HeartbeatWatch {
 public:
  HeartbeatWatch(asio::io_context& io, std::chrono::milliseconds timeout) : timeout_(timeout), timer_(io) {}
  HeartbeatWatch(const HeartbeatWatch&) = delete;
  HeartbeatWatch& operator=(const HeartbeatWatch&) = delete;

  // From now on while `watched` gives an attempt (nullptr: none running), `frozen` for each
  // running rank found frozen, with how long it has been silent. Nothing with a timeout of 0.
  void start(std::function<LiveAttempt*()> watched, std::function<void(Rank&, std::chrono::duration<double>)> frozen);
  void stop();

 private:
  void check();

  std::chrono::milliseconds timeout_;
  asio::steady_timer timer_;
  std::function<LiveAttempt*()> watched_;
  std::function<void(Rank&, std::chrono::duration<double>)> frozen_;
  bool stopped_ = false;
};

}  // namespace idist::launchers::supervision

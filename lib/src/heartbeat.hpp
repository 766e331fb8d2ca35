#pragma once
// Live recovery's heartbeat (issue 46, InitOptions::recovery): a thread of the rank's own
// stamps the time into the memory idist-run reads (the recorder's segment, beat_ns) every
// kBeatEvery. It says the process runs, not that the program progresses: a rank busy in a
// long computation beats on; one under SIGSTOP, or not run by its machine, does not, and
// idist-run stops it after --heartbeat-timeout (supervise/heartbeat_watch.hpp).

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "idist/common/flight_recorder.hpp"

namespace idist::detail {

class Heartbeat {
 public:
  // Beats into `segment` from now on; nothing where it is null (no idist-run to watch).
  explicit Heartbeat(common::recorder::Segment* segment);
  // Stops and clears the stamp: a rank that stops beating on purpose (finalize) is not frozen.
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool beating() const { return segment_ != nullptr; }

 private:
  common::recorder::Segment* segment_;
  pid_t owner_;  // the process whose thread beats
  std::mutex mu_;
  std::condition_variable stop_asked_;
  bool stop_ = false;
  std::unique_ptr<std::thread> thread_;
};

}  // namespace idist::detail

#pragma once
// Whether a rank's SIGKILL came from the kernel's OOM killer. A rank killed for memory dies of
// plain SIGKILL, the same status as a kill -9, and the user's next step differs (a smaller
// batch, not a hunt for who killed it). The memory cgroup the ranks run in counts its OOM
// kills: cgroup v2's memory.events ("oom_kill N"), v1's memory.oom_control (the same line).
// Read when a rank dies of SIGKILL: a count that grew since the last reading names the OOM
// killer. Where neither file is readable nothing is said.

#include <cstdint>
#include <optional>
#include <string>

#include "output/run_summary.hpp"

namespace idist::launchers::supervision {

class OomWatch {
 public:
  OomWatch();  // the cgroup's file and its count now
  // Marks `rank` (just reaped) oom_killed when it died of SIGKILL and the count grew.
  void explain(detail::RankRecord& rank);
  const std::string& source() const { return path_; }  // "" where there is none

 private:
  std::optional<std::uint64_t> read() const;
  std::string path_;
  std::uint64_t seen_ = 0;
};

// The oom_kill count in a memory.events or memory.oom_control text; nullopt without one.
std::optional<std::uint64_t> oom_kill_count(const std::string& text);

}  // namespace idist::launchers::supervision

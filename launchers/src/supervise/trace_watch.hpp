#pragma once
// --trace's reading (issue 47): every 20 ms, each running rank's trace (common/trace_area.hpp)
// is taken into idist-run's memory, call by call, before the rank's rings go round; at the
// job's end every attempt's ranks once more, and output/trace_file.hpp writes the file.

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "idist/common/trace_area.hpp"
#include "output/trace_file.hpp"

namespace idist::launchers::supervision {

namespace asio = boost::asio;
struct LiveAttempt;
class RecorderMemory;

// One rank's trace as read so far: per ring, the first entry not yet resolved and those beyond
// it that are (a call still open holds the cursor; the calls after it are taken).
class TraceReader {
 public:
  TraceReader(int rank, int attempt) { taken_.rank = rank; taken_.attempt = attempt; }
  // Takes what `memory`'s rings hold beyond what was taken; `last`: the rank has ended or the
  // job is over, so an open call is taken as open. Keeps the newest `keep` calls.
  void read(const RecorderMemory& memory, bool last, std::size_t keep);
  const detail::TracedRank& taken() const { return taken_; }
  void trim(std::size_t keep);  // the newest `keep` calls; the rest counted as lost

 private:
  struct Cursor {
    std::uint64_t next = 0;
    std::set<std::uint64_t> resolved;  // beyond `next`
  };
  void read_steps(const common::recorder::TraceSteps& steps, bool last);

  Cursor cursors_[common::recorder::kRings];
  std::uint64_t steps_next_ = 0;  // the first step mark not yet taken
  detail::TracedRank taken_;
};

class TraceWatch {
 public:
  TraceWatch(asio::io_context& io, std::string path) : timer_(io), path_(std::move(path)) {}
  bool on() const { return !path_.empty(); }
  void start(std::function<LiveAttempt*()> watched);
  void stop();
  // Every attempt's ranks read to their end; then the file (a part of it on node K > 0).
  // Returns the line to say.
  std::string write(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, detail::TraceNode node);

 private:
  void check();
  void read(LiveAttempt& attempt, bool last);
  std::size_t keep() const;  // calls kept of each rank

  asio::steady_timer timer_;
  std::string path_;
  std::function<LiveAttempt*()> watched_;
  // By the memory each rank's process records in (one per rank started; kept to the job's end).
  std::map<const RecorderMemory*, TraceReader> readers_;
  bool stopped_ = false;
};

}  // namespace idist::launchers::supervision

#pragma once
// `idist-run --metrics [HOST:]PORT` (issue 47): this node's ranks' metrics in Prometheus' text
// exposition format, at http://HOST:PORT/metrics. Each node's idist-run serves its own ranks.
// Nothing is read until a scrape: the ranks count their calls in their flight recorders
// (common/rank_metrics.hpp), and a scrape reads those and /proc.

#include <sys/types.h>

#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "idist/common/flight_recorder.hpp"

namespace idist::launchers::supervision {

// The job as this node sees it, for the labels and the job's own metrics.
struct JobFigures {
  std::string job;   // the run id
  std::string host;
  int node = 0;      // this node's rank in the job (the last attempt's that had one)
  int attempt = 0;
  int restarts = 0;  // attempts started after the first
  int world = 0;     // ranks in the job now (after re-forms, the last one's)
  std::size_t reforms = 0;  // live recovery's re-forms, every attempt's
  std::map<int, double> stragglers;  // rank -> how much longer its work is (0.23: 23%)
};

struct RankFigures {
  int rank = 0;
  pid_t pid = 0;      // the rank's process
  pid_t program = 0;  // the process that records, where a script runs the program as its child
  bool running = false;
  const common::recorder::Segment* segment = nullptr;  // null: no recorder
};

std::string prometheus_text(const JobFigures& job, const std::vector<RankFigures>& ranks);

struct LiveAttempt;
// A scrape's answer: `job` (job, host, restarts) and what the attempts say; the last one's
// ranks where `running` (not while the nodes meet).
std::string metrics_text(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, bool running, JobFigures job);

// The endpoint. Serves each scrape on the event loop with what `text` returns.
class MetricsEndpoint {
 public:
  // Listens at `where` ("PORT" on every address, or "HOST:PORT"); throws std::runtime_error
  // whose message names --metrics and the address where that fails.
  MetricsEndpoint(boost::asio::io_context& io, const std::string& where, std::function<std::string()> text);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  std::uint16_t port() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace idist::launchers::supervision

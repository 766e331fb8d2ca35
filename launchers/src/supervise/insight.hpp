#pragma once
// What idist-run tells of a running job's speed (issue 47), in one place for the supervisor:
// the metrics endpoint (--metrics), straggler lines (--straggler-threshold) and the trace
// (--trace). Each reads the ranks' flight recorders; none decides anything about the job.

#include <boost/asio.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "idist/launchers/supervisor.hpp"
#include "metrics.hpp"
#include "rank_process.hpp"
#include "straggler_watch.hpp"
#include "trace_watch.hpp"

namespace idist::launchers::supervision {

class Insight {
 public:
  Insight(asio::io_context& io, const SuperviseOptions& options, std::string host);
  // What the ranks must record for these (RecorderMemory::make).
  static RecorderOptions recorder(const SuperviseOptions& options);

  struct Job {
    std::function<LiveAttempt*()> running;  // the attempt whose ranks run, or null
    std::function<bool()> started;          // its ranks exist (not while the nodes meet)
    const std::vector<std::unique_ptr<LiveAttempt>>* attempts = nullptr;
    const int* restarts = nullptr;
  };
  // Binds --metrics' port now (throws std::runtime_error naming --metrics where it cannot).
  void start(Job job);
  void stop();
  // At the job's end, after the event loop: the trace's file (node 0 merges the other nodes'
  // parts). Says its line; a file that cannot be written is said as an error and returns false.
  bool write_trace(int node_rank, int nnodes);
  // The rendezvous' job-wide comparison (Coordinator::Events::stragglers): said, recorded, and
  // this node's ranks among `named` served as idist_straggler.
  void heard_stragglers(const std::vector<std::string>& lines, const std::map<int, double>& named);

 private:
  asio::io_context& io_;
  const SuperviseOptions& options_;
  std::string host_;
  Job job_;
  StragglerWatch stragglers_;
  TraceWatch traces_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  void say(const std::vector<std::string>& lines);  // straggler lines: said, and in summary.json
  std::map<int, double> named_now() const;  // for idist_straggler: this node's ranks named now
  std::map<int, double> named_;  // this node's ranks the rendezvous named in attempt named_attempt_
  int named_attempt_ = -1;
  std::int64_t started_unix_ns_;  // a trace's part older than this is an earlier job's
};

}  // namespace idist::launchers::supervision

#include "insight.hpp"

#include <spdlog/spdlog.h>

namespace idist::launchers::supervision {

Insight::Insight(asio::io_context& io, const SuperviseOptions& options, std::string host)
    : io_(io), options_(options), host_(std::move(host)), stragglers_(io, options.straggler_threshold, host_),
      traces_(io, options.trace),
      started_unix_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count()) {}

RecorderOptions Insight::recorder(const SuperviseOptions& options) {
  // Counting every call's op and bytes costs an 8-byte call about 2% (BENCHMARKS.md): only where
  // --metrics serves them. Straggler reports need only the sampled work between calls.
  namespace rec = common::recorder;
  const auto counting = !options.metrics.empty()            ? rec::kCountCalls
                        : options.straggler_threshold > 0 ? rec::kTimeWork
                                                          : 0;
  return {.count_calls = counting, .trace = !options.trace.empty()};
}

void Insight::start(Job job) {
  job_ = std::move(job);
  if (options_.coordinator)
    stragglers_.share_with([this] { return options_.coordinator->compares_stragglers(); },
                           [this, threshold = options_.straggler_threshold](const std::string& samples) {
                             options_.coordinator->share_work(options_.coordinator->attempt(), samples, threshold);
                           });
  if (traces_.on())  // before any rank starts: a trace that could not be written would be lost work
    if (const auto error = detail::check_trace_path(options_.trace); !error.empty()) throw std::runtime_error(error);
  stragglers_.start(job_.running, [this](const std::string& line) { say({line}); });
  traces_.start(job_.running);
  if (options_.metrics.empty()) return;
  metrics_ = std::make_unique<MetricsEndpoint>(io_, options_.metrics, [this] {
    return metrics_text(*job_.attempts, job_.started(),
                        {.job = options_.run_id, .host = host_, .restarts = *job_.restarts,
                         .stragglers = named_now()});
  });
}

void Insight::say(const std::vector<std::string>& lines) {
  LiveAttempt* a = job_.running ? job_.running() : nullptr;
  for (const auto& line : lines) {
    spdlog::warn("{}", line);
    if (a != nullptr) a->record.stragglers.push_back(line);
  }
}

void Insight::heard_stragglers(const std::vector<std::string>& lines, const std::map<int, double>& named) {
  say(lines);
  const LiveAttempt* a = job_.running ? job_.running() : nullptr;
  if (a == nullptr) return;
  named_.clear();
  named_attempt_ = a->record.index;
  for (const auto& r : a->ranks)
    if (const auto it = named.find(r.spec->rank); it != named.end()) named_.insert(*it);
}

std::map<int, double> Insight::named_now() const {
  const auto& c = options_.coordinator;
  if (!c || !c->compares_stragglers()) return stragglers_.current();
  const LiveAttempt* a = job_.running ? job_.running() : nullptr;
  return a != nullptr && a->record.index == named_attempt_ ? named_ : std::map<int, double>{};
}

void Insight::stop() {
  stragglers_.stop();
  traces_.stop();
  metrics_.reset();  // its pending accepts would keep the event loop going
}

bool Insight::write_trace(int node_rank, int nnodes) {
  if (!traces_.on() || job_.attempts == nullptr) return true;
  try {
    detail::TraceNode node;
    node.run_id = options_.run_id;
    node.host = host_;
    node.node_rank = node_rank;
    node.nnodes = nnodes;
    node.started_unix_ns = started_unix_ns_;
    spdlog::warn("{}", traces_.write(*job_.attempts, std::move(node)));
    return true;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return false;
  }
}

}  // namespace idist::launchers::supervision

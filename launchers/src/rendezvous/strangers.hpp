#pragma once
// The built-in rendezvous' account of connections it refused (another protocol, another job's
// idist-run, silence). A flood of them must not flood the log: the first is logged at once, the
// rest in one line a second with their count, addresses and reasons (a few named, the rest
// counted). Refusals for another job identity are kept by address: a node started with a
// mistyped --rdzv-id is what "node 1 never joined" usually means, and the join timeout's
// message says so.

#include <boost/asio.hpp>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace idist::launchers::rendezvous {

class Strangers {
 public:
  Strangers(boost::asio::io_context& io, bool quiet) : timer_(io), quiet_(quiet) {}

  // A connection from `peer` ("host:port", for the first line) at `address` was refused, as `why` says.
  void refused(const std::string& peer, const std::string& address, const std::string& why);
  // And it presented another job's identity.
  void other_job(const std::string& address);
  // "; refused 1 connection from 10.0.0.2 with another job id (--rdzv-id)", or nothing.
  std::string other_job_text() const;
  // The rendezvous ends: the refusals counted since the last line, now.
  void flush();

 private:
  static constexpr std::size_t kNamed = 3;
  struct Counted {
    std::size_t count = 0;
    std::vector<std::string> addresses;                        // the first kNamed distinct
    std::vector<std::pair<std::string, std::size_t>> reasons;  // the first kNamed distinct, counted
    std::size_t other_reasons = 0;
  };
  void log();

  boost::asio::steady_timer timer_;
  bool quiet_ = false;
  Counted counted_;
  std::chrono::steady_clock::time_point logged_{};
  bool armed_ = false;
  std::map<std::string, int> other_job_;
  int other_job_unnamed_ = 0;  // beyond the addresses remembered
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace idist::launchers::rendezvous

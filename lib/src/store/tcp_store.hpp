#pragma once
// The client side of the TCP store: one blocking connection per rank.

#include <atomic>
#include <mutex>
#include <string>

#include "store/store.hpp"

namespace idist::detail {

struct TcpStoreOptions {
  std::string host;
  int port = 0;
  std::string token;
  // Bounds both the connection attempts (rank 0 may start later than us) and every blocking
  // get/wait.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

class TcpStore final : public Store {
 public:
  // Connects, retrying until the server is up or the timeout passes (TimeoutFailure), and
  // presents the token (std::runtime_error when refused).
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<bool> check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  // From another thread: the request in flight, and every later one, fails at once (live
  // recovery gives up a generation that a newer one replaced while it connected).
  void interrupt();

 private:
  using Clock = std::chrono::steady_clock;
  std::string request(std::vector<char> frame, Clock::time_point deadline, const std::string& what);
  // request(), turning an ERROR reply (the server refused a well-formed request) into
  // std::runtime_error; the connection stays usable.
  std::string call(std::vector<char> frame, Clock::time_point deadline, const std::string& what);
  void connect(Clock::time_point deadline);

  TcpStoreOptions options_;
  std::mutex mu_;  // one request in flight per connection
  void close_fd();
  std::mutex fd_mu_;  // closing fd_ against interrupt()'s shutdown
  std::atomic<int> fd_ = -1;
  std::atomic<bool> interrupted_ = false;
};

}  // namespace idist::detail

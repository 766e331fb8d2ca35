#pragma once
// `idist-run --status`: a running idist-run answers on a Unix socket in the abstract namespace,
// "@idist-run.<uid>.<pid>" (no file to leave behind after a kill -9: the name goes with the
// process), and `idist-run --status [PID]` finds it in /proc/net/unix. Only the same user, or
// root, is answered: the kernel's peer credentials say who asks.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace idist::launchers::detail {

class StatusServer {
 public:
  // Listens at once (a failure to is logged and leaves --status unanswered, nothing else);
  // `report` is called on the event loop's thread for each query and its text sent back.
  StatusServer(boost::asio::io_context& io, std::function<std::string()> report);
  ~StatusServer();
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// The pids of this user's idist-run processes that answer --status on this host.
std::vector<pid_t> jobs_answering_status();

}  // namespace idist::launchers::detail

#pragma once
// The rendezvous itself, hosted by node 0's agent (see rendezvous.hpp for what it decides).
// Event-driven on the agent's loop: every state change comes from a message, a closed
// connection or a timer, so a thousand agents cost a thousand small messages per attempt.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "wire.hpp"

namespace idist::launchers::rendezvous {

struct ServerOptions {
  std::string token;
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  std::chrono::milliseconds last_call{2000};
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds dead_after{5000};
  std::chrono::milliseconds join_timeout{300000};
  // A member that has not said "over" this long after its attempt ended (its own --grace,
  // from its join, plus stop_margin) is dropped, so that the verdict never waits on it.
  std::chrono::milliseconds grace{5000};
  std::chrono::milliseconds stop_margin{5000};
  // A connection that has not joined this long after connecting is closed.
  std::chrono::milliseconds handshake{10000};
  // A job-wide stall report covers the calls some rank has waited in this long (the agents'
  // --stall-timeout); 0: the agents ask for none.
  std::chrono::milliseconds stall_timeout{0};
  bool quiet = false;  // no log lines (the scale simulation)
  // Live recovery: a generations' store for each attempt, at the rendezvous' own address.
  bool recovery = false;
  int min_world = 1;
};

class Server {
 public:
  // Serves on `acceptor`, already listening.
  Server(asio::io_context& io, tcp::acceptor acceptor, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();
  // After the final verdict: `done` once every agent has hung up (or after a grace period).
  // Before it, node 0 leaves the job: every node hears so, with `why` (its outcome) if given.
  void when_drained(const std::string& why, std::function<void()> done);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace idist::launchers::rendezvous

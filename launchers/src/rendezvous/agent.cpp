// NodeAgent: this node's side of the rendezvous (rendezvous.hpp), and on node 0 its host.

#include <netinet/in.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "idist/common/addresses.hpp"
#include "idist/common/duration.hpp"
#include "idist/common/host.hpp"
#include "idist/launchers/ports.hpp"
#include "idist/launchers/rendezvous.hpp"
#include "rendezvous/server.hpp"
#include "rendezvous/wire.hpp"

namespace idist::launchers {
namespace {

using rendezvous::Connection;
using rendezvous::field;
using rendezvous::Json;
namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Between tries to reach a rendezvous that does not listen yet (node 0 starts later).
constexpr auto kConnectRetry = std::chrono::milliseconds(100);
// How long a node leaving the job waits for its last message to be written.
constexpr auto kLeaveFlush = std::chrono::seconds(1);
// A silence timer woken this late was not waiting: the process was not running.
constexpr auto kOwnSilence = std::chrono::seconds(1);
// An endpoint of this host whose port someone else holds: how long (beyond one heartbeat, the
// longest a rendezvous takes to say anything to a joined node) we wait for it to speak our
// protocol before calling it another program's.
constexpr auto kProbe = std::chrono::seconds(3);

// A socket listening at host:port, or -1 with why not (EADDRNOTAVAIL: the address is not this
// host's). `in_use`: one of the host's addresses is ours but its port is taken (EADDRINUSE):
// another agent hosts there, or another program holds the port.
int listen_at(const std::string& host, int port, int& error, bool& in_use) {
  int fd = -1;
  error = 0;
  in_use = false;
  common::try_addresses(host, std::to_string(port), SOCK_STREAM, [&](const addrinfo& a, std::string&) {
    const int s = ::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC, a.ai_protocol);
    if (s < 0) return error = errno, false;
    const int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s, a.ai_addr, a.ai_addrlen) != 0 || ::listen(s, 4096) != 0) {
      error = errno;
      if (error == EADDRINUSE) in_use = true;
      ::close(s);
      return false;
    }
    fd = s;
    return true;
  });
  return fd;
}

}  // namespace

struct NodeAgent::State {
  RendezvousOptions options;
  std::string endpoint;  // "host:port", for messages
  int listen_fd = -1;
  Assignment assignment;
  bool compares_stragglers = false;  // node 0's rendezvous compares every node's ranks (its "assign")
  asio::io_context* io = nullptr;
  Events events;
  std::unique_ptr<rendezvous::Server> server;
  std::shared_ptr<Connection> connection;
  std::unique_ptr<PortReservation> port;  // hosting: rank 0's store port for this attempt
  std::unique_ptr<asio::steady_timer> beat_timer;
  std::unique_ptr<asio::steady_timer> silence_timer;
  std::unique_ptr<asio::steady_timer> connect_timer;
  std::unique_ptr<asio::steady_timer> probe_timer;
  // Bounds what this node waits for, whatever the rendezvous does: an answer to a join, and
  // (on node 0) the drain at the end.
  std::unique_ptr<asio::steady_timer> guard_timer;
  Clock::time_point connect_deadline;
  Clock::time_point last_heard = Clock::now();
  std::optional<Json> pending_join;  // sent once connected
  std::function<void(const std::optional<RemoteVerdict>&)> joined;
  std::function<void(const RemoteVerdict&)> verdict;
  std::optional<RemoteVerdict> early_verdict;  // came while no over() waited for it
  std::function<void()> leave_sent;  // finish()'s `done`, once its "leave" is written
  std::string lost_why;
  bool finished = false;
  // Our bind found the endpoint's port taken on this host: until a message comes, whatever is
  // there may not be a rendezvous at all.
  bool probing = false;
  bool heard = false;          // any message from the rendezvous
  bool final_verdict = false;  // success or failure came: this node leaves with the job
  int opted_in = -1;           // the attempt whose ranks all opted in to live recovery (capable)

  std::string port_taken() const {
    return fmt::format("--rdzv-endpoint {}: the port is in use by another program (not an idist rendezvous)", endpoint);
  }

  bool hosting() const { return server != nullptr || listen_fd >= 0; }

  void send(const Json& message) {
    if (connection && !connection->closed()) connection->send(message);
  }

  void connect() {
    auto socket = std::make_shared<tcp::socket>(*io);
    tcp::resolver resolver(*io);
    boost::system::error_code ec;
    const auto endpoints = resolver.resolve(options.host, std::to_string(options.port), ec);
    if (ec) return give_up(fmt::format("cannot resolve the rendezvous host '{}': {}", options.host, ec.message()));
    asio::async_connect(*socket, endpoints, [this, socket](auto error, const tcp::endpoint&) {
      if (finished) return;
      if (error) {
        // A port of ours that someone holds yet refuses connections: the probe ends it.
        if (Clock::now() >= connect_deadline && !probing)
          return give_up(fmt::format("could not reach the rendezvous at {} within {} ({}): is node 0's idist-run "
                                     "started, with the same endpoint?",
                                     endpoint, common::duration_text(options.join_timeout), error.message()));
        connect_timer->expires_after(kConnectRetry);
        connect_timer->async_wait([this](auto e) {
          if (!e && !finished) connect();
        });
        return;
      }
      connected(std::move(*socket));
    });
  }

  void connected(tcp::socket socket) {
    connection = std::make_shared<Connection>(std::move(socket));
    last_heard = Clock::now();
    connection->start([this](const Json& m) { on_message(m); }, [this](const std::string& why) { on_close(why); });
    if (pending_join) connection->send(*std::exchange(pending_join, std::nullopt));
    beat();
    watch();
  }

  void beat() {
    if (finished || !connection || connection->closed()) return;
    connection->send(Json{{"t", "hb"}});
    beat_timer->expires_after(options.heartbeat);
    beat_timer->async_wait([this](auto ec) {
      if (!ec) beat();
    });
  }

  // The rendezvous' silence, checked when it reaches dead_after rather than at our next
  // heartbeat: noticed within dead_after of its last message, not up to a heartbeat later.
  void watch() {
    if (finished || !connection || connection->closed()) return;
    const auto deadline = last_heard + options.dead_after;
    const auto now = Clock::now();
    if (now >= deadline) {
      // Woken well past the deadline: this idist-run itself did not run meanwhile (stopped, or
      // starved), and the silence it sees is its own. On node 0 that is the rendezvous it hosts.
      const auto late = now - deadline;
      const std::string own = late > kOwnSilence
                                  ? fmt::format("; this idist-run itself did not run for at least {} (stopped or "
                                                "starved): the silence was its own",
                                                common::measured_duration_text(late))
                                  : std::string();
      return connection->close(
          fmt::format("stopped answering (no heartbeat for {}){}", common::duration_text(options.dead_after), own));
    }
    silence_timer->expires_at(deadline);
    silence_timer->async_wait([this](auto ec) {
      if (!ec) watch();
    });
  }

  void on_message(const Json& m) {
    last_heard = Clock::now();
    heard = true;
    if (probing) probe_timer->cancel();
    const auto type = m["t"].get<std::string>();
    if (type == "assign") {
      assignment.attempt = field<int>(m, "attempt", 0);
      assignment.node_rank = field<int>(m, "node_rank", 0);
      assignment.nnodes = field<int>(m, "nnodes", 1);
      assignment.world_size = field<int>(m, "world_size", 1);
      assignment.rank_base = field<int>(m, "rank_base", 0);
      assignment.master_port = field<int>(m, "master_port", 0);
      const int recovery_port = field<int>(m, "recovery_port", 0);
      assignment.recovery_store = recovery_port > 0 ? fmt::format("{}:{}", options.host, recovery_port) : "";
      assignment.joins_after = field<long long>(m, "joins_after", -1);
      compares_stragglers = field<bool>(m, "stragglers", false);
      guard_timer->cancel();
      if (auto done = std::exchange(joined, nullptr)) done(std::nullopt);
    } else if (type == "end") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.end_attempt)
        events.end_attempt(field<std::string>(m, "cause", "another node failed"));
    } else if (type == "verdict") {
      const auto v = rendezvous::verdict_of(m);
      if (v.then != RemoteVerdict::Then::restart) final_verdict = true;
      deliver(v);
    } else if (type == "error") {
      lost_why = "the rendezvous at " + endpoint + " refused this node: " + field<std::string>(m, "message", "?");
    } else if (type == "look") {
      // The views a job-wide stall report needs: this node's ranks, read now.
      if (field<int>(m, "attempt", -1) == assignment.attempt && connection && !connection->closed())
        connection->send(Json{{"t", "views"},
                              {"attempt", assignment.attempt},
                              {"id", field<std::uint64_t>(m, "id", 0)},
                              {"ranks", Json::parse(events.views ? events.views() : std::string("[]"), nullptr,
                                                    false)}});
    } else if (type == "reformed") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.reformed)
        events.reformed(field<std::uint64_t>(m, "generation", 0), field<std::string>(m, "line", ""),
                        field<std::vector<int>>(m, "members", {}));
    } else if (type == "replace") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.replace)
        events.replace(field<int>(m, "lost", -1), field<int>(m, "origin", -1), field<std::uint64_t>(m, "after", 0));
    } else if (type == "members_ended") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.members_ended)
        events.members_ended(field<std::vector<int>>(m, "unjoined", {}));
    } else if (type == "straggler") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.stragglers)
        events.stragglers(field<std::vector<std::string>>(m, "lines", {}),
                          field<std::map<int, double>>(m, "named", {}));
    } else if (type == "report") {
      if (field<int>(m, "attempt", -1) == assignment.attempt && events.report)
        events.report(field<std::vector<std::string>>(m, "lines", {}));
    }
  }

  void deliver(const RemoteVerdict& v) {
    if (auto done = std::exchange(verdict, nullptr)) return done(v);
    // The job ended while this node waited to join it (a late node of an elastic job).
    if (v.then != RemoteVerdict::Then::restart && joined) {
      RemoteVerdict ended = v;
      if (v.then == RemoteVerdict::Then::success) {
        ended.then = RemoteVerdict::Then::failure;
        ended.cause = "the job ended (it succeeded) before this node could join it";
        ended.exit_code = 1;
      }
      return std::exchange(joined, nullptr)(ended);
    }
    early_verdict = v;
    if (v.then == RemoteVerdict::Then::failure && events.end_attempt) events.end_attempt(v.cause);
  }

  void on_close(const std::string& why) {
    if (finished) {
      // The "leave" finish() queued has gone out (or never will): this node may go.
      if (auto done = std::exchange(leave_sent, nullptr)) done();
      return;
    }
    if (probing && !heard) return give_up(port_taken());
    // Live recovery survives any node but node 0, which hosts the rendezvous and the
    // generations' store: said where the job had it, so that nobody expects the survivors to go on.
    const std::string unsurvived =
        opted_in != assignment.attempt || server
            ? ""
            : "; live recovery cannot go on without node 0 (it hosts the rendezvous and the job's generations)";
    const std::string text = !lost_why.empty()
                                 ? lost_why
                                 : fmt::format("lost the rendezvous at {} ({}): {}{}", endpoint,
                                               server ? "hosted by this idist-run, node 0" : "node 0",
                                               why == "the other side closed the connection"
                                                   ? "node 0's idist-run ended or was killed"
                                                   : why,
                                               unsurvived);
    give_up(text);
  }

  // No rendezvous any more: whoever waits hears it once.
  void give_up(const std::string& why) {
    RemoteVerdict v;
    v.cause = why;
    if (auto done = std::exchange(joined, nullptr)) return done(v);
    if (auto done = std::exchange(verdict, nullptr)) return done(v);
    if (!early_verdict) {
      RemoteVerdict v;
      v.cause = why;
      early_verdict = v;
    }
    if (events.lost) events.lost(why);
  }
};

NodeAgent::NodeAgent(RendezvousOptions options) : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.options = std::move(options);
  s.endpoint = s.options.host + ":" + std::to_string(s.options.port);
  if (!s.options.may_host) return;
  int error = 0;
  bool in_use = false;
  s.listen_fd = listen_at(s.options.host, s.options.port, error, in_use);
  if (s.listen_fd < 0 && s.options.node_rank.value_or(-1) == 0)
    throw std::runtime_error(fmt::format("node 0 hosts the rendezvous, but cannot listen at {}: {}", s.endpoint,
                                         error == 0 ? "no address" : std::strerror(error)));
  // The endpoint is this host's and its port is taken: by the agent that hosts (a node started
  // here before us), or by another program, which would leave us waiting join_timeout for a
  // rendezvous that never answers. start() finds out which.
  s.probing = s.listen_fd < 0 && in_use;
}

NodeAgent::~NodeAgent() {
  if (state_->listen_fd >= 0) ::close(state_->listen_fd);
}

RendezvousOptions rendezvous_options(const LaunchPlan& plan, int max_restarts, std::chrono::milliseconds join_timeout,
                                     std::chrono::milliseconds grace) {
  const auto& r = plan.rendezvous.value();
  return {.host = r.host,
          .port = r.port,
          .token = r.token,
          .min_nodes = r.min_nodes,
          .max_nodes = r.max_nodes,
          .node_rank = r.node_rank,
          .nproc = plan.local_count,
          .max_restarts = max_restarts,
          .may_host = r.node_rank.value_or(0) == 0,
          .join_timeout = join_timeout,
          .grace = grace};
}

bool NodeAgent::hosting() const { return state_->hosting(); }

const Assignment& NodeAgent::assignment() const { return state_->assignment; }

void NodeAgent::start(boost::asio::io_context& io, Events events) {
  auto& s = *state_;
  s.io = &io;
  s.events = std::move(events);
  s.beat_timer = std::make_unique<asio::steady_timer>(io);
  s.silence_timer = std::make_unique<asio::steady_timer>(io);
  s.connect_timer = std::make_unique<asio::steady_timer>(io);
  s.probe_timer = std::make_unique<asio::steady_timer>(io);
  s.guard_timer = std::make_unique<asio::steady_timer>(io);
  if (s.listen_fd >= 0) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&address), &length);
    tcp::acceptor acceptor(io, address.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), std::exchange(s.listen_fd, -1));
    s.server = std::make_unique<rendezvous::Server>(
        io, std::move(acceptor),
        rendezvous::ServerOptions{.token = s.options.token,
                                  .min_nodes = s.options.min_nodes,
                                  .max_nodes = s.options.max_nodes,
                                  .max_restarts = s.options.max_restarts,
                                  .last_call = s.options.last_call,
                                  .heartbeat = s.options.heartbeat,
                                  .dead_after = s.options.dead_after,
                                  .join_timeout = s.options.join_timeout,
                                  .grace = s.options.grace,
                                  .stall_timeout = s.options.stall_timeout,
                                  .recovery = s.options.recovery,
                                  .min_world = s.options.min_world});
    s.server->start();
    spdlog::info("rendezvous: hosting at {} for {} node{}", s.endpoint,
                 s.options.min_nodes == s.options.max_nodes ? std::to_string(s.options.max_nodes)
                                                            : fmt::format("{} to {}", s.options.min_nodes, s.options.max_nodes),
                 s.options.max_nodes == 1 ? "" : "s");
  }
  s.connect_deadline = Clock::now() + s.options.join_timeout;
  if (s.probing) {
    s.probe_timer->expires_after(kProbe + s.options.heartbeat);
    s.probe_timer->async_wait([&s](auto ec) {
      if (!ec && !s.heard && !s.finished) s.give_up(s.port_taken());
    });
  }
  s.connect();
}

void NodeAgent::join(int attempt, std::function<void(const std::optional<RemoteVerdict>&)> joined) {
  auto& s = *state_;
  if (s.early_verdict && s.early_verdict->then == RemoteVerdict::Then::failure) return joined(s.early_verdict);
  s.early_verdict.reset();
  s.joined = std::move(joined);
  Json message{{"t", "join"},     {"token", s.options.token}, {"host", common::host_name("localhost")},
               {"nproc", s.options.nproc}, {"hosting", s.server != nullptr}, {"attempt", attempt},
               {"grace_ms", s.options.grace.count()}, {"recovery", s.options.recovery}};
  if (s.options.node_rank) message["node_rank"] = *s.options.node_rank;
  if (s.server) {
    // Rank 0's store gets a fresh port for every attempt, taken while the last one is held.
    try {
      auto fresh = std::make_unique<PortReservation>(s.options.host, "the rendezvous host");
      s.port = std::move(fresh);
    } catch (const std::exception& e) {
      RemoteVerdict v;
      v.cause = fmt::format("cannot reserve a port for rank 0's store: {}", e.what());
      return std::exchange(s.joined, nullptr)(v);
    }
    message["master_port"] = s.port->port();
  }
  if (s.connection && !s.connection->closed()) {
    s.connection->send(message);
  } else {
    s.pending_join = std::move(message);
  }
  // The rendezvous answers within its join timeout (an assignment, or the job's end); should
  // it not, this node does not wait for ever.
  s.guard_timer->expires_after(s.options.join_timeout + std::chrono::seconds(5));
  s.guard_timer->async_wait([&s](auto ec) {
    if (ec || !s.joined) return;
    s.give_up(fmt::format("the rendezvous at {} did not answer this node's join within {}", s.endpoint,
                          common::duration_text(s.options.join_timeout + std::chrono::seconds(5))));
  });
}

void NodeAgent::failed(int attempt, const LocalFailure& failure) {
  auto& s = *state_;
  if (!s.connection || s.connection->closed()) return;
  Json message = rendezvous::failure_json(failure);
  message["t"] = "fail";
  message["attempt"] = attempt;
  s.connection->send(message);
}

void NodeAgent::over(int attempt, const std::optional<LocalFailure>& failure,
                     std::function<void(const RemoteVerdict&)> verdict) {
  auto& s = *state_;
  if (s.early_verdict) return verdict(*std::exchange(s.early_verdict, std::nullopt));
  s.verdict = std::move(verdict);
  Json message{{"t", "over"}, {"attempt", attempt}};
  if (failure) message["failure"] = rendezvous::failure_json(*failure);
  if (s.connection && !s.connection->closed()) s.connection->send(message);
}

void NodeAgent::stalled(int attempt) {
  auto& s = *state_;
  if (s.connection && !s.connection->closed()) s.connection->send(Json{{"t", "stalled"}, {"attempt", attempt}});
}

void NodeAgent::capable(int attempt, bool admits) {
  state_->opted_in = attempt;
  state_->send(Json{{"t", "capable"}, {"attempt", attempt}, {"admits", admits}});
}

void NodeAgent::ended(int attempt, int rank) {
  state_->send(Json{{"t", "ended"}, {"attempt", attempt}, {"rank", rank}});
}

void NodeAgent::admit(int attempt, int origin, const std::string& why) {
  state_->send(Json{{"t", "admit"}, {"attempt", attempt}, {"origin", origin}, {"why", why}});
}

bool NodeAgent::compares_stragglers() const { return state_->compares_stragglers; }

void NodeAgent::share_work(int attempt, const std::string& samples, double threshold) {
  state_->send(Json{{"t", "work"}, {"attempt", attempt}, {"threshold", threshold},
                    {"ranks", Json::parse(samples, nullptr, false)}});
}

void NodeAgent::finish(const std::string& outcome, std::function<void()> done) {
  auto& s = *state_;
  s.finished = true;
  s.beat_timer->cancel();
  s.silence_timer->cancel();
  s.connect_timer->cancel();
  s.probe_timer->cancel();
  if (s.connection && !s.final_verdict && !s.connection->closed()) {
    // Leaving before the job's verdict (a signal, the timeout, ranks it could not start): the
    // rendezvous names why, rather than a node lost for no known reason.
    s.connection->send(Json{{"t", "leave"}, {"why", outcome}});
    s.connection->close_after_sends();
  } else if (s.connection) {
    s.connection->close("the job is over here");
  }
  if (!s.server) {
    s.guard_timer->cancel();
    if (!s.connection || s.connection->closed()) return done();
    // The supervisor stops the event loop at `done`: the "leave" must be written first, or the
    // rendezvous hears a node lost rather than why it left. Bounded: a peer that reads nothing.
    s.leave_sent = std::move(done);
    s.guard_timer->expires_after(kLeaveFlush);
    s.guard_timer->async_wait([&s](auto ec) {
      if (ec) return;
      if (auto d = std::exchange(s.leave_sent, nullptr)) d();
    });
    return;
  }
  // The server drains within its own grace; this bounds it from outside, once.
  auto once = std::make_shared<std::function<void()>>(std::move(done));
  auto call = [once] {
    if (auto f = std::exchange(*once, nullptr)) f();
  };
  s.guard_timer->expires_after(std::chrono::seconds(10));
  s.guard_timer->async_wait([call](auto ec) {
    if (!ec) call();
  });
  s.server->when_drained(s.final_verdict ? std::string() : outcome, [&s, call] {
    s.guard_timer->cancel();
    call();
  });
}

void NodeAgent::detach() {
  auto& s = *state_;
  s.finished = true;
  s.leave_sent = nullptr;  // the loop is gone: nothing may be called on it
  if (s.connection) s.connection->close("the job is over here");
  s.connection.reset();
  s.server.reset();
  s.beat_timer.reset();
  s.silence_timer.reset();
  s.connect_timer.reset();
  s.probe_timer.reset();
  s.guard_timer.reset();
}

}  // namespace idist::launchers

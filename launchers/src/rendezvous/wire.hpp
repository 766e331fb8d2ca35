#pragma once
// The node agents' rendezvous protocol: one TCP connection per agent to the rendezvous
// (rendezvous.hpp), both ways, messages as JSON objects in frames of a 4-byte little-endian
// length and the text. Every message has "t", its type:
//
//   agent -> rendezvous                          rendezvous -> agent
//   join  {token, host, nproc, node_rank?,       assign  {attempt, node_rank, nnodes, world_size,
//          hosting, master_port, grace_ms,                rank_base, master_port}
//          recovery}
//   fail  {attempt, rank, how, exit_code}        end     {attempt, cause}: stop your ranks
//   over  {attempt, failure?{rank,how,exit_code}} verdict {attempt, then: restart|success|failure,
//   leave {why}: then it closes                           cause?, exit_code?, restarts_left}
//   hb    {}                                     hb {}; error {message} (then it closes)
//
//   stalled {attempt}                            look {attempt, id}
//   views {attempt, id, ranks}                   report {attempt, lines}
//
//   capable {attempt, admits?}                   assign's recovery_port (live recovery offered),
//                                                        joins_after (a node joining it live)
//   ended {attempt, rank}                        reformed {attempt, generation, line, members}
//   admit {attempt, origin, why}                 replace {attempt, lost, origin, after}
//   fail's recoverable, replaceable: true        members_ended {attempt, unjoined}
//   work {attempt, threshold, ranks}             straggler {attempt, lines, named}
//
// An agent joins, runs its ranks once assigned, says "fail" at its first failing rank and
// "over" once its ranks are gone; the rendezvous answers every node's "over" with one verdict
// for all. Heartbeats go both ways, so either side notices the other's silence. An agent whose
// ranks stall says "stalled"; the rendezvous asks every node to "look" at its ranks, and sends
// the report made from all their "views" (stall_report.hpp) to every node. An agent that
// leaves before the job's verdict says why ("leave"), so that the others hear its cause.
// Live recovery (node 0 hosts the generations' store at recovery_port): an agent whose ranks
// all opted in says "capable" (again with admits, once they all admit replacements: a node
// may then join the running attempt live, assigned with joins_after); its loss of a rank, "fail" with recoverable (and replaceable,
// where its other ranks admit a replacement: the rendezvous answers "replace", origin -1 for
// none); a rank that ended its program while others run, "ended"; a replacement that beats,
// "admit"; every node hears each generation ("reformed", with its members), and where every
// member ended, which replacements never joined ("members_ended"). Each agent shares its ranks'
// work counters ("work", about four times a second while they run); the rendezvous compares
// every node's ranks and tells every node who straggles ("straggler", job_stragglers.hpp).

#include <fcntl.h>

#include <boost/asio.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "idist/launchers/coordinator.hpp"
#include "rules.hpp"

namespace idist::launchers::rendezvous {

using Json = nlohmann::json;
namespace asio = boost::asio;
using asio::ip::tcp;

// Above any message (an assignment is ~200 bytes; a node's views for a stall report are kept
// under stall_report.hpp's kViewsBudget), far below what a stranger could make us buffer.
inline constexpr std::uint32_t kMaxFrame = 1024 * 1024;

// One end of an agent's connection: framed reads into `on_message` until the peer closes or
// errs (`on_close`, once, with why); writes queued in order. Lives as long as a handler holds it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using OnMessage = std::function<void(const Json&)>;
  using OnClose = std::function<void(const std::string& why)>;

  explicit Connection(tcp::socket socket) : socket_(std::move(socket)) {
    // Not the ranks' to inherit: a rank holding the agent's connection would keep it open
    // after a kill -9 of the agent, and its loss would be noticed only by silence.
    ::fcntl(socket_.native_handle(), F_SETFD, FD_CLOEXEC);
    boost::system::error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    const auto remote = socket_.remote_endpoint(ignored);
    address_ = ignored ? std::string("?") : remote.address().to_string();
    peer_ = ignored ? address_ : address_ + ":" + std::to_string(remote.port());
  }

  void start(OnMessage on_message, OnClose on_close) {
    on_message_ = std::move(on_message);
    on_close_ = std::move(on_close);
    read_header();
  }

  void send(const Json& message) {
    if (closed_) return;
    const std::string text = message.dump();
    std::string frame(4, '\0');
    const auto n = static_cast<std::uint32_t>(text.size());
    for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    frame += text;
    queue_.push_back(std::move(frame));
    if (queue_.size() == 1) write_next();
  }

  // Sends what is queued, then closes (an error message before hanging up).
  void close_after_sends() {
    closing_ = true;
    if (queue_.empty()) close("closed here");
  }

  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (auto callback = std::move(on_close_)) callback(why);
    on_message_ = nullptr;
  }

  bool closed() const { return closed_; }
  const std::string& peer() const { return peer_; }
  // The peer's address without its port: one node's connections share it.
  const std::string& address() const { return address_; }

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this()](auto ec, std::size_t) {
      // A reset is a close too: a process killed with bytes it had not read resets.
      if (ec == asio::error::eof || ec == asio::error::connection_reset)
        return self->close("the other side closed the connection");
      if (ec) return self->close(ec.message());
      std::uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(self->header_[static_cast<std::size_t>(i)]) << (8 * i);
      if (n > kMaxFrame) return self->close("a frame of " + std::to_string(n) + " bytes: not our protocol");
      self->body_.resize(n);
      self->read_body();
    });
  }

  void read_body() {
    asio::async_read(socket_, asio::buffer(body_), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return self->close(ec.message());
      Json message = Json::parse(self->body_, nullptr, false);
      if (message.is_discarded() || !message.is_object() || !message.contains("t") || !message["t"].is_string())
        return self->close("a message that is not ours");
      // A copy: the handler may close this connection, which lets go of on_message_.
      if (auto handler = self->on_message_) handler(message);
      if (!self->closed_) self->read_header();
    });
  }

  void write_next() {
    asio::async_write(socket_, asio::buffer(queue_.front()), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return self->close(ec.message());
      self->queue_.pop_front();
      if (!self->queue_.empty()) return self->write_next();
      if (self->closing_) self->close("closed here");
    });
  }

  tcp::socket socket_;
  std::string peer_;
  std::string address_;
  OnMessage on_message_;
  OnClose on_close_;
  std::array<unsigned char, 4> header_{};
  std::string body_;
  std::deque<std::string> queue_;
  bool closing_ = false;
  bool closed_ = false;
};

// A field of a message, or `fallback` when absent or of another type.
template <class T>
T field(const Json& message, const char* name, T fallback) {
  const auto it = message.find(name);
  if (it == message.end()) return fallback;
  try {
    return it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

using rules::kEndedByNodes;
using rules::kEndedByRestarts;

// A failure as a node reports it (its "fail", its "over"'s final word; on etcd a/K/fail/ID), and
// as the rules read it: about node rank `node_rank`.
inline Json failure_json(const LocalFailure& f) {
  Json j{{"rank", f.rank}, {"how", f.how}, {"exit_code", f.exit_code}, {"root", f.root_cause}};
  if (f.lost_peer) j["lost_peer"] = *f.lost_peer;
  if (f.recoverable) j["recoverable"] = true;
  if (f.replaceable) j["replaceable"] = true;
  return j;
}
inline rules::Failure failure_of(const Json& m, int node_rank) {
  rules::Failure f;
  f.node_rank = node_rank;
  f.rank = field<int>(m, "rank", -1);
  f.how = field<std::string>(m, "how", "failed");
  f.exit_code = field<int>(m, "exit_code", 1);
  f.root = field<bool>(m, "root", false);
  if (m.contains("lost_peer") && m["lost_peer"].is_number_integer()) f.lost_peer = m["lost_peer"].get<int>();
  f.recoverable = field<bool>(m, "recoverable", false);
  f.replaceable = field<bool>(m, "replaceable", false);
  return f;
}

// A verdict of the rules as both rendezvous write it: the built-in one's "verdict" message (with
// its "t"), and the etcd one's state; verdict_of() reads either.
inline Json verdict_json(const rules::Verdict& v) {
  using Then = rules::Verdict::Then;
  Json j{{"attempt", v.attempt},
         {"then", v.then == Then::restart ? "restart" : v.then == Then::success ? "success" : "failure"}};
  if (v.then == Then::success) return j;
  j["cause"] = v.cause;
  j["rank"] = v.rank;
  if (v.then == Then::restart) {
    j["next"] = v.next;
    j["restarts_left"] = v.restarts_left;
    j["counted"] = v.counted;
    return j;
  }
  j["exit_code"] = v.exit_code;
  if (!v.ended_by.empty()) j["ended_by"] = std::string(v.ended_by);
  return j;
}

// A job's verdict as both rendezvous write it: the built-in one's "verdict" message, and the
// etcd one's state (the same keys, so that every node reads one meaning).
inline RemoteVerdict verdict_of(const Json& m) {
  RemoteVerdict v;
  const auto then = field<std::string>(m, "then", "failure");
  v.then = then == "restart"   ? RemoteVerdict::Then::restart
           : then == "success" ? RemoteVerdict::Then::success
                               : RemoteVerdict::Then::failure;
  v.next_attempt = field<int>(m, "next", 0);
  v.cause = field<std::string>(m, "cause", "");
  v.exit_code = field<int>(m, "exit_code", 1);
  v.restarts_left = field<int>(m, "restarts_left", 0);
  v.counted = field<bool>(m, "counted", true);
  v.rank = field<int>(m, "rank", -1);
  const auto ended_by = field<std::string>(m, "ended_by", "");
  v.ended_by = ended_by == kEndedByRestarts ? RemoteVerdict::End::restarts_spent
               : ended_by == kEndedByNodes  ? RemoteVerdict::End::too_few_nodes
                                            : RemoteVerdict::End::other;
  return v;
}

}  // namespace idist::launchers::rendezvous

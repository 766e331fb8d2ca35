#include "idist_store/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cstdlib>
#include <functional>
#include <future>
#include <list>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "log.hpp"
#include "store/store.hpp"
#include "store/wire.hpp"

namespace idist::detail {

std::vector<char> hello_frame(std::string_view token) {
  return wire::Writer(static_cast<std::uint8_t>(wire::Op::hello)).bytes(token).frame();
}

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// A body is read in pieces of at most this, so that memory grows with the bytes a client has
// actually sent, not with the length it announced.
constexpr std::size_t kReadChunk = 64 * 1024;

class Session;

// Lines about what strangers do (a flood of connections) are summed up, so that the flood
// does not flood the log too: the first at once, then at most one a second with the count and
// the latest peer. The last count is written a second after the one before even if nothing
// follows it, so that no refusal goes unlogged.
class RateLimitedLog {
 public:
  using Line = std::function<void(std::size_t count, const std::string& latest_peer)>;
  RateLimitedLog(asio::io_context& io, Line line) : timer_(io), line_(std::move(line)) {}

  void note(const std::string& peer) {
    const auto now = Clock::now();
    if (!armed_ && now - last_ >= kEvery) {
      last_ = now;
      return line_(1, peer);
    }
    ++pending_;
    latest_ = peer;
    if (armed_) return;
    armed_ = true;
    timer_.expires_at(last_ + kEvery);
    timer_.async_wait([this](auto ec) {
      armed_ = false;
      if (ec || pending_ == 0) return;
      last_ = Clock::now();
      line_(std::exchange(pending_, 0), latest_);
    });
  }

  // The count not logged yet, as the server stops (its io thread is gone then: no timer).
  void flush() {
    if (pending_ > 0) line_(std::exchange(pending_, 0), latest_);
  }

 private:
  static constexpr auto kEvery = std::chrono::seconds(1);
  asio::steady_timer timer_;
  Line line_;
  Clock::time_point last_{};
  std::size_t pending_ = 0;
  std::string latest_;
  bool armed_ = false;
};

// All state lives on the server's single io thread: no locks.
struct ServerState {
  explicit ServerState(asio::io_context& io);
  StoreServerOptions options;
  std::unordered_map<std::string, std::vector<char>> data;
  std::size_t data_bytes = 0;  // keys and values in `data`
  // Sessions whose reply is held until a key appears.
  std::unordered_map<std::string, std::vector<std::weak_ptr<Session>>> waiters;
  std::set<std::shared_ptr<Session>> sessions;  // owns every open connection
  // The sessions that have not presented the token yet, oldest first: when the store is at
  // its cap (or out of descriptors) the oldest of them makes room for a newcomer, so that
  // strangers' idle connections can never keep out a rank of the job, whose hello follows its
  // connection at once. Only the job's own ranks, once in, are never pushed out.
  std::list<Session*> strangers;
  RateLimitedLog evictions;     // strangers dropped to make room
  std::string eviction_why;     // why room was needed, the latest time
  RateLimitedLog slow_hellos;   // strangers dropped for saying nothing in time

  // Stores value at key unless that takes the store past its bounds; returns why not, or
  // nullptr when stored.
  const char* put(std::string_view key, std::vector<char> value);
  void key_set(const std::string& key);
  void forget_waiter(const std::string& key, const Session* session);
};

// Says `why` on a connection about to be closed, without waiting: the frame is small and the
// connection new, so it fits the socket's buffer. BUSY when the client may try again (room
// was made), ERROR when it may not (wire.hpp). What the client sent (its hello) is read off
// first, since closing with unread bytes resets the connection, and a reset may beat our reply
// to the client.
void turn_away(tcp::socket& socket, const std::string& why, wire::Reply code = wire::Reply::busy) {
  const auto frame = wire::Writer(static_cast<std::uint8_t>(code)).bytes(why).frame();
  const int fd = socket.native_handle();
  [[maybe_unused]] const auto sent = ::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  std::array<char, wire::kMaxHelloFrame + 4> sink{};
  for (int i = 0; i < 4 && ::recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0; ++i) {
  }
  boost::system::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

// One client connection. The client sends one request and waits for its reply, so a session
// reads a request, answers it (possibly later, for get/wait), then reads the next.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerState& state, tcp::socket socket)
      : state_(state), socket_(std::move(socket)), hello_timer_(socket_.get_executor()),
        frame_timer_(socket_.get_executor()) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() {
    stranger_ = state_.strangers.insert(state_.strangers.end(), this);
    // A stranger that connects and says nothing would otherwise hold a connection forever.
    hello_timer_.expires_after(state_.options.hello_timeout);
    hello_timer_.async_wait([self = shared_from_this()](auto ec) {
      if (ec || self->authenticated_ || self->closed_) return;
      self->state_.slow_hellos.note(self->peer_);
      self->close();
    });
    read_header();
  }

  // Called when `key` was set; replies once every key this session waits for exists.
  void key_arrived(const std::string& key) {
    if (pending_.erase(key) == 0 || !pending_.empty() || closed_) return;
    reply_ready();
  }

  const std::string& peer() const { return peer_; }

  // Drops this stranger to make room, telling it why (BUSY): should it be a rank whose hello
  // is still on its way, the rank tries again rather than take it for rank 0's exit.
  void evict(const std::string& why) {
    if (closed_) return;
    state_.evictions.note(peer_);
    turn_away(socket_, why);
    close();
  }

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return self->close();
      const auto length = wire::read_u32(self->header_.data());
      const auto limit = self->authenticated_ ? wire::kMaxFrame : wire::kMaxHelloFrame;
      if (const char* why = wire::check_frame_length(length, limit)) return self->close(why);
      self->body_.clear();
      self->body_length_ = length;
      // Between requests a client may be idle for the whole job, but once a frame has begun
      // its sender is supposed to finish it: a stalled half frame is a slow-loris.
      const auto generation = ++self->frame_generation_;
      self->frame_timer_.expires_after(self->state_.options.frame_timeout);
      self->frame_timer_.async_wait([self, generation](auto ec2) {
        if (!ec2 && self->frame_generation_ == generation) self->close("stalled in the middle of a message");
      });
      self->read_body();
    });
  }

  void read_body() {
    const auto have = body_.size();
    const auto chunk = std::min<std::size_t>(body_length_ - have, kReadChunk);
    body_.resize(have + chunk);
    asio::async_read(socket_, asio::buffer(body_.data() + have, chunk), [self = shared_from_this(), have](auto ec, std::size_t n) {
      // A client that goes away between messages is just leaving; one that goes away inside
      // a message is broken or hostile, and the log should say which peer it was.
      if (ec && !self->closed_ && ec != asio::error::operation_aborted)
        return self->close("closed in the middle of a message (" + std::to_string(have + n) + " of " +
                           std::to_string(self->body_length_) + " bytes)");
      if (ec) return self->close();
      if (self->body_.size() < self->body_length_) return self->read_body();
      ++self->frame_generation_;
      self->frame_timer_.cancel();
      self->handle();
    });
  }

  void handle() {
    auto parsed = wire::parse_request({body_.data(), body_.size()});
    if (!authenticated_) {
      if (!parsed.request || parsed.request->op != wire::Op::hello) return close("no hello");
      if (!state_.options.token.empty() && parsed.request->token != state_.options.token) {
        detail::log().warn("idist store: refused a client from {}: wrong or missing IDIST_JOB_TOKEN", peer_);
        closing_ = true;
        return send_error(wire::kWrongToken);
      }
      authenticated_ = true;
      state_.strangers.erase(stranger_);
      hello_timer_.cancel();
      return send_ok();
    }
    if (!parsed.request) {
      if (parsed.fatal) return close(parsed.error);
      detail::log().warn("idist store: refused a request from {}: {}", peer_, parsed.error);
      return send_error(parsed.error);
    }
    const auto& r = *parsed.request;
    switch (r.op) {
      case wire::Op::hello:
        return close("a second hello");
      case wire::Op::set: {
        if (const char* why = state_.put(r.key, {r.value.begin(), r.value.end()})) return refuse(why);
        send_ok();
        return state_.key_set(std::string(r.key));
      }
      case wire::Op::get:
        pending_get_ = std::string(r.key);
        return await({*pending_get_});
      case wire::Op::add: {
        const std::string key(r.key);
        auto it = state_.data.find(key);
        auto slot = it == state_.data.end() ? std::vector<char>() : it->second;
        std::int64_t value = 0;
        try {
          value = add_to_counter(slot, r.delta);
        } catch (const std::exception& e) {
          return refuse(std::string("add on '") + key + "': " + e.what());
        }
        if (const char* why = state_.put(key, std::move(slot))) return refuse(why);
        send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::value)).i64(value).frame());
        return state_.key_set(key);
      }
      case wire::Op::wait:
        return await({r.keys.begin(), r.keys.end()});
      case wire::Op::check: {
        std::string present;
        for (const auto& k : r.keys) present.push_back(state_.data.count(std::string(k)) ? '1' : '0');
        return send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::value)).bytes(present).frame());
      }
    }
  }

  // Replies now if every key exists, otherwise parks the session until they do.
  void await(const std::vector<std::string>& keys) {
    for (const auto& k : keys)
      if (!state_.data.count(k)) pending_.insert(k);
    if (pending_.empty()) return reply_ready();
    for (const auto& k : pending_) state_.waiters[k].push_back(weak_from_this());
    // A synchronous client sends nothing while parked, so readability means it gave up
    // (timeout) and closed. The generation keeps a wait left over from an earlier park from
    // closing a session that is legitimately parked again.
    const auto generation = ++park_generation_;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](auto) {
      if (!self->pending_.empty() && self->park_generation_ == generation) self->close();
    });
  }

  void reply_ready() {
    if (!pending_get_) return send_ok();
    const auto& value = state_.data.at(*pending_get_);
    pending_get_.reset();
    send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::value)).bytes({value.data(), value.size()}).frame());
  }

  // A well-formed request the store will not carry out: the client hears why and may go on.
  void refuse(const std::string& why) {
    detail::log().warn("idist store: refused a request from {}: {}", peer_, why);
    send_error(why);
  }

  void send_ok() { send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::ok)).frame()); }
  void send_error(std::string_view why) {
    send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::error)).bytes(why).frame());
  }

  void send(std::vector<char> frame) {
    out_ = std::move(frame);
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec || self->closing_) return self->close();
      self->read_header();
    });
  }

  void close(const char* why = nullptr) { close(why == nullptr ? std::string() : std::string(why)); }
  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    if (!why.empty()) detail::log().warn("idist store: dropped client {}: {}", peer_, why);
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    hello_timer_.cancel();
    frame_timer_.cancel();
    if (!authenticated_) state_.strangers.erase(stranger_);
    // Clients that wait for keys nobody sets and then go away must not leave entries behind.
    for (const auto& k : pending_) state_.forget_waiter(k, this);
    pending_.clear();
    body_ = {};
    out_ = {};
    state_.sessions.erase(shared_from_this());
  }

  ServerState& state_;
  tcp::socket socket_;
  asio::steady_timer hello_timer_;
  asio::steady_timer frame_timer_;
  std::string peer_;
  std::array<char, 4> header_{};
  std::vector<char> body_;
  std::size_t body_length_ = 0;
  std::vector<char> out_;
  std::list<Session*>::iterator stranger_;  // in state_.strangers while not authenticated_
  bool authenticated_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::set<std::string> pending_;
  std::optional<std::string> pending_get_;
  std::uint64_t park_generation_ = 0;
  std::uint64_t frame_generation_ = 0;
};

ServerState::ServerState(asio::io_context& io)
    : evictions(io, [this](std::size_t n, const std::string& latest) {
        detail::log().warn(
            "idist store: dropped {} connection(s) (latest from {}) that had not presented the job token, to make room: {}",
            n, latest, eviction_why);
      }),
      slow_hellos(io, [](std::size_t n, const std::string& latest) {
        detail::log().warn("idist store: dropped {} client(s) (latest {}): no hello in time", n, latest);
      }) {}

const char* ServerState::put(std::string_view key, std::vector<char> value) {
  auto it = data.find(std::string(key));
  const std::size_t old_bytes = it == data.end() ? 0 : key.size() + it->second.size();
  const std::size_t new_bytes = key.size() + value.size();
  if (it == data.end() && data.size() >= options.max_keys) return "the store is full (too many keys)";
  if (data_bytes - old_bytes + new_bytes > options.max_bytes) return "the store is full (too many bytes)";
  data_bytes = data_bytes - old_bytes + new_bytes;
  if (it == data.end()) {
    data.emplace(std::string(key), std::move(value));
  } else {
    it->second = std::move(value);
  }
  return nullptr;
}

void ServerState::key_set(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto parked = std::move(it->second);
  waiters.erase(it);
  for (auto& weak : parked)
    if (auto session = weak.lock()) session->key_arrived(key);
}

void ServerState::forget_waiter(const std::string& key, const Session* session) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::erase_if(it->second, [&](const std::weak_ptr<Session>& weak) {
    auto locked = weak.lock();
    return !locked || locked.get() == session;
  });
  if (it->second.empty()) waiters.erase(it);
}

}  // namespace

namespace {

// Descriptors may run short for a moment (another thread of rank 0 between open and close):
// only once they have been short this long does the store refuse for good (ERROR), so that a
// rank refused then would have waited for nothing.
constexpr auto kShortOfDescriptorsGrace = std::chrono::milliseconds(500);

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system;
}

}  // namespace

struct TcpStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  ServerState state{io};
  std::thread thread;
  std::size_t open_at_refusal = 0;
  // Held open only to be closed when descriptors run out: the one free descriptor that lets
  // the store accept a waiting connection and tell it why it cannot stay, where it could
  // otherwise only leave it in the listen queue until the client's deadline (300 s).
  int reserve_fd = -1;
  std::optional<Clock::time_point> short_since;  // since when accept() has failed for descriptors
  RateLimitedLog refusals{io, [this](std::size_t n, const std::string& latest) {
                            detail::log().warn("idist store: refused {} connection(s) (latest from {}): already {} open, the limit",
                                               n, latest, open_at_refusal);
                          }};
  std::string short_why;  // the latest refusal for want of descriptors
  RateLimitedLog short_refusals{io, [this](std::size_t n, const std::string& latest) {
                                  detail::log().warn("idist store: refused {} connection(s) (latest from {}): {}", n, latest,
                                                     short_why);
                                }};
  RateLimitedLog accept_failures{io, [](std::size_t n, const std::string& what) {
                                   detail::log().warn("idist store: accept failed {} time(s): {}", n, what);
                                 }};

  Impl() { reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
  ~Impl() {
    if (reserve_fd >= 0) ::close(reserve_fd);
  }

  // Makes room for a newcomer by dropping the oldest stranger; false when every open
  // connection is the job's own.
  bool evict_a_stranger(const std::string& why) {
    if (state.strangers.empty()) return false;
    state.eviction_why = why;
    // The session erases itself from the list as it closes.
    state.strangers.front()->evict(why);
    return true;
  }

  std::string full_text() const {
    return "the store is full: " + std::to_string(state.options.max_connections) +
           " connections open, its limit (max_connections)";
  }

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (out_of_descriptors(ec)) return on_out_of_descriptors(ec);
      if (ec) return retry_accept(ec);
      short_since.reset();
      take(std::move(socket));
      accept();
    });
  }

  // ENOBUFS and the like, or descriptors short for less than the grace: accepting again at
  // once would spin.
  void retry_accept(const boost::system::error_code& ec) {
    accept_failures.note(ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](auto ec2) {
      if (!ec2) accept();
    });
  }

  void take(tcp::socket socket) {
    if (state.sessions.size() >= state.options.max_connections && !evict_a_stranger(full_text()))
      return refuse_connection(socket);
    // As the listener's (below): a connection accepted here is not the processes' the host
    // starts (a rank holding idist-run's watcher open would hide idist-run's death).
    ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
    boost::system::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    auto session = std::make_shared<Session>(state, std::move(socket));
    state.sessions.insert(session);
    session->start();
  }

  // Whether a connection is in the listen queue. accept() fails for want of a descriptor
  // before it looks for one, so its failure alone says nothing of a newcomer.
  bool connection_waiting() {
    pollfd p{acceptor.native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }

  void on_out_of_descriptors(const boost::system::error_code& ec) {
    // Nobody waiting: dropping a stranger now (maybe the rank just accepted, its hello on its
    // way) would make room for no one. Wait for a newcomer instead, without spinning.
    if (!connection_waiting()) {
      acceptor.async_wait(tcp::acceptor::wait_read, [this](auto ec2) {
        if (!ec2) accept();
      });
      return;
    }
    const std::string why =
        "rank 0 is out of file descriptors (" + ec.message() +
        (ec == asio::error::no_descriptors ? "; raise its RLIMIT_NOFILE, ulimit -n)" : "; the system's file table)");
    if (evict_a_stranger(why)) return accept();  // a descriptor is free again: the one waiting may be a rank
    const auto now = Clock::now();
    if (!short_since) short_since = now;
    if (now - *short_since < kShortOfDescriptorsGrace || reserve_fd < 0) return retry_accept(ec);
    // Every descriptor is held by the job's own connections (and rank 0's other work), none
    // of which is going away: a rank left in the listen queue would wait its whole timeout.
    // Answer each connection as it comes instead (readability: no spinning while none does).
    acceptor.async_wait(tcp::acceptor::wait_read, [this, why](auto ec2) {
      if (ec2) return;
      turn_away_waiting(why);
      accept();
    });
  }

  // A connection is waiting while descriptors are short: served if one came free meanwhile,
  // else accepted on the reserve descriptor and refused for good, naming the cause.
  void turn_away_waiting(const std::string& why) {
    tcp::socket socket(io);
    boost::system::error_code ec;
    acceptor.non_blocking(true, ec);
    acceptor.accept(socket, ec);
    if (!ec) {
      short_since.reset();
      return take(std::move(socket));
    }
    if (!out_of_descriptors(ec) || reserve_fd < 0) return;  // would block: the client gave up meanwhile
    ::close(reserve_fd);
    acceptor.accept(socket, ec);
    if (!ec) {
      const auto peer = socket.remote_endpoint(ec);
      short_why = why + ", with " + std::to_string(state.sessions.size()) + " store connections open, all of them this job's";
      short_refusals.note(ec ? std::string("?") : peer.address().to_string());
      turn_away(socket, short_why, wire::Reply::error);
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  // Over the connection cap with only the job's own connections open: nothing to make room
  // with, nor will there be (a job's ranks keep theirs to the end). The newcomer hears why
  // (ERROR) and gives up at once rather than wait out its deadline.
  void refuse_connection(tcp::socket& socket) {
    boost::system::error_code ec;
    const auto peer = socket.remote_endpoint(ec);
    open_at_refusal = state.sessions.size();
    refusals.note(ec ? std::string("?") : peer.address().to_string());
    turn_away(socket, full_text() + ", all of them this job's", wire::Reply::error);
  }
};

TcpStoreServer::TcpStoreServer(const StoreServerOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->state.options = options;
  const std::string where = options.host + ":" + std::to_string(options.port);
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto results = resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::numeric_service, ec);
  if (ec) throw std::runtime_error("cannot resolve MASTER_ADDR for the store at " + where + ": " + ec.message());
  if (results.empty()) throw std::runtime_error("cannot resolve MASTER_ADDR for the store at " + where);

  auto& acceptor = impl_->acceptor;
  auto try_bind = [&](const tcp::endpoint& ep) {
    acceptor.close(ec);
    if (acceptor.open(ep.protocol(), ec)) return;
    // Not into the processes the host starts (idist-run's ranks): the port must close when the
    // host ends, or a rank would hold it open past idist-run's death.
    ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
    // SO_REUSEADDR is what lets us take over the port idist-run reserved for us.
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (acceptor.bind(ep, ec)) return;
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
  };
  if (options.bind_all) {
    const auto protocol = results.begin()->endpoint().protocol();
    try_bind(tcp::endpoint(protocol == tcp::v6() ? tcp::v6() : tcp::v4(), static_cast<unsigned short>(options.port)));
  } else {
    // Only the address rank 0 is reached at: the store is no business of other networks.
    for (const auto& entry : results) {
      try_bind(entry.endpoint());
      if (!ec) break;
    }
  }
  if (ec == boost::system::errc::address_in_use)
    throw std::runtime_error("cannot listen on " + where + " for the store: " + ec.message() +
                             " (another job on this port? choose one with --master-port or MASTER_PORT)");
  if (ec == boost::system::errc::address_not_available)
    throw std::runtime_error("cannot listen on " + where + " for the store: " + ec.message() +
                             " (MASTER_ADDR is not an address of this host; behind NAT or a floating alias, set " +
                             "IDIST_STORE_BIND_ALL=1 to listen on every interface)");
  if (ec) throw std::runtime_error("cannot listen on " + where + " for the store: " + ec.message());

  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->io.run();
    } catch (const std::exception& e) {
      detail::log().error("idist store: server stopped: {}", e.what());
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->refusals.flush();
  impl_->short_refusals.flush();
  impl_->accept_failures.flush();
  impl_->state.evictions.flush();
  impl_->state.slow_hellos.flush();
  // The listening socket closes before the clients' connections do (when the io context's
  // handlers are destroyed): a client that sees its connection close may connect again at
  // once and must be refused, not greeted by this dying store. finalize() relies on it.
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
}

namespace {

// Runs `f` on the server's io thread, which owns every piece of its state, and returns what it
// returns; bounded, for a server whose thread has stopped. The promise is shared with the io
// thread, which may outlive a wait that gave up.
template <class F>
auto on_io_thread(asio::io_context& io, const std::string& what, F f) {
  using Result = decltype(f());
  auto result = std::make_shared<std::promise<Result>>();
  auto done = result->get_future();
  asio::post(io, [f = std::move(f), result]() mutable { result->set_value(f()); });
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
    throw std::runtime_error("cannot " + what + ": the store's thread does not answer");
  return done.get();
}

}  // namespace

void TcpStoreServer::set(const std::string& key, std::vector<char> value) {
  auto put = [state = &impl_->state, key, value = std::move(value)]() mutable {
    const char* why = state->put(key, std::move(value));
    if (why == nullptr) state->key_set(key);
    return why;
  };
  const char* refused = on_io_thread(impl_->io, "store " + key, std::move(put));
  if (refused != nullptr) throw std::runtime_error("cannot store " + key + ": " + refused);
}

std::vector<bool> TcpStoreServer::check(const std::vector<std::string>& keys) {
  return on_io_thread(impl_->io, "check the store", [state = &impl_->state, keys] {
    std::vector<bool> present;
    for (const auto& k : keys) present.push_back(state->data.count(k) > 0);
    return present;
  });
}

int TcpStoreServer::port() const { return impl_->acceptor.local_endpoint().port(); }

std::string TcpStoreServer::listen_address() const { return impl_->acceptor.local_endpoint().address().to_string(); }

}  // namespace idist::detail

#include "store/tcp_store_server.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio.hpp>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "store/store.hpp"
#include "store/wire.hpp"

namespace idist::detail {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class Session;

// All state lives on the server's single io thread: no locks.
struct ServerState {
  std::string token;
  std::unordered_map<std::string, std::vector<char>> data;
  // Sessions whose reply is held until a key appears.
  std::unordered_map<std::string, std::vector<std::weak_ptr<Session>>> waiters;
  std::set<std::shared_ptr<Session>> sessions;  // owns every open connection

  void key_set(const std::string& key);
};

// One client connection. The client sends one request and waits for its reply, so a session
// reads a request, answers it (possibly later, for get/wait), then reads the next.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerState& state, tcp::socket socket) : state_(state), socket_(std::move(socket)) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() { read_header(); }

  // Called when `key` was set; replies once every key this session waits for exists.
  void key_arrived(const std::string& key) {
    if (pending_.erase(key) == 0 || !pending_.empty() || closed_) return;
    reply_ready();
  }

 private:
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return self->close();
      const auto length = wire::read_u32(self->header_.data());
      if (length == 0 || length > wire::kMaxFrame) return self->close("frame length out of bounds");
      self->body_.resize(length);
      asio::async_read(self->socket_, asio::buffer(self->body_), [self](auto ec2, std::size_t) {
        if (ec2) return self->close();
        self->handle();
      });
    });
  }

  void handle() {
    wire::Reader in({body_.data(), body_.size()});
    const auto code = in.code();
    if (!authenticated_) {
      auto token = in.bytes();
      if (code != static_cast<std::uint8_t>(wire::Op::hello) || !token) return close("no hello");
      if (!state_.token.empty() && *token != state_.token) {
        spdlog::warn("idist store: refused a client from {}: wrong or missing IDIST_JOB_TOKEN", peer_);
        closing_ = true;
        return send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::error)).bytes("wrong job token").frame());
      }
      authenticated_ = true;
      return send_ok();
    }
    switch (static_cast<wire::Op>(code.value_or(0))) {
      case wire::Op::set: {
        auto key = in.bytes();
        auto value = in.bytes();
        if (!key || !value || !in.done()) return close("malformed set");
        std::string k(*key);
        state_.data[k].assign(value->begin(), value->end());
        send_ok();
        return state_.key_set(k);
      }
      case wire::Op::get: {
        auto key = in.bytes();
        if (!key || !in.done()) return close("malformed get");
        pending_get_ = std::string(*key);
        return await({*pending_get_});
      }
      case wire::Op::add: {
        auto key = in.bytes();
        auto delta = in.i64();
        if (!key || !delta || !in.done()) return close("malformed add");
        std::string k(*key);
        std::int64_t value = 0;
        try {
          value = add_to_counter(state_.data[k], *delta);
        } catch (const std::exception&) {
          return close("add on a non-integer key");
        }
        send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::value)).i64(value).frame());
        return state_.key_set(k);
      }
      case wire::Op::wait:
      case wire::Op::check: {
        const bool wait = code == static_cast<std::uint8_t>(wire::Op::wait);
        auto n = in.u32();
        if (!n || *n > wire::kMaxKeys) return close("malformed wait or check");
        std::vector<std::string> keys;
        for (std::uint32_t i = 0; i < *n; ++i) {
          auto key = in.bytes();
          if (!key) return close("malformed wait or check");
          keys.emplace_back(*key);
        }
        if (!in.done()) return close("malformed wait or check");
        if (wait) return await(keys);
        std::string present;
        for (const auto& k : keys) present.push_back(state_.data.count(k) ? '1' : '0');
        return send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::value)).bytes(present).frame());
      }
      default:
        return close("unknown request");
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

  void send_ok() { send(wire::Writer(static_cast<std::uint8_t>(wire::Reply::ok)).frame()); }

  void send(std::vector<char> frame) {
    out_ = std::move(frame);
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec || self->closing_) return self->close();
      self->read_header();
    });
  }

  void close(const char* why = nullptr) {
    if (closed_) return;
    closed_ = true;
    if (why != nullptr) spdlog::warn("idist store: dropped client {}: {}", peer_, why);
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    pending_.clear();
    state_.sessions.erase(shared_from_this());
  }

  ServerState& state_;
  tcp::socket socket_;
  std::string peer_;
  std::array<char, 4> header_{};
  std::vector<char> body_;
  std::vector<char> out_;
  bool authenticated_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::set<std::string> pending_;
  std::optional<std::string> pending_get_;
  std::uint64_t park_generation_ = 0;
};

void ServerState::key_set(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto parked = std::move(it->second);
  waiters.erase(it);
  for (auto& weak : parked)
    if (auto session = weak.lock()) session->key_arrived(key);
}

}  // namespace

struct TcpStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  ServerState state;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);
        auto session = std::make_shared<Session>(state, std::move(socket));
        state.sessions.insert(session);
        session->start();
      }
      accept();
    });
  }
};

TcpStoreServer::TcpStoreServer(const StoreServerOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->state.token = options.token;
  const std::string where = options.host + ":" + std::to_string(options.port);
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto results = resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::numeric_service, ec);
  if (ec) throw std::runtime_error("cannot resolve MASTER_ADDR for the store at " + where + ": " + ec.message());

  // Bind the address rank 0 is reached at. When that is not an address of this host (a
  // name behind NAT, a floating alias) fall back to every interface rather than fail.
  auto& acceptor = impl_->acceptor;
  auto try_bind = [&](const tcp::endpoint& ep) {
    acceptor.close(ec);
    if (acceptor.open(ep.protocol(), ec)) return;
    // SO_REUSEADDR is what lets us take over the port idist-run reserved for us.
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (acceptor.bind(ep, ec)) return;
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
  };
  for (const auto& entry : results) {
    try_bind(entry.endpoint());
    if (!ec) break;
  }
  if (ec == boost::system::errc::address_not_available && !results.empty()) {
    const auto any = results.begin()->endpoint().protocol() == tcp::v6() ? tcp::endpoint(tcp::v6(), options.port)
                                                                         : tcp::endpoint(tcp::v4(), options.port);
    try_bind(any);
  }
  if (ec == boost::system::errc::address_in_use)
    throw std::runtime_error("cannot listen on " + where + " for the store: " + ec.message() +
                             " (another job on this port? choose one with --master-port or MASTER_PORT)");
  if (ec) throw std::runtime_error("cannot listen on " + where + " for the store: " + ec.message());

  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->io.run();
    } catch (const std::exception& e) {
      spdlog::error("idist store: server stopped: {}", e.what());
    }
  });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace idist::detail

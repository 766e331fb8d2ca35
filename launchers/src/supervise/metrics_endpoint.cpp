// The HTTP side of --metrics: GET /metrics answered with the exposition, one request per
// connection (Prometheus' scraper and curl both accept Connection: close). A client that sends
// nothing, or too much, is dropped: it must never hold the job.

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>

#include <charconv>
#include <stdexcept>

#include "metrics.hpp"

namespace idist::launchers::supervision {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr std::size_t kMostRequest = 16 * 1024;
constexpr auto kPatience = std::chrono::seconds(10);  // for a whole exchange: request and answer
constexpr int kMostClients = 32;                      // at once; more are closed at their accept

std::string response(std::string_view status, std::string_view type, const std::string& body) {
  return fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", status,
                     type, body.size(), body);
}

// host and port of "PORT" or "HOST:PORT" (an IPv6 HOST in brackets).
tcp::endpoint endpoint_of(asio::io_context& io, const std::string& where) {
  const auto colon = where.rfind(':');
  std::string host = colon == std::string::npos ? "" : where.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? where : where.substr(colon + 1);
  int port = -1;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535)
    throw std::runtime_error(fmt::format("--metrics '{}': expected [HOST:]PORT, PORT 0 to 65535", where));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) return {tcp::v4(), static_cast<std::uint16_t>(port)};
  boost::system::error_code error;
  tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, port_text, error);
  if (error || found.empty())
    throw std::runtime_error(fmt::format("--metrics '{}': cannot resolve '{}': {}", where, host, error.message()));
  return found.begin()->endpoint();
}

}  // namespace

struct MetricsEndpoint::Impl : std::enable_shared_from_this<MetricsEndpoint::Impl> {
  Impl(asio::io_context& io, std::function<std::string()> text)
      : io(io), acceptor(io), pause(io), text(std::move(text)) {}
  asio::io_context& io;
  tcp::acceptor acceptor;
  asio::steady_timer pause;  // after a failed accept (no descriptors left): not a busy loop
  std::function<std::string()> text;
  int clients = 0;

  void accept() {
    acceptor.async_accept([self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (ec) {
        self->pause.expires_after(std::chrono::milliseconds(200));
        self->pause.async_wait([self](auto e) {
          if (!e && self->acceptor.is_open()) self->accept();
        });
        return;
      }
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);  // a rank started meanwhile must not hold it
      if (self->clients < kMostClients) self->serve(std::make_shared<tcp::socket>(std::move(socket)));
      self->accept();
    });
  }

  // Reads the request's head, then answers and closes; all within kPatience.
  void serve(std::shared_ptr<tcp::socket> peer) {
    ++clients;
    auto request = std::make_shared<std::string>();
    auto timer = std::make_shared<asio::steady_timer>(io, kPatience);
    timer->async_wait([peer](auto ec) {
      if (!ec) peer->close();
    });
    asio::async_read_until(*peer, asio::dynamic_buffer(*request, kMostRequest), "\r\n\r\n",
                           [self = shared_from_this(), peer, request, timer](const boost::system::error_code& ec, std::size_t) {
                             if (ec) return self->done(*timer);  // gone, too slow or too long: nothing to answer
                             self->answer(peer, *request, timer);
                           });
  }

  void done(asio::steady_timer& timer) {
    timer.cancel();
    --clients;
  }

  // The exposition, or a 500 where reading it failed: a scrape must never end the job.
  std::string exposition() {
    try {
      return response("200 OK", "text/plain; version=0.0.4; charset=utf-8", text());
    } catch (const std::exception& e) {
      return response("500 Internal Server Error", "text/plain", std::string("idist-run: ") + e.what() + "\n");
    }
  }

  void answer(const std::shared_ptr<tcp::socket>& peer, const std::string& request,
              const std::shared_ptr<asio::steady_timer>& timer) {
    const auto line = request.substr(0, request.find("\r\n"));
    const auto first = line.find(' ');
    const auto second = line.find(' ', first + 1);
    const auto method = line.substr(0, first);
    auto target = first == std::string::npos ? "" : line.substr(first + 1, second - first - 1);
    target = target.substr(0, target.find('?'));
    std::string reply;
    if (method != "GET" && method != "HEAD") {
      reply = response("405 Method Not Allowed", "text/plain", "only GET /metrics here\n");
    } else if (target != "/metrics") {
      reply = response("404 Not Found", "text/plain", "idist-run serves its metrics at /metrics\n");
    } else {
      reply = exposition();
      if (method == "HEAD") reply.resize(reply.find("\r\n\r\n") + 4);
    }
    auto out = std::make_shared<std::string>(std::move(reply));
    asio::async_write(*peer, asio::buffer(*out), [self = shared_from_this(), peer, out, timer](auto, std::size_t) {
      boost::system::error_code ignored;
      peer->shutdown(tcp::socket::shutdown_both, ignored);
      self->done(*timer);
    });
  }
};

MetricsEndpoint::MetricsEndpoint(asio::io_context& io, const std::string& where, std::function<std::string()> text)
    : impl_(std::make_shared<Impl>(io, std::move(text))) {
  const auto at = endpoint_of(io, where);
  boost::system::error_code ec;
  auto& a = impl_->acceptor;
  if (!a.open(at.protocol(), ec) && !a.set_option(tcp::acceptor::reuse_address(true), ec) && !a.bind(at, ec) &&
      !a.listen(asio::socket_base::max_listen_connections, ec)) {
    ::fcntl(a.native_handle(), F_SETFD, FD_CLOEXEC);  // the ranks must not keep the port
    impl_->accept();
    return;
  }
  throw std::runtime_error(fmt::format("--metrics '{}': cannot listen there: {}", where, ec.message()));
}

MetricsEndpoint::~MetricsEndpoint() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->pause.cancel();
}

std::uint16_t MetricsEndpoint::port() const {
  boost::system::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

}  // namespace idist::launchers::supervision

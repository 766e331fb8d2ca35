#include "client.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <set>
#include <stdexcept>

namespace idist::launchers::etcd {

// A connection to one member (plain, or TLS where the client has a context), kept between
// calls. with(f) calls f on whichever stream it is: Beast's operations are templates.
struct Connection {
  Connection(boost::asio::io_context& io, boost::asio::ssl::context* tls) {
    if (tls != nullptr)
      secure = std::make_unique<boost::beast::ssl_stream<boost::beast::tcp_stream>>(io, *tls);
    else
      plain = std::make_unique<boost::beast::tcp_stream>(io);
  }
  template <class F>
  auto with(F&& f) {
    return secure ? f(*secure) : f(*plain);
  }
  boost::beast::tcp_stream& tcp() { return secure ? boost::beast::get_lowest_layer(*secure) : *plain; }
  void close() {
    boost::beast::error_code ignored;
    tcp().socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    tcp().close();
  }

  // Connected to `e`: TLS's handshake done, the member's certificate checked against its name
  // (or address) and the CA; then `done` (an error's text, or empty).
  template <class Done>
  void open(boost::asio::ip::tcp::resolver::results_type results, const Endpoint& e, Done done) {
    tcp().async_connect(results, [this, host = e.host, done = std::move(done)](auto ec, const auto&) mutable {
      if (ec) return done(ec);
      boost::beast::error_code ignored;
      local = tcp().socket().local_endpoint(ignored).address().to_string();
      if (!secure) return done(ec);
      boost::system::error_code parse;
      boost::asio::ip::make_address(host, parse);
      if (parse) SSL_set_tlsext_host_name(secure->native_handle(), host.c_str());  // SNI: names only
      secure->set_verify_callback(boost::asio::ssl::host_name_verification(host));
      secure->async_handshake(boost::asio::ssl::stream_base::client, [this, host, done = std::move(done)](auto ec) mutable {
        if (ec) tls_refusal = verify_failure(ec, host);
        handshaken = !ec;
        done(ec);
      });
    });
  }

  // Why the member's certificate was refused, if it was ("self-signed certificate"); empty when
  // the handshake failed for another reason.
  std::string verify_failure(const boost::system::error_code& ec, const std::string& host) const {
    if (ec.category() != boost::asio::error::get_ssl_category() ||
        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) != SSL_R_CERTIFICATE_VERIFY_FAILED)
      return "";
    const long result = SSL_get_verify_result(secure->native_handle());
    // A good chain: what failed is the name check, host_name_verification's.
    return result != X509_V_OK ? X509_verify_cert_error_string(result) : "the certificate does not name '" + host + "'";
  }

  std::unique_ptr<boost::beast::tcp_stream> plain;
  std::unique_ptr<boost::beast::ssl_stream<boost::beast::tcp_stream>> secure;
  std::string local;  // this host's address on it
  std::string tls_refusal;  // the handshake failed on the member's certificate: why
  bool handshaken = false;  // TLS's handshake done (secure only)
};

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Between two rounds over every member, when none answered: a member restarting or an
// election takes a moment, and a tight loop would only flood the log of a member that is back.
constexpr auto kRoundPause = std::chrono::milliseconds(100);
// A watch stream that broke is opened again after this.
constexpr auto kWatchRetry = std::chrono::milliseconds(100);
// A member that did not answer is tried again only after this, while another one may answer.
constexpr auto kShun = std::chrono::seconds(3);

// The status of an exchange that failed after the member answered, but not in etcd's HTTP.
constexpr int kAnswered = -1;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// An error's text; TLS's own say which check failed ("certificate verify failed").
std::string error_message(const boost::system::error_code& ec) {
  if (ec.category() == boost::asio::error::get_ssl_category()) {
    char text[256] = {};
    ERR_error_string_n(static_cast<unsigned long>(ec.value()), text, sizeof text);
    return fmt::format("TLS: {}", text);
  }
  return ec.message();
}

// A TLS handshake that failed, in one line: what OpenSSL said, and where the likely cause is
// the scheme (https:// to a plain server), what to give instead.
std::string tls_failure(const boost::system::error_code& ec, const std::string& refusal) {
  const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
  const std::string why = reason != nullptr ? reason : ec.message();
  if (!refusal.empty()) return fmt::format("TLS failed: {} ({})", why, refusal);
  const int code = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
  const bool plain = code == SSL_R_WRONG_VERSION_NUMBER || code == SSL_R_PACKET_LENGTH_TOO_LONG ||
                     code == SSL_R_RECORD_LENGTH_MISMATCH || code == SSL_R_HTTP_REQUEST;
  return fmt::format("TLS failed: {}{}", why, plain ? " (it answers in plain HTTP: give http://)" : "");
}

// An answer that is not etcd's gateway (a web server, a proxy's page): its status, never its
// body, which can be pages of HTML. Go's TLS server (etcd's with TLS on) answers plain HTTP
// with a 400 that says so.
std::string not_etcd(int status, const std::string& body, const Endpoint& e) {
  if (status == 400 && body.find("HTTP request to an HTTPS server") != std::string::npos)
    return fmt::format("a TLS server (HTTP 400 from {}): give https://, or --rdzv-conf protocol=https", e.text());
  return fmt::format("not an etcd member (HTTP {} from {})", status, e.text());
}

// The gateway's error: {"error": ..., "code": gRPC code, "message": ...}, or what answered
// instead of etcd (not_etcd).
std::string error_text(int status, const std::string& body, const Endpoint& e, int& code) {
  code = -1;
  const Json j = Json::parse(body, nullptr, false);
  if (j.is_object()) {
    if (j.contains("code") && j["code"].is_number_integer()) code = j["code"].get<int>();
    for (const char* key : {"message", "error"})
      if (j.contains(key) && j[key].is_string() && !j[key].get<std::string>().empty()) return j[key].get<std::string>();
  }
  return not_etcd(status, body, e);
}

// gRPC codes no other member would answer differently: invalid argument, not found (a lease),
// permission denied, failed precondition. Unauthenticated is the caller's to retry once with
// a fresh token (simple tokens are per member and expire).
bool permanent(int code) { return code == 3 || code == 5 || code == 7 || code == 9; }

// One HTTP exchange, on a connection kept from an earlier one to the same member when there is
// one (HTTP/1.1 keep-alive: a node's heartbeat is then one round trip, not a TCP handshake
// and a teardown; with a thousand nodes, the handshakes were most of etcd's work), else on a
// fresh one.
struct Exchange : std::enable_shared_from_this<Exchange> {
  // `stale`: a kept connection failed before any answer (the member closed it while idle):
  // worth one more try on a fresh one, not a strike against the member.
  using Done = std::function<void(const std::string& error, int status, const std::string& body, bool keep, bool stale)>;
  Exchange(asio::io_context& io, std::shared_ptr<Connection> c, bool reused)
      : resolver(io), connection(std::move(c)), reused(reused) {}
  tcp::resolver resolver;
  std::shared_ptr<Connection> connection;
  bool reused = false;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response<http::string_body> response;
  Done done;

  // `kAnswered` as the status: something answered, but not as an etcd member does (a TLS
  // handshake that failed, bytes that are not HTTP), which no retry will change.
  void fail(beast::error_code ec) {
    const bool timed_out = ec == beast::error::timeout;
    std::string why = timed_out ? "no answer (timed out)" : error_message(ec);
    int status = 0;
    static const auto& http_errors = http::make_error_code(http::error::bad_version).category();
    if (ec.category() == asio::error::get_ssl_category()) {
      why = tls_failure(ec, connection->tls_refusal);
      status = kAnswered;
    } else if (!reused && (ec == asio::ssl::error::stream_truncated ||
                           (ec == asio::error::connection_reset && connection->secure && !connection->handshaken))) {
      // A plain server's 400 and close: the close, or a reset where the hello was still unread.
      why = "TLS failed: the member closed the connection during the handshake (a plain HTTP server? give http://)";
      status = kAnswered;
    } else if (ec == http::error::end_of_stream && !reused) {
      // Accepted, then closed unanswered: what a TLS server does with plain HTTP (etcd's, s_server).
      why = connection->secure ? "closed the connection without an answer, after the TLS handshake (not an etcd member?)"
                               : "closed the connection without an answer (a TLS server? give https://, or "
                                 "--rdzv-conf protocol=https)";
      status = kAnswered;
    } else if (ec.category() == http_errors && ec != http::error::end_of_stream && ec != http::error::partial_message) {
      // A TLS record (alert 0x15, handshake 0x16, then version 3.x) where HTTP was expected.
      const auto bytes = buffer.cdata();
      const auto* first = static_cast<const unsigned char*>(bytes.data());
      const bool tls = bytes.size() >= 2 && (first[0] == 0x15 || first[0] == 0x16) && first[1] == 0x03;
      why = tls ? "a TLS server: give https://, or --rdzv-conf protocol=https"
                : fmt::format("not an etcd member (its answer is not HTTP: {})", ec.message());
      status = kAnswered;
    }
    if (auto d = std::exchange(done, nullptr)) d(why, status, "", false, reused && !timed_out && status == 0);
    connection->close();
  }

  void run(const Endpoint& e, std::chrono::milliseconds timeout) {
    connection->tcp().expires_after(timeout);
    if (reused) return exchange();
    resolver.async_resolve(e.host, e.port, [self = shared_from_this(), e](auto ec, tcp::resolver::results_type results) {
      if (ec) return self->fail(ec);
      self->connection->open(results, e, [self](beast::error_code ec) {
        if (ec) return self->fail(ec);
        self->exchange();
      });
    });
  }

  void exchange() {
    connection->with([self = shared_from_this()](auto& stream) {
      http::async_write(stream, self->request, [self, &stream](auto ec, std::size_t) {
        if (ec) return self->fail(ec);
        http::async_read(stream, self->buffer, self->response, [self](auto ec, std::size_t) {
          if (ec) return self->fail(ec);
          const bool keep = self->response.keep_alive();
          if (!keep)
            self->connection->close();
          else
            self->connection->tcp().expires_never();
          if (auto d = std::exchange(self->done, nullptr))
            d("", static_cast<int>(self->response.result_int()), self->response.body(), keep, false);
        });
      });
    });
  }
};

// Kept connections per member, at most this many (a node has a call or two in flight).
constexpr std::size_t kKeepPerMember = 4;

}  // namespace

std::vector<Endpoint> parse_endpoints(const std::string& text) {
  std::vector<Endpoint> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    auto end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(at, end - at);
    at = end + 1;
    Endpoint e;
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    else if (item.rfind("https://", 0) == 0) item = item.substr(8), e.https = true;
    if (!item.empty() && item.back() == '/') item.pop_back();
    const auto colon = item.rfind(':');
    e.host = colon == std::string::npos ? item : item.substr(0, colon);
    e.port = colon == std::string::npos ? "2379" : item.substr(colon + 1);
    if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
    int port = 0;
    const auto [ptr, ec] = std::from_chars(e.port.data(), e.port.data() + e.port.size(), port);
    if (e.host.empty() || e.port.empty() || ec != std::errc() || ptr != e.port.data() + e.port.size() || port < 1 ||
        port > 65535)
      throw std::invalid_argument("'" + item + "' is not HOST:PORT");
    if (!out.empty() && out.front().https != e.https)
      throw std::invalid_argument("'" + text + "' mixes https:// and http:// members: one cluster speaks one");
    out.push_back(std::move(e));
  }
  return out;
}

std::shared_ptr<asio::ssl::context> tls_context(const std::string& cacert, const std::string& cert,
                                                const std::string& key) {
  if (cert.empty() != key.empty())
    throw std::invalid_argument("a client certificate needs both cert= and key= (one was given)");
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
  context->set_verify_mode(asio::ssl::verify_peer);
  const auto use = [](const char* what, const std::string& path, auto load) {
    boost::system::error_code ec;
    load(ec);
    if (ec) throw std::invalid_argument(fmt::format("{} '{}': {}", what, path, error_message(ec)));
  };
  if (cacert.empty())
    use("the system's CAs", "", [&](auto& ec) { context->set_default_verify_paths(ec); });
  else
    use("cacert", cacert, [&](auto& ec) { context->load_verify_file(cacert, ec); });
  if (!cert.empty()) {
    use("cert", cert, [&](auto& ec) { context->use_certificate_chain_file(cert, ec); });
    use("key", key, [&](auto& ec) { context->use_private_key_file(key, asio::ssl::context::pem, ec); });
  }
  return context;
}

std::string endpoints_text(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const auto& e : endpoints) out += (out.empty() ? "" : ", ") + e.text();
  return out;
}

std::string base64(const std::string& raw) {
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < raw.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(raw[i]) << 16) | (static_cast<unsigned char>(raw[i + 1]) << 8) |
                       static_cast<unsigned char>(raw[i + 2]);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], kAlphabet[v & 63]};
  }
  if (i + 1 == raw.size()) {
    const unsigned v = static_cast<unsigned char>(raw[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == raw.size()) {
    const unsigned v = (static_cast<unsigned char>(raw[i]) << 16) | (static_cast<unsigned char>(raw[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

std::string unbase64(const std::string& text) {
  // By table: a thousand nodes' states are megabytes of it.
  static const auto value = [] {
    std::array<signed char, 256> v{};
    v.fill(-1);
    for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(kAlphabet[i])] = static_cast<signed char>(i);
    return v;
  }();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned v = 0;
  int bits = 0;
  for (const char c : text) {
    const int d = value[static_cast<unsigned char>(c)];
    if (d < 0) continue;
    v = (v << 6) | static_cast<unsigned>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xff);
    }
  }
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

struct Client::Call {
  std::string path;
  std::string body;
  Clock::time_point deadline;
  Reply reply;
  std::map<std::size_t, std::string> tried;  // the last error of each member
  std::set<std::size_t> answered;            // members that answered, if not as etcd would
  std::size_t tries_this_round = 0;
  bool reauthenticated = false;
  std::unique_ptr<asio::steady_timer> pause;
};

// One watch stream on one member, with everything its pending operations use: replaced, not
// reused, when the watch moves, so that an old stream's handlers never touch a new one's parser.
struct WatchStream {
  WatchStream(asio::io_context& io, asio::ssl::context* tls) : connection(io, tls) {}
  Connection connection;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  std::string pending;  // stream text not yet a whole line
  std::size_t scanned = 0;  // of `pending`, known to hold no line end
  std::function<std::size_t(std::uint64_t, beast::string_view, beast::error_code&)> on_chunk;
  http::request<http::string_body> request;
};

struct Client::Watcher {
  std::string key;
  std::string range_end;
  long long next_revision = 0;
  OnEvents on_events;
  std::size_t member = 0;
  std::shared_ptr<WatchStream> current;
  asio::steady_timer retry;
  explicit Watcher(asio::io_context& io) : retry(io) {}
};

Client::Client(asio::io_context& io, ClientOptions options) : io_(io), options_(std::move(options)) {}

Client::~Client() { close(); }

void Client::close() {
  closed_ = true;
  for (auto& [member, kept] : std::exchange(idle_, {}))
    for (auto& connection : kept) connection->close();
  for (auto& [id, w] : std::exchange(watchers_, {})) {
    w->retry.cancel();
    if (w->current) w->current->connection.close();
  }
}

void Client::call(const std::string& path, Json body, std::chrono::milliseconds deadline, Reply reply) {
  auto c = std::make_shared<Call>();
  c->path = path;
  c->body = body.dump();
  c->deadline = Clock::now() + deadline;
  c->reply = std::move(reply);
  c->pause = std::make_unique<asio::steady_timer>(io_);
  try_call(c);
}

void Client::send(const std::shared_ptr<Call>& c, const std::string& path, const std::string& body,
                  std::function<void(const std::string&, int, const std::string&)> done, bool fresh) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c->deadline - Clock::now());
  const auto timeout = std::max(std::chrono::milliseconds(50), std::min(options_.try_timeout, left));
  const std::size_t member = current_;
  auto& kept = idle_[member];
  const bool reused = !fresh && !kept.empty();
  std::shared_ptr<Connection> connection;
  if (reused) {
    connection = std::move(kept.back());
    kept.pop_back();
  } else {
    connection = std::make_shared<Connection>(io_, options_.tls.get());
  }
  auto x = std::make_shared<Exchange>(io_, connection, reused);
  x->request = http::request<http::string_body>(http::verb::post, path, 11);
  const auto& e = options_.endpoints[member];
  x->request.set(http::field::host, e.text());
  x->request.set(http::field::content_type, "application/json");
  x->request.keep_alive(true);
  if (const auto t = tokens_.find(member); t != tokens_.end() && path != "/v3/auth/authenticate")
    x->request.set(http::field::authorization, t->second);
  x->request.body() = body;
  x->request.prepare_payload();
  std::weak_ptr<Client> weak = shared_from_this();
  x->done = [weak, c, path, body, member, connection, done = std::move(done)](
                const std::string& error, int status, const std::string& text, bool keep, bool stale) mutable {
    auto self = weak.lock();
    if (!self || self->closed_) return;
    if (stale && member == self->current_) return self->send(c, path, body, std::move(done), /*fresh=*/true);
    if (!connection->local.empty()) self->local_address_ = connection->local;
    if (keep && self->idle_[member].size() < kKeepPerMember) self->idle_[member].push_back(connection);
    done(error, status, text);
  };
  x->run(e, timeout);
}

void Client::try_call(const std::shared_ptr<Call>& c) {
  if (closed_) return;
  const std::size_t member = current_;
  // `unreachable`: no answer at all (refused, reset, silent), not an error etcd answered.
  auto next = [this, c, member](const std::string& why, bool unreachable) {
    c->tried[member] = why;
    if (!unreachable) c->answered.insert(member);
    if (Clock::now() >= c->deadline) return c->reply(given_up(*c), Json());
    // An unreachable member is left alone for a while: every call in flight (a heartbeat, a
    // read, a proposal) would otherwise wait out its silence in turn, and a member cut off
    // costs a whole try_timeout each time. Another call may have moved on already.
    if (unreachable) shunned_until_[member] = Clock::now() + kShun;
    if (current_ == member || shunned(current_)) current_ = next_member(member);
    if (++c->tries_this_round < options_.endpoints.size()) return try_call(c);
    c->tries_this_round = 0;
    c->pause->expires_after(kRoundPause);
    c->pause->async_wait([this, c, weak = weak_from_this()](auto ec) {
      if (!ec && weak.lock()) try_call(c);
    });
  };
  auto request = [this, c, member, next] {
    send(c, c->path, c->body, [this, c, member, next](const std::string& error, int status, const std::string& text) {
      if (!error.empty()) return next(error, status != kAnswered);
      if (status == 200) {
        Json j = Json::parse(text, nullptr, false);
        if (j.is_discarded()) return next(not_etcd(status, text, options_.endpoints[member]) + ": not JSON", false);
        follow(member);
        return c->reply("", j);
      }
      int code = -1;
      const auto why = error_text(status, text, options_.endpoints[member], code);
      if (code == 16 && !c->reauthenticated && !options_.user.empty()) {
        c->reauthenticated = true;
        tokens_.erase(member);
        return try_call(c);
      }
      if (permanent(code)) return c->reply(fmt::format("etcd at {}: {}", options_.endpoints[member].text(), why), Json());
      next(why, false);
    });
  };
  if (options_.user.empty() || tokens_.count(member)) return request();
  const Json auth{{"name", options_.user}, {"password", options_.password}};
  send(c, "/v3/auth/authenticate", auth.dump(),
       [this, c, member, next, request](const std::string& error, int status, const std::string& text) {
         if (!error.empty()) return next(error, status != kAnswered);
         int code = -1;
         if (status != 200) {
           const auto why = error_text(status, text, options_.endpoints[member], code);
           if (permanent(code))
             return c->reply(fmt::format("etcd at {} refused user '{}': {}", options_.endpoints[member].text(),
                                         options_.user, why),
                             Json());
           return next(why, false);
         }
         const Json j = Json::parse(text, nullptr, false);
         if (!j.is_object() || !j.contains("token") || !j["token"].is_string()) return next("no token in its answer", false);
         tokens_[member] = j["token"].get<std::string>();
         request();
       });
}

// The call's end at its deadline, in one line. "No answer" only where none answered: a web
// server, a TLS mismatch or a member without a leader did answer, and the line says what.
std::string Client::given_up(const Call& c) const {
  std::string each;
  for (const auto& [m, error] : c.tried)
    each += fmt::format("{}{}: {}", each.empty() ? "" : "; ", options_.endpoints[m].text(), error);
  if (c.answered.empty()) return fmt::format("no answer from etcd (tried {}: {})", endpoints_text(options_.endpoints), each);
  return fmt::format("etcd did not work ({})", each);
}

bool Client::shunned(std::size_t member) const {
  const auto it = shunned_until_.find(member);
  return it != shunned_until_.end() && it->second > Clock::now();
}

std::size_t Client::next_member(std::size_t from) const {
  const auto n = options_.endpoints.size();
  for (std::size_t i = 1; i <= n; ++i)
    if (!shunned((from + i) % n)) return (from + i) % n;
  return (from + 1) % n;  // none answered lately: round robin
}

// A member cut off from the others (no reset, no FIN) leaves a watch on it silent, not broken.
// Calls notice (they time out and move on): the watch moves to the member that answers them.
void Client::follow(std::size_t member) {
  shunned_until_.erase(member);
  for (auto [id, w] : watchers_) {
    if (closed_ || w->member == member || !w->current) continue;
    w->member = member;
    w->retry.cancel();
    auto old = std::exchange(w->current, nullptr);
    old->connection.close();  // its handlers see an error and find the stream replaced: they do nothing
    start_watch(w);
  }
}

int Client::watch(const std::string& key, const std::string& range_end, long long start_revision,
                  OnEvents on_events) {
  auto w = std::make_shared<Watcher>(io_);
  w->key = key;
  w->range_end = range_end;
  w->next_revision = start_revision;
  w->on_events = std::move(on_events);
  w->member = current_;
  const int id = next_watch_++;
  watchers_[id] = w;
  start_watch(w);
  return id;
}

void Client::unwatch(int id) {
  const auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  auto w = it->second;
  watchers_.erase(it);  // first: the closed stream's handlers then find it unwatched
  w->retry.cancel();
  if (w->current) w->current->connection.close();
}

bool Client::watching(const std::shared_ptr<Watcher>& w) const {
  return std::any_of(watchers_.begin(), watchers_.end(), [&](const auto& x) { return x.second == w; });
}

namespace {

// The decimal text at j[key] (the gateway writes etcd's int64s so), or `otherwise`.
long long number_at(const Json& j, const char* key, long long otherwise) {
  try {
    return j.is_object() && j.contains(key) ? std::stoll(j[key].get<std::string>()) : otherwise;
  } catch (const std::exception&) {
    return otherwise;
  }
}

// A watch answer's events, each with its key, whether it was deleted, its value and revision.
std::vector<Client::Event> events_of(const Json& result, long long revision) {
  std::vector<Client::Event> keys;
  for (const auto& e : result["events"]) {
    if (!e.is_object() || !e.contains("kv") || !e["kv"].contains("key")) continue;
    const auto& kv = e["kv"];
    Client::Event event{.key = unbase64(kv["key"].get<std::string>()),
                        .deleted = e.value("type", "") == "DELETE",
                        .value = kv.contains("value") && kv["value"].is_string() ? unbase64(kv["value"].get<std::string>())
                                                                                 : std::string(),
                        .mod_revision = number_at(kv, "mod_revision", revision)};
    keys.push_back(std::move(event));
  }
  return keys;
}

// Connected, the request sent, then the answer read as it comes (its chunks go to the parser's
// on_chunk) until it breaks: `broken` with why. No timeout once the request is sent: a watch
// is silent while nothing changes.
void run_stream(const std::shared_ptr<WatchStream>& st, const tcp::resolver::results_type& results, const Endpoint& e,
                std::chrono::milliseconds timeout, std::function<void(const std::string&)> broken) {
  st->connection.tcp().expires_after(timeout);
  st->connection.open(results, e, [st, broken](beast::error_code ec) {
    if (ec) return broken(error_message(ec));
    st->connection.with([st, broken](auto& stream) {
      http::async_write(stream, st->request, [st, broken, &stream](auto ec, std::size_t) {
        if (ec) return broken(ec.message());
        st->connection.tcp().expires_never();
        http::async_read_header(stream, st->buffer, st->parser, [st, broken, &stream](auto ec, std::size_t) {
          if (ec) return broken(ec.message());
          auto more = std::make_shared<std::function<void()>>();
          *more = [st, broken, more, &stream] {
            http::async_read_some(stream, st->buffer, st->parser, [st, broken, more](auto ec, std::size_t) {
              if (ec || st->parser.is_done()) {
                *more = nullptr;  // the cycle through the handler
                return broken(ec ? ec.message() : "the stream ended");
              }
              (*more)();
            });
          };
          (*more)();
        });
      });
    });
  });
}

}  // namespace

// One line of a watch stream, {"result": {...events}}: the revision to resume from, and the
// events handed on with their keys, values and revisions.
void Client::on_watch_line(Watcher& w, const Json& j) {
  if (!j.is_object() || !j.contains("result")) return;
  const auto& r = j["result"];
  const long long revision = r.contains("header") ? number_at(r["header"], "revision", 0) : 0;
  const bool events = r.contains("events") && r["events"].is_array() && !r["events"].empty();
  if (revision > 0 && events) w.next_revision = std::max(w.next_revision, revision + 1);
  // Unwatched, perhaps by the handler of an event earlier in this very chunk: nothing more.
  const bool unwatched =
      std::none_of(watchers_.begin(), watchers_.end(), [&w](const auto& x) { return x.second.get() == &w; });
  if (!events || closed_ || unwatched || !w.on_events) return;
  w.on_events(events_of(r, revision));
}

// The stream: the gateway answers a watch with chunks, each holding JSON lines; a stream that
// breaks is opened again, on the next member.
void Client::start_watch(const std::shared_ptr<Watcher>& w) {
  if (closed_ || !watching(w)) return;
  const std::size_t member = w->member % options_.endpoints.size();
  const auto& e = options_.endpoints[member];
  auto st = std::make_shared<WatchStream>(io_, options_.tls.get());
  w->current = st;
  st->parser.body_limit(boost::none);
  std::weak_ptr<Client> weak = shared_from_this();
  // Held by the stream, whose parser calls it (hence plain pointers).
  st->on_chunk = [weak, w = w.get(), st = st.get()](std::uint64_t, beast::string_view body,
                                                    beast::error_code&) -> std::size_t {
    st->pending.append(body.data(), body.size());
    std::size_t at = 0;
    for (auto nl = st->pending.find('\n', st->scanned); nl != std::string::npos; nl = st->pending.find('\n', at)) {
      const Json j = Json::parse(st->pending.begin() + static_cast<std::ptrdiff_t>(at),
                                 st->pending.begin() + static_cast<std::ptrdiff_t>(nl), nullptr, false);
      at = nl + 1;
      if (auto self = weak.lock()) self->on_watch_line(*w, j);
    }
    st->pending.erase(0, at);
    st->scanned = st->pending.size();
    return body.size();
  };
  st->parser.on_chunk_body(st->on_chunk);
  st->request = http::request<http::string_body>(http::verb::post, "/v3/watch", 11);
  st->request.set(http::field::host, e.text());
  st->request.set(http::field::content_type, "application/json");
  if (const auto t = tokens_.find(member); t != tokens_.end()) st->request.set(http::field::authorization, t->second);
  Json create{{"key", base64(w->key)}, {"start_revision", std::to_string(w->next_revision)}};
  if (!w->range_end.empty()) create["range_end"] = base64(w->range_end);
  st->request.body() = Json{{"create_request", create}}.dump();
  st->request.prepare_payload();
  auto broken = [weak, w, st](const std::string&) {
    auto self = weak.lock();
    if (!self || self->closed_ || !self->watching(w) || w->current != st) return;
    // Another member next: this one may be down, or cut off from the others.
    w->member = self->next_member(w->member % self->options_.endpoints.size());
    w->retry.expires_after(kWatchRetry);
    w->retry.async_wait([weak, w](auto ec) {
      auto self = weak.lock();
      if (!ec && self && !self->closed_) self->start_watch(w);
    });
  };
  tcp::resolver resolver(io_);
  beast::error_code ec;
  const auto results = resolver.resolve(e.host, e.port, ec);
  if (ec) return broken(ec.message());
  run_stream(st, results, e, options_.try_timeout, broken);
}

}  // namespace idist::launchers::etcd

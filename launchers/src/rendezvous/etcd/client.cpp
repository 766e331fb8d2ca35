#include "client.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <stdexcept>

namespace idist::launchers::etcd {
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

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The gateway's error: {"error": ..., "code": gRPC code, "message": ...}, or the raw text.
std::string error_text(int status, const std::string& body, int& code) {
  code = -1;
  const Json j = Json::parse(body, nullptr, false);
  if (j.is_object()) {
    if (j.contains("code") && j["code"].is_number_integer()) code = j["code"].get<int>();
    for (const char* key : {"message", "error"})
      if (j.contains(key) && j[key].is_string() && !j[key].get<std::string>().empty()) return j[key].get<std::string>();
  }
  return fmt::format("HTTP {}: {}", status, body.substr(0, 200));
}

// gRPC codes no other member would answer differently: invalid argument, not found (a lease),
// permission denied, failed precondition. Unauthenticated is the caller's to retry once with
// a fresh token (simple tokens are per member and expire).
bool permanent(int code) { return code == 3 || code == 5 || code == 7 || code == 9; }

// One HTTP exchange on a fresh connection: the gateway is on loopback or a LAN, a connection
// costs little next to etcd's own fsync, and a member that died mid-call leaves nothing behind.
struct Exchange : std::enable_shared_from_this<Exchange> {
  using Done = std::function<void(const std::string& error, int status, const std::string& body, std::string local)>;
  Exchange(asio::io_context& io) : resolver(io), stream(io) {}
  tcp::resolver resolver;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response<http::string_body> response;
  Done done;
  std::string local;

  void fail(const std::string& why) {
    if (auto d = std::exchange(done, nullptr)) d(why, 0, "", "");
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
  }

  void run(const Endpoint& e, std::chrono::milliseconds timeout) {
    stream.expires_after(timeout);
    resolver.async_resolve(e.host, e.port, [self = shared_from_this()](auto ec, tcp::resolver::results_type results) {
      if (ec) return self->fail(ec.message());
      self->stream.async_connect(results, [self](auto ec, const tcp::endpoint&) {
        if (ec) return self->fail(ec == beast::error::timeout ? "no answer (timed out)" : ec.message());
        beast::error_code ignored;
        self->local = self->stream.socket().local_endpoint(ignored).address().to_string();
        http::async_write(self->stream, self->request, [self](auto ec, std::size_t) {
          if (ec) return self->fail(ec == beast::error::timeout ? "no answer (timed out)" : ec.message());
          http::async_read(self->stream, self->buffer, self->response, [self](auto ec, std::size_t) {
            if (ec) return self->fail(ec == beast::error::timeout ? "no answer (timed out)" : ec.message());
            if (auto d = std::exchange(self->done, nullptr))
              d("", static_cast<int>(self->response.result_int()), self->response.body(), self->local);
            beast::error_code ignored;
            self->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
            self->stream.close();
          });
        });
      });
    });
  }
};

}  // namespace

std::vector<Endpoint> parse_endpoints(const std::string& text) {
  std::vector<Endpoint> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    auto end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    if (item.rfind("https://", 0) == 0)
      throw std::invalid_argument("'" + item + "': https is not supported (TLS to etcd: see README)");
    if (!item.empty() && item.back() == '/') item.pop_back();
    const auto colon = item.rfind(':');
    Endpoint e;
    e.host = colon == std::string::npos ? item : item.substr(0, colon);
    e.port = colon == std::string::npos ? "2379" : item.substr(colon + 1);
    if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
    int port = 0;
    const auto [ptr, ec] = std::from_chars(e.port.data(), e.port.data() + e.port.size(), port);
    if (e.host.empty() || e.port.empty() || ec != std::errc() || ptr != e.port.data() + e.port.size() || port < 1 ||
        port > 65535)
      throw std::invalid_argument("'" + item + "' is not HOST:PORT");
    out.push_back(std::move(e));
  }
  return out;
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
  std::string out;
  unsigned v = 0;
  int bits = 0;
  for (const char c : text) {
    const char* p = std::strchr(kAlphabet, c);
    if (c == '=' || c == '\0' || p == nullptr) continue;
    v = (v << 6) | static_cast<unsigned>(p - kAlphabet);
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
  std::size_t tries_this_round = 0;
  bool reauthenticated = false;
  std::unique_ptr<asio::steady_timer> pause;
};

// One watch stream on one member, with everything its pending operations use: replaced, not
// reused, when the watch moves, so that an old stream's handlers never touch a new one's parser.
struct WatchStream {
  explicit WatchStream(asio::io_context& io) : stream(io) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  std::string pending;  // stream text not yet a whole line
  std::function<std::size_t(std::uint64_t, beast::string_view, beast::error_code&)> on_chunk;
  http::request<http::string_body> request;
};

struct Client::Watcher {
  std::string key;
  std::string range_end;
  long long next_revision = 0;
  OnEvents on_events;
  std::size_t member = 0;
  bool no_puts = false;
  std::shared_ptr<WatchStream> current;
  asio::steady_timer retry;
  explicit Watcher(asio::io_context& io) : retry(io) {}
};

Client::Client(asio::io_context& io, ClientOptions options) : io_(io), options_(std::move(options)) {}

Client::~Client() { close(); }

void Client::close() {
  closed_ = true;
  for (auto& [id, w] : std::exchange(watchers_, {})) {
    w->retry.cancel();
    if (w->current) w->current->stream.close();
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
                  std::function<void(const std::string&, int, const std::string&)> done) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c->deadline - Clock::now());
  const auto timeout = std::max(std::chrono::milliseconds(50), std::min(options_.try_timeout, left));
  auto x = std::make_shared<Exchange>(io_);
  x->request = http::request<http::string_body>(http::verb::post, path, 11);
  const auto& e = options_.endpoints[current_];
  x->request.set(http::field::host, e.text());
  x->request.set(http::field::content_type, "application/json");
  if (const auto t = tokens_.find(current_); t != tokens_.end() && path != "/v3/auth/authenticate")
    x->request.set(http::field::authorization, t->second);
  x->request.body() = body;
  x->request.prepare_payload();
  std::weak_ptr<Client> weak = shared_from_this();
  x->done = [weak, done = std::move(done)](const std::string& error, int status, const std::string& text,
                                          std::string local) {
    auto self = weak.lock();
    if (!self || self->closed_) return;
    if (!local.empty()) self->local_address_ = local;
    done(error, status, text);
  };
  x->run(e, timeout);
}

void Client::try_call(const std::shared_ptr<Call>& c) {
  if (closed_) return;
  const std::size_t member = current_;
  auto next = [this, c, member](const std::string& why) {
    c->tried[member] = why;
    if (Clock::now() >= c->deadline) {
      std::string each;
      for (const auto& [m, error] : c->tried)
        each += fmt::format("{}{}: {}", each.empty() ? "" : "; ", options_.endpoints[m].text(), error);
      return c->reply(fmt::format("no answer from etcd (tried {}: {})", endpoints_text(options_.endpoints), each), Json());
    }
    current_ = (current_ + 1) % options_.endpoints.size();
    if (++c->tries_this_round < options_.endpoints.size()) return try_call(c);
    c->tries_this_round = 0;
    c->pause->expires_after(kRoundPause);
    c->pause->async_wait([this, c, weak = weak_from_this()](auto ec) {
      if (!ec && weak.lock()) try_call(c);
    });
  };
  auto request = [this, c, member, next] {
    send(c, c->path, c->body, [this, c, member, next](const std::string& error, int status, const std::string& text) {
      if (!error.empty()) return next(error);
      if (status == 200) {
        Json j = Json::parse(text, nullptr, false);
        if (j.is_discarded()) return next("an answer that is not JSON: " + text.substr(0, 100));
        follow(member);
        return c->reply("", j);
      }
      int code = -1;
      const auto why = error_text(status, text, code);
      if (code == 16 && !c->reauthenticated && !options_.user.empty()) {
        c->reauthenticated = true;
        tokens_.erase(member);
        return try_call(c);
      }
      if (permanent(code)) return c->reply(fmt::format("etcd at {}: {}", options_.endpoints[member].text(), why), Json());
      next(why);
    });
  };
  if (options_.user.empty() || tokens_.count(member)) return request();
  const Json auth{{"name", options_.user}, {"password", options_.password}};
  send(c, "/v3/auth/authenticate", auth.dump(),
       [this, c, member, next, request](const std::string& error, int status, const std::string& text) {
         if (!error.empty()) return next(error);
         int code = -1;
         if (status != 200) {
           const auto why = error_text(status, text, code);
           if (permanent(code))
             return c->reply(fmt::format("etcd at {} refused user '{}': {}", options_.endpoints[member].text(),
                                         options_.user, why),
                             Json());
           return next(why);
         }
         const Json j = Json::parse(text, nullptr, false);
         if (!j.is_object() || !j.contains("token") || !j["token"].is_string()) return next("no token in its answer");
         tokens_[member] = j["token"].get<std::string>();
         request();
       });
}

// A member cut off from the others (no reset, no FIN) leaves a watch on it silent, not broken.
// Calls notice (they time out and move on): the watch moves to the member that answers them.
void Client::follow(std::size_t member) {
  for (auto [id, w] : watchers_) {
    if (closed_ || w->member == member || !w->current) continue;
    w->member = member;
    w->retry.cancel();
    auto old = std::exchange(w->current, nullptr);
    old->stream.close();  // its handlers see an error and find the stream replaced: they do nothing
    start_watch(w);
  }
}

int Client::watch(const std::string& key, const std::string& range_end, long long start_revision, OnEvents on_events,
                  bool no_puts) {
  auto w = std::make_shared<Watcher>(io_);
  w->key = key;
  w->range_end = range_end;
  w->next_revision = start_revision;
  w->on_events = std::move(on_events);
  w->member = current_;
  w->no_puts = no_puts;
  const int id = next_watch_++;
  watchers_[id] = w;
  start_watch(w);
  return id;
}

void Client::unwatch(int id) {
  const auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  auto w = it->second;
  watchers_.erase(it);
  w->retry.cancel();
  if (w->current) w->current->stream.close();
}

bool Client::watching(const std::shared_ptr<Watcher>& w) const {
  return std::any_of(watchers_.begin(), watchers_.end(), [&](const auto& x) { return x.second == w; });
}

// The stream: the gateway answers a watch with chunks, each holding JSON lines {"result":
// {...events}}. Only the events' keys are handed on: the rendezvous reads what it needs again
// (the events are a wake-up, the read is the truth).
void Client::start_watch(const std::shared_ptr<Watcher>& w) {
  if (closed_ || !watching(w)) return;
  const std::size_t member = w->member % options_.endpoints.size();
  const auto& e = options_.endpoints[member];
  auto st = std::make_shared<WatchStream>(io_);
  w->current = st;
  st->parser.body_limit(boost::none);
  std::weak_ptr<Client> weak = shared_from_this();
  // Held by the stream, whose parser calls it (hence plain pointers).
  st->on_chunk = [weak, w = w.get(), st = st.get()](std::uint64_t, beast::string_view body,
                                                    beast::error_code&) -> std::size_t {
    st->pending.append(body.data(), body.size());
    std::size_t at = 0;
    for (auto nl = st->pending.find('\n', at); nl != std::string::npos; nl = st->pending.find('\n', at)) {
      const Json j = Json::parse(st->pending.substr(at, nl - at), nullptr, false);
      at = nl + 1;
      if (!j.is_object() || !j.contains("result")) continue;
      const auto& r = j["result"];
      long long revision = 0;
      try {
        if (r.contains("header") && r["header"].contains("revision"))
          revision = std::stoll(r["header"]["revision"].get<std::string>());
      } catch (const std::exception&) {
      }
      const bool events = r.contains("events") && r["events"].is_array() && !r["events"].empty();
      if (revision > 0 && events) w->next_revision = std::max(w->next_revision, revision + 1);
      auto self = weak.lock();
      if (!events || !self || self->closed_ || !w->on_events) continue;
      std::vector<Client::Event> keys;
      for (const auto& e : r["events"]) {
        if (!e.is_object() || !e.contains("kv") || !e["kv"].contains("key")) continue;
        keys.push_back({unbase64(e["kv"]["key"].get<std::string>()), e.value("type", "") == "DELETE"});
      }
      w->on_events(keys);
    }
    st->pending.erase(0, at);
    return body.size();
  };
  st->parser.on_chunk_body(st->on_chunk);
  st->request = http::request<http::string_body>(http::verb::post, "/v3/watch", 11);
  st->request.set(http::field::host, e.text());
  st->request.set(http::field::content_type, "application/json");
  if (const auto t = tokens_.find(member); t != tokens_.end()) st->request.set(http::field::authorization, t->second);
  Json create{{"key", base64(w->key)}, {"start_revision", std::to_string(w->next_revision)}};
  if (!w->range_end.empty()) create["range_end"] = base64(w->range_end);
  if (w->no_puts) create["filters"] = Json::array({"NOPUT"});
  st->request.body() = Json{{"create_request", create}}.dump();
  st->request.prepare_payload();
  auto broken = [weak, w, st](const std::string&) {
    auto self = weak.lock();
    if (!self || self->closed_ || !self->watching(w) || w->current != st) return;
    // Another member next: this one may be down, or cut off from the others.
    w->member = (w->member + 1) % self->options_.endpoints.size();
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
  st->stream.expires_after(options_.try_timeout);
  st->stream.async_connect(results, [st, broken](auto ec, const tcp::endpoint&) {
    if (ec) return broken(ec.message());
    http::async_write(st->stream, st->request, [st, broken](auto ec, std::size_t) {
      if (ec) return broken(ec.message());
      st->stream.expires_never();
      http::async_read_header(st->stream, st->buffer, st->parser, [st, broken](auto ec, std::size_t) {
        if (ec) return broken(ec.message());
        auto more = std::make_shared<std::function<void()>>();
        *more = [st, broken, more] {
          http::async_read_some(st->stream, st->buffer, st->parser, [st, broken, more](auto ec, std::size_t) {
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
}

}  // namespace idist::launchers::etcd

#pragma once
// A small asynchronous client of etcd's v3 API through its JSON gateway (HTTP/1.1 POST to
// /v3/kv/range, /v3/kv/txn, /v3/lease/..., /v3/watch; keys and values base64), on the
// caller's io_context with Boost.Beast. Why not etcd's gRPC client: Debian ships no C++ one,
// and gRPC would be a heavy dependency for a handful of calls; Beast is header-only and part of
// the Boost we already build with. The gateway is served by every etcd 3.4 member on its client
// port, so nothing runs beside etcd.
//
// TLS (https, a client certificate) with Boost.Asio's streams over OpenSSL (libssl3, which
// every Debian has; its headers from libssl-dev).
//
// Failover: a call goes to the member that answered last, and on a refused connection, a
// timeout or an error etcd calls transient ("request timed out", "leader changed", "no
// leader") to the next, skipping members that did not answer at all in the last few
// seconds, round after round, until its deadline; then it fails with one sentence naming
// every endpoint tried and what each said ("no answer from etcd" only where none answered:
// a web server there, or https:// to a plain one, is said as what it is). Errors that no other member would
// answer differently (a lease not found, a permission denied) come back at once.

#include <boost/asio.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace idist::launchers::etcd {

using Json = nlohmann::json;
struct Connection;

struct Endpoint {
  std::string host;
  std::string port;
  bool https = false;  // given as https://HOST:PORT
  std::string text() const { return host + ":" + port; }
};

struct ClientOptions {
  std::vector<Endpoint> endpoints;
  std::string user;  // with password: etcd's auth (a token per member, from /v3/auth/authenticate)
  std::string password;
  std::chrono::milliseconds try_timeout{1000};  // one member's answer to one call
  std::shared_ptr<boost::asio::ssl::context> tls;  // set: every connection is TLS (tls_context())
};

// TLS towards etcd: the members' certificates checked against `cacert` (a PEM file; empty:
// the system's CAs) and their names; `cert` and `key` (PEM files, both or neither) this
// node's client certificate, for a cluster started with --client-cert-auth. Throws
// std::invalid_argument naming a file that cannot be read or used.
std::shared_ptr<boost::asio::ssl::context> tls_context(const std::string& cacert, const std::string& cert,
                                                       const std::string& key);

// "h1:2379,h2:2379" (each may start with http:// or https://, all the same) -> endpoints;
// throws std::invalid_argument naming the bad one.
std::vector<Endpoint> parse_endpoints(const std::string& text);
std::string endpoints_text(const std::vector<Endpoint>& endpoints);

std::string base64(const std::string& raw);
std::string unbase64(const std::string& text);
// The key just past every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(const std::string& prefix);

class Client : public std::enable_shared_from_this<Client> {
 public:
  // error empty: `body` is etcd's answer.
  using Reply = std::function<void(const std::string& error, const Json& body)>;
  // Watch events came, in etcd's order: each key, whether it was deleted, its value put and
  // that put's revision (a stream that breaks is restarted, from the revision after the last
  // one seen, without a word).
  struct Event {
    std::string key;
    bool deleted = false;
    std::string value;
    long long mod_revision = 0;
  };
  using OnEvents = std::function<void(const std::vector<Event>& events)>;

  Client(boost::asio::io_context& io, ClientOptions options);
  ~Client();

  // POST `path` with `body`; `reply` once, on the io_context, within `deadline`.
  void call(const std::string& path, Json body, std::chrono::milliseconds deadline, Reply reply);

  // Watches [key, range_end) from `start_revision`, across members: a stream that breaks is
  // opened again on the next member, from the revision after the last one seen. Returns the
  // watch's id for unwatch().
  int watch(const std::string& key, const std::string& range_end, long long start_revision, OnEvents on_events);
  // Ends that watch (its stream closed): no event of it comes after. An id not watched: nothing.
  void unwatch(int id);

  // This host's address on its connection to etcd: where the other nodes, which reach the same
  // etcd, most likely reach this one. Empty until a call succeeded.
  const std::string& local_address() const { return local_address_; }
  const std::vector<Endpoint>& endpoints() const { return options_.endpoints; }

  // Cancels every call and the watch; no reply comes after.
  void close();

 private:
  struct Call;
  struct Watcher;
  void try_call(const std::shared_ptr<Call>& call);
  std::string given_up(const Call& call) const;
  void send(const std::shared_ptr<Call>& call, const std::string& path, const std::string& body,
            std::function<void(const std::string& error, int status, const std::string& body)> done,
            bool fresh = false);
  void start_watch(const std::shared_ptr<Watcher>& w);
  void on_watch_line(Watcher& w, const Json& line);
  void follow(std::size_t member);
  std::size_t next_member(std::size_t from) const;  // after `from`, the first not shunned
  bool shunned(std::size_t member) const;
  bool watching(const std::shared_ptr<Watcher>& w) const;

  boost::asio::io_context& io_;
  ClientOptions options_;
  std::size_t current_ = 0;  // the member that answered last
  std::map<std::size_t, std::chrono::steady_clock::time_point> shunned_until_;  // members that failed lately
  std::map<std::size_t, std::string> tokens_;  // auth token by member
  std::map<std::size_t, std::vector<std::shared_ptr<Connection>>> idle_;  // kept connections by member
  std::string local_address_;
  std::map<int, std::shared_ptr<Watcher>> watchers_;
  int next_watch_ = 0;
  bool closed_ = false;
};

}  // namespace idist::launchers::etcd

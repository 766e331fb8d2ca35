// The job-wide rendezvous (launchers/src/rendezvous/server.cpp) driven message by message:
// a real Server on loopback, and simulated node agents whose every message the test writes,
// so that orders the real agents produce only by chance (a failure that crosses a re-form's
// `end`, a node that never says "over", a node lost between attempts) happen every run.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"
#include "rendezvous/server.hpp"
#include "rendezvous/wire.hpp"
#include "store/tcp_store.hpp"

namespace rdzv = idist::launchers::rendezvous;
using rdzv::Json;
using rdzv::tcp;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

const std::string kToken = "unit-test";

struct Harness {
  asio::io_context io;
  tcp::endpoint where;
  std::unique_ptr<rdzv::Server> server;

  // Quiet unless the test reads the log.
  explicit Harness(rdzv::ServerOptions options, bool quiet = true) {
    options.quiet = quiet;
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    acceptor.listen();
    where = acceptor.local_endpoint();
    server = std::make_unique<rdzv::Server>(io, std::move(acceptor), std::move(options));
    server->start();
  }

  // Runs the loop until `done` holds; false after `limit`.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 5s) {
    const auto end = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() >= end) return false;
      io.restart();
      io.run_one_until(end);
    }
    return true;
  }
};

// One simulated node agent: what it is sent (heartbeats aside), and when its connection closed.
struct Agent {
  std::string host;
  std::shared_ptr<rdzv::Connection> connection;
  std::vector<Json> got;
  bool closed = false;
  Clock::time_point closed_at;
  std::unique_ptr<asio::steady_timer> beat_timer;

  Agent(Harness& h, std::string name) : host(std::move(name)) {
    tcp::socket socket(h.io);
    socket.connect(h.where);
    connection = std::make_shared<rdzv::Connection>(std::move(socket));
    connection->start(
        [this](const Json& m) {
          if (m["t"] != "hb") got.push_back(m);
        },
        [this](const std::string&) {
          closed = true;
          closed_at = Clock::now();
        });
  }

  void join(bool hosting = false, int grace_ms = -1) {
    Json m{{"t", "join"}, {"token", kToken}, {"host", host}, {"nproc", 2}, {"hosting", hosting}};
    if (hosting) m["master_port"] = 1;
    if (grace_ms >= 0) m["grace_ms"] = grace_ms;
    connection->send(m);
  }

  // Heartbeats every `period`, as a live agent does (until its connection closes).
  void beat(asio::io_context& io, std::chrono::milliseconds period) {
    if (!beat_timer) beat_timer = std::make_unique<asio::steady_timer>(io);
    if (closed) return;
    connection->send(Json{{"t", "hb"}});
    beat_timer->expires_after(period);
    beat_timer->async_wait([this, &io, period](auto ec) {
      if (!ec) beat(io, period);
    });
  }

  // The last message of type `t` ("assign", "end", "verdict", "error"), or null.
  Json last(const std::string& t) const {
    for (auto it = got.rbegin(); it != got.rend(); ++it)
      if ((*it)["t"] == t) return *it;
    return nullptr;
  }
  int count(const std::string& t) const {
    int n = 0;
    for (const auto& m : got) n += m["t"] == t;
    return n;
  }
  bool has(const std::string& t) const { return count(t) > 0; }
};

Json fail_message(int attempt, int rank, int code) {
  return Json{{"t", "fail"}, {"attempt", attempt}, {"rank", rank}, {"how", "exited with code " + std::to_string(code)},
              {"exit_code", code}, {"root", false}};
}

Json over_message(int attempt, std::optional<Json> failure = std::nullopt) {
  Json m{{"t", "over"}, {"attempt", attempt}};
  if (failure) {
    failure->erase("t");
    failure->erase("attempt");
    m["failure"] = *failure;
  }
  return m;
}

// The default logger's lines (the rendezvous logs through spdlog's default logger) for the
// test's duration.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100000)) {
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::vector<std::string> lines() const { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// A stranger's connection, made with a plain blocking socket: it sends `bytes` and hangs up.
void send_and_hang_up(const tcp::endpoint& where, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(where.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

std::string framed(const std::string& text) {
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return frame + text;
}

std::string text_of(const Json& m, const char* key) { return m.is_object() ? m.value(key, std::string()) : std::string(); }

}  // namespace

TEST_CASE("a failure that crosses a re-form's end is not counted: --max-restarts 0, MIN:MAX, the job re-forms") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 3, .max_restarts = 0, .last_call = 50ms, .dead_after = 60s});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  Agent c(h, "hc");
  c.join();
  REQUIRE(h.run_until([&] { return a.has("end") && b.has("end"); }));
  CHECK(text_of(b.last("end"), "cause") == "the node on hc joined");
  // Node b's ranks lost their peers on node a, which stopped first, and b said so before it
  // read its `end`: a consequence of the re-form, which must not spend the (empty) budget.
  b.connection->send(fail_message(0, 2, 1));
  b.connection->send(over_message(0, fail_message(0, 2, 1)));
  a.connection->send(over_message(0));
  REQUIRE(h.run_until([&] { return a.has("verdict") && b.has("verdict"); }));
  for (const Agent* n : {&a, &b}) {
    CHECK(text_of(n->last("verdict"), "then") == "restart");
    CHECK(n->last("verdict").value("restarts_left", -1) == 0);
    CHECK(n->last("verdict").value("counted", true) == false);  // each node counts it as a re-form
    CHECK(text_of(n->last("verdict"), "cause") == "the node on hc joined");
  }
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.count("assign") == 2 && b.count("assign") == 2 && c.has("assign"); }));
  CHECK(c.last("assign").value("nnodes", 0) == 3);
  CHECK(c.last("assign").value("attempt", -1) == 1);
}

TEST_CASE("after a failure ends an attempt, the budget is spent once and the first failure is named") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .max_restarts = 1, .dead_after = 60s});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  a.connection->send(fail_message(0, 1, 7));
  REQUIRE(h.run_until([&] { return b.has("end"); }));
  b.connection->send(fail_message(0, 3, 1));
  b.connection->send(over_message(0, fail_message(0, 3, 1)));
  a.connection->send(over_message(0, fail_message(0, 1, 7)));
  REQUIRE(h.run_until([&] { return a.has("verdict") && b.has("verdict"); }));
  CHECK(text_of(b.last("verdict"), "then") == "restart");
  CHECK(b.last("verdict").value("restarts_left", -1) == 0);
  CHECK(b.last("verdict").value("counted", false) == true);
  CHECK(text_of(b.last("verdict"), "cause") == "rank 1 on node 0 (ha) exited with code 7");
}

TEST_CASE("a member that heartbeats but never says over is dropped after its grace and the margin, named") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .max_restarts = 3, .dead_after = 60s, .stop_margin = 200ms});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true, 100);
  b.join(false, 300);  // the largest grace of the members counts
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  b.beat(h.io, 50ms);
  const auto failed_at = Clock::now();
  a.connection->send(fail_message(0, 0, 3));
  a.connection->send(over_message(0, fail_message(0, 0, 3)));
  REQUIRE(h.run_until([&] { return a.has("verdict"); }, 3s));
  const auto took = Clock::now() - failed_at;
  CHECK(took >= 500ms);
  CHECK(took < 1500ms);
  const auto verdict = a.last("verdict");
  CHECK(text_of(verdict, "then") == "failure");
  CHECK(text_of(verdict, "cause") ==
        "rank 0 on node 0 (ha) exited with code 3; node 1 (hb) did not report its ranks stopped within 0.5s of "
        "attempt 0's end; 1 node left, the job needs 2");
  CHECK(verdict.value("exit_code", 0) == 3);
  // 3 restarts left: too few nodes ended it, which every node's line must say (not the budget).
  CHECK(rdzv::verdict_of(verdict).ended_by == idist::launchers::RemoteVerdict::End::too_few_nodes);
  REQUIRE(h.run_until([&] { return b.closed; }));
  CHECK(text_of(b.last("error"), "message") ==
        "this node did not report its ranks stopped within 0.5s of attempt 0's end; dropped from the job");
}

TEST_CASE("a member lost between attempts ends a fixed-N job at once, naming it") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .max_restarts = 2, .dead_after = 60s, .join_timeout = 60s});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  a.connection->send(fail_message(0, 1, 7));
  a.connection->send(over_message(0, fail_message(0, 1, 7)));
  b.connection->send(over_message(0));
  REQUIRE(h.run_until([&] { return a.has("verdict") && b.has("verdict"); }));
  REQUIRE(text_of(a.last("verdict"), "then") == "restart");
  a.join(true);
  const auto lost_at = Clock::now();
  b.connection->close("test");  // node b's idist-run goes instead of joining attempt 1
  REQUIRE(h.run_until([&] { return a.count("verdict") == 2; }, 3s));
  CHECK(Clock::now() - lost_at < 1s);
  const auto verdict = a.last("verdict");
  CHECK(text_of(verdict, "then") == "failure");
  CHECK(text_of(verdict, "cause") ==
        "before attempt 1 could start, node 1 (hb) was lost: its idist-run ended or was killed; 1 node left, the job "
        "needs 2");
}

TEST_CASE("with MIN:MAX, a member lost between attempts is left out while MIN remain") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 3, .max_restarts = 2, .last_call = 50ms, .dead_after = 60s});
  Agent a(h, "ha"), b(h, "hb"), c(h, "hc");
  a.join(true);
  b.join();
  c.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign") && c.has("assign"); }));
  a.connection->send(fail_message(0, 1, 7));
  for (Agent* n : {&a, &b, &c}) n->connection->send(over_message(0));
  REQUIRE(h.run_until([&] { return a.has("verdict") && b.has("verdict"); }));
  c.connection->close("test");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.count("assign") == 2 && b.count("assign") == 2; }));
  CHECK(a.last("assign").value("nnodes", 0) == 2);
  CHECK(a.count("verdict") == 1);
}

TEST_CASE("with MIN:MAX and no restart left, a lost node ends the job, saying the scale-down needed a restart") {
  Harness h({.token = kToken, .min_nodes = 1, .max_nodes = 2, .max_restarts = 0, .last_call = 50ms, .dead_after = 60s});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  b.connection->close("test");  // node b's idist-run is killed while the job runs
  REQUIRE(h.run_until([&] { return a.has("end"); }));
  a.connection->send(over_message(0));
  REQUIRE(h.run_until([&] { return a.has("verdict"); }));
  const auto verdict = a.last("verdict");
  CHECK(text_of(verdict, "then") == "failure");
  CHECK(text_of(verdict, "cause") ==
        "node 1 (hb) was lost: its idist-run ended or was killed; no restart left (--max-restarts 0): going on without "
        "a lost node spends a restart");
  CHECK(rdzv::verdict_of(verdict).ended_by == idist::launchers::RemoteVerdict::End::restarts_spent);
}

TEST_CASE("a node that leaves with a reason is named with it") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .dead_after = 60s});
  Agent a(h, "ha"), b(h, "hb");
  a.join(true);
  b.join();
  REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
  b.connection->send(Json{{"t", "leave"}, {"why", "could not start every rank"}});
  b.connection->close_after_sends();
  REQUIRE(h.run_until([&] { return a.has("end"); }));
  CHECK(text_of(a.last("end"), "cause") == "node 1 (hb) left the job: could not start every rank");
}

TEST_CASE("silence is noticed at node_timeout, not up to a heartbeat later") {
  // A check once per heartbeat would see node b's silence only at the first beat past 0.5 s
  // (0.8 s here); its own deadline is 0.5 s after its last message.
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .heartbeat = 400ms, .dead_after = 500ms});
  Agent a(h, "ha"), b(h, "hb");
  a.beat(h.io, 100ms);
  a.join(true);
  b.join();
  const auto last_word = Clock::now();  // b says nothing after its join
  REQUIRE(h.run_until([&] { return a.has("end"); }, 3s));
  const auto took = Clock::now() - last_word;
  CHECK(took >= 500ms);
  CHECK(took < 750ms);  // the bound: node_timeout plus a quarter second of scheduling
  CHECK(text_of(a.last("end"), "cause") == "node 1 (hb) stopped answering (no heartbeat for 0.5s)");
}

TEST_CASE("a connection that never joins is closed after the handshake time") {
  Harness h({.token = kToken, .dead_after = 60s, .handshake = 300ms});
  Agent quiet(h, "quiet"), beating(h, "beating");
  beating.beat(h.io, 50ms);  // heartbeats are not a join
  const auto start = Clock::now();
  REQUIRE(h.run_until([&] { return quiet.closed && beating.closed; }, 3s));
  CHECK(quiet.closed_at - start >= 300ms);
  CHECK(quiet.closed_at - start < 800ms);
  CHECK(beating.closed_at - start < 800ms);
}

// Issue 28, defect 7: one log line per refused stranger (19,900 lines for a flood).
TEST_CASE("a flood of strangers' connections is logged in a bounded number of lines") {
  LogCapture log;
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .handshake = 10s}, false);
  constexpr int kFlood = 400;
  for (int i = 0; i < kFlood; ++i) {
    // Half speak another protocol, half are idist-runs of another job.
    if (i % 2 == 0) {
      send_and_hang_up(h.where, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    } else {
      send_and_hang_up(h.where, framed(Json{{"t", "join"}, {"token", "another-job"}, {"host", "x"}}.dump()));
    }
    if (i % 50 == 0) h.run_until([] { return false; }, 1ms);
  }
  h.run_until([] { return false; }, 2500ms);  // the last aggregated line comes a second after the flood
  int refusal_lines = 0;
  long counted = 0;
  for (const auto& line : log.lines()) {
    if (line.find("refused") == std::string::npos) continue;
    ++refusal_lines;
    MESSAGE(line);
    // "refused N connection(s) from ..." or, for the first one, "refused a connection from ..."
    const auto at = line.find("refused ") + 8;
    counted += line.compare(at, 2, "a ") == 0 ? 1 : std::atol(line.c_str() + at);
  }
  MESSAGE(kFlood << " refused connections logged in " << refusal_lines << " line(s)");
  CHECK(refusal_lines >= 1);
  CHECK(refusal_lines <= 8);  // at most one a second over the flood, and the first at once
  CHECK(counted == kFlood);   // none left out
}

// Issue 28, defect 8: with a mistyped --rdzv-id on node 1, node 0 said only "node 1 never joined".
TEST_CASE("a round that times out names the connections refused for another job id") {
  Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .join_timeout = 500ms});
  Agent a(h, "ha"), b(h, "hb");
  a.beat(h.io, 100ms);
  a.join(true);
  b.connection->send(Json{{"t", "join"}, {"token", "mistyped"}, {"host", "hb"}, {"nproc", 2}});
  REQUIRE(h.run_until([&] { return b.closed; }));
  CHECK(text_of(b.last("error"), "message").find("--rdzv-id") != std::string::npos);
  REQUIRE(h.run_until([&] { return a.has("verdict"); }, 3s));
  const auto cause = text_of(a.last("verdict"), "cause");
  MESSAGE(cause);
  CHECK(cause.find("node 1 never joined") != std::string::npos);
  CHECK(cause.find("refused 1 connection from 127.0.0.1 with another job id (--rdzv-id)") != std::string::npos);
}

// Live recovery: both members say their ranks opted in; node 1 loses rank 3 (a kill). The job
// goes on: no end, every node told of generation 1 through the store at recovery_port, where
// the survivors connect. A survivor that never joins it leaves the loss unrecovered: the verdict
// names it; where each joined, the job succeeds.
TEST_CASE("live recovery: a recoverable loss re-forms in place, told to every node; the verdict checks that it was") {
  for (const bool joined : {false, true}) {
    CAPTURE(joined);
    Harness h({.token = kToken, .min_nodes = 2, .max_nodes = 2, .max_restarts = 0, .dead_after = 60s,
               .recovery = true});
    Agent a(h, "ha"), b(h, "hb");
    a.join(true);
    b.join();
    REQUIRE(h.run_until([&] { return a.has("assign") && b.has("assign"); }));
    const int port = b.last("assign").value("recovery_port", 0);
    REQUIRE(port > 0);
    a.connection->send(Json{{"t", "capable"}, {"attempt", 0}});
    b.connection->send(Json{{"t", "capable"}, {"attempt", 0}});
    b.connection->send(Json{{"t", "fail"}, {"attempt", 0}, {"rank", 3}, {"how", "was killed by SIGKILL"},
                            {"exit_code", 137}, {"root", true}, {"recoverable", true}});
    REQUIRE(h.run_until([&] { return a.has("reformed") && b.has("reformed"); }));
    CHECK_FALSE(a.has("end"));
    CHECK(text_of(a.last("reformed"), "line") == "rank 3 on node 1 (hb) was killed by SIGKILL; world 4 -> 3");
    idist::detail::TcpStore store({"127.0.0.1", port, kToken + "#0", 5s});
    const auto members = store.get(idist::env::generation_key(1));
    CHECK(std::string(members.begin(), members.end()) == "members=0,1,2");
    if (joined)
      for (int r : {0, 1, 2}) store.set(idist::env::joined_key(1, r), {});
    b.connection->send(over_message(0));
    a.connection->send(over_message(0));
    REQUIRE(h.run_until([&] { return a.has("verdict") && b.has("verdict"); }));
    CHECK(text_of(a.last("verdict"), "then") == (joined ? "success" : "failure"));
    if (!joined)
      CHECK(text_of(a.last("verdict"), "cause") ==
            "rank 3 on node 1 (hb) was killed by SIGKILL, and a rank of generation 1 ended without re-forming (its "
            "program did not call idist::reform()): the loss stands");
  }
}

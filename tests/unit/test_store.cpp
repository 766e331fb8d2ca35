// The rendezvous store over real loopback TCP: a real server thread, real client sockets.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <climits>
#include <deque>
#include <cstdio>
#include <future>
#include <optional>
#include <thread>

#include "log.hpp"
#include "store/tcp_store.hpp"
#include "idist_store/server.hpp"
#include "store/wire.hpp"

using namespace idist::detail;
using namespace std::chrono_literals;

namespace {

std::vector<char> bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

TcpStoreOptions client_of(const TcpStoreServer& server, std::string token = "",
                          std::chrono::milliseconds timeout = 5s) {
  return {"127.0.0.1", server.port(), std::move(token), timeout};
}

// A client that speaks raw bytes: what an attacker, a port scanner or a broken peer sends.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(std::string_view bytes) {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  void send(const std::vector<char>& frame) { send(std::string_view(frame.data(), frame.size())); }
  void hello(std::string_view token = "") {
    send(wire::Writer(static_cast<std::uint8_t>(wire::Op::hello)).bytes(token).frame());
    auto reply = read_frame(2s);
    REQUIRE(reply);
    REQUIRE(static_cast<std::uint8_t>(reply->at(0)) == static_cast<std::uint8_t>(wire::Reply::ok));
  }
  void close() {
    ::close(fd_);
    fd_ = -1;
  }

  // One reply payload, or nullopt when the server closed the connection or sent nothing in time.
  std::optional<std::string> read_frame(std::chrono::milliseconds timeout) {
    char header[4];
    if (!read_exact(header, 4, timeout)) return std::nullopt;
    std::string payload(wire::read_u32(header), '\0');
    if (!read_exact(payload.data(), payload.size(), timeout)) return std::nullopt;
    return payload;
  }

  // True when the server closes the connection within the timeout (and sends nothing first).
  bool dropped_within(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  bool read_exact(char* out, std::size_t size, std::chrono::milliseconds timeout) {
    std::size_t got = 0;
    while (got < size) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
      const auto n = ::recv(fd_, out + got, size - got, 0);
      if (n <= 0) return false;
      got += static_cast<std::size_t>(n);
    }
    return true;
  }
  int fd_ = -1;
};

std::string u32_bytes(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// The job is undisturbed: a well-behaved client connects, sets and gets, all promptly.
void check_serves_promptly(const TcpStoreServer& server, const std::string& token = "") {
  const auto start = std::chrono::steady_clock::now();
  TcpStore good(client_of(server, token, 2s));
  good.set("probe", bytes("ok"));
  CHECK(text(good.get("probe")) == "ok");
  CHECK(std::chrono::steady_clock::now() - start < 1s);
}

// Routes the library's log to a ring buffer for the test's duration, to check what the
// server logged.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    idist::detail::log_sinks().set_sinks({sink_});
  }
  ~LogCapture() { idist::detail::log_sinks().set_sinks({std::make_shared<spdlog::sinks::stderr_color_sink_mt>()}); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Whether a line holding every one of `parts` shows up within a second (the server logs
  // from its own thread).
  bool saw(std::initializer_list<std::string_view> parts) {
    const auto deadline = std::chrono::steady_clock::now() + 1s;
    do {
      for (const auto& line : sink_->last_formatted()) {
        bool all = true;
        for (auto part : parts) all = all && line.find(part) != std::string::npos;
        if (all) return true;
      }
      std::this_thread::sleep_for(10ms);
    } while (std::chrono::steady_clock::now() < deadline);
    return false;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// A flood holds two descriptors per connection in this one process (ours and the server's).
// Returns the soft limit after raising it as far as the hard limit allows.
rlim_t raise_fd_limit(rlim_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = std::min(limit.rlim_max, wanted);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

long resident_kib() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace

TEST_CASE("set, get, add and wait round-trip") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore store(client_of(server));
  store.set("k", bytes("value"));
  CHECK(text(store.get("k")) == "value");
  store.set("k", bytes(""));
  CHECK(text(store.get("k")).empty());
  CHECK(store.add("n", 3) == 3);
  CHECK(store.add("n", -1) == 2);
  CHECK(text(store.get("n")) == "2");
  store.wait({"k", "n"}, 1s);
  // Binary values with every byte value survive.
  std::vector<char> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = static_cast<char>(i);
  store.set("bin", all);
  CHECK(store.get("bin") == all);
}

TEST_CASE("get blocks until another client sets the key") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore reader(client_of(server));
  auto value = std::async(std::launch::async, [&] { return text(reader.get("late")); });
  CHECK(value.wait_for(100ms) == std::future_status::timeout);
  TcpStore writer(client_of(server));
  writer.set("late", bytes("here"));
  CHECK(value.get() == "here");
}

TEST_CASE("wait for several keys returns once the last one is set") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore waiter(client_of(server));
  TcpStore writer(client_of(server));
  auto done = std::async(std::launch::async, [&] { waiter.wait({"a", "b", "c"}, 5s); });
  writer.set("a", {});
  writer.set("c", {});
  CHECK(done.wait_for(100ms) == std::future_status::timeout);
  writer.set("b", {});
  CHECK(done.wait_for(5s) == std::future_status::ready);
  done.get();
}

TEST_CASE("a get that is never answered times out with TimeoutFailure") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore store(client_of(server, "", 300ms));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(store.get("never"), TimeoutFailure);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  // The server dropped the abandoned request; other clients are unaffected.
  TcpStore other(client_of(server));
  other.set("x", bytes("1"));
  CHECK(text(other.get("x")) == "1");
}

TEST_CASE("a client retries until the server comes up") {
  int port = 0;
  {
    TcpStoreServer probe({"127.0.0.1", 0, ""});
    port = probe.port();
  }
  auto client = std::async(std::launch::async, [&] {
    TcpStore store({"127.0.0.1", port, "", 5s});
    return text(store.get("ready"));
  });
  std::this_thread::sleep_for(300ms);
  TcpStoreServer server({"127.0.0.1", port, ""});
  TcpStore writer({"127.0.0.1", port, "", 5s});
  writer.set("ready", bytes("yes"));
  CHECK(client.get() == "yes");
}

TEST_CASE("no server within the timeout is a TimeoutFailure naming host and port") {
  int port = 0;
  {
    TcpStoreServer probe({"127.0.0.1", 0, ""});
    port = probe.port();
  }
  try {
    TcpStore store({"127.0.0.1", port, "", 300ms});
    FAIL("connected to nothing");
  } catch (const TimeoutFailure& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  }
}

TEST_CASE("the job token is required when the server has one") {
  TcpStoreServer server({"127.0.0.1", 0, "s3cret"});
  CHECK_THROWS_WITH_AS(TcpStore(client_of(server, "wrong")),
                       doctest::Contains("refused this rank: wrong IDIST_JOB_TOKEN"), std::runtime_error);
  CHECK_THROWS_AS(TcpStore(client_of(server, "")), std::runtime_error);
  // A refused stranger does not disturb the job.
  TcpStore good(client_of(server, "s3cret"));
  good.set("k", bytes("v"));
  CHECK(text(good.get("k")) == "v");
}

TEST_CASE("concurrent clients all complete") {
  TcpStoreServer server({"127.0.0.1", 0, "tok"});
  constexpr int kClients = 64;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      TcpStore store(client_of(server, "tok"));
      store.set("key/" + std::to_string(i), bytes(std::to_string(i)));
      store.add("count", 1);
      // Everyone waits for everyone: exercises parked requests under load.
      std::vector<std::string> all;
      for (int j = 0; j < kClients; ++j) all.push_back("key/" + std::to_string(j));
      store.wait(all, 10s);
      if (text(store.get("key/" + std::to_string((i + 1) % kClients))) == std::to_string((i + 1) % kClients)) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == kClients);
  TcpStore check(client_of(server, "tok"));
  CHECK(check.add("count", 0) == kClients);
  MESSAGE(kClients << " concurrent clients: "
                   << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count()
                   << " ms");
}

TEST_CASE("binding a port that is in use is an error naming it") {
  TcpStoreServer first({"127.0.0.1", 0, ""});
  const auto port = first.port();
  const std::string where = "127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(TcpStoreServer({"127.0.0.1", port, ""}), doctest::Contains(where.c_str()), std::runtime_error);
}

// --- The store under attack: each case ends with a well-behaved client served promptly. ---

TEST_CASE("attack: garbage bytes instead of a hello are dropped") {
  LogCapture log;
  TcpStoreServer server({"127.0.0.1", 0, "tok"});
  RawClient http(server.port());
  http.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // "GET " read as a length: far beyond a hello
  CHECK(http.dropped_within(2s));
  CHECK(log.saw({"dropped client 127.0.0.1:", "frame length out of bounds"}));
  RawClient noise(server.port());
  noise.send(std::string("\x05\x00\x00\x00\xff\x01\x02\x03\x04", 9));  // a small frame that is no hello
  CHECK(noise.dropped_within(2s));
  CHECK(log.saw({"no hello"}));
  check_serves_promptly(server, "tok");
}

TEST_CASE("attack: a huge length prefix is refused without allocating it") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  {
    RawClient before_hello(server.port());
    before_hello.send(u32_bytes(0xffffffffu));
    CHECK(before_hello.dropped_within(2s));
  }
  {
    RawClient after_hello(server.port());
    after_hello.hello();
    after_hello.send(u32_bytes(wire::kMaxFrame + 1));
    CHECK(after_hello.dropped_within(2s));
  }
  {
    RawClient zero(server.port());
    zero.hello();
    zero.send(u32_bytes(0));
    CHECK(zero.dropped_within(2s));
  }
  // Frames that announce the maximum and then send a little: memory follows what arrived, not
  // what was announced (32 x 64 MiB would be 2 GiB).
  const auto rss_before = resident_kib();
  std::vector<std::unique_ptr<RawClient>> announcers;
  for (int i = 0; i < 32; ++i) {
    announcers.push_back(std::make_unique<RawClient>(server.port()));
    announcers.back()->hello();
    announcers.back()->send(u32_bytes(wire::kMaxFrame) + std::string(100, 'x'));
  }
  check_serves_promptly(server);
  const auto grown_mib = (resident_kib() - rss_before) / 1024;
  MESSAGE("resident memory after 32 half-sent 64 MiB frames grew by " << grown_mib << " MiB");
  CHECK(grown_mib < 64);
}

TEST_CASE("attack: closing mid-message leaves nothing behind") {
  TcpStoreServer server({"127.0.0.1", 0, "tok"});
  {
    RawClient half_hello(server.port());
    half_hello.send(u32_bytes(100) + "0123456789");
  }
  {
    RawClient half_header(server.port());
    half_header.hello("tok");
    half_header.send(std::string("\x10\x00", 2));
  }
  {
    RawClient half_set(server.port());
    half_set.hello("tok");
    const auto frame = wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes("half").bytes("value").frame();
    half_set.send(std::string_view(frame.data(), frame.size() - 3));
  }
  check_serves_promptly(server, "tok");
  TcpStore good(client_of(server, "tok"));
  CHECK(good.check({"half"}) == std::vector<bool>{false});
}

TEST_CASE("attack: a wrong or missing token is refused, logged with the peer, and the job goes on") {
  LogCapture log;
  TcpStoreServer server({"127.0.0.1", 0, "s3cret"});
  TcpStore job(client_of(server, "s3cret"));
  job.set("before", bytes("1"));
  CHECK_THROWS_WITH_AS(TcpStore(client_of(server, "guess")), doctest::Contains("wrong IDIST_JOB_TOKEN"),
                       std::runtime_error);
  CHECK(log.saw({"refused a client from 127.0.0.1:", "IDIST_JOB_TOKEN"}));
  CHECK_THROWS_AS(TcpStore(client_of(server, "")), std::runtime_error);
  // A refused stranger cannot slip requests in behind its hello either.
  RawClient stranger(server.port());
  auto hello = wire::Writer(static_cast<std::uint8_t>(wire::Op::hello)).bytes("guess").frame();
  auto set = wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes("before").bytes("evil").frame();
  hello.insert(hello.end(), set.begin(), set.end());
  stranger.send(hello);
  auto reply = stranger.read_frame(2s);
  REQUIRE(reply);
  CHECK(static_cast<std::uint8_t>(reply->at(0)) == static_cast<std::uint8_t>(wire::Reply::error));
  CHECK(stranger.dropped_within(2s));
  CHECK(text(job.get("before")) == "1");
  check_serves_promptly(server, "s3cret");
}

TEST_CASE("with no token configured any client is accepted") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore a(client_of(server, "anything"));
  a.set("k", bytes("v"));
  TcpStore b(client_of(server, ""));
  CHECK(text(b.get("k")) == "v");
}

TEST_CASE("attack: requests before the hello are refused") {
  LogCapture log;
  TcpStoreServer server({"127.0.0.1", 0, ""});
  RawClient rude(server.port());
  rude.send(wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes("k").bytes("v").frame());
  CHECK(rude.dropped_within(2s));
  CHECK(log.saw({"dropped client 127.0.0.1:", "no hello"}));
  TcpStore good(client_of(server));
  CHECK(good.check({"k"}) == std::vector<bool>{false});
  check_serves_promptly(server);
}

TEST_CASE("attack: malformed requests after the hello drop only that client") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  const std::vector<std::string> payloads = {
      std::string("\x63", 1),                                    // unknown opcode
      std::string("\x02\xff\xff\xff\x7f", 5),                    // set whose key length runs past the frame
      std::string("\x03\x01\x00\x00\x00kX", 7),                  // get with trailing bytes
      std::string("\x04\x01\x00\x00\x00k\x01", 7),               // add with a short delta
      std::string("\x05\x02\x00\x00\x00\x01\x00\x00\x00k", 10),  // wait for 2 keys, 1 sent
      std::string("\x01\x00\x00\x00\x00", 5),                    // a second hello
  };
  for (const auto& payload : payloads) {
    RawClient bad(server.port());
    bad.hello();
    bad.send(u32_bytes(static_cast<std::uint32_t>(payload.size())) + payload);
    CHECK(bad.dropped_within(2s));
  }
  check_serves_promptly(server);
}

TEST_CASE("attack: too many keys in one request is refused with an error, the connection stays") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  RawClient greedy(server.port());
  greedy.hello();
  wire::Writer wait(static_cast<std::uint8_t>(wire::Op::wait));
  wait.u32(wire::kMaxKeys + 1);
  for (std::uint32_t i = 0; i <= wire::kMaxKeys; ++i) wait.bytes("");
  greedy.send(wait.frame());
  auto reply = greedy.read_frame(2s);
  REQUIRE(reply);
  CHECK(static_cast<std::uint8_t>(reply->at(0)) == static_cast<std::uint8_t>(wire::Reply::error));
  CHECK(reply->find("too many keys") != std::string::npos);
  // Still in step: the next request is answered.
  greedy.send(wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes("k").bytes("v").frame());
  reply = greedy.read_frame(2s);
  REQUIRE(reply);
  CHECK(static_cast<std::uint8_t>(reply->at(0)) == static_cast<std::uint8_t>(wire::Reply::ok));
  // The client library refuses before sending.
  TcpStore store(client_of(server));
  std::vector<std::string> keys(wire::kMaxKeys + 1, "k");
  CHECK_THROWS_AS(store.wait(keys, 1s), std::invalid_argument);
  CHECK_THROWS_AS(store.check(keys), std::invalid_argument);
  check_serves_promptly(server);
}

TEST_CASE("attack: the store's size is bounded; an oversize value is refused with a clear error") {
  StoreServerOptions options{"127.0.0.1", 0, ""};
  options.max_keys = 10;
  options.max_bytes = 1 << 20;
  TcpStoreServer server(options);
  TcpStore store(client_of(server));
  CHECK_THROWS_WITH_AS(store.set("big", std::vector<char>(2 << 20, 'x')), doctest::Contains("the store is full"),
                       std::runtime_error);
  for (int i = 0; i < 9; ++i) store.set("k" + std::to_string(i), bytes("v"));  // 9 keys + "probe" below = 10
  check_serves_promptly(server);
  CHECK_THROWS_WITH_AS(store.set("one-too-many", bytes("v")), doctest::Contains("too many keys"), std::runtime_error);
  CHECK_THROWS_WITH_AS(store.add("counter", 1), doctest::Contains("too many keys"), std::runtime_error);
  store.set("k0", std::vector<char>(1000, 'y'));  // replacing a key is always fine within the bytes
  CHECK(store.get("k0").size() == 1000);
  // A frame beyond the wire's bound is refused by the client library before it is sent.
  CHECK_THROWS_AS(store.set("huge", std::vector<char>(wire::kMaxFrame, 'x')), std::invalid_argument);
  check_serves_promptly(server);
}

TEST_CASE("attack: add on a non-integer or past INT64_MAX is refused, the store goes on") {
  TcpStoreServer server({"127.0.0.1", 0, ""});
  TcpStore store(client_of(server));
  store.set("text", bytes("12abc"));
  CHECK_THROWS_WITH_AS(store.add("text", 1), doctest::Contains("not an integer"), std::runtime_error);
  CHECK(store.add("n", LLONG_MAX) == LLONG_MAX);
  CHECK_THROWS_WITH_AS(store.add("n", 1), doctest::Contains("overflow"), std::runtime_error);
  CHECK(store.add("n", 0) == LLONG_MAX);
  check_serves_promptly(server);
}

TEST_CASE("attack: a stalled client does not hold up the others, and is dropped in time") {
  LogCapture log;
  StoreServerOptions options{"127.0.0.1", 0, "tok"};
  options.hello_timeout = 300ms;
  options.frame_timeout = 300ms;
  TcpStoreServer server(options);
  RawClient silent(server.port());  // connects and never says hello
  RawClient half(server.port());    // sends half a frame and stalls
  half.hello("tok");
  const auto frame = wire::Writer(static_cast<std::uint8_t>(wire::Op::set)).bytes("k").bytes("value").frame();
  half.send(std::string_view(frame.data(), 7));
  // While both stall, everyone else is served at once.
  for (int i = 0; i < 5; ++i) check_serves_promptly(server, "tok");
  CHECK(silent.dropped_within(2s));
  CHECK(half.dropped_within(2s));
  CHECK(log.saw({"no hello in time"}));
  CHECK(log.saw({"stalled in the middle of a message"}));
  // An authenticated client idle between requests is not a stall: it keeps its connection.
  TcpStore idle(client_of(server, "tok"));
  std::this_thread::sleep_for(600ms);
  idle.set("still", bytes("here"));
  CHECK(text(idle.get("still")) == "here");
}

TEST_CASE("attack: connections beyond the cap are closed, and served again once below it") {
  LogCapture log;
  StoreServerOptions options{"127.0.0.1", 0, ""};
  options.max_connections = 4;
  TcpStoreServer server(options);
  std::vector<std::unique_ptr<RawClient>> hogs;
  for (int i = 0; i < 4; ++i) {
    hogs.push_back(std::make_unique<RawClient>(server.port()));
    hogs.back()->hello();
  }
  CHECK_THROWS_AS(TcpStore(client_of(server, "", 1s)), std::runtime_error);
  CHECK(log.saw({"refused 1 connection(s)", "the limit"}));
  hogs.clear();
  // The server notices the closes asynchronously.
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  for (;;) {
    try {
      TcpStore store(client_of(server, "", 1s));
      break;
    } catch (const std::runtime_error&) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(20ms);
    }
  }
  check_serves_promptly(server);
}

TEST_CASE("the store binds the address rank 0 is reached at, not every interface") {
  TcpStoreServer loopback({"127.0.0.1", 0, ""});
  CHECK(loopback.listen_address() == "127.0.0.1");
  StoreServerOptions all{"127.0.0.1", 0, ""};
  all.bind_all = true;
  TcpStoreServer wildcard(all);
  CHECK(wildcard.listen_address() == "0.0.0.0");
  check_serves_promptly(wildcard);
  // An address this host does not have fails, naming the way out, instead of quietly
  // listening everywhere. (192.0.2.1 is TEST-NET-1: never assigned.)
  StoreServerOptions foreign{"192.0.2.1", 0, ""};
  foreign.bind_all = false;
  CHECK_THROWS_WITH_AS(TcpStoreServer{foreign}, doctest::Contains("IDIST_STORE_BIND_ALL=1"), std::runtime_error);
}

// Issue 28, defect 4: a stranger's idle connections filled rank 0's store up to its cap while a
// rank was still joining, and the rank was turned away with "did rank 0 exit?". The cap here is
// small so that a flood well above it fits this process's descriptors.
TEST_CASE("flood: strangers' idle connections above the cap do not keep a rank of the job out") {
  constexpr std::size_t kCap = 128;
  const auto fds = raise_fd_limit(8 * kCap + 256);
  const std::size_t flood_size = std::min<std::size_t>(6 * kCap, (fds - 128) / 2);
  REQUIRE_MESSAGE(flood_size > 2 * kCap, "RLIMIT_NOFILE " << fds << " is too low for the test");
  LogCapture log;
  StoreServerOptions options{"127.0.0.1", 0, "tok"};
  options.max_connections = kCap;
  TcpStoreServer server(options);
  std::vector<std::unique_ptr<RawClient>> flood;  // connect and never say a word
  for (std::size_t i = 0; i < flood_size; ++i) flood.push_back(std::make_unique<RawClient>(server.port()));
  MESSAGE(flood_size << " idle stranger connections against a cap of " << kCap);
  // Every rank of a small job gets in, at once, and is served.
  std::vector<std::unique_ptr<TcpStore>> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 8; ++r) ranks.push_back(std::make_unique<TcpStore>(client_of(server, "tok", 5s)));
  ranks[0]->set("k", bytes("v"));
  for (auto& rank : ranks) CHECK(text(rank->get("k")) == "v");
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  CHECK(log.saw({"had not presented the job token", "to make room"}));
}

// The same while the flood goes on: a stranger that keeps connecting competes with the ranks'
// own connections for the slots the cap leaves.
TEST_CASE("flood: a rank gets in while a stranger keeps opening connections") {
  constexpr std::size_t kCap = 64;
  const auto fds = raise_fd_limit(8 * kCap + 256);
  const std::size_t held = std::min<std::size_t>(4 * kCap, (fds - 128) / 2);
  REQUIRE(held > kCap);
  StoreServerOptions options{"127.0.0.1", 0, "tok"};
  options.max_connections = kCap;
  TcpStoreServer server(options);
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> opened{0};
  std::thread flooder([&, port = server.port()] {
    std::deque<int> open;  // plain descriptors: no test assertions off the main thread
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (!stop) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(fd);
        continue;
      }
      open.push_back(fd);
      if (open.size() > held) {
        ::close(open.front());
        open.pop_front();
      }
      ++opened;
    }
    for (int fd : open) ::close(fd);
  });
  std::vector<std::unique_ptr<TcpStore>> ranks;
  for (int r = 0; r < 8; ++r) {
    CHECK_NOTHROW(ranks.push_back(std::make_unique<TcpStore>(client_of(server, "tok", 5s))));
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  flooder.join();
  MESSAGE(opened.load() << " stranger connections opened while 8 ranks joined, cap " << kCap);
  REQUIRE(ranks.size() == 8);
  ranks[0]->set("k", bytes("v"));
  for (auto& rank : ranks) CHECK(text(rank->get("k")) == "v");
}

// When the job's own connections fill the store, nothing can be made room for: the rank is
// told that at once, not at its timeout, and not that rank 0 may have exited.
TEST_CASE("a rank turned away by a store full of the job's own connections is told so") {
  StoreServerOptions options{"127.0.0.1", 0, "tok"};
  options.max_connections = 4;
  TcpStoreServer server(options);
  std::vector<std::unique_ptr<TcpStore>> ranks;
  for (int i = 0; i < 4; ++i) ranks.push_back(std::make_unique<TcpStore>(client_of(server, "tok")));
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    TcpStore late(client_of(server, "tok", 10s));
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  MESSAGE(message);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(message.find("4 connections") != std::string::npos);
  CHECK(message.find("full") != std::string::npos);
  CHECK(message.find("did rank 0 exit") == std::string::npos);
}

// Rank 0 out of descriptors, where the store runs in a child process of its own, is in
// test_store_load.cpp.

// The rendezvous store over real loopback TCP: a real server thread, real client sockets.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "store/tcp_store.hpp"
#include "store/tcp_store_server.hpp"

using namespace idist::detail;
using namespace std::chrono_literals;

namespace {

std::vector<char> bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

TcpStoreOptions client_of(const TcpStoreServer& server, std::string token = "",
                          std::chrono::milliseconds timeout = 5s) {
  return {"127.0.0.1", server.port(), std::move(token), timeout};
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

// init() and finalize() through the process environment, as a program under idist-run sees it.
#include <doctest/doctest.h>
#include <idist/idist.hpp>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "runtime.hpp"

namespace {

// Sets variables for one test and restores a clean environment after it.
struct ScopedEnv {
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      ::setenv(k, v, 1);
      names.push_back(k);
    }
  }
  ~ScopedEnv() {
    for (auto* k : names) ::unsetenv(k);
  }
  std::vector<const char*> names;
};

// A port nobody listens on (bound then released; fine for a negative test).
std::string unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return std::to_string(ntohs(a.sin_port));
}

}  // namespace

TEST_CASE("queries before init answer for a world of one; collectives refuse") {
  CHECK_FALSE(idist::is_initialized());
  CHECK(idist::get_rank() == 0);
  CHECK(idist::get_world_size() == 1);
  CHECK(idist::backend().empty());
  CHECK_THROWS_WITH_AS(idist::barrier(), "[idist] barrier: call idist::init() first", idist::Error);
}

TEST_CASE("no environment: init runs a world of one and every call works") {
  idist::init();
  CHECK(idist::is_initialized());
  CHECK(idist::backend() == "gloo");
  CHECK(idist::get_world_size() == 1);
  CHECK(idist::get_nnodes() == 1);
  std::vector<float> v = {1.5f, -2.0f};
  idist::all_reduce(v, idist::ReduceOp::MAX);
  CHECK(v == std::vector<float>{1.5f, -2.0f});
  CHECK(idist::all_reduce(7) == 7);
  CHECK(idist::all_gather(3.0) == std::vector<double>{3.0});
  CHECK(idist::all_gather(std::vector<std::int32_t>{}).empty());
  CHECK(idist::all_gather(std::string("x")) == std::vector<std::string>{"x"});
  CHECK(idist::broadcast(std::string("hello"), 0) == "hello");
  CHECK(idist::broadcast(std::int64_t{42}, 0) == 42);
  CHECK_THROWS_WITH_AS((void)idist::broadcast(1, 1), "[idist rank 0/1] broadcast(gloo): src=1 is not a rank (world size 1)",
                       idist::Error);
  idist::barrier();
  std::ostringstream config;
  idist::show_config(config);
  CHECK(config.str().find("  backend: gloo\n") != std::string::npos);
  CHECK(config.str().find("  world_size: 1\n") != std::string::npos);
  CHECK_THROWS_WITH_AS(idist::init(), doctest::Contains("already initialized"), idist::Error);
  idist::finalize();
  idist::finalize();  // twice is fine
  CHECK_FALSE(idist::is_initialized());
}

// The message of the idist::Error that `call` raises; any other exception escapes to doctest.
template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const idist::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("the typed templates refuse bad arguments with idist::Error, and the group stays usable") {
  idist::init();
  const std::vector<std::int32_t> three = {1, 2, 3};
  std::vector<std::int32_t> two(2);
  auto still_usable = [] {
    std::vector<std::int64_t> v = {5};
    idist::all_reduce(v);
    return v[0] == 5 && idist::all_reduce(2.5) == 2.5;
  };
  CHECK(error_of([&] { idist::reduce_scatter(std::span<const std::int32_t>(three), std::span<std::int32_t>(two)); }) ==
        "[idist rank 0/1] reduce_scatter(gloo): input holds 3 elements; expected group size x output (2)");
  CHECK(still_usable());
  CHECK(error_of([&] { idist::all_gather(std::span<const std::int32_t>(three), std::span<std::int32_t>(two)); }) ==
        "[idist rank 0/1] all_gather(gloo): output holds 2 elements; expected group size x input (3)");
  CHECK(still_usable());
  CHECK(error_of([&] { (void)idist::iall_gather(std::span<const std::int32_t>(three), std::span<std::int32_t>(two)); }) ==
        "[idist rank 0/1] iall_gather(gloo): output holds 2 elements; expected group size x input (3)");
  CHECK(still_usable());
  CHECK(error_of([&] { (void)idist::Tensor::of(three).as<double>(); }) ==
        "[idist rank 0/1] Tensor::as(gloo): the tensor holds int32, not float64");
  CHECK(still_usable());
  // The library's own checks behind the templates, for comparison: the same kind, the same prefix.
  CHECK(error_of([&] { (void)idist::broadcast(std::optional<std::vector<float>>{}); }) ==
        "[idist rank 0/1] broadcast(gloo): src rank 0 passed no value");
  CHECK(still_usable());
  // Through the exported helper itself, on the world and on a group.
  const auto group = idist::new_group({0});
  CHECK(error_of([&] { idist::detail::refuse("op", "why"); }) == "[idist rank 0/1] op(gloo): why");
  CHECK(error_of([&] { idist::detail::refuse("op", "why", group); }) == "[idist rank 0/1] op on group [0](gloo): why");
  try {
    idist::detail::refuse("op", "why");
  } catch (const idist::Error& e) {
    CHECK(e.op() == "op");
    CHECK(e.backend() == "gloo");
    CHECK(e.rank() == 0);
    CHECK(e.detail() == "why");
  }
  CHECK(still_usable());
  idist::finalize();
  // Before init: a world of one with no backend yet.
  CHECK(error_of([&] { (void)idist::Tensor::of(three).as<float>(); }) ==
        "[idist rank 0/1] Tensor::as: the tensor holds int32, not float32");
}

TEST_CASE("a malformed variable is an init error naming it") {
  ScopedEnv env({{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  CHECK_THROWS_WITH_AS(idist::init(), "[idist] init: bad environment: RANK='abc': not an integer", idist::Error);
  CHECK_FALSE(idist::is_initialized());
}

TEST_CASE("an unknown or uninstalled backend is an init error naming it") {
  CHECK_THROWS_WITH_AS(idist::init({.backend = "pigeon"}),
                       doctest::Contains("unknown backend 'pigeon' (expected gloo, nccl or mpi)"), idist::Error);
  // These tests link libidist's objects statically, so no plugin lies beside them: mpi and
  // nccl are "not installed" here, whatever the build has (tests/e2e/plugins.sh loads them).
  for (const std::string name : {"mpi", "nccl"}) {
    ScopedEnv env({{"IDIST_BACKEND", name.c_str()}, {"IDIST_PLUGIN_PATH", "/nonexistent/plugins"}});
    const std::string want = "backend '" + name + "' is not installed: no libidist-backend-" + name +
                             ".so in /nonexistent/plugins, ";
    CHECK_THROWS_WITH_AS(idist::init(), doctest::Contains(want.c_str()), idist::Error);
  }
  CHECK(!idist::is_initialized());
}

TEST_CASE("rank 0 never comes: init raises TimeoutError within IDIST_TIMEOUT") {
  const auto port = unused_port();
  ScopedEnv env({{"RANK", "1"},
                 {"WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port.c_str()},
                 {"IDIST_TIMEOUT", "0.5"}});
  const auto start = std::chrono::steady_clock::now();
  try {
    idist::init();
    FAIL("init succeeded without rank 0");
  } catch (const idist::TimeoutError& e) {
    CHECK(std::string(e.what()).find("[idist rank 1/2] init(gloo): could not reach the store at 127.0.0.1:" + port) == 0);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("a peer that never joins: rank 0's init raises TimeoutError") {
  const auto port = unused_port();
  ScopedEnv env({{"RANK", "0"},
                 {"WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port.c_str()},
                 {"IDIST_TIMEOUT", "0.5"}});
  CHECK_THROWS_AS(idist::init(), idist::TimeoutError);
  CHECK_FALSE(idist::is_initialized());
}

TEST_CASE("ranks whose thresholds or transports differ: every rank's init names the setting and both values") {
  // Both ends of a message follow these, so a difference would otherwise surface as a timeout
  // or a size error in some later collective.
  struct Case {
    std::function<void(idist::env::Contract&)> differ;
    std::string want;
    bool recovery = false;  // rank 1's InitOptions::recovery
  };
  const std::vector<Case> cases = {
      {[](auto& c) { c.tuning.hier_segment = 4096; },
       "ranks disagree on IDIST_HIER_SEGMENT: 4096 on rank 1 but unset on rank 0; set it alike for every rank, or "
       "unset it everywhere"},
      {[](auto& c) { c.tuning.ucx_tcp_from = idist::env::Contract::Tuning::kNever; },
       "ranks disagree on IDIST_UCX_TCP_FROM: off on rank 1 but unset on rank 0"},
      {[](auto& c) { c.interhost = "gloo"; }, "ranks disagree on IDIST_INTERHOST: gloo on rank 1 but auto on rank 0"},
      {[](auto& c) { c.debug = true; }, "ranks disagree on IDIST_DEBUG: 1 on rank 1 but 0 on rank 0"},
      {[](auto& c) { c.intranode = "off"; }, "ranks disagree on IDIST_INTRANODE: off on rank 1 but auto on rank 0"},
      {[](auto&) {}, "ranks disagree on live recovery: not offered by idist-run on rank 1 but off on rank 0", true},
  };
  for (const auto& one : cases) {
    CAPTURE(one.want);
    const auto port = unused_port();
    std::string errors[2];
    std::thread ranks[2];
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < 2; ++r)
      ranks[r] = std::thread([&, r] {
        idist::env::Contract c;
        c.rank = r;
        c.world_size = 2;
        c.local_world_size = 2;
        c.master_port = std::stoi(port);
        c.timeout = std::chrono::seconds(10);
        c.from_env = true;
        if (r == 1) one.differ(c);
        try {
          idist::detail::Runtime runtime(c, {.recovery = r == 1 && one.recovery});
          errors[r] = "no error";
        } catch (const idist::Error& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) CHECK(errors[r].find(one.want) != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
}

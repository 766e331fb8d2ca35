// Point-to-point over every backend configuration (configurations.hpp): send/recv and
// isend/irecv between threads-as-ranks, tags, ordering, Work's wait/is_completed, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <numeric>

#include "ranks.hpp"

using namespace idist;
using idist::detail::ProcessGroup;
using namespace std::chrono_literals;

namespace {

std::vector<std::int64_t> ramp(std::size_t n, std::int64_t start) {
  std::vector<std::int64_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST_CASE("send/recv: a ring of every rank to the next, sizes from 1 element to 4 MiB") {
  test::for_each_backend([&](const test::Config& config) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{512 * 1024}}) {
      test::run_ranks(config, 3, [n](ProcessGroup& g, test::Failures& failures) {
        const int next = (g.rank() + 1) % g.size();
        const int prev = (g.rank() + g.size() - 1) % g.size();
        const auto mine = ramp(n, 1000 * g.rank());
        std::vector<std::int64_t> got(n, -1);
        // Even ranks send first, odd ranks receive first: blocking calls in a ring would otherwise
        // wait for each other only if the transport had no buffering; this order works either way.
        if (g.rank() % 2 == 0) {
          g.send(mine.data(), n * sizeof(std::int64_t), next, 0);
          g.recv(got.data(), n * sizeof(std::int64_t), prev, 0);
        } else {
          g.recv(got.data(), n * sizeof(std::int64_t), prev, 0);
          g.send(mine.data(), n * sizeof(std::int64_t), next, 0);
        }
        if (got != ramp(n, 1000 * prev)) failures.add(g.rank(), "wrong data from rank " + std::to_string(prev));
      });
    }
  });
}

TEST_CASE("tags keep transfers apart, and one tag keeps their order") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& g, test::Failures& failures) {
      constexpr int kMessages = 20;
      if (g.rank() == 0) {
        for (int i = 0; i < kMessages; ++i) {
          const std::int32_t a = i, b = 100 + i;
          g.send(&b, sizeof(b), 1, 7);  // tag 7 first...
          g.send(&a, sizeof(a), 1, 3);
        }
      } else {
        std::vector<Work> works;
        std::vector<std::int32_t> a(kMessages), b(kMessages);
        // ...received tag 3 first: tags are separate channels.
        for (int i = 0; i < kMessages; ++i) works.push_back(g.irecv(&a[static_cast<std::size_t>(i)], 4, 0, 3));
        for (int i = 0; i < kMessages; ++i) works.push_back(g.irecv(&b[static_cast<std::size_t>(i)], 4, 0, 7));
        for (auto& w : works) w.wait();
        for (int i = 0; i < kMessages; ++i) {
          if (a[static_cast<std::size_t>(i)] != i) failures.add(1, "tag 3 message " + std::to_string(i) + " out of order");
          if (b[static_cast<std::size_t>(i)] != 100 + i) failures.add(1, "tag 7 message " + std::to_string(i) + " out of order");
        }
      }
    });
  });
}

TEST_CASE("a fresh tag per message, many times over: every message arrives, in order") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& g, test::Failures& failures) {
      for (int tag = 0; tag < 2000; ++tag) {
        std::int32_t v = tag;
        if (g.rank() == 0) {
          g.send(&v, sizeof(v), 1, tag);
        } else {
          g.recv(&v, sizeof(v), 0, tag);
          if (v != tag) failures.add(1, "tag " + std::to_string(tag) + " got " + std::to_string(v));
        }
      }
    });
  });
}

TEST_CASE("a user's tag-0 transfer posted around collectives never meets the collectives' own traffic") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 4, [](ProcessGroup& g, test::Failures& failures) {
      // Rank 1 posts a receive from rank 0 before a reduce to rank 1, and waits after it; rank 0
      // sends after the reduce. Over the hierarchical path both ranks share a host.
      std::int32_t user = -1;
      Work pending;
      if (g.rank() == 1) pending = g.irecv(&user, sizeof(user), 0, 0);
      std::int32_t sum = g.rank() + 1;
      g.reduce(&sum, 1, DType::int32, ReduceOp::SUM, 1);
      if (g.rank() == 0) {
        const std::int32_t mine = 42;
        g.send(&mine, sizeof(mine), 1, 0);
      }
      if (g.rank() == 1) {
        pending.wait();
        if (user != 42) failures.add(1, "the user's message got " + std::to_string(user));
        if (sum != 10) failures.add(1, "the reduce got " + std::to_string(sum));
      }
      // No rank tears its connections down while rank 1 still waits (a program's finalize() waits
      // so too): over gloo a peer's closed connection can fail a transfer still pending.
      g.barrier();
    });
  });
}

TEST_CASE("isend/irecv: Work completes, is_completed tells without disturbing it") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& g, test::Failures& failures) {
      std::vector<double> data(1000, g.rank() == 0 ? 2.5 : 0.0);
      if (g.rank() == 1) {
        auto work = g.irecv(data.data(), data.size() * sizeof(double), 0, 1);
        // Rank 0 sends only after a pause: meanwhile the receive is pending, and asking about it
        // must not break it.
        for (int i = 0; i < 5; ++i) {
          if (work.is_completed()) failures.add(1, "completed before anything was sent");
          std::this_thread::sleep_for(10ms);
        }
        work.wait();
        if (!work.is_completed()) failures.add(1, "not completed after wait()");
        if (data != std::vector<double>(1000, 2.5)) failures.add(1, "wrong data");
      } else {
        std::this_thread::sleep_for(100ms);
        auto work = g.isend(data.data(), data.size() * sizeof(double), 1, 1);
        work.wait(5s);
      }
    });
  });
}

TEST_CASE("Work::wait(timeout) throws TimeoutError and the transfer goes on") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& g, test::Failures& failures) {
      std::int64_t value = g.rank() == 0 ? 42 : 0;
      if (g.rank() == 1) {
        auto work = g.irecv(&value, sizeof(value), 0, 0);
        try {
          work.wait(50ms);
          failures.add(1, "wait(50ms) returned before anything was sent");
        } catch (const TimeoutError& e) {
          if (std::string(e.what()).find("irecv(gloo)") == std::string::npos) failures.add(1, e.what());
        }
        g.barrier();  // now rank 0 sends
        work.wait();
        if (value != 42) failures.add(1, "wrong value after the second wait");
      } else {
        g.barrier();
        g.send(&value, sizeof(value), 1, 0);
      }
    });
  });
}

TEST_CASE("a transfer whose peer never comes fails on the waiting thread with TimeoutError") {
  test::for_each_backend([&](const test::Config& config) {
    std::atomic<bool> done{false};
    test::run_ranks(
        config,
        2,
        [&done](ProcessGroup& g, test::Failures& failures) {
          if (g.rank() == 0) {
            // Alive but silent (a peer that exits instead resets the connection: an Error too).
            while (!done) std::this_thread::sleep_for(10ms);
            return;
          }
          struct Done {
            std::atomic<bool>& flag;
            ~Done() { flag = true; }
          } mark{done};
          std::int64_t value = 0;
          auto work = g.irecv(&value, sizeof(value), 0, 0);
          try {
            work.wait();
            failures.add(1, "wait() returned though nothing was sent");
          } catch (const TimeoutError& e) {
            if (std::string(e.what()).find("[idist rank 1/2] irecv(gloo)") == std::string::npos)
              failures.add(1, std::string("message: ") + e.what());
          }
        },
        1s);
  });
}

TEST_CASE("an irecv nobody matches, its Work dropped, does not hold the group's end for the timeout") {
  test::for_each_backend([&](const test::Config& config) {
    // As finalize() after an unmatched irecv: each rank's group is torn down at the end of its
    // body, rank 1's with the receive still posted.
    const auto start = std::chrono::steady_clock::now();
    test::run_ranks(
        config,
        2,
        [](ProcessGroup& g, test::Failures&) {
          g.barrier();  // both connected before rank 0 leaves
          if (g.rank() == 1) {
            static std::int64_t value = 0;  // outlives the group
            try {
              g.irecv(&value, sizeof(value), 0, 5);
            } catch (const idist::Error&) {
              // gloo: rank 0's group may be gone already, which it tells at once: not the case here.
            }
          }
        },
        10s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    CHECK_MESSAGE(took < 5s, "the groups' end took " << took.count() << " ms (timeout 10 s)");
  });
}

TEST_CASE("an isend whose Work was dropped before the group's end still arrives whole") {
  test::for_each_backend([&](const test::Config& config) {
    // Rank 1 leaves at once (its group's end waits for the send); rank 0 receives later. 4 MiB:
    // more than a shared-memory ring holds, so the sender is mid-message when its group ends.
    const std::size_t n = 1 << 20;
    test::run_ranks(config, 2, [n](ProcessGroup& g, test::Failures& failures) {
      g.barrier();
      if (g.rank() == 1) {
        static std::vector<float> out(n, 3.0f);  // outlives the group
        g.isend(out.data(), n * sizeof(float), 0, 6);
        return;
      }
      std::this_thread::sleep_for(300ms);
      std::vector<float> in(n);
      g.recv(in.data(), n * sizeof(float), 1, 6);
      if (std::count(in.begin(), in.end(), 3.0f) != static_cast<std::ptrdiff_t>(n)) failures.add(0, "the message came wrong");
    });
  });
}

// Shared memory only: over gloo each group's end waits for the other to close.
TEST_CASE("two irecvs nobody matches, one each way: both groups end at once (shared memory)") {
  test::for_each_backend_where(test::shm_only, [&](const test::Config& config) {
    const auto start = std::chrono::steady_clock::now();
    test::run_ranks(
        config,
        2,
        [](ProcessGroup& g, test::Failures&) {
          g.barrier();
          static std::int64_t values[2];  // outlive the groups
          g.irecv(&values[g.rank()], sizeof(std::int64_t), 1 - g.rank(), 5);
        },
        10s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    CHECK_MESSAGE(took < 5s, "the groups' end took " << took.count() << " ms (timeout 10 s)");
  });
}

TEST_CASE("bad point-to-point arguments are errors naming the argument, and the group stays usable") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& g, test::Failures& failures) {
      std::int32_t x = 0;
      auto expect = [&](auto call, const std::string& part) {
        try {
          call();
          failures.add(g.rank(), "no error for " + part);
        } catch (const Error& e) {
          if (std::string(e.what()).find(part) == std::string::npos) failures.add(g.rank(), e.what());
        }
      };
      expect([&] { g.send(&x, 4, g.rank(), 0); }, "is this rank");
      expect([&] { g.send(&x, 4, 2, 0); }, "dst=2 is not a rank (world size 2)");
      expect([&] { g.recv(&x, 4, -1, 0); }, "src=-1 is not a rank");
      expect([&] { (void)g.isend(&x, 4, 1 - g.rank(), -3); }, "tag=-3 is negative");
      expect([&] { g.recv(nullptr, 4, 1 - g.rank(), 0); }, "null buffer");
      // Nothing was sent by the calls above: a real exchange still works.
      std::int32_t mine = 10 + g.rank(), theirs = 0;
      auto r = g.irecv(&theirs, 4, 1 - g.rank(), 0);
      g.send(&mine, 4, 1 - g.rank(), 0);
      r.wait();
      if (theirs != 11 - g.rank()) failures.add(g.rank(), "exchange after errors failed");
    });
  });
}

TEST_CASE("a default Work is complete") {
  Work w;
  CHECK(w.is_completed());
  CHECK_NOTHROW(w.wait());
  CHECK_NOTHROW(w.wait(1ms));
}

TEST_CASE("a receive buffer of another size than the message is an error, not a hang") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(
        config,
        2,
        [](ProcessGroup& g, test::Failures& failures) {
          std::vector<std::int32_t> buffer(g.rank() == 0 ? 8 : 4, 1);
          try {
            if (g.rank() == 0) {
              g.send(buffer.data(), buffer.size() * 4, 1, 0);
            } else {
              g.recv(buffer.data(), buffer.size() * 4, 0, 0);
            }
            if (g.rank() == 1) failures.add(1, "no error for an 8-element message into a 4-element buffer");
          } catch (const Error& e) {
            const std::string message = e.what();
            if (g.rank() == 0 || message.find("recv(gloo): rank 0 sent 32 bytes (tag 0) but the receive buffer holds 16") ==
                                     std::string::npos)
              failures.add(g.rank(), "message: " + message);
          }
          // The message was drained: the channel is in step, and the group still works.
          std::int32_t next = g.rank() == 0 ? 99 : 0;
          if (g.rank() == 0) g.send(&next, 4, 1, 0);
          if (g.rank() == 1) g.recv(&next, 4, 0, 0);
          if (next != 99) failures.add(g.rank(), "the next transfer got " + std::to_string(next));
        },
        2s);
  });
}

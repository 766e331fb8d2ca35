// Every collective over every backend configuration (configurations.hpp), on a grid of world
// sizes x element counts x dtypes x ops, against expected values computed in closed form from
// the inputs' formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ranks.hpp"

using namespace idist;
using idist::detail::ProcessGroup;

namespace {

constexpr std::size_t kMiB = 1 << 20;
const std::vector<int> kWorldSizes = {1, 2, 3, 4};

// Small values so that SUM and PRODUCT over 4 ranks stay exact in every dtype (int8 included).
template <class T>
T input(int rank, std::size_t i) {
  return static_cast<T>(1 + (static_cast<std::size_t>(rank) + i) % 3);
}

template <class T>
T expected(int size, std::size_t i, ReduceOp op) {
  T acc = input<T>(0, i);
  for (int r = 1; r < size; ++r) {
    const T v = input<T>(r, i);
    switch (op) {
      case ReduceOp::SUM: acc = static_cast<T>(acc + v); break;
      case ReduceOp::PRODUCT: acc = static_cast<T>(acc * v); break;
      case ReduceOp::MIN: acc = std::min(acc, v); break;
      case ReduceOp::MAX: acc = std::max(acc, v); break;
      default: break;  // the bitwise ops have their own grid in the e2e matrix
    }
  }
  return acc;
}

template <class T>
void all_reduce_grid(ProcessGroup& group, test::Failures& failures) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, kMiB / sizeof(T)}) {
    for (auto op : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = input<T>(group.rank(), i);
      group.all_reduce(buf.data(), count, dtype_of<T>, op);
      for (std::size_t i = 0; i < count; ++i) {
        if (buf[i] != expected<T>(group.size(), i, op)) {
          failures.add(group.rank(), "all_reduce " + std::string(to_string(dtype_of<T>)) + " " +
                                         std::string(to_string(op)) + " count " + std::to_string(count) +
                                         ": wrong value at " + std::to_string(i));
          break;
        }
      }
    }
  }
}

// Rank r contributes count_of(r) elements valued 1000*r + i.
template <class T, class CountOf>
void all_gather_case(ProcessGroup& group, test::Failures& failures, CountOf count_of, const char* label) {
  const auto mine = count_of(group.rank());
  std::vector<T> in(mine);
  for (std::size_t i = 0; i < mine; ++i) in[i] = static_cast<T>(1000 * group.rank() + static_cast<int>(i % 1000));
  const auto counts = group.all_gather_counts(mine);
  std::size_t total = 0;
  for (int r = 0; r < group.size(); ++r) {
    if (counts[static_cast<std::size_t>(r)] != count_of(r)) failures.add(group.rank(), std::string(label) + ": counts");
    total += count_of(r);
  }
  std::vector<T> out(total);
  group.all_gather_v(in.data(), mine, counts, out.data(), sizeof(T));
  std::size_t at = 0;
  for (int r = 0; r < group.size(); ++r) {
    for (std::size_t i = 0; i < count_of(r); ++i, ++at) {
      if (out[at] != static_cast<T>(1000 * r + static_cast<int>(i % 1000))) {
        failures.add(group.rank(), std::string(label) + ": wrong element from rank " + std::to_string(r));
        return;
      }
    }
  }
}

template <class T>
void all_gather_grid(ProcessGroup& group, test::Failures& failures) {
  for (std::size_t base : {std::size_t{0}, std::size_t{1}, std::size_t{7}, kMiB / sizeof(T)}) {
    all_gather_case<T>(group, failures, [&](int) { return base; }, "equal");
    all_gather_case<T>(group, failures, [&](int r) { return base + static_cast<std::size_t>(r); }, "unequal");
    all_gather_case<T>(group, failures, [&](int r) { return r % 2 == 1 ? std::size_t{0} : base + 1; },
                       "some empty");
  }
}

}  // namespace

TEST_CASE("all_reduce: world sizes 1..4 x counts {0, 1, 7, 1 MiB} x dtypes x ops") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        all_reduce_grid<std::int8_t>(group, failures);
        all_reduce_grid<std::uint8_t>(group, failures);
        all_reduce_grid<std::int32_t>(group, failures);
        all_reduce_grid<std::int64_t>(group, failures);
        all_reduce_grid<float>(group, failures);
        all_reduce_grid<double>(group, failures);
      });
    }
  });
}

// The hierarchical backend's rails (equal hosts, from 1 MiB): each host's member i carries
// block i of the buffer between hosts; the elements past the last whole block (1 or 2 here,
// with 2 or 3 members per host) go by the leaders. Every element, on every rank.
TEST_CASE("all_reduce past 1 MiB with a count that does not split evenly over a host's members") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : {4, 6}) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        for (std::size_t count : {std::size_t{262147}, std::size_t{262148}}) {
          std::vector<float> v(count);
          for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i + static_cast<std::size_t>(group.rank())) % 5);
          group.all_reduce(v.data(), count, DType::float32, ReduceOp::SUM);
          for (std::size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < group.size(); ++r) want += static_cast<float>((i + static_cast<std::size_t>(r)) % 5);
            if (v[i] != want) {
              failures.add(group.rank(), "count " + std::to_string(count) + ": element " + std::to_string(i) + " is " +
                                             std::to_string(v[i]) + ", want " + std::to_string(want));
              break;
            }
          }
        }
      });
    }
  });
}

// AVG (torch's ReduceOp.AVG): the SUM divided by the group's size, in all_reduce, reduce (on
// dst only) and reduce_scatter; floats only. The inputs average exactly: SUM of 1 + (r + i) % 3
// over n ranks, divided by n, compared with the same division in the dtype's arithmetic.
template <class T>
void average_case(ProcessGroup& group, test::Failures& failures) {
  const auto n = static_cast<std::size_t>(group.size());
  const std::string dtype(to_string(dtype_of<T>));
  auto want = [&](std::size_t i) {
    double sum = 0;
    for (int r = 0; r < group.size(); ++r) sum += static_cast<double>(1 + (static_cast<std::size_t>(r) + i) % 3);
    return static_cast<float>(static_cast<T>(static_cast<float>(sum)));  // the SUM, rounded to T once
  };
  auto check = [&](const std::vector<T>& got, std::size_t offset, const char* what) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float expected = want(offset + i) / static_cast<float>(n);
      if (std::abs(static_cast<float>(got[i]) - expected) > 1e-2f * expected) {
        failures.add(group.rank(), std::string(what) + " AVG " + dtype + ": at " + std::to_string(i) + " got " +
                                       std::to_string(static_cast<float>(got[i])) + ", want " + std::to_string(expected));
        return;
      }
    }
  };
  const std::size_t count = 1000;
  auto inputs = [&](std::size_t elements) {
    std::vector<T> v(elements);
    for (std::size_t i = 0; i < elements; ++i) v[i] = T(static_cast<float>(1 + (static_cast<std::size_t>(group.rank()) + i) % 3));
    return v;
  };
  auto buf = inputs(count);
  group.all_reduce(buf.data(), count, dtype_of<T>, ReduceOp::AVG);
  check(buf, 0, "all_reduce");
  buf = inputs(count);
  group.reduce(buf.data(), count, dtype_of<T>, ReduceOp::AVG, 0);
  if (group.rank() == 0) check(buf, 0, "reduce");
  else if (buf != inputs(count)) failures.add(group.rank(), "reduce AVG " + dtype + ": a non-dst rank's buffer changed");
  const auto in = inputs(count * n);
  std::vector<T> out(count);
  group.reduce_scatter(in.data(), out.data(), count, dtype_of<T>, ReduceOp::AVG);
  check(out, static_cast<std::size_t>(group.rank()) * count, "reduce_scatter");
}

TEST_CASE("AVG: all_reduce, reduce and reduce_scatter divide the SUM by the group's size; integers refused") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        average_case<float>(group, failures);
        average_case<double>(group, failures);
        average_case<float16>(group, failures);
        average_case<bfloat16>(group, failures);
        std::vector<std::int32_t> ints(3, 1);
        try {
          group.all_reduce(ints.data(), ints.size(), DType::int32, ReduceOp::AVG);
          failures.add(group.rank(), "AVG on int32 was not refused");
        } catch (const idist::Error& e) {
          if (std::string(e.what()).find("AVG is defined on floating dtypes only, not int32") == std::string::npos)
            failures.add(group.rank(), std::string("AVG on int32: ") + e.what());
        }
      });
    }
  });
}

TEST_CASE("all_gather: equal, unequal and empty contributions, in rank order") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        all_gather_grid<std::int32_t>(group, failures);
        all_gather_grid<double>(group, failures);
        all_gather_grid<std::int8_t>(group, failures);
      });
    }
  });
}

TEST_CASE("all_gather of strings of different lengths, empty included") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        const auto mine = std::string(static_cast<std::size_t>(group.rank() * 3), static_cast<char>('a' + group.rank()));
        const auto all = group.all_gather(mine);
        for (int r = 0; r < group.size(); ++r)
          if (all.at(static_cast<std::size_t>(r)) != std::string(static_cast<std::size_t>(r * 3), static_cast<char>('a' + r)))
            failures.add(group.rank(), "string from rank " + std::to_string(r));
      });
    }
  });
}

TEST_CASE("broadcast of buffers and strings from every src") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      test::run_ranks(config, size, [](ProcessGroup& group, test::Failures& failures) {
        for (int src = 0; src < group.size(); ++src) {
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, kMiB / sizeof(double)}) {
            std::vector<double> buf(count, -1.0);
            if (group.rank() == src)
              for (std::size_t i = 0; i < count; ++i) buf[i] = src * 1e6 + static_cast<double>(i);
            group.broadcast(buf.data(), count, DType::float64, src);
            for (std::size_t i = 0; i < count; ++i)
              if (buf[i] != src * 1e6 + static_cast<double>(i)) {
                failures.add(group.rank(), "broadcast from " + std::to_string(src) + " count " + std::to_string(count));
                break;
              }
          }
          // Non-src ranks pass strings of other lengths: the length travels first.
          const auto got = group.broadcast("from " + std::to_string(group.rank()) + std::string(group.rank() * 5, '!'), src);
          if (got != "from " + std::to_string(src) + std::string(static_cast<std::size_t>(src * 5), '!'))
            failures.add(group.rank(), "string broadcast from " + std::to_string(src) + " gave '" + got + "'");
          if (!group.broadcast(std::string(), src).empty()) failures.add(group.rank(), "empty string broadcast");
        }
      });
    }
  });
}

TEST_CASE("barrier: nobody leaves before everyone arrived") {
  test::for_each_backend([&](const test::Config& config) {
    for (int size : kWorldSizes) {
      CAPTURE(size);
      std::atomic<int> arrived{0};
      test::run_ranks(config, size, [&](ProcessGroup& group, test::Failures& failures) {
        for (int round = 1; round <= 3; ++round) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10 * group.rank()));
          ++arrived;
          group.barrier();
          if (arrived.load() < round * group.size()) failures.add(group.rank(), "left the barrier early");
          group.barrier();  // nobody starts the next round before everyone checked
        }
      });
    }
  });
}

TEST_CASE("errors name rank, op and backend; bad arguments do not break the group") {
  test::for_each_backend([&](const test::Config& config) {
    test::run_ranks(config, 2, [](ProcessGroup& group, test::Failures& failures) {
      int value = 1;
      try {
        group.broadcast(&value, 1, DType::int32, 5);
        failures.add(group.rank(), "src=5 accepted");
      } catch (const Error& e) {
        const std::string want = "[idist rank " + std::to_string(group.rank()) +
                                 "/2] broadcast(gloo): src=5 is not a rank (world size 2)";
        if (e.what() != want) failures.add(group.rank(), std::string("message: ") + e.what());
        if (e.op() != "broadcast" || e.backend() != "gloo" || e.rank() != group.rank())
          failures.add(group.rank(), "error fields");
      }
      group.all_reduce(&value, 1, DType::int32, ReduceOp::SUM);
      if (value != 2) failures.add(group.rank(), "group unusable after an argument error");
    });
  });
}

TEST_CASE("a rank that never arrives gives TimeoutError, not a hang") {
  test::for_each_backend([&](const test::Config& config) {
    using namespace std::chrono_literals;
    std::atomic<bool> rank0_done{false};
    const auto start = std::chrono::steady_clock::now();
    test::run_ranks(
        config,
        2,
        [&](ProcessGroup& group, test::Failures& failures) {
          if (group.rank() == 1) {
            while (!rank0_done) std::this_thread::sleep_for(10ms);  // alive, but never calls
            return;
          }
          int value = 1;
          try {
            group.all_reduce(&value, 1, DType::int32, ReduceOp::SUM);
            failures.add(0, "all_reduce returned without its peer");
          } catch (const TimeoutError& e) {
            if (std::string(e.what()).find("[idist rank 0/2] all_reduce(gloo): ") != 0)
              failures.add(0, std::string("message: ") + e.what());
          }
          // The connections are in an unknown state now: later calls refuse rather than corrupt.
          try {
            group.barrier();
            failures.add(0, "barrier ran on a broken group");
          } catch (const TimeoutError&) {
            failures.add(0, "second call timed out again instead of failing fast");
          } catch (const Error& e) {
            if (std::string(e.what()).find("unusable after an earlier failure") == std::string::npos)
              failures.add(0, std::string("message: ") + e.what());
          }
          rank0_done = true;
        },
        500ms);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  });
}

// Over shared memory the backend carries each call's note beside its arrival, so ranks in
// different calls fail instead of mixing one call's bytes into another's (shm_backend.cpp).
// 2 ranks watch each other's words, 5 step by a generation: both ways are tried; tiny
// all_reduces go through boxes up to 4 ranks.
TEST_CASE("shm: calls that do not match fail on the ranks that would read the other's data") {
  test::for_each_backend_where(test::shm_only, [&](const test::Config& config) {
    auto mismatch = [](const Error& e) {
      return std::string(e.what()).find("the ranks' calls do not match") != std::string::npos;
    };
    for (int size : {2, 3, 4, 5}) {
      CAPTURE(size);
      // Another count on the last rank: every rank raises, none returns a result, and the
      // message names both calls. 3 floats: boxes on both sides; 100: past shm's boxes, so the
      // last rank's call goes by halves, the others' by boxes.
      for (std::size_t last : {std::size_t{3}, std::size_t{100}}) {
        CAPTURE(last);
        const auto theirs = "all_reduce (float32 SUM, " + std::to_string(last * 4) + " bytes)";
        test::run_ranks(config, size, [&](ProcessGroup& group, test::Failures& failures) {
          std::vector<float> v(group.rank() == group.size() - 1 ? last : 2, 1.0f);
          try {
            group.all_reduce(v.data(), v.size(), DType::float32, ReduceOp::SUM);
            failures.add(group.rank(), "all_reduce of another count returned");
          } catch (const Error& e) {
            if (!mismatch(e)) failures.add(group.rank(), std::string("message: ") + e.what());
            const std::string msg = e.what();
            if (msg.find(theirs) == std::string::npos || msg.find("all_reduce (float32 SUM, 8 bytes)") == std::string::npos)
              failures.add(group.rank(), "the message names both calls: " + msg);
          }
        });
      }
      // A skipped barrier: the last rank's all_reduce meets the others' barrier.
      test::run_ranks(config, size, [&](ProcessGroup& group, test::Failures& failures) {
        float x = 1.0f;
        try {
          if (group.rank() != group.size() - 1) group.barrier();
          group.all_reduce(&x, 1, DType::float32, ReduceOp::SUM);
          if (group.rank() == group.size() - 1) failures.add(group.rank(), "all_reduce met a barrier and returned");
        } catch (const Error& e) {
          if (!mismatch(e)) failures.add(group.rank(), std::string("message: ") + e.what());
        }
      });
      // Another root for one rank: whoever waits on a rank in another call raises; the roots,
      // which do not wait, raise at their next call at the latest: an all_reduce (which writes
      // first) or a barrier (a full step, which compares the one-sided step's notes).
      for (const bool then_barrier : {false, true}) {
        test::run_ranks(config, size, [&](ProcessGroup& group, test::Failures& failures) {
          int v = group.rank() * 10;
          const int root = group.rank() == 1 ? 1 : 0;
          bool raised = false;
          try {
            group.broadcast(&v, 1, DType::int32, root);
            if (!then_barrier && group.rank() != root && v != root * 10) failures.add(group.rank(), "got " + std::to_string(v));
            if (then_barrier) {
              group.barrier();
            } else {
              group.all_reduce(&v, 1, DType::int32, ReduceOp::SUM);
            }
          } catch (const Error& e) {
            raised = true;
            if (!mismatch(e)) failures.add(group.rank(), std::string("message: ") + e.what());
          }
          if (!raised && (group.rank() == 0 || group.rank() == 1))
            failures.add(group.rank(), std::string("another root, then ") + (then_barrier ? "a barrier" : "an all_reduce") +
                                           ", went unnoticed");
        });
      }
    }
  });
}

// Over ucx between hosts a message shorter than the receive is a success to UCX (a longer one
// is truncated, an error): the backend checks every collective receive's length, so ranks in
// calls of different sizes raise wherever one reads the other's data, and those waiting on
// them time out; none returns. Counts: recursive doubling's whole messages, the ring's blocks
// (from 256 KiB), and one rank on each side of that switch.
TEST_CASE("ucx between hosts: calls of different sizes raise on every rank, none returns") {
  test::for_each_backend_where(&test::Config::ucx_between_ranks, [&](const test::Config& config) {
    for (int size : {2, 3}) {
      CAPTURE(size);
      for (const auto& [theirs, ours] : {std::pair<std::size_t, std::size_t>{3, 2}, {70001, 70000}, {65536, 65535}}) {
        CAPTURE(theirs);
        std::atomic<int> named{0};
        test::run_ranks(
            config,
            size,
            [&](ProcessGroup& group, test::Failures& failures) {
              std::vector<float> v(group.rank() == group.size() - 1 ? theirs : ours, 1.0f);
              try {
                group.all_reduce(v.data(), v.size(), DType::float32, ReduceOp::SUM);
                failures.add(group.rank(), "all_reduce of another count returned");
              } catch (const Error& e) {
                if (std::string(e.what()).find("the ranks called different collectives or sizes") != std::string::npos)
                  ++named;
              }
            },
            std::chrono::seconds(3));
        CHECK(named >= 1);
      }
      // A skipped barrier: the last rank's all_reduce meets the others' barrier.
      test::run_ranks(
          config,
          size,
          [&](ProcessGroup& group, test::Failures& failures) {
            float x = 1.0f;
            try {
              if (group.rank() != group.size() - 1) group.barrier();
              group.all_reduce(&x, 1, DType::float32, ReduceOp::SUM);
              failures.add(group.rank(), "a barrier met an all_reduce and both returned");
            } catch (const Error&) {
            }
          },
          std::chrono::seconds(3));
    }
  });
}

// Matching rooted calls with uneven work between them: a rank that waits in writable_half for
// a slow peer's arrival at the previous call must not take it for another call.
TEST_CASE("shm: rooted calls in a loop with uneven work never raise a mismatch") {
  test::for_each_backend_where(test::shm_only, [&](const test::Config& config) {
    for (int size : {2, 3, 4, 5}) {
      CAPTURE(size);
      test::run_ranks(config, size, [&](ProcessGroup& group, test::Failures& failures) {
        std::uint64_t seed = 12345u + static_cast<std::uint64_t>(group.rank());
        for (int i = 0; i < 3000; ++i) {
          seed = seed * 6364136223846793005ull + 1442695040888963407ull;
          if ((seed >> 60) == 0) std::this_thread::sleep_for(std::chrono::microseconds((seed >> 40) % 200));
          float x = 1.0f;
          const int root = i % group.size();
          // all_reduce of 1 to 80 floats: in shm's boxes up to 264 bytes, by halves past them.
          std::vector<float> v(1 + (static_cast<std::size_t>(i) / 3) % 80, static_cast<float>(group.rank()));
          try {
            if (i % 3 == 0) group.reduce(&x, 1, DType::float32, ReduceOp::SUM, root);
            if (i % 3 == 1) group.broadcast(&x, 1, DType::float32, root);
            if (i % 3 == 2) group.all_reduce(v.data(), v.size(), DType::float32, ReduceOp::SUM);
          } catch (const Error& e) {
            failures.add(group.rank(), "call " + std::to_string(i) + ": " + e.what());
            return;
          }
          if (i % 3 == 0 && group.rank() == root && x != static_cast<float>(group.size()))
            failures.add(group.rank(), "reduce " + std::to_string(i) + " gave " + std::to_string(x));
          const auto ranks = static_cast<float>(group.size());
          if (i % 3 == 2 && std::count(v.begin(), v.end(), ranks * (ranks - 1) / 2) != static_cast<long>(v.size()))
            failures.add(group.rank(), "all_reduce " + std::to_string(i) + " of " + std::to_string(v.size()) +
                                           " floats gave " + std::to_string(v.front()));
        }
      });
    }
  });
}

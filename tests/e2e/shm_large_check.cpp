// Large all_reduces on 2 ranks, for shm_large.sh: every dtype and op at counts where shared
// memory splits the work (from 128 KiB) and goes in several rounds (its halves are 512 KiB),
// odd counts included, with NaNs among the floats (a NaN wins every op but the bitwise ones,
// torch.minimum's rule); every element checked. Then 200 back-to-back calls of 1 MiB whose
// values change every call: a rank whose next call wrote its half of the segment while its
// peer still read the last one would hand the peer the next values.
//   shm_large_check            the checks; "shm_large_check rank R: N checks, M failed"
//   shm_large_check --forever  64 MiB all_reduces until killed (a peer that dies mid-call);
//                              "calling" once the first one is done
#include <idist/idist.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

int failures = 0;
int cases = 0;

void expect(bool ok, const std::string& what) {
  ++cases;
  if (ok) return;
  ++failures;
  std::printf("rank %d FAILED: %s\n", idist::get_rank(), what.c_str());
}

// Rank r's element i: 1 to 5 (sums, products and averages of two are exact in every dtype); a
// NaN in every 97th float element of rank 1 and every 89th of rank 0.
template <class T>
double value(int rank, std::size_t i) {
  if constexpr (!std::is_integral_v<T>)
    if ((rank == 1 && i % 97 == 0) || (rank == 0 && i % 89 == 0)) return std::numeric_limits<double>::quiet_NaN();
  return 1 + static_cast<double>((static_cast<std::size_t>(rank) * 7 + i) % 5);
}

template <class T>
double as_double(T x) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<double>(x);
  else
    return static_cast<double>(static_cast<float>(x));
}

double combine(idist::ReduceOp op, double a, double b) {
  using idist::ReduceOp;
  // Only integers (never a NaN) take the bitwise ops.
  const auto bits = [&](auto f) { return static_cast<double>(f(static_cast<long long>(a), static_cast<long long>(b))); };
  if (op != ReduceOp::AND && op != ReduceOp::OR && op != ReduceOp::XOR && (std::isnan(a) || std::isnan(b)))
    return std::numeric_limits<double>::quiet_NaN();
  switch (op) {
    case ReduceOp::SUM: return a + b;
    case ReduceOp::AVG: return (a + b) / 2;
    case ReduceOp::PRODUCT: return a * b;
    case ReduceOp::MIN: return std::min(a, b);
    case ReduceOp::MAX: return std::max(a, b);
    case ReduceOp::AND: return bits([](long long x, long long y) { return x & y; });
    case ReduceOp::OR: return bits([](long long x, long long y) { return x | y; });
    default: return bits([](long long x, long long y) { return x ^ y; });
  }
}

template <class T>
void check_dtype() {
  using idist::ReduceOp;
  std::vector<ReduceOp> ops{ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
  if constexpr (std::is_integral_v<T>)
    ops.insert(ops.end(), {ReduceOp::AND, ReduceOp::OR, ReduceOp::XOR});
  else
    ops.push_back(ReduceOp::AVG);
  const int me = idist::get_rank();
  const std::string type(idist::to_string(idist::dtype_of<T>));
  const std::size_t split = 128 * 1024 / sizeof(T), half = 512 * 1024 / sizeof(T);
  for (auto op : ops) {
    for (std::size_t count : {split - 1, split, half + 3, 4 * half + split + 1}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(value<T>(me, i));
      idist::all_reduce(buf, {.op = op});
      std::size_t wrong = count;
      for (std::size_t i = 0; i < count && wrong == count; ++i) {
        const double want = combine(op, value<T>(0, i), value<T>(1, i)), got = as_double(buf[i]);
        if (!(got == want || (std::isnan(want) && std::isnan(got)))) wrong = i;
      }
      expect(wrong == count, "all_reduce " + type + " " + std::string(idist::to_string(op)) + " of " +
                                 std::to_string(count) + (wrong == count ? "" : ": element " + std::to_string(wrong)));
    }
  }
}

void back_to_back() {
  const int me = idist::get_rank();
  std::vector<std::int32_t> buf(256 * 1024);
  for (int round = 0; round < 200; ++round) {
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = (me + 1) * (round + static_cast<int>(i % 7));
    idist::all_reduce(buf);
    bool ok = true;
    for (std::size_t i = 0; i < buf.size() && ok; ++i) ok = buf[i] == 3 * (round + static_cast<int>(i % 7));
    expect(ok, "back-to-back call " + std::to_string(round));
  }
}

}  // namespace

int main(int argc, char** argv) try {
  idist::init();
  if (idist::get_world_size() != 2) {
    std::fprintf(stderr, "shm_large_check: needs 2 ranks\n");
    return 2;
  }
  if (argc > 1 && std::string(argv[1]) == "--forever") {
    std::vector<float> big(16 * 1024 * 1024, 1.0f);
    idist::all_reduce(big);
    std::printf("calling\n");
    std::fflush(stdout);
    for (;;) idist::all_reduce(big);
  }
  check_dtype<float>();
  check_dtype<double>();
  check_dtype<idist::bfloat16>();
  check_dtype<idist::float16>();
  check_dtype<std::int32_t>();
  check_dtype<std::int64_t>();
  check_dtype<std::int8_t>();
  check_dtype<std::uint8_t>();
  back_to_back();
  std::printf("shm_large_check rank %d: %d checks, %d failed\n", idist::get_rank(), cases, failures);
  idist::finalize();
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "shm_large_check rank %d: %s\n", idist::get_rank(), e.what());
  return 3;
}

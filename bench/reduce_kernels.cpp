// The reduction kernels alone (reduce/kernels.hpp), every variant this CPU has: ns per element
// of out = a op b over buffers that stay in L2 (64 KiB of elements: the kernels' own speed,
// not memory's), for the dtypes and ops given. The best of 5 repetitions of ~0.2 s each.
//   reduce_kernels [DTYPE...]   (default: float16 bfloat16 float32)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "idist/types.hpp"
#include "reduce/isa.hpp"
#include "reduce/kernels.hpp"

using namespace idist;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::vector<DType> dtypes;
  for (int i = 1; i < argc; ++i) {
    bool known = false;
    for (auto d : {DType::int8, DType::uint8, DType::int32, DType::int64, DType::float16, DType::bfloat16,
                   DType::float32, DType::float64})
      if (argv[i] == to_string(d)) dtypes.push_back(d), known = true;
    if (!known) {
      std::fprintf(stderr, "reduce_kernels: unknown dtype '%s'\n", argv[i]);
      return 2;
    }
  }
  if (dtypes.empty()) dtypes = {DType::float16, DType::bfloat16, DType::float32};
  constexpr std::size_t kCount = 32768;
  std::mt19937 rng(1);
  std::printf("%-9s %-8s %-9s %s\n", "dtype", "op", "isa", "ns/element");
  for (auto dtype : dtypes) {
    const auto size = dtype_size(dtype);
    std::vector<char> a(kCount * size), b(kCount * size), out(kCount * size);
    // Values in [1, 2) whatever the dtype, so that no product runs off to infinity or NaN.
    for (std::size_t i = 0; i < kCount; ++i) {
      const float v = 1.0f + static_cast<float>(rng() % 1000) / 1000.0f;
      const auto put = [&](std::vector<char>& buf, auto x) { std::memcpy(buf.data() + i * size, &x, size); };
      switch (dtype) {
        case DType::float16: put(a, float16(v)), put(b, float16(v)); break;
        case DType::bfloat16: put(a, bfloat16(v)), put(b, bfloat16(v)); break;
        case DType::float32: put(a, v), put(b, v); break;
        case DType::float64: put(a, double(v)), put(b, double(v)); break;
        default: put(a, static_cast<std::int64_t>(rng())), put(b, static_cast<std::int64_t>(rng())); break;
      }
    }
    for (auto op : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
      for (auto isa : detail::kReduceIsas) {
        if (!detail::cpu_has(isa)) continue;
        const auto kernel = detail::reduce_kernel(dtype, op, isa);
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
          std::size_t calls = 0;
          const auto start = Clock::now();
          auto now = start;
          while (now - start < std::chrono::milliseconds(200)) {
            for (int k = 0; k < 8; ++k) kernel(out.data(), a.data(), b.data(), kCount);
            calls += 8;
            now = Clock::now();
          }
          const double ns = std::chrono::duration<double, std::nano>(now - start).count() / (calls * kCount);
          best = std::min(best, ns);
        }
        std::printf("%-9s %-8s %-9s %.3f\n", std::string(to_string(dtype)).c_str(), std::string(to_string(op)).c_str(),
                    std::string(detail::to_string(isa)).c_str(), best);
      }
    }
  }
}

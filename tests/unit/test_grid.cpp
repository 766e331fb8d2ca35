// The whole reduction and rooted-collective grid, threads as ranks, over every backend
// configuration (configurations.hpp: gloo, shm, hierarchical on three host maps, ucx):
// all_reduce, reduce to every root and reduce_scatter, for every dtype (16-bit floats
// included) x every op (bitwise on integers) x counts from 1 to past a shm half (rounds, and
// the split reduction); gather and scatter from every root. Expected values come from the
// shared kernels applied on the host in rank order, over inputs small enough to be exact.
#include <doctest/doctest.h>

#include <cstring>

#include "ranks.hpp"
#include "reduce/kernels.hpp"

using namespace idist;
using idist::detail::ProcessGroup;

namespace {

constexpr DType kDTypes[] = {DType::int8,     DType::uint8,    DType::int32,   DType::int64,
                             DType::float16,  DType::bfloat16, DType::float32, DType::float64};
constexpr ReduceOp kOps[] = {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX,
                             ReduceOp::AND, ReduceOp::OR,      ReduceOp::XOR};
// 1, a few, 38 and 60 (a shm box's 1, 2, 3 and 5 lines for 1-, 2- and 4-byte types; halves for
// 8) and 300k elements: over 1 MiB for the 4-byte and 8-byte types.
constexpr std::size_t kCounts[] = {1, 7, 38, 60, 300'000};

// Element i of rank r, in [1, 3]: products of 4 ranks stay exact in int8 and float16.
int value(int rank, std::size_t i) { return 1 + static_cast<int>((static_cast<std::size_t>(rank) * 7 + i) % 3); }

void put(DType dtype, void* at, int v) {
  switch (dtype) {
    case DType::int8: *static_cast<std::int8_t*>(at) = static_cast<std::int8_t>(v); break;
    case DType::uint8: *static_cast<std::uint8_t*>(at) = static_cast<std::uint8_t>(v); break;
    case DType::int32: *static_cast<std::int32_t*>(at) = v; break;
    case DType::int64: *static_cast<std::int64_t*>(at) = v; break;
    case DType::float16: *static_cast<float16*>(at) = float16(static_cast<float>(v)); break;
    case DType::bfloat16: *static_cast<bfloat16*>(at) = bfloat16(static_cast<float>(v)); break;
    case DType::float32: *static_cast<float*>(at) = static_cast<float>(v); break;
    case DType::float64: *static_cast<double*>(at) = v; break;
  }
}

std::vector<char> input(DType dtype, int rank, std::size_t count, std::size_t offset = 0) {
  const auto e = dtype_size(dtype);
  std::vector<char> out(count * e);
  for (std::size_t i = 0; i < count; ++i) put(dtype, out.data() + i * e, value(rank, offset + i));
  return out;
}

// Every rank's input reduced in rank order, as the host computes it.
std::vector<char> expected(DType dtype, ReduceOp op, int size, std::size_t count, std::size_t offset = 0) {
  auto acc = input(dtype, 0, count, offset);
  const auto fn = detail::reduce_kernel(dtype, op);
  for (int r = 1; r < size; ++r) {
    const auto in = input(dtype, r, count, offset);
    fn(acc.data(), acc.data(), in.data(), count);
  }
  return acc;
}

std::string label(const char* what, DType dtype, ReduceOp op, std::size_t count) {
  return std::string(what) + " " + std::string(to_string(dtype)) + " " + std::string(to_string(op)) + " count " +
         std::to_string(count);
}

void reductions(ProcessGroup& group, test::Failures& failures) {
  const int me = group.rank();
  const int n = group.size();
  for (auto dtype : kDTypes) {
    for (auto op : kOps) {
      if (is_bitwise(op) && !is_integer(dtype)) continue;
      for (auto count : kCounts) {
        const auto want = expected(dtype, op, n, count);
        auto buf = input(dtype, me, count);
        group.all_reduce(buf.data(), count, dtype, op);
        if (buf != want) failures.add(me, label("all_reduce", dtype, op, count));

        for (int root = 0; root < n; ++root) {
          buf = input(dtype, me, count);
          group.reduce(buf.data(), count, dtype, op, root);
          if (me == root && buf != want) failures.add(me, label("reduce", dtype, op, count) + " at root");
          if (me != root && buf != input(dtype, me, count))
            failures.add(me, label("reduce", dtype, op, count) + ": a non-root buffer changed");
        }

        // Block b of rank r is its input at offset b * count: rank r gets the reduction of block r.
        const auto all = input(dtype, me, count * static_cast<std::size_t>(n));
        std::vector<char> out(count * dtype_size(dtype));
        group.reduce_scatter(all.data(), out.data(), count, dtype, op);
        if (out != expected(dtype, op, n, count, count * static_cast<std::size_t>(me)))
          failures.add(me, label("reduce_scatter", dtype, op, count));
      }
    }
  }
}

void rooted(ProcessGroup& group, test::Failures& failures) {
  const int me = group.rank();
  const auto n = static_cast<std::size_t>(group.size());
  for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{600'000}}) {
    for (int root = 0; root < group.size(); ++root) {
      const auto mine = input(DType::int32, me, count);
      std::vector<char> all(count * n * 4);
      group.gather(mine.data(), count, DType::int32, all.data(), root);
      if (me == root)
        for (std::size_t r = 0; r < n; ++r)
          if (std::memcmp(all.data() + r * count * 4, input(DType::int32, static_cast<int>(r), count).data(), count * 4) != 0)
            failures.add(me, "gather count " + std::to_string(count) + " root " + std::to_string(root) +
                                 ": wrong block from rank " + std::to_string(r));

      // root scatters block r = rank r's input.
      std::vector<char> blocks;
      if (me == root)
        for (std::size_t r = 0; r < n; ++r) {
          const auto b = input(DType::int32, static_cast<int>(r), count);
          blocks.insert(blocks.end(), b.begin(), b.end());
        }
      std::vector<char> got(count * 4);
      group.scatter(blocks.data(), blocks.size() / 4, got.data(), count, DType::int32, root);
      if (got != mine) failures.add(me, "scatter count " + std::to_string(count) + " root " + std::to_string(root));
    }
  }
}

}  // namespace

TEST_CASE("reductions: every dtype x op x count, all_reduce, reduce to every root, reduce_scatter") {
  test::for_each_backend([](const test::Config& config) {
    for (int size : {2, 3, 4}) {
      CAPTURE(size);
      test::run_ranks(config, size, reductions, std::chrono::seconds(120));
    }
  });
}

TEST_CASE("gather and scatter from every root, past a shared-memory half") {
  test::for_each_backend([](const test::Config& config) {
    for (int size : {2, 3, 4}) {
      CAPTURE(size);
      test::run_ranks(config, size, rooted);
    }
  });
}

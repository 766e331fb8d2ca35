// The collective matrix: every op x dtype x element count (0, 1, odd, large) on the world and
// on every group shape a world of up to 4 ranks has (every non-empty subset of ranks: groups of
// one, non-contiguous groups, the whole world again), through the public API, on whichever
// backend it is given. Expected values are closed forms of the inputs, folded over the group's
// ranks with plain arithmetic, never computed by the library under test. Ranks outside a group
// check that they get their input back unchanged.
//
//   matrix [--backend gloo|mpi|nccl] [--quick]   run the matrix
//   matrix --die                                 rank 1 dies mid-run: the others must raise
//   matrix --mismatch                            ranks disagree (run with IDIST_DEBUG=1)
//   matrix --hang                                the last rank is late (run with IDIST_TIMEOUT=2)
//   matrix --sizes                               rank 1 all_reduces 5 floats, the others 4 (no
//                                                IDIST_DEBUG): every rank must raise
//   matrix --loop                                all_reduce until it raises (60 s at most): for a
//                                                link cut under the ranks' feet
//   matrix --leave                               the last rank calls finalize() while the others
//                                                wait in a monitored_barrier: they must raise at
//                                                once, naming it; its finalize() raises too
//
// Prints "matrix rank r/n (backend): N checks, M failed" and exits non-zero on any failure.
#include <idist/idist.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int checks = 0;
int failures = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok && ++failures <= 30) std::fprintf(stderr, "rank %d: FAILED %s\n", idist::get_rank(), what.c_str());
}

// Arithmetic on any element type goes through double (16-bit floats through float).
template <class T>
double num(T v) {
  if constexpr (std::is_same_v<T, idist::float16> || std::is_same_v<T, idist::bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}
template <class T>
T make(double v) {
  if constexpr (std::is_same_v<T, idist::float16> || std::is_same_v<T, idist::bfloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
constexpr bool kInteger = std::is_integral_v<T>;

// Inputs small enough that SUM and PRODUCT over 4 ranks are exact in every dtype (int8 and
// float16 included): 1..3, so at most 3^4 = 81.
template <class T>
T input(int rank, std::size_t i) {
  return make<T>(1 + static_cast<double>((static_cast<std::size_t>(rank) + i) % 3));
}
// For the bitwise ops: a few bits that differ between ranks.
template <class T>
T bits(int rank, std::size_t i) {
  return static_cast<T>((1 << ((static_cast<std::size_t>(rank) + i) % 6)) | static_cast<int>(i % 2));
}

template <class T>
T fold(const std::vector<int>& ranks, std::size_t i, idist::ReduceOp op) {
  using idist::ReduceOp;
  const bool bitwise = op == ReduceOp::AND || op == ReduceOp::OR || op == ReduceOp::XOR;
  auto value = [&](int r) { return bitwise ? bits<T>(r, i) : input<T>(r, i); };
  if constexpr (kInteger<T>) {
    if (bitwise) {
      T acc = value(ranks[0]);
      for (std::size_t k = 1; k < ranks.size(); ++k) {
        const T v = value(ranks[k]);
        acc = static_cast<T>(op == ReduceOp::AND ? (acc & v) : op == ReduceOp::OR ? (acc | v) : (acc ^ v));
      }
      return acc;
    }
  }
  double acc = num(value(ranks[0]));
  for (std::size_t k = 1; k < ranks.size(); ++k) {
    const double v = num(value(ranks[k]));
    switch (op) {
      case ReduceOp::SUM: acc += v; break;
      case ReduceOp::PRODUCT: acc *= v; break;
      case ReduceOp::MIN: acc = std::min(acc, v); break;
      case ReduceOp::MAX: acc = std::max(acc, v); break;
      default: break;
    }
  }
  return make<T>(acc);
}

template <class T>
bool same(T a, T b) {
  return num(a) == num(b);
}

std::string name_of(const std::vector<int>& ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "]";
}

struct Case {
  idist::Group group;
  std::vector<int> ranks;  // global ranks, in group order
  std::string label;
  bool member() const { return group.is_member(); }
};

template <class T>
std::vector<idist::ReduceOp> ops_for() {
  using idist::ReduceOp;
  if constexpr (kInteger<T>) {
    return {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX, ReduceOp::AND, ReduceOp::OR, ReduceOp::XOR};
  } else {
    return {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
  }
}

template <class T>
void reductions(const Case& c, const std::vector<std::size_t>& counts) {
  const int me = idist::get_rank();
  const std::string type(idist::to_string(idist::dtype_of<T>));
  for (auto op : ops_for<T>()) {
    const bool bitwise = op == idist::ReduceOp::AND || op == idist::ReduceOp::OR || op == idist::ReduceOp::XOR;
    auto mine = [&](std::size_t i) { return bitwise ? bits<T>(me, i) : input<T>(me, i); };
    const std::string what = type + " " + std::string(idist::to_string(op)) + " on " + c.label;
    for (std::size_t count : counts) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = mine(i);
      idist::all_reduce(buf, {.op = op, .group = c.group});
      bool ok = true;
      for (std::size_t i = 0; i < count && ok; ++i)
        ok = same(buf[i], c.member() ? fold<T>(c.ranks, i, op) : mine(i));
      expect(ok, "all_reduce " + what + " count " + std::to_string(count));

      // reduce to the group's last member; the others keep their input.
      const int dst = c.ranks.back();
      for (std::size_t i = 0; i < count; ++i) buf[i] = mine(i);
      idist::reduce(buf, {.dst = dst, .op = op, .group = c.group});
      ok = true;
      for (std::size_t i = 0; i < count && ok; ++i)
        ok = same(buf[i], c.member() && me == dst ? fold<T>(c.ranks, i, op) : mine(i));
      expect(ok, "reduce to " + std::to_string(dst) + " " + what + " count " + std::to_string(count));
    }
    // Scalars.
    const T got = idist::all_reduce(mine(3), {.op = op, .group = c.group});
    expect(same(got, c.member() ? fold<T>(c.ranks, 3, op) : mine(3)), "all_reduce scalar " + what);

    // reduce_scatter: block b of rank r's input holds mine(b * count + i).
    const auto n = static_cast<std::size_t>(c.member() ? c.ranks.size() : 1);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      std::vector<T> in(n * count);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = mine(i);
      const auto out = idist::reduce_scatter(in, {.op = op, .group = c.group});
      const auto block = static_cast<std::size_t>(c.member() ? c.group.rank() : 0);
      bool ok = out.size() == count;
      for (std::size_t i = 0; i < count && ok; ++i)
        ok = same(out[i], c.member() ? fold<T>(c.ranks, block * count + i, op) : mine(i));
      expect(ok, "reduce_scatter " + what + " count " + std::to_string(count));
    }
  }
}

// MIN and MAX with a NaN from one member (each in turn), in the even elements: those come back
// NaN on every member whichever rank held it, the odd ones as without it (torch.minimum's and
// torch.maximum's rule; a MAX over the ranks' losses catches a NaN anywhere).
template <class T>
void nans(const Case& c) {
  const int me = idist::get_rank();
  const std::string type(idist::to_string(idist::dtype_of<T>));
  const std::size_t count = 7;
  for (auto op : {idist::ReduceOp::MIN, idist::ReduceOp::MAX}) {
    for (const int holder : c.ranks) {
      auto mine = [&](std::size_t i) {
        return me == holder && i % 2 == 0 ? make<T>(std::numeric_limits<double>::quiet_NaN()) : input<T>(me, i);
      };
      auto unchanged = [&](std::size_t i, T own) {
        return std::isnan(num(mine(i))) ? std::isnan(num(own)) : same(own, mine(i));
      };
      auto reduced = [&](std::size_t i, T own) {
        return i % 2 == 0 ? std::isnan(num(own)) : same(own, fold<T>(c.ranks, i, op));
      };
      const std::string what = type + " " + std::string(idist::to_string(op)) + ", a NaN from rank " +
                               std::to_string(holder) + ", on " + c.label;
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = mine(i);
      idist::all_reduce(buf, {.op = op, .group = c.group});
      bool ok = true;
      for (std::size_t i = 0; i < count && ok; ++i) ok = c.member() ? reduced(i, buf[i]) : unchanged(i, buf[i]);
      expect(ok, "all_reduce " + what);
      const int dst = c.ranks.front();
      for (std::size_t i = 0; i < count; ++i) buf[i] = mine(i);
      idist::reduce(buf, {.dst = dst, .op = op, .group = c.group});
      ok = true;
      for (std::size_t i = 0; i < count && ok; ++i)
        ok = c.member() && me == dst ? reduced(i, buf[i]) : unchanged(i, buf[i]);
      expect(ok, "reduce " + what);
    }
  }
}

// Rank r's data for the data-movement ops: 100 * r + i, exact in every dtype for small i.
template <class T>
T tagged(int rank, std::size_t i) {
  return make<T>(static_cast<double>(10 * rank + static_cast<int>(i % 10)));
}

template <class T>
void movement(const Case& c) {
  const int me = idist::get_rank();
  const std::string type(idist::to_string(idist::dtype_of<T>));
  const std::vector<int> solo = {me};
  const auto& ranks = c.member() ? c.ranks : solo;  // what a rank sees: a non-member is alone

  // all_gather, equal sizes (0, 1, 7) and unequal (rank r sends r % 3 elements: zero included).
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    std::vector<T> in(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = tagged<T>(me, i);
    const auto out = idist::all_gather(in, {.group = c.group});
    bool ok = out.size() == count * ranks.size();
    for (std::size_t k = 0; k < ranks.size() && ok; ++k)
      for (std::size_t i = 0; i < count && ok; ++i) ok = same(out[k * count + i], tagged<T>(ranks[k], i));
    expect(ok, "all_gather " + type + " count " + std::to_string(count) + " on " + c.label);

    std::vector<T> async_out(count * ranks.size());
    auto work = idist::iall_gather(std::span<const T>(in), std::span<T>(async_out), {.group = c.group});
    work.wait();
    expect(async_out == out, "iall_gather " + type + " count " + std::to_string(count) + " on " + c.label);

    // gather to the first member, scatter from the last.
    const int dst = c.ranks.front();
    const auto gathered = idist::gather(in, {.dst = dst, .group = c.group});
    if (c.member() && me != dst) {
      expect(gathered.empty(), "gather leaves non-dst empty on " + c.label);
    } else {
      expect(gathered == out, "gather " + type + " count " + std::to_string(count) + " on " + c.label);
    }
    const int src = c.ranks.back();
    std::vector<T> blocks(me == src ? count * c.ranks.size() : 0);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = tagged<T>(static_cast<int>(i / std::max<std::size_t>(count, 1)), i % std::max<std::size_t>(count, 1));
    std::vector<T> got(count, make<T>(-1));
    idist::scatter(blocks, got, {.src = src, .group = c.group});
    bool sok = true;
    for (std::size_t i = 0; i < count && sok; ++i)
      sok = same(got[i], c.member() ? tagged<T>(c.group.rank(), i) : make<T>(-1));
    expect(sok, "scatter " + type + " count " + std::to_string(count) + " on " + c.label);
  }
  std::vector<T> uneven(static_cast<std::size_t>(me % 3));
  for (std::size_t i = 0; i < uneven.size(); ++i) uneven[i] = tagged<T>(me, i);
  const auto joined = idist::all_gather(uneven, {.group = c.group});
  std::vector<T> want;
  for (int r : ranks)
    for (std::size_t i = 0; i < static_cast<std::size_t>(r % 3); ++i) want.push_back(tagged<T>(r, i));
  expect(joined == want, "all_gather unequal " + type + " on " + c.label);

  // broadcast from every member; odd and empty lengths.
  for (int src : c.ranks) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{9}}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i) buf[i] = tagged<T>(me, i);
      idist::broadcast(buf, {.src = src, .group = c.group});
      bool ok = true;
      for (std::size_t i = 0; i < count && ok; ++i) ok = same(buf[i], tagged<T>(c.member() ? src : me, i));
      expect(ok, "broadcast " + type + " from " + std::to_string(src) + " count " + std::to_string(count) + " on " + c.label);
    }
  }
}

void everything_else(const Case& c) {
  const int me = idist::get_rank();
  const std::vector<int> solo = {me};
  const auto& ranks = c.member() ? c.ranks : solo;
  const int src = c.ranks.back();

  // Strings and raw bytes, of every length.
  const auto names = idist::all_gather("r" + std::string(static_cast<std::size_t>(me), '*'), {.group = c.group});
  bool ok = names.size() == ranks.size();
  for (std::size_t k = 0; k < ranks.size() && ok; ++k) ok = names[k] == "r" + std::string(static_cast<std::size_t>(ranks[k]), '*');
  expect(ok, "all_gather strings on " + c.label);
  std::vector<std::byte> raw(static_cast<std::size_t>(me), std::byte{static_cast<unsigned char>(me)});
  const auto bytes = idist::all_gather(std::span<const std::byte>(raw), {.group = c.group});
  std::vector<std::byte> want_bytes;
  for (int r : ranks) want_bytes.insert(want_bytes.end(), static_cast<std::size_t>(r), std::byte{static_cast<unsigned char>(r)});
  expect(bytes == want_bytes, "all_gather raw bytes on " + c.label);
  const auto msg = idist::broadcast("hello from " + std::to_string(me) + std::string(static_cast<std::size_t>(me), '!'),
                                    {.src = src, .group = c.group});
  const int from = c.member() ? src : me;
  expect(msg == "hello from " + std::to_string(from) + std::string(static_cast<std::size_t>(from), '!'),
         "broadcast string on " + c.label);

  // safe_mode: ranks other than src know neither the length nor (Tensor) the type.
  std::optional<std::vector<float>> value;
  if (me == src || !c.member()) value = std::vector<float>(static_cast<std::size_t>(me) + 2, 0.5f * static_cast<float>(me));
  const auto got = idist::broadcast(value, {.src = src, .safe_mode = true, .group = c.group});
  expect(got == std::vector<float>(static_cast<std::size_t>(from) + 2, 0.5f * static_cast<float>(from)),
         "safe_mode broadcast of a vector on " + c.label);
  std::optional<idist::Tensor> tensor;
  if (me == src || !c.member()) tensor = idist::Tensor::of(std::vector<std::int64_t>{me, -me, 7});
  const auto t = idist::broadcast(tensor, {.src = src, .safe_mode = true, .group = c.group});
  expect(t.dtype == idist::DType::int64 && t.as<std::int64_t>() == std::vector<std::int64_t>{from, -from, 7},
         "safe_mode broadcast of a Tensor on " + c.label);
  std::vector<double> exact(3, static_cast<double>(me));
  idist::broadcast(exact, {.src = src, .safe_mode = true, .group = c.group});
  expect(exact == std::vector<double>(3, static_cast<double>(from)), "safe_mode broadcast in place on " + c.label);

  // Async collectives, several in flight, completed in any order.
  std::vector<std::int32_t> a(5, me + 1), b(3, me + 1);
  auto wa = idist::iall_reduce(a, {.op = idist::ReduceOp::SUM, .group = c.group});
  auto wb = idist::iall_reduce(b, {.op = idist::ReduceOp::MAX, .group = c.group});
  auto wbar = idist::ibarrier({.group = c.group});
  wb.wait();
  wa.wait(std::chrono::seconds(60));
  wbar.wait();
  std::int32_t sum = 0, max = 0;
  for (int r : ranks) sum += r + 1, max = std::max(max, r + 1);
  expect(a == std::vector<std::int32_t>(5, sum) && b == std::vector<std::int32_t>(3, max) && wa.is_completed(),
         "iall_reduce x2 + ibarrier on " + c.label);
  idist::barrier({.group = c.group});
}

// Between each pair (r -> r+1), three messages on tag 1 and three on tag 0, interleaved; the
// receiver takes tag 0 first: each tag's messages still arrive in the order they were sent.
void point_to_point() {
  const int me = idist::get_rank();
  const int n = idist::get_world_size();
  if (n == 1) return;
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  std::vector<idist::Work> sends;
  std::vector<std::vector<std::int64_t>> out;
  for (int k = 0; k < 3; ++k)
    for (int tag : {1, 0}) out.push_back({me, tag, k});
  for (std::size_t m = 0; m < out.size(); ++m) sends.push_back(idist::isend(out[m], next, static_cast<int>(out[m][1])));
  bool ok = true;
  for (int tag : {0, 1}) {
    for (int k = 0; k < 3; ++k) {
      std::vector<std::int64_t> in(3);
      idist::recv(in, prev, tag);
      ok = ok && in == std::vector<std::int64_t>{prev, tag, k};
    }
  }
  for (auto& w : sends) w.wait();
  expect(ok, "p2p: per-tag ordering between " + std::to_string(prev) + " and " + std::to_string(me));
}

std::vector<Case> cases(bool quick) {
  const int n = idist::get_world_size();
  std::vector<Case> out;
  std::vector<int> all(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
  out.push_back({idist::Group{}, all, "the world"});
  // Every non-empty subset, in one order on every rank (new_group is a collective).
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> ranks;
    for (int r = 0; r < n; ++r)
      if (mask & (1u << r)) ranks.push_back(r);
    if (quick && ranks.size() != 1 && ranks.size() != static_cast<std::size_t>(n) && mask != 5u) continue;
    // Reversed order for groups of 2+: group ranks need not follow global ranks.
    if (ranks.size() > 1 && mask % 2 == 1) std::reverse(ranks.begin(), ranks.end());
    out.push_back({idist::new_group(ranks), ranks, "group " + name_of(ranks)});
  }
  return out;
}

int run_matrix(bool quick) {
  point_to_point();
  for (const auto& c : cases(quick)) {
    const bool full = c.group.is_world() || !quick;
    const std::vector<std::size_t> counts =
        full ? std::vector<std::size_t>{0, 1, 7, 1001} : std::vector<std::size_t>{0, 7};
    reductions<std::int8_t>(c, counts);
    reductions<std::uint8_t>(c, counts);
    reductions<std::int32_t>(c, counts);
    reductions<std::int64_t>(c, counts);
    reductions<idist::float16>(c, counts);
    reductions<idist::bfloat16>(c, counts);
    reductions<float>(c, counts);
    reductions<double>(c, counts);
    if (full) {
      nans<float>(c);
      nans<double>(c);
      nans<idist::float16>(c);
      nans<idist::bfloat16>(c);
    }
    movement<std::uint8_t>(c);
    movement<idist::float16>(c);
    movement<double>(c);
    everything_else(c);
  }
  return 0;
}

// Rank 1 dies in the middle of the run; the others' next collective must raise (not hang).
int run_die() {
  std::vector<float> v(1000, 1.0f);
  idist::all_reduce(v);
  if (idist::get_rank() == 1) ::_exit(9);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100; ++i) idist::all_reduce(v);
    std::printf("rank %d: no error after the peer died\n", idist::get_rank());
    return 1;
  } catch (const idist::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::printf("rank %d raised after %lld ms: %s\n", idist::get_rank(), static_cast<long long>(ms.count()), e.what());
    return 3;
  }
}

// all_reduce over and over until it raises; "looping" once the first went through, so that a
// script knows when to cut the link.
int run_loop() {
  std::vector<float> v(1000, 1.0f);
  idist::all_reduce(v);
  std::printf("rank %d: looping\n", idist::get_rank());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  try {
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) idist::all_reduce(v);
    std::printf("rank %d: no error in 60 s\n", idist::get_rank());
    return 1;
  } catch (const idist::Error& e) {
    std::printf("rank %d raised: %s\n", idist::get_rank(), e.what());
    return 3;
  }
}

// The last rank is late (run with IDIST_TIMEOUT=2): first for a monitored_barrier with a 1 s
// timeout, then for an all_reduce. The others must raise TimeoutError naming it.
int run_hang() {
  const int me = idist::get_rank();
  const int late = idist::get_world_size() - 1;
  int named = 0;
  if (me == late) std::this_thread::sleep_for(std::chrono::seconds(3));
  try {
    idist::monitored_barrier({.timeout = std::chrono::seconds(1)});
  } catch (const idist::TimeoutError& e) {
    std::printf("rank %d: %s\n", me, e.what());
    named += std::string(e.what()).find("rank " + std::to_string(late) + " did not arrive within 1s") != std::string::npos;
  }
  if (me == late) std::this_thread::sleep_for(std::chrono::seconds(6));
  try {
    std::vector<float> v(10, 1.0f);
    idist::all_reduce(v);
  } catch (const idist::TimeoutError& e) {
    std::printf("rank %d: %s\n", me, e.what());
    named += std::string(e.what()).find("rank " + std::to_string(late) + " did not arrive at it") != std::string::npos;
  } catch (const idist::Error& e) {
    std::printf("rank %d: %s\n", me, e.what());
  }
  std::printf("rank %d: named the late rank %d time(s)\n", me, named);
  return me == late || named == 2 ? 0 : 1;
}

// Under IDIST_DEBUG=1 every rank must raise, naming rank 1, which calls something else.
int run_mismatch() {
  const int me = idist::get_rank();
  int raised = 0;
  try {
    std::vector<float> v(me == 1 ? 5 : 4, 1.0f);
    idist::all_reduce(v);
  } catch (const idist::Error& e) {
    ++raised;
    std::printf("rank %d: %s\n", me, e.what());
  }
  try {
    std::vector<std::int32_t> v(4, 1);
    if (me == 1) {
      idist::broadcast(v, 0);
    } else {
      idist::all_reduce(v, idist::ReduceOp::MAX);
    }
  } catch (const idist::Error& e) {
    ++raised;
    std::printf("rank %d: %s\n", me, e.what());
  }
  // After the mismatch is caught the group is still usable.
  const auto total = idist::all_reduce(1);
  std::printf("rank %d: raised %d of 2; group still usable: %s\n", me, raised, total == idist::get_world_size() ? "yes" : "no");
  return raised == 2 && total == idist::get_world_size() ? 0 : 1;
}

// Without IDIST_DEBUG's check: rank 1 passes 5 floats where the others pass 4. A backend that
// can tell (a header, a length) raises; exit 3 for raised, 1 for a wrong answer taken.
int run_sizes() {
  const int me = idist::get_rank();
  try {
    std::vector<float> v(me == 1 ? 5 : 4, 1.0f);
    idist::all_reduce(v);
    std::printf("rank %d: no error for different sizes\n", me);
    return 1;
  } catch (const idist::Error& e) {
    std::printf("rank %d raised: %s\n", me, e.what());
    return 3;
  }
}

// The last rank leaves after one all_reduce; the others wait for it in a monitored_barrier of
// 30 s. Exit 0 where the barrier raised within 5 s naming what the leaver did; the leaver's
// finalize() (in main) must raise, as it left them waiting.
int run_leave() {
  const int me = idist::get_rank();
  const int leaver = idist::get_world_size() - 1;
  if (idist::all_reduce(1) != idist::get_world_size()) return 1;
  if (me == leaver) return 0;
  const auto start = std::chrono::steady_clock::now();
  try {
    idist::monitored_barrier({.timeout = std::chrono::seconds(30)});
    std::printf("rank %d: monitored_barrier returned\n", me);
    return 1;
  } catch (const idist::TimeoutError& e) {
    const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d raised after %.2f s: %s\n", me, waited, e.what());
    const bool named = std::string(e.what()).find("rank " + std::to_string(leaver) + " called finalize() after 1 collective") !=
                       std::string::npos;
    return named && waited < 5 ? 0 : 1;
  }
}

}  // namespace

int main(int argc, char** argv) try {
  std::string backend = "gloo";
  std::string mode = "matrix";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--die" || arg == "--mismatch" || arg == "--hang" || arg == "--loop" || arg == "--sizes" ||
               arg == "--leave") {
      mode = arg.substr(2);
    } else {
      std::fprintf(stderr, "matrix: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  idist::init({.backend = backend});
  {
    // What carries the backend (shared memory, hierarchical), for the scripts to check.
    std::ostringstream config;
    idist::show_config(config);
    std::istringstream lines(config.str());
    for (std::string line; std::getline(lines, line);)
      if (line.find("backend:") != std::string::npos) std::printf("matrix rank %d:%s\n", idist::get_rank(), line.c_str());
  }
  int rc = 0;
  if (mode == "die") {
    rc = run_die();
  } else if (mode == "loop") {
    rc = run_loop();
  } else if (mode == "hang") {
    rc = run_hang();
  } else if (mode == "mismatch") {
    rc = run_mismatch();
  } else if (mode == "sizes") {
    rc = run_sizes();
  } else if (mode == "leave") {
    rc = run_leave();
  } else {
    rc = run_matrix(quick);
    std::printf("matrix rank %d/%d (%s): %d checks, %d failed\n", idist::get_rank(), idist::get_world_size(),
                idist::backend().c_str(), checks, failures);
    rc = failures == 0 ? 0 : 1;
  }
  std::fflush(stdout);
  if (mode == "die" || mode == "hang" || mode == "loop" || mode == "sizes") ::_exit(rc);  // the world is broken: finalize would only wait for the dead
  idist::finalize();
  return rc;
} catch (const std::exception& e) {
  // Not idist::get_rank(): after finalize() it answers for a world of one.
  std::fprintf(stderr, "matrix: %s\n", e.what());
  return 1;
}

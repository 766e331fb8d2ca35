#pragma once
// The measuring harness of idist-bench and of the raw references in bench/ (raw_gloo, raw_mpi).
// All three run this same code and differ only in the communicator they plug in, so that a
// ratio between them is idist's overhead and nothing else: same sweep, same buffers, same
// timing, same checks.
//
// What it measures, per collective x dtype x op x size:
//   - nccl-tests' columns: size, count, type, redop, root, time, algbw, busbw, #wrong. Sizes of
//     all_gather and reduce_scatter are the whole buffer (group size x one rank's block), as in
//     nccl-tests; busbw is algbw times nccl-tests' factor (2(n-1)/n all_reduce, (n-1)/n
//     all_gather and reduce_scatter, 1 broadcast, reduce and send_recv).
//   - Latency as OSU reports it: each rank's mean time per call, then the average, minimum and
//     maximum of those means across ranks (gathered after the timed loop). algbw and busbw come
//     from the average. The JSON also has each rank's median call (averaged over ranks), which
//     the odd call held up by the scheduler does not move.
//   - #wrong: elements of the last timed call's result that differ from a closed form, summed
//     over ranks. Inputs are rank-dependent small integers, exact in every dtype, so expected
//     values are computed, never copied from a run.
//
// How one size is timed: every iteration first restores the in-place inputs and poisons the
// outputs (outside the clock), then times the call alone. So every call, warm-up included, sees
// the same fresh inputs (in-place SUMs would otherwise grow without bound), a call that wrote
// nothing cannot pass the check on a previous call's result, and the check validates exactly
// the data the last timed call produced. Ranks meet in a barrier before the timed loop.
// send_recv is a ping-pong between pairs of ranks (0 and 1, 2 and 3, ...; with an odd world
// the last rank sits out); its time is half the round trip, OSU's latency.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <idist/types.hpp>
#include <nlohmann/json.hpp>

namespace CLI {
class App;
}

namespace idist::bench {

enum class Collective : std::uint8_t { all_reduce, all_gather, broadcast, reduce_scatter, reduce, barrier, send_recv };
inline constexpr std::array<Collective, 7> kCollectives = {Collective::all_reduce, Collective::all_gather,
                                                           Collective::broadcast,  Collective::reduce_scatter,
                                                           Collective::reduce,     Collective::barrier,
                                                           Collective::send_recv};
inline constexpr std::array<DType, 8> kDTypes = {DType::int8,     DType::uint8,    DType::int32,   DType::int64,
                                                 DType::float16,  DType::bfloat16, DType::float32, DType::float64};
inline constexpr std::array<ReduceOp, 7> kOps = {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX,
                                                 ReduceOp::AND, ReduceOp::OR,      ReduceOp::XOR};

std::string_view name_of(Collective c);
std::string_view name_of(ReduceOp op);  // nccl-tests' lowercase names: sum, prod, min, max; and, or, xor
bool is_reduction(Collective c);
// nccl-tests' bus bandwidth factor over n ranks (0 for barrier, which moves no data).
double bus_factor(Collective c, int n);

struct Options {
  std::vector<Collective> collectives{kCollectives.begin(), kCollectives.end()};
  std::uint64_t min_bytes = 8;
  std::uint64_t max_bytes = std::uint64_t{32} << 20;
  std::uint64_t step_factor = 2;
  std::vector<DType> dtypes{DType::float32};
  std::vector<ReduceOp> ops{ReduceOp::SUM};
  int root = 0;
  int warmup = 5;
  int iters = 0;  // 0: as many as fit in seconds_per_size (at least kMinIters)
  double seconds_per_size = 0.2;
  bool seconds_given = false;  // -t on the command line: it, not kMaxIters, bounds the loop
  bool check = true;
  bool json = false;
};

inline constexpr int kMinIters = 5;
inline constexpr int kMaxIters = 20000;
// With -t given, the loop fills it (a small size's 20,000 calls take milliseconds, too short a
// sample beside another job), in batches of at most this many calls. Whatever the count (-n
// too), the first this many calls are kept for the median (8 bytes each); the mean counts all.
inline constexpr int kMaxTimedIters = 5000000;

// What a run's results are labelled with.
struct Subject {
  std::string program;         // "idist-bench", "raw_gloo", "raw_mpi"
  std::string implementation;  // "idist", or "raw" for the references
  std::string backend;         // "gloo", "mpi", "nccl"
  std::string memory = "host"; // where the benchmarked buffers live: "host" or "device"
};

// The options every benchmark program shares, added to the program's CLI11 app (which may
// have options of its own).
class CommandLine {
 public:
  CommandLine(CLI::App& app, Options& options);
  // Returns nullopt to go on, or the exit code to leave with: 0 after --help, 2 after a usage
  // error, which it prints as one line ("PROGRAM: error: ...") on stderr. Needs no world, so
  // every rank refuses alike before init: a size of 0, a negative root, a size that is not
  // whole elements of a dtype, a sweep whose buffers do not fit in this host's memory.
  std::optional<int> parse(int argc, char** argv);

 private:
  // What is wrong with the options as parsed, in one line; empty when nothing is.
  std::string problem() const;
  std::string size_problem() const;
  std::string memory_problem() const;
  // The option as the user wrote it ("-b" or "--min-bytes") and the value as typed, for messages.
  std::string typed(std::string_view short_name, std::string_view long_name, const std::string& value) const;

  CLI::App& app_;
  Options& options_;
  // The lists as typed, until parse() turns them into options_.
  std::vector<std::string> collectives_{"all"};
  std::vector<std::string> dtypes_{"float32"};
  std::vector<std::string> ops_{"sum"};
  int check_ = 1;
  // The sizes as typed ("1T"), before CLI11 turns them into bytes.
  std::string min_text_ = "8";
  std::string max_text_ = "32M";
  std::vector<std::string_view> args_;
};

// Buffers of the largest size a rank holds on the host at once: the inputs computed on the
// host, their pristine copy and the buffer the call works in (Runner::measure).
inline constexpr int kHostBuffersPerRank = 3;
// Bytes of memory this process may still take: MemAvailable, or less under a cgroup limit.
std::uint64_t available_memory();
// Ranks on this host by the launcher's variables (LOCAL_WORLD_SIZE, Open MPI's, MPICH's); 1
// when none is set.
int ranks_on_this_host();

// One line, exit 2: for checks that need the world (a root beyond the world size).
int usage_error(std::string_view program, std::string_view message);

// --- where the benchmarked buffers live --------------------------------------------------------

// Host memory by default; device memory for nccl (idist-bench --memory device). Only the
// untimed steps (allocation, restoring inputs, poisoning outputs, reading results) go
// through here.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* src, std::size_t bytes) = 0;
  virtual void fill(void* dst, unsigned char byte, std::size_t bytes) = 0;
  // Between two buffers of this memory; done when it returns.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // Host memory can be read in place, without a copy.
  virtual bool is_host() const { return false; }
};

class HostMemory final : public Memory {
 public:
  void* allocate(std::size_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* host, std::size_t bytes) override;
  void download(void* host, const void* src, std::size_t bytes) override;
  void fill(void* dst, unsigned char byte, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  bool is_host() const override { return true; }
};

// A buffer of `count` elements of T in `memory`.
template <class T>
class Buffer {
 public:
  Buffer(Memory& memory, std::size_t count)
      : memory_(memory), count_(count), data_(static_cast<T*>(memory.allocate(std::max<std::size_t>(count, 1) * sizeof(T)))) {}
  ~Buffer() { memory_.release(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() const { return data_; }
  std::size_t count() const { return count_; }
  void upload(const std::vector<T>& host) { memory_.upload(data_, host.data(), count_ * sizeof(T)); }
  // Restores an in-place input from a pristine copy in the same memory: for device memory a
  // copy on the GPU, not an upload from the host (0.1 s at 1 GiB, before every call).
  void restore(const Buffer& pristine) { memory_.copy(data_, pristine.data_, count_ * sizeof(T)); }
  // Bytes 0xff: NaN in every floating type, and a value no integer check below expects.
  void poison() { memory_.fill(data_, 0xff, count_ * sizeof(T)); }
  // The contents, readable on the host (a view for host memory, a copy otherwise).
  std::span<const T> read(std::vector<T>& scratch) const {
    if (memory_.is_host()) return {data_, count_};
    scratch.resize(count_);
    memory_.download(scratch.data(), data_, count_ * sizeof(T));
    return scratch;
  }

 private:
  Memory& memory_;
  std::size_t count_;
  T* data_;
};

// --- closed forms -------------------------------------------------------------------------------

// What rank r contributes at element i of a reduction: small integers, so that every sum,
// product, minimum and maximum over a few dozen ranks is exact in every dtype, float16 and
// bfloat16 included (sums stay below 256, products are powers of two).
std::uint64_t reduction_input(ReduceOp op, int rank, std::size_t i);
// What rank r sends at element i of a data movement (all_gather, broadcast, send_recv):
// different for every rank and position, exact in every dtype.
std::uint64_t payload(int rank, std::size_t i);

template <class T>
T as_element(std::uint64_t v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
inline constexpr bool kFloating = std::is_floating_point_v<T> || std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// op over every rank's reduction_input at element i, in T's own arithmetic: integers wrap (as
// the libraries' integer sums and products do), floats are exact (see reduction_input).
template <class T>
T fold(ReduceOp op, int ranks, std::size_t i) {
  if constexpr (kFloating<T>) {
    double acc = static_cast<double>(reduction_input(op, 0, i));
    for (int r = 1; r < ranks; ++r) {
      const auto v = static_cast<double>(reduction_input(op, r, i));
      switch (op) {
        case ReduceOp::SUM: acc += v; break;
        case ReduceOp::PRODUCT: acc *= v; break;
        case ReduceOp::MIN: acc = std::min(acc, v); break;
        case ReduceOp::MAX: acc = std::max(acc, v); break;
        default: break;  // bitwise ops never reach floating types
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(acc);
    } else {
      return T(static_cast<float>(acc));
    }
  } else {
    std::uint64_t acc = reduction_input(op, 0, i);
    for (int r = 1; r < ranks; ++r) {
      const auto v = reduction_input(op, r, i);
      switch (op) {
        case ReduceOp::SUM: acc += v; break;
        case ReduceOp::PRODUCT: acc *= v; break;
        case ReduceOp::MIN: acc = std::min(acc, v); break;  // inputs are small and non-negative
        case ReduceOp::MAX: acc = std::max(acc, v); break;
        case ReduceOp::AND: acc &= v; break;
        case ReduceOp::OR: acc |= v; break;
        case ReduceOp::XOR: acc ^= v; break;
        case ReduceOp::AVG: break;  // floating only, never an integer dtype here
      }
    }
    return static_cast<T>(acc);  // modulo 2^bits, as C++20 defines it
  }
}

template <class T>
bool same(T a, T b) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return a.bits == b.bits;
  } else {
    return a == b;
  }
}

// Elements of `got` that differ from expected(i).
template <class T, class Expected>
std::uint64_t count_wrong(std::span<const T> got, Expected&& expected) {
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += same(got[i], expected(i)) ? 0 : 1;
  return wrong;
}

// --- results ------------------------------------------------------------------------------------

struct Row {
  Collective collective = Collective::all_reduce;
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
  std::optional<DType> dtype;   // none for barrier
  std::optional<ReduceOp> op;   // reductions only
  int root = -1;
  int iters = 0;
  double avg_us = 0, min_us = 0, max_us = 0;
  double median_us = 0;  // each rank's median call, averaged over ranks (JSON only)
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes per second), from avg_us
  std::uint64_t wrong = 0;
  bool checked = false;
};

// Prints (rank 0 only) a table as rows come, or one JSON document at the end.
class Report {
 public:
  Report(Subject subject, const Options& options, int rank, int world_size);
  void start();
  void row(const Row& row);
  void skipped(const std::string& why);
  // The closing lines (or the JSON document); returns the exit code: 1 when any element was wrong.
  int finish();

 private:
  bool printing() const { return rank_ == 0; }
  Subject subject_;
  Options options_;
  int rank_;
  int world_size_;
  nlohmann::json results_ = nlohmann::json::array();
  nlohmann::json skipped_ = nlohmann::json::array();
  std::uint64_t wrong_ = 0;
  double busbw_sum_ = 0;
  int busbw_rows_ = 0;
};

// --- the sweep ----------------------------------------------------------------------------------

// Calls f.template operator()<T>() with the C++ type of `dtype`.
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::int8: return f.template operator()<std::int8_t>();
    case DType::uint8: return f.template operator()<std::uint8_t>();
    case DType::int32: return f.template operator()<std::int32_t>();
    case DType::int64: return f.template operator()<std::int64_t>();
    case DType::float16: return f.template operator()<float16>();
    case DType::bfloat16: return f.template operator()<bfloat16>();
    case DType::float32: return f.template operator()<float>();
    case DType::float64: return f.template operator()<double>();
  }
}

// The sizes of the sweep: min, min*f, min*f^2, ... up to max.
std::vector<std::uint64_t> sweep_sizes(const Options& options);

// A communicator provides, with T any of the element types:
//   int rank() const; int size() const;
//   std::optional<std::string> unsupported(Collective, DType, std::optional<ReduceOp>) const;
//   template <class T> void all_reduce(T* data, std::size_t count, ReduceOp op);
//   template <class T> void reduce(T* data, std::size_t count, ReduceOp op, int root);
//   template <class T> void reduce_scatter(const T* in, T* out, std::size_t block, ReduceOp op);
//   template <class T> void all_gather(const T* in, T* out, std::size_t block);
//   template <class T> void broadcast(T* data, std::size_t count, int root);
//   void barrier();
//   template <class T> void send(const T* data, std::size_t count, int peer);
//   template <class T> void recv(T* data, std::size_t count, int peer);
//   std::vector<double> all_gather_doubles(std::span<const double> mine);  // untimed bookkeeping
// The collectives block until this rank's part is done, as the blocking calls of every
// library here do.
template <class Comm>
class Runner {
 public:
  Runner(Comm& comm, Memory& memory, const Options& options, Report& report)
      : comm_(comm), memory_(memory), options_(options), report_(report) {}

  void run() {
    for (const auto c : options_.collectives) {
      if (c == Collective::barrier) {
        report_.row(measure_barrier());
        continue;
      }
      for (const auto dtype : options_.dtypes) {
        if (!is_reduction(c)) {
          sweep(c, dtype, std::nullopt);
          continue;
        }
        for (const auto op : options_.ops) {
          if (is_bitwise(op) && !is_integer(dtype)) {
            report_.skipped(std::string(name_of(c)) + " " + std::string(name_of(op)) + " on " +
                            std::string(to_string(dtype)) + ": bitwise ops take integer types only");
            continue;
          }
          sweep(c, dtype, op);
        }
      }
    }
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Timing {
    double mean_us = 0;
    double median_us = 0;  // robust to the odd call that waited for the scheduler
    int iters = 0;
  };

  void sweep(Collective c, DType dtype, std::optional<ReduceOp> op) {
    const std::string what = std::string(name_of(c)) + (op ? " " + std::string(name_of(*op)) : std::string()) +
                             " on " + std::string(to_string(dtype));
    if (auto why = comm_.unsupported(c, dtype, op)) return report_.skipped(what + ": " + *why);
    if (c == Collective::send_recv && comm_.size() < 2) return report_.skipped(what + ": needs two ranks");
    for (const auto bytes : sweep_sizes(options_)) {
      with_type(dtype, [&]<class T>() {
        auto count = bytes / sizeof(T);
        // all_gather and reduce_scatter: the whole buffer, a multiple of the world size.
        if (c == Collective::all_gather || c == Collective::reduce_scatter)
          count -= count % static_cast<std::size_t>(comm_.size());
        if (count == 0) return;
        report_.row(measure<T>(c, count, op));
      });
    }
  }

  // Warm-up, then the timed loop; every call is preceded by prepare() and timed alone.
  template <class Prepare, class Call>
  Timing time_calls(Prepare&& prepare, Call&& call) {
    const int warmup = std::max(options_.warmup, options_.iters == 0 ? 1 : 0);
    // Each iteration's whole time, its untimed preparation included, so that --time-per-size
    // bounds the wall time (a GPU's 10 us call at 1 GiB follows a 0.5 ms restore).
    const auto warm_start = Clock::now();
    for (int i = 0; i < warmup; ++i) {
      prepare();
      call();
    }
    const double warm_us = std::chrono::duration<double, std::micro>(Clock::now() - warm_start).count();
    int iters = options_.iters;
    if (iters == 0) {
      // Every rank sizes the loop from the slowest rank's warm-up, so all run the same count.
      const double slowest = options_.seconds_given ? probe_us(prepare, call) : slowest_us(warm_us / warmup);
      const double most = options_.seconds_given ? kMaxTimedIters : kMaxIters;
      iters = static_cast<int>(std::clamp(options_.seconds_per_size * 1e6 / slowest, double{kMinIters}, most));
    }
    // Each call's time, the first kMaxTimedIters of them kept for the median.
    std::vector<double> calls;
    calls.reserve(static_cast<std::size_t>(std::min(iters, kMaxTimedIters)));
    double total_us = 0;
    std::int64_t made = 0;
    comm_.barrier();
    // With -t, batches until the time is spent: a probe taken while the machine was busy (a
    // neighbour's burst) overestimates a call, and one batch would then end far short of -t.
    // Each batch is sized from the one before, alike on every rank (their slowest).
    for (double spent_us = 0;;) {
      const auto batch_start = Clock::now();
      for (int i = 0; i < iters; ++i) {
        prepare();
        const auto t0 = Clock::now();
        call();
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        total_us += us;
        if (calls.size() < static_cast<std::size_t>(kMaxTimedIters)) calls.push_back(us);
      }
      made += iters;
      if (!options_.seconds_given || options_.iters != 0) break;
      const double took = slowest_us(std::chrono::duration<double, std::micro>(Clock::now() - batch_start).count());
      spent_us += took;
      const double left = options_.seconds_per_size * 1e6 - spent_us;
      if (left <= 0) break;
      iters = static_cast<int>(std::clamp(left / (took / iters), 1.0, double{kMaxTimedIters}));
    }
    iters = static_cast<int>(std::min<std::int64_t>(made, std::numeric_limits<int>::max()));
    const auto middle = calls.begin() + static_cast<std::ptrdiff_t>(calls.size() / 2);
    std::nth_element(calls.begin(), middle, calls.end());
    return {total_us / static_cast<double>(made), *middle, iters};
  }

  double slowest_us(double mine) {
    const auto all = comm_.all_gather_doubles(std::span<const double>(&mine, 1));
    return std::max(*std::max_element(all.begin(), all.end()), 1e-3);
  }

  // With -t given, a call's time from runs of 1, 2, 4... calls (the same on every rank) until
  // one takes 10 ms or 4096 calls: the warm-up's first calls (connections, page faults) would
  // make a small size's estimate tens of times too long, and -t a tenth of what it says.
  template <class Prepare, class Call>
  double probe_us(Prepare& prepare, Call& call) {
    for (int n = 1;; n *= 2) {
      const auto start = Clock::now();
      for (int i = 0; i < n; ++i) {
        prepare();
        call();
      }
      const double slowest = slowest_us(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      if (slowest >= 10000 || n >= 4096) return slowest / n;
    }
  }

  // Every rank's (mean time, wrong elements, took part) into one row, alike on every rank.
  Row summarize(Row row, const Timing& t, std::uint64_t wrong, bool took_part) {
    constexpr std::size_t kFields = 4;
    const std::array<double, kFields> mine = {t.mean_us, t.median_us, static_cast<double>(wrong), took_part ? 1.0 : 0.0};
    const auto all = comm_.all_gather_doubles(mine);
    double sum = 0;
    double median_sum = 0;
    int counted = 0;
    row.min_us = 0;
    row.max_us = 0;
    for (std::size_t r = 0; r + kFields <= all.size(); r += kFields) {
      row.wrong += static_cast<std::uint64_t>(all[r + 2]);
      if (all[r + 3] == 0) continue;
      const double us = all[r];
      row.min_us = counted == 0 ? us : std::min(row.min_us, us);
      row.max_us = counted == 0 ? us : std::max(row.max_us, us);
      sum += us;
      median_sum += all[r + 1];
      ++counted;
    }
    row.avg_us = counted > 0 ? sum / counted : 0;
    row.median_us = counted > 0 ? median_sum / counted : 0;
    row.iters = t.iters;
    if (row.avg_us > 0) {
      row.algbw = static_cast<double>(row.bytes) / (row.avg_us * 1e3);  // bytes/us/1e3 = GB/s
      row.busbw = row.algbw * bus_factor(row.collective, comm_.size());
    }
    return row;
  }

  Row measure_barrier() {
    Row row;
    row.collective = Collective::barrier;
    const auto t = time_calls([] {}, [&] { comm_.barrier(); });
    return summarize(row, t, 0, true);
  }

  template <class T>
  Row measure(Collective c, std::size_t count, std::optional<ReduceOp> op) {
    const int rank = comm_.rank();
    const int n = comm_.size();
    const auto block = count / static_cast<std::size_t>(n);
    Row row;
    row.collective = c;
    row.bytes = count * sizeof(T);
    row.count = count;
    row.dtype = dtype_of<T>;
    row.op = op;
    row.checked = options_.check;
    std::vector<T> scratch;
    std::uint64_t wrong = 0;
    auto inputs = [&](std::size_t elements, auto&& value) {
      std::vector<T> host(elements);
      for (std::size_t i = 0; i < elements; ++i) host[i] = as_element<T>(value(i));
      return host;
    };
    auto reduction = [&](std::size_t i) { return reduction_input(*op, rank, i); };
    auto mine = [&](std::size_t i) { return payload(rank, i); };

    switch (c) {
      case Collective::all_reduce: {
        const auto host = inputs(count, reduction);
        Buffer<T> pristine(memory_, count);
        pristine.upload(host);
        Buffer<T> work(memory_, count);
        const auto t = time_calls([&] { work.restore(pristine); }, [&] { comm_.all_reduce(work.data(), count, *op); });
        if (options_.check)
          wrong = count_wrong<T>(work.read(scratch), [&](std::size_t i) { return fold<T>(*op, n, i); });
        return summarize(row, t, wrong, true);
      }
      case Collective::reduce: {
        row.root = options_.root;
        const auto host = inputs(count, reduction);
        Buffer<T> pristine(memory_, count);
        pristine.upload(host);
        Buffer<T> work(memory_, count);
        const auto t =
            time_calls([&] { work.restore(pristine); }, [&] { comm_.reduce(work.data(), count, *op, options_.root); });
        // The root holds the reduction; every other rank its own input, untouched.
        if (options_.check)
          wrong = count_wrong<T>(work.read(scratch), [&](std::size_t i) {
            return rank == options_.root ? fold<T>(*op, n, i) : host[i];
          });
        return summarize(row, t, wrong, true);
      }
      case Collective::reduce_scatter: {
        // Rank r's block b is elements b*block.. of its input; it ends with every rank's block r reduced.
        Buffer<T> in(memory_, count);
        in.upload(inputs(count, reduction));
        Buffer<T> out(memory_, block);
        const auto t = time_calls([&] { out.poison(); }, [&] { comm_.reduce_scatter(in.data(), out.data(), block, *op); });
        if (options_.check)
          wrong = count_wrong<T>(out.read(scratch), [&](std::size_t j) {
            return fold<T>(*op, n, static_cast<std::size_t>(rank) * block + j);
          });
        return summarize(row, t, wrong, true);
      }
      case Collective::all_gather: {
        Buffer<T> in(memory_, block);
        in.upload(inputs(block, mine));
        Buffer<T> out(memory_, count);
        const auto t = time_calls([&] { out.poison(); }, [&] { comm_.all_gather(in.data(), out.data(), block); });
        if (options_.check)
          wrong = count_wrong<T>(out.read(scratch), [&](std::size_t i) {
            return as_element<T>(payload(static_cast<int>(i / block), i % block));
          });
        return summarize(row, t, wrong, true);
      }
      case Collective::broadcast: {
        row.root = options_.root;
        Buffer<T> pristine(memory_, count);
        pristine.upload(inputs(count, mine));
        Buffer<T> work(memory_, count);
        const auto t =
            time_calls([&] { work.restore(pristine); }, [&] { comm_.broadcast(work.data(), count, options_.root); });
        if (options_.check)
          wrong = count_wrong<T>(work.read(scratch), [&](std::size_t i) { return as_element<T>(payload(options_.root, i)); });
        return summarize(row, t, wrong, true);
      }
      case Collective::send_recv: {
        // Pairs (0, 1), (2, 3), ...: the even rank sends first, the odd one answers.
        const int peer = rank % 2 == 0 ? rank + 1 : rank - 1;
        const bool takes_part = peer < n;
        Buffer<T> out(memory_, count);
        out.upload(inputs(count, mine));
        Buffer<T> in(memory_, count);
        auto t = time_calls([&] { in.poison(); },
                            [&] {
                              if (!takes_part) return;
                              if (rank % 2 == 0) {
                                comm_.send(out.data(), count, peer);
                                comm_.recv(in.data(), count, peer);
                              } else {
                                comm_.recv(in.data(), count, peer);
                                comm_.send(out.data(), count, peer);
                              }
                            });
        t.mean_us /= 2;  // one way
        t.median_us /= 2;
        if (options_.check && takes_part)
          wrong = count_wrong<T>(in.read(scratch), [&](std::size_t i) { return as_element<T>(payload(peer, i)); });
        return summarize(row, t, wrong, takes_part);
      }
      case Collective::barrier: break;
    }
    return row;
  }

  Comm& comm_;
  Memory& memory_;
  const Options& options_;
  Report& report_;
};

}  // namespace idist::bench

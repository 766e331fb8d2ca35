#include "harness.hpp"

#include "idist/common/host.hpp"

#include <CLI/CLI.hpp>
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <new>

namespace idist::bench {
namespace {

constexpr std::size_t kAlignment = 64;  // a cache line: what the libraries' vector kernels like

const std::map<std::string, Collective>& collective_names() {
  static const std::map<std::string, Collective> names = [] {
    std::map<std::string, Collective> m;
    for (const auto c : kCollectives) m.emplace(std::string(name_of(c)), c);
    m.emplace("sendrecv", Collective::send_recv);  // nccl-tests' spelling
    m.emplace("allreduce", Collective::all_reduce);
    m.emplace("allgather", Collective::all_gather);
    m.emplace("reducescatter", Collective::reduce_scatter);
    return m;
  }();
  return names;
}

// idist's names, plus nccl-tests' (float, double, half, bf16, int, char).
const std::map<std::string, DType>& dtype_names() {
  static const std::map<std::string, DType> names = [] {
    std::map<std::string, DType> m;
    for (const auto d : kDTypes) m.emplace(std::string(to_string(d)), d);
    m.emplace("float", DType::float32);
    m.emplace("double", DType::float64);
    m.emplace("half", DType::float16);
    m.emplace("bf16", DType::bfloat16);
    m.emplace("int", DType::int32);
    m.emplace("char", DType::int8);
    return m;
  }();
  return names;
}

const std::map<std::string, ReduceOp>& op_names() {
  static const std::map<std::string, ReduceOp> names = [] {
    std::map<std::string, ReduceOp> m;
    for (const auto o : kOps) m.emplace(std::string(name_of(o)), o);
    m.emplace("product", ReduceOp::PRODUCT);
    return m;
  }();
  return names;
}

template <class Map>
std::vector<std::string> keys_and_all(const Map& map) {
  std::vector<std::string> keys{"all"};
  for (const auto& [key, value] : map) keys.push_back(key);
  return keys;
}

// "all" or a list of names; in the order given, each once.
template <class T, std::size_t N, class Map>
std::vector<T> pick(const std::vector<std::string>& words, const std::array<T, N>& every, const Map& names) {
  std::vector<T> out;
  for (const auto& w : words) {
    if (w == "all") return {every.begin(), every.end()};
    const T v = names.at(w);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

// 8 -> "8 B", 65536 -> "64 KiB", 3 << 20 -> "3 MiB"; other values in bytes.
std::string human_bytes(std::uint64_t bytes) {
  constexpr std::array<const char*, 7> units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t u = 0;
  while (u + 1 < units.size() && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{} {}", bytes, units[u]);
}

std::string host_name() { return common::host_name("unknown"); }

std::string now_utc() {
  const auto t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[32] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Rounded, for amounts of memory that are not powers of two: "11.6 GiB".
std::string approx_bytes(long double bytes) {
  constexpr std::array<const char*, 7> units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t u = 0;
  while (u + 1 < units.size() && bytes >= 1024) {
    bytes /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", static_cast<double>(bytes), units[u]);
}

// The first number in a file (/sys/fs/cgroup/...), or nullopt ("max", absent).
std::optional<std::uint64_t> number_in(const std::string& path) {
  std::ifstream in(path);
  std::uint64_t value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

}  // namespace

std::string_view name_of(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::broadcast: return "broadcast";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::reduce: return "reduce";
    case Collective::barrier: return "barrier";
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}

std::string_view name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::PRODUCT: return "prod";
    case ReduceOp::MIN: return "min";
    case ReduceOp::MAX: return "max";
    case ReduceOp::AND: return "and";
    case ReduceOp::OR: return "or";
    case ReduceOp::XOR: return "xor";
    case ReduceOp::AVG: return "avg";  // not benchmarked: the raw references have no AVG
  }
  return "?";
}

bool is_reduction(Collective c) {
  return c == Collective::all_reduce || c == Collective::reduce_scatter || c == Collective::reduce;
}

double bus_factor(Collective c, int n) {
  const double ranks = n;
  switch (c) {
    case Collective::all_reduce: return 2 * (ranks - 1) / ranks;
    case Collective::all_gather:
    case Collective::reduce_scatter: return (ranks - 1) / ranks;
    case Collective::broadcast:
    case Collective::reduce:
    case Collective::send_recv: return 1;
    case Collective::barrier: return 0;
  }
  return 0;
}

std::uint64_t reduction_input(ReduceOp op, int rank, std::size_t i) {
  const auto r = static_cast<std::uint64_t>(rank);
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return (r + i) % 3;                 // sums up to 2 x ranks
    case ReduceOp::PRODUCT: return 1 + (r + i) % 2;         // products are powers of two
    case ReduceOp::MIN:
    case ReduceOp::MAX: return (5 * r + i) % 7;
    case ReduceOp::AND:
    case ReduceOp::OR:
    case ReduceOp::XOR: return ((i * 2654435761u) >> 7 ^ (r * 40503u)) & 0x7f;  // mixed bits, fit int8
  }
  return 0;
}

std::uint64_t payload(int rank, std::size_t i) { return (static_cast<std::uint64_t>(rank) * 37 + i) % 101; }

std::vector<std::uint64_t> sweep_sizes(const Options& o) {
  std::vector<std::uint64_t> sizes;
  for (auto bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
    sizes.push_back(bytes);
    if (bytes > o.max_bytes / o.step_factor) break;  // the next step would pass max (or overflow)
  }
  return sizes;
}

// --- options ------------------------------------------------------------------------------------

CommandLine::CommandLine(CLI::App& app, Options& o) : app_(app), options_(o) {
  const auto size = CLI::AsSizeValue(false);  // K, M, G are powers of 1024, as in nccl-tests
  app.add_option("collectives", collectives_,
                 "Collectives to run, any of: all_reduce all_gather broadcast reduce_scatter reduce barrier send_recv; "
                 "or all (the default)")
      ->check(CLI::IsMember(keys_and_all(collective_names())));
  // transform() puts each new transform first: the recorders see the text as typed.
  app.add_option("-b,--min-bytes", o.min_bytes, "Smallest size (8, 1K, 64M, ...), at least 1 byte")
      ->transform(size)->transform([this](std::string text) { return min_text_ = text; })->capture_default_str();
  app.add_option("-e,--max-bytes", o.max_bytes, "Largest size")
      ->transform(size)->transform([this](std::string text) { return max_text_ = text; })->capture_default_str();
  app.add_option("-f,--step-factor", o.step_factor, "Each size is the previous one times this")
      ->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1} << 20))->capture_default_str();
  app.add_option("-d,--datatype", dtypes_,
                 "Element types, comma-separated: int8 uint8 int32 int64 float16 bfloat16 float32 float64 (or float, "
                 "double, half, bf16, int, char); all")
      ->delimiter(',')->allow_extra_args(false)->check(CLI::IsMember(keys_and_all(dtype_names())))->capture_default_str();
  app.add_option("-o,--op", ops_, "Reduction ops, comma-separated: sum prod min max and or xor; all")
      ->delimiter(',')->allow_extra_args(false)->check(CLI::IsMember(keys_and_all(op_names())))->capture_default_str();
  app.add_option("-r,--root", o.root, "Root rank of broadcast and reduce")->capture_default_str();
  app.add_option("-w,--warmup-iters", o.warmup, "Untimed calls before each size's timed loop")
      ->check(CLI::Range(0, 1000000))->capture_default_str();
  app.add_option("-n,--iters", o.iters,
                 "Timed calls per size; 0 (the default): as many as fit in --time-per-size, at least 5")
      ->check(CLI::Range(0, 100000000))->capture_default_str();
  app.add_option("-t,--time-per-size", o.seconds_per_size,
                 "Seconds per size when -n is 0 (given, up to 5,000,000 calls; by default at most 20,000)")
      ->check(CLI::Range(1e-3, 3600.0))->capture_default_str();
  app.add_option("-c,--check", check_, "Check every element of the result (1) or not (0)")
      ->check(CLI::Range(0, 1))->capture_default_str();
  app.add_flag("--json", o.json, "Print one JSON document (rank 0) instead of the table");
}

std::optional<int> CommandLine::parse(int argc, char** argv) {
  args_.assign(argv, argv + argc);
  try {
    app_.parse(argc, argv);
    options_.collectives = pick(collectives_, kCollectives, collective_names());
    options_.dtypes = pick(dtypes_, kDTypes, dtype_names());
    options_.ops = pick(ops_, kOps, op_names());
    options_.check = check_ != 0;
    options_.seconds_given = app_.count("--time-per-size") > 0;
    if (const auto why = problem(); !why.empty()) return usage_error(app_.get_name(), why);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app_.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(app_.get_name(), e.what());
  }
}

std::string CommandLine::typed(std::string_view short_name, std::string_view long_name, const std::string& value) const {
  std::string_view name = short_name;  // the default's own spelling when the option was not given
  for (std::size_t i = 1; i < args_.size() && args_[i] != "--"; ++i) {
    const auto a = args_[i];
    if (a == long_name || (a.starts_with(long_name) && a.size() > long_name.size() && a[long_name.size()] == '='))
      name = long_name;
    else if (a.starts_with(short_name))
      name = short_name;
  }
  return fmt::format("{} {}", name, value);
}

std::string CommandLine::problem() const {
  const auto& o = options_;
  if (o.min_bytes == 0) return typed("-b", "--min-bytes", min_text_) + ": the size must be at least 1 byte";
  if (o.max_bytes == 0) return typed("-e", "--max-bytes", max_text_) + ": the size must be at least 1 byte";
  if (o.root < 0) return typed("-r", "--root", std::to_string(o.root)) + ": the root must be a rank, 0 or more";
  if (o.min_bytes > o.max_bytes)
    return fmt::format("--min-bytes ({}) is larger than --max-bytes ({})", o.min_bytes, o.max_bytes);
  // barrier alone moves no data: its sizes and types are not used.
  if (std::all_of(o.collectives.begin(), o.collectives.end(), [](Collective c) { return c == Collective::barrier; }))
    return {};
  if (auto why = size_problem(); !why.empty()) return why;
  return memory_problem();
}

// Every size of the sweep is min times a whole number, so min holding whole elements of each
// dtype is enough; otherwise sizes were silently cut down to whole elements, or skipped when
// less than one.
std::string CommandLine::size_problem() const {
  std::optional<DType> worst;
  for (const auto d : options_.dtypes)
    if (options_.min_bytes % dtype_size(d) != 0 && (!worst || dtype_size(d) > dtype_size(*worst))) worst = d;
  if (!worst) return {};
  return fmt::format("{} is not a multiple of {}'s {} bytes (every size must be whole elements)",
                     typed("-b", "--min-bytes", min_text_), to_string(*worst), dtype_size(*worst));
}

// A sweep whose largest size cannot fit is refused before the first call, rather than run
// until an allocation fails (std::bad_alloc) or the OOM killer picks a rank.
std::string CommandLine::memory_problem() const {
  const auto largest = sweep_sizes(options_).back();
  const int ranks = ranks_on_this_host();
  const auto per_rank = static_cast<long double>(largest) * kHostBuffersPerRank;
  const auto needed = per_rank * ranks;
  const auto available = available_memory();
  if (available == 0 || needed <= static_cast<long double>(available)) return {};
  return fmt::format("{}: the sweep's largest size, {}, needs {} per rank ({} buffers of it) x {} rank{} on this host, "
                     "more than the {} of memory available",
                     typed("-e", "--max-bytes", max_text_), human_bytes(largest), approx_bytes(per_rank),
                     kHostBuffersPerRank, ranks, ranks == 1 ? "" : "s", approx_bytes(available));
}

std::uint64_t available_memory() {
  std::uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (available == 0) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  }
  // A container's limit (cgroup v2) is what the OOM killer goes by, however much the host has.
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (!line.starts_with("0::")) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const auto limit = number_in(dir + "/memory.max");
    const auto used = number_in(dir + "/memory.current");
    if (limit && used) available = std::min(available, *limit > *used ? *limit - *used : 0);
  }
  return available;
}

int ranks_on_this_host() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    const int n = std::atoi(value);
    if (n > 0) return n;
  }
  return 1;
}

int usage_error(std::string_view program, std::string_view message) {
  // One write: std::cerr writes each piece apart, and the ranks of a job that share the
  // launcher's pipe (mpirun's) would interleave the pieces of their lines.
  const auto line = fmt::format("{}: error: {} (see --help)\n", program, one_line(std::string(message)));
  std::cerr.flush();
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
  return 2;
}

// --- memory -------------------------------------------------------------------------------------

void* HostMemory::allocate(std::size_t bytes) {
  return ::operator new((bytes + kAlignment - 1) / kAlignment * kAlignment, std::align_val_t{kAlignment});
}
void HostMemory::release(void* p) { ::operator delete(p, std::align_val_t{kAlignment}); }
void HostMemory::upload(void* dst, const void* host, std::size_t bytes) { std::memcpy(dst, host, bytes); }
void HostMemory::download(void* host, const void* src, std::size_t bytes) { std::memcpy(host, src, bytes); }
void HostMemory::fill(void* dst, unsigned char byte, std::size_t bytes) { std::memset(dst, byte, bytes); }
void HostMemory::copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

// --- the report ---------------------------------------------------------------------------------

Report::Report(Subject subject, const Options& options, int rank, int world_size)
    : subject_(std::move(subject)), options_(options), rank_(rank), world_size_(world_size) {}

void Report::start() {
  if (!printing() || options_.json) return;
  const auto label = subject_.implementation == "idist" ? "idist over " + subject_.backend : "raw " + subject_.backend;
  fmt::print("# {}: {}, {} rank{}, {} memory, on {} at {}\n", subject_.program, label, world_size_,
             world_size_ == 1 ? "" : "s", subject_.memory, host_name(), now_utc());
  fmt::print("# sizes {} to {} (x{}), warm-up {}, iterations {}, check {}\n", human_bytes(options_.min_bytes),
             human_bytes(options_.max_bytes), options_.step_factor, options_.warmup,
             options_.iters > 0 ? std::to_string(options_.iters)
                                : fmt::format("auto ({:g} s per size)", options_.seconds_per_size),
             options_.check ? "on" : "off");
  fmt::print("# time: each rank's mean per call; avg, min and max over ranks. algbw, busbw from avg (nccl-tests).\n");
  fmt::print("#\n");
  fmt::print("# {:>14} {:>11} {:>11} {:>8} {:>5} {:>4} {:>10} {:>10} {:>10} {:>7} {:>7}\n", "", "", "", "", "", "",
             "time", "min", "max", "algbw", "busbw");
  fmt::print("# {:>14} {:>11} {:>11} {:>8} {:>5} {:>4} {:>10} {:>10} {:>10} {:>7} {:>7} {:>6} {:>6}\n", "collective",
             "size (B)", "count", "type", "redop", "root", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "#wrong", "iters");
  std::fflush(stdout);
}

void Report::row(const Row& r) {
  wrong_ += r.wrong;
  if (r.collective != Collective::barrier) {
    busbw_sum_ += r.busbw;
    ++busbw_rows_;
  }
  if (!printing()) return;
  const std::string type = r.dtype ? std::string(to_string(*r.dtype)) : "-";
  const std::string op = r.op ? std::string(name_of(*r.op)) : "none";
  if (options_.json) {
    results_.push_back({{"collective", name_of(r.collective)},
                        {"size", r.bytes},
                        {"count", r.count},
                        {"type", type},
                        {"redop", op},
                        {"root", r.root},
                        {"iters", r.iters},
                        {"time_us", r.avg_us},
                        {"time_min_us", r.min_us},
                        {"time_max_us", r.max_us},
                        {"time_median_us", r.median_us},
                        {"algbw", r.algbw},
                        {"busbw", r.busbw},
                        {"wrong", r.wrong},
                        {"checked", r.checked && r.collective != Collective::barrier}});
    return;
  }
  const std::string wrong =
      r.collective == Collective::barrier || !r.checked ? std::string("N/A") : std::to_string(r.wrong);
  fmt::print("  {:>14} {:>11} {:>11} {:>8} {:>5} {:>4} {:>10.2f} {:>10.2f} {:>10.2f} {:>7.3f} {:>7.3f} {:>6} {:>6}\n",
             name_of(r.collective), r.bytes, r.count, type, op, r.root, r.avg_us, r.min_us, r.max_us, r.algbw, r.busbw,
             wrong, r.iters);
  std::fflush(stdout);
}

void Report::skipped(const std::string& why) {
  if (!printing()) return;
  if (options_.json) {
    skipped_.push_back(why);
    return;
  }
  fmt::print("# skipped: {}\n", why);
  std::fflush(stdout);
}

int Report::finish() {
  const double avg_busbw = busbw_rows_ > 0 ? busbw_sum_ / busbw_rows_ : 0;
  if (printing()) {
    if (options_.json) {
      std::vector<std::string> collectives;
      for (const auto c : options_.collectives) collectives.emplace_back(name_of(c));
      const nlohmann::json doc = {
          {"program", subject_.program},
          {"implementation", subject_.implementation},
          {"backend", subject_.backend},
          {"memory", subject_.memory},
          {"world_size", world_size_},
          {"host", host_name()},
          {"date", now_utc()},
          {"options",
           {{"collectives", collectives},
            {"min_bytes", options_.min_bytes},
            {"max_bytes", options_.max_bytes},
            {"step_factor", options_.step_factor},
            {"warmup", options_.warmup},
            {"iters", options_.iters},
            {"time_per_size", options_.seconds_per_size},
            {"check", options_.check},
            {"root", options_.root}}},
          {"results", results_},
          {"skipped", skipped_},
          {"wrong", wrong_},
          {"avg_busbw", avg_busbw}};
      std::cout << doc.dump(1) << "\n";
    } else {
      fmt::print("# Out of bounds values : {} {}\n", wrong_, wrong_ == 0 ? "OK" : "FAILED");
      fmt::print("# Avg bus bandwidth    : {:.3f}\n#\n", avg_busbw);
    }
    std::fflush(stdout);
  }
  return wrong_ == 0 ? 0 : 1;
}

}  // namespace idist::bench

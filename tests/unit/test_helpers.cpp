// The helpers of idist/helpers.hpp that need no peers: the sampler, the batch size, the
// bucket plan; and, in a world of one, the ones that communicate.
#include <doctest/doctest.h>
#include <idist/helpers.hpp>

#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

extern char** environ;

namespace {

using Indices = std::vector<std::size_t>;

std::vector<Indices> all_ranks(idist::DistributedSamplerOptions options, std::uint64_t epoch = 0) {
  std::vector<Indices> out;
  for (int r = 0; r < *options.num_replicas; ++r) {
    options.rank = r;
    idist::DistributedSampler sampler(options);
    sampler.set_epoch(epoch);
    out.push_back(sampler.indices());
  }
  return out;
}

std::map<std::size_t, int> histogram(const std::vector<Indices>& per_rank) {
  std::map<std::size_t, int> seen;
  for (const auto& indices : per_rank)
    for (auto i : indices) ++seen[i];
  return seen;
}

}  // namespace

TEST_CASE("sampler without shuffle: torch's layout, padded from the start") {
  const auto ranks = all_ranks({.dataset_size = 10, .num_replicas = 3, .shuffle = false});
  CHECK(ranks[0] == Indices{0, 3, 6, 9});
  CHECK(ranks[1] == Indices{1, 4, 7, 0});
  CHECK(ranks[2] == Indices{2, 5, 8, 1});
}

TEST_CASE("sampler with drop_last: the tail is cut to a multiple of the replicas") {
  const auto ranks = all_ranks({.dataset_size = 10, .num_replicas = 3, .shuffle = false, .drop_last = true});
  CHECK(ranks[0] == Indices{0, 3, 6});
  CHECK(ranks[1] == Indices{1, 4, 7});
  CHECK(ranks[2] == Indices{2, 5, 8});
  // Fewer samples than ranks: nothing for anyone, as torch's ceil((n - R) / R) gives.
  idist::DistributedSampler tiny({.dataset_size = 2, .num_replicas = 3, .rank = 0, .drop_last = true});
  CHECK(tiny.size() == 0);
  CHECK(tiny.indices().empty());
}

TEST_CASE("sampler: fewer samples than ranks pads cyclically") {
  const auto ranks = all_ranks({.dataset_size = 2, .num_replicas = 5, .shuffle = false});
  CHECK(ranks == std::vector<Indices>{{0}, {1}, {0}, {1}, {0}});
  CHECK(all_ranks({.dataset_size = 0, .num_replicas = 3}) == std::vector<Indices>{{}, {}, {}});
}

TEST_CASE("sampler over a grid: equal lengths, every index once, padding from the permutation's start") {
  for (std::size_t n : {0u, 1u, 7u, 10u, 64u, 1000u, 1001u}) {
    for (int replicas : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          CAPTURE(n);
          CAPTURE(replicas);
          CAPTURE(shuffle);
          CAPTURE(drop_last);
          const idist::DistributedSamplerOptions options{
              .dataset_size = n, .num_replicas = replicas, .shuffle = shuffle, .seed = 7, .drop_last = drop_last};
          const auto ranks = all_ranks(options, 3);
          const auto r = static_cast<std::size_t>(replicas);
          const std::size_t per_rank = drop_last ? n / r : (n + r - 1) / r;
          for (const auto& indices : ranks) CHECK(indices.size() == per_rank);
          const auto seen = histogram(ranks);
          for (const auto& [index, times] : seen) CHECK(index < n);
          if (drop_last) {
            CHECK(seen.size() == per_rank * r);  // distinct, the tail dropped
            for (const auto& [index, times] : seen) CHECK(times == 1);
          } else {
            CHECK(seen.size() == n);  // all covered; the padding repeats the permutation's first ones
            const Indices order = shuffle ? idist::permutation(n, 7 + 3) : [n] {
              Indices all(n);
              std::iota(all.begin(), all.end(), std::size_t{0});
              return all;
            }();
            const std::size_t padding = per_rank * r - n;
            for (std::size_t k = 0; k < n; ++k) {
              int extra = 0;  // position n + j of the padded list holds order[j % n]
              for (std::size_t j = k; j < padding; j += n) ++extra;
              CHECK(seen.at(order[k]) == 1 + extra);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sampler: the first k of every rank are the first k x replicas of the permutation") {
  // What lets a training loop split a global batch into exact per-rank batches.
  const std::size_t n = 96, replicas = 4, per_rank_batch = 6;
  const auto ranks = all_ranks({.dataset_size = n, .num_replicas = 4, .seed = 11}, 2);
  const auto order = idist::permutation(n, 13);
  for (std::size_t b = 0; b < n / (replicas * per_rank_batch); ++b) {
    Indices from_ranks, global(order.begin() + static_cast<std::ptrdiff_t>(b * replicas * per_rank_batch),
                               order.begin() + static_cast<std::ptrdiff_t>((b + 1) * replicas * per_rank_batch));
    for (const auto& indices : ranks)
      from_ranks.insert(from_ranks.end(), indices.begin() + static_cast<std::ptrdiff_t>(b * per_rank_batch),
                        indices.begin() + static_cast<std::ptrdiff_t>((b + 1) * per_rank_batch));
    std::sort(from_ranks.begin(), from_ranks.end());
    std::sort(global.begin(), global.end());
    CHECK(from_ranks == global);
  }
}

TEST_CASE("sampler shuffle: deterministic for seed + epoch, different across epochs and seeds") {
  idist::DistributedSampler a({.dataset_size = 100, .num_replicas = 2, .rank = 1, .seed = 5});
  idist::DistributedSampler b({.dataset_size = 100, .num_replicas = 2, .rank = 1, .seed = 5});
  CHECK(a.indices() == b.indices());
  const auto epoch0 = a.indices();
  a.set_epoch(1);
  CHECK(a.epoch() == 1);
  CHECK(a.indices() != epoch0);
  b.set_epoch(1);
  CHECK(a.indices() == b.indices());
  // torch seeds with seed + epoch: seed 5 at epoch 1 is seed 6 at epoch 0.
  idist::DistributedSampler c({.dataset_size = 100, .num_replicas = 2, .rank = 1, .seed = 6});
  CHECK(c.indices() == a.indices());
  idist::DistributedSampler d({.dataset_size = 100, .num_replicas = 2, .rank = 1, .seed = 500});
  CHECK(d.indices() != epoch0);
  Indices strided;
  for (std::size_t i = 1; i < 100; i += 2) strided.push_back(i);
  CHECK(epoch0 != strided);  // shuffled
}

TEST_CASE("permutation: a permutation, the same on every platform") {
  for (std::size_t n : {0u, 1u, 2u, 10u, 1000u}) {
    auto p = idist::permutation(n, 42);
    std::sort(p.begin(), p.end());
    Indices identity(n);
    std::iota(identity.begin(), identity.end(), std::size_t{0});
    CHECK(p == identity);
  }
  // mt19937_64 is fully specified by the standard, and so is our sampling, so these hold on
  // every platform. They come from an independent Python rendering of both (mt19937_64 from
  // its published recurrence, checked against the standard's 10000th value).
  CHECK(idist::permutation(10, 0) == Indices{7, 2, 0, 8, 3, 9, 6, 1, 5, 4});
  CHECK(idist::permutation(10, 42) == Indices{1, 7, 9, 0, 3, 8, 4, 2, 5, 6});
  // Each of the 10 positions is equally likely for element 0 over many seeds.
  std::vector<int> where(10);
  for (std::uint64_t seed = 0; seed < 20000; ++seed) {
    const auto q = idist::permutation(10, seed);
    ++where[static_cast<std::size_t>(std::find(q.begin(), q.end(), 0) - q.begin())];
  }
  for (int count : where) CHECK(count == doctest::Approx(2000).epsilon(0.1));
}

TEST_CASE("sampler: bad arguments are one-line errors") {
  CHECK_THROWS_WITH_AS(idist::DistributedSampler({.dataset_size = 5, .num_replicas = 0, .rank = 0}),
                       "[idist rank 0/1] DistributedSampler: num_replicas=0 must be at least 1", idist::Error);
  CHECK_THROWS_WITH_AS(idist::DistributedSampler({.dataset_size = 5, .num_replicas = 2, .rank = 2}),
                       "[idist rank 0/1] DistributedSampler: rank=2 is not in [0, 2)", idist::Error);
  CHECK_THROWS_AS(idist::DistributedSampler({.dataset_size = 5, .num_replicas = 2, .rank = -1}), idist::Error);
}

TEST_CASE("sampler defaults to this process's rank and world size") {
  idist::DistributedSampler s({.dataset_size = 5, .shuffle = false});
  CHECK(s.num_replicas() == idist::get_world_size());
  CHECK(s.rank() == idist::get_rank());
  CHECK(s.indices() == Indices{0, 1, 2, 3, 4});
  CHECK(s.total_size() == 5);
}

TEST_CASE("per_rank_batch_size divides as ignite's auto_dataloader, and refuses too small a batch") {
  CHECK(idist::per_rank_batch_size(48, 1) == 48);
  CHECK(idist::per_rank_batch_size(48, 4) == 12);
  CHECK(idist::per_rank_batch_size(50, 4) == 12);  // rounded down, as ignite does
  CHECK(idist::per_rank_batch_size(3, 3) == 1);
  CHECK_THROWS_WITH_AS((void)idist::per_rank_batch_size(2, 3),
                       "[idist rank 0/1] per_rank_batch_size: global batch 2 is smaller than the world size 3: every "
                       "rank needs at least one sample",
                       idist::Error);
  CHECK_THROWS_AS((void)idist::per_rank_batch_size(8, 0), idist::Error);
  CHECK(idist::per_rank_batch_size(8) == 8 / static_cast<std::size_t>(idist::get_world_size()));
}

TEST_CASE("plan_buckets packs consecutive buffers up to the cap") {
  using B = idist::Bucket;
  const std::vector<std::size_t> sizes = {4, 4, 4, 4, 4};
  CHECK(idist::plan_buckets(sizes, 8) == std::vector<B>{{0, 2, 8}, {2, 4, 8}, {4, 5, 4}});
  CHECK(idist::plan_buckets(sizes, 9) == std::vector<B>{{0, 2, 8}, {2, 4, 8}, {4, 5, 4}});
  CHECK(idist::plan_buckets(sizes, 100) == std::vector<B>{{0, 5, 20}});
  CHECK(idist::plan_buckets(sizes, 0).size() == 5);  // one per buffer, as the tutorial's loop
  // Larger than the cap: a bucket of its own, neighbours unaffected.
  const std::vector<std::size_t> big = {4, 100, 4, 4};
  CHECK(idist::plan_buckets(big, 8) == std::vector<B>{{0, 1, 4}, {1, 2, 100}, {2, 4, 8}});
  // Empty buffers ride along and never cost a bucket.
  const std::vector<std::size_t> empties = {0, 0, 8, 0, 8, 0};
  CHECK(idist::plan_buckets(empties, 8) == std::vector<B>{{0, 4, 8}, {4, 6, 8}});
  CHECK(idist::plan_buckets(std::vector<std::size_t>{}, 8).empty());
  CHECK(idist::plan_buckets(std::vector<std::size_t>{0, 0}, 8) == std::vector<B>{{0, 2, 0}});
}

TEST_CASE("plan_buckets: 1000 small buffers under DDP's 25 MiB cap make one bucket; every buffer in one") {
  const std::vector<std::size_t> sizes(1000, 4 * 1000);  // 1000 floats each: 4 MB in all
  CHECK(idist::plan_buckets(sizes, idist::GradientAveragerOptions{}.bucket_cap_bytes).size() == 1);
  const auto buckets = idist::plan_buckets(sizes, 1 << 20);
  CHECK(buckets.size() == 4);  // 262 buffers of 4000 bytes fit in 1 MiB
  std::size_t next = 0;
  for (const auto& b : buckets) {
    CHECK(b.first == next);
    CHECK(b.bytes <= std::size_t{1} << 20);
    next = b.last;
  }
  CHECK(next == sizes.size());
}

TEST_CASE("world of one: the communicating helpers work without idist-run") {
  idist::init();
  std::vector<std::vector<float>> params(1000);
  for (std::size_t i = 0; i < params.size(); ++i) params[i].assign(1 + i % 7, static_cast<float>(i));
  std::vector<std::span<float>> grads(params.begin(), params.end());
  const auto before = params;

  idist::GradientAverager averager;
  averager.average(grads);
  CHECK(averager.last_collective_count() == 1);
  CHECK(params == before);  // the average over one rank is the gradient itself

  idist::GradientAverager one_each({.bucket_cap_bytes = 0});
  one_each.average(grads);
  CHECK(one_each.last_collective_count() == 1000);
  CHECK(params == before);

  idist::GradientAverager small({.bucket_cap_bytes = 64});
  std::vector<double> a(3, 1.5), b(100, -2.0), c;
  small.average(std::vector<std::span<double>>{a, b, c});
  CHECK(small.last_collective_count() == 2);  // a alone, b in place (larger than the cap), c free
  CHECK(a == std::vector<double>(3, 1.5));
  CHECK(b == std::vector<double>(100, -2.0));

  std::vector<idist::bfloat16> h(5, idist::bfloat16(0.75f));
  small.average(std::vector<std::span<idist::bfloat16>>{h});
  CHECK(static_cast<float>(h[4]) == 0.75f);

  CHECK(idist::one_rank_only([] { return 7; }, {.rank = 0, .with_barrier = true}) == std::optional<int>(7));
  int runs = 0;
  idist::one_rank_only([&] { ++runs; });
  CHECK(runs == 1);
  CHECK_THROWS_WITH_AS(idist::one_rank_only([] {}, {.rank = 1}),
                       "[idist rank 0/1] one_rank_only(gloo): rank=1 is not a rank (world size 1)", idist::Error);
  CHECK(idist::local_rank_first([] { return std::string("data"); }) == "data");
  idist::one_rank_first([&] { ++runs; });
  CHECK(runs == 2);
  CHECK_THROWS_WITH_AS(idist::one_rank_first([] {}, {.rank = 2, .local = true}),
                       "[idist rank 0/1] one_rank_first(gloo): rank=2 is not a rank (ranks per node 1)", idist::Error);
  idist::finalize();
}

// --- several processes ------------------------------------------------------------------
// The public API has one runtime per process, so ranks here are processes: this test binary
// started again, running only the "rank process" test case below with a rank's environment.

namespace {

constexpr int kRanks = 3;
constexpr const char* kChildVariable = "IDIST_TEST_HELPERS_RANK";

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// 40 buffers of assorted lengths, some empty; on rank r, element j of buffer i is
// r * (i + 1) + j, so the average over ranks R is mean(R) * (i + 1) + j: small integers, exact
// in every floating type, bfloat16 included.
template <class T>
std::vector<std::vector<T>> gradients(int rank) {
  std::vector<std::vector<T>> g(40);
  for (std::size_t i = 0; i < g.size(); ++i)
    for (std::size_t j = 0; j < (i * 7) % 13; ++j)
      g[i].push_back(T(static_cast<float>(static_cast<std::size_t>(rank) * (i + 1) + j)));
  return g;
}

template <class T>
void check_average(const idist::GradientAveragerOptions& options, int mean_rank) {
  const int rank = idist::get_rank();
  auto g = gradients<T>(rank);
  idist::GradientAverager averager(options);
  averager.average(std::vector<std::span<T>>(g.begin(), g.end()));
  const auto want = gradients<T>(options.group.is_member() ? mean_rank : rank);
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    for (std::size_t j = 0; j < g[i].size(); ++j) CHECK(static_cast<float>(g[i][j]) == static_cast<float>(want[i][j]));
  }
  std::vector<std::size_t> sizes;
  for (const auto& b : g) sizes.push_back(b.size() * sizeof(T));
  std::size_t expected = 0;
  for (const auto& bucket : idist::plan_buckets(sizes, options.bucket_cap_bytes)) expected += bucket.bytes > 0 ? 1 : 0;
  CHECK(averager.last_collective_count() == (options.group.is_member() ? expected : 0));
}

}  // namespace

TEST_CASE("rank process: one rank of the multi-process test below (a no-op when run directly)") {
  if (std::getenv(kChildVariable) == nullptr) return;
  idist::init();
  REQUIRE(idist::get_world_size() == kRanks);
  const idist::Group even = idist::new_group({0, 2});
  for (std::size_t cap : {std::size_t{0}, std::size_t{16}, std::size_t{100}, std::size_t{1000}, std::size_t{25} << 20}) {
    CAPTURE(cap);
    check_average<float>({.bucket_cap_bytes = cap}, 1);  // mean of ranks 0, 1, 2
    check_average<double>({.bucket_cap_bytes = cap}, 1);
    check_average<idist::bfloat16>({.bucket_cap_bytes = cap}, 1);
    check_average<idist::float16>({.bucket_cap_bytes = cap}, 1);
    check_average<float>({.bucket_cap_bytes = cap, .group = even}, 1);  // mean of ranks 0 and 2
  }

  // one_rank_first: rank 1 writes a file before the others look; each then appends its rank.
  const auto dir = idist::broadcast(std::string(std::getenv("IDIST_TEST_HELPERS_DIR")), 0);
  const auto file = std::filesystem::path(dir) / "first.txt";
  const auto seen = idist::one_rank_first(
      [&] {
        std::string content;
        std::getline(std::ifstream(file), content);
        std::ofstream(file, std::ios::app) << idist::get_rank();
        return content;
      },
      {.rank = 1});
  if (idist::get_rank() == 1) CHECK(seen.empty());
  else CHECK(seen.substr(0, 1) == "1");

  // one_rank_only with its barrier: rank 2's file is there for everyone afterwards.
  const auto only = std::filesystem::path(dir) / "only.txt";
  const auto wrote = idist::one_rank_only([&] { return static_cast<bool>(std::ofstream(only) << "2"); },
                                          {.rank = 2, .with_barrier = true});
  CHECK(wrote.has_value() == (idist::get_rank() == 2));
  CHECK(std::filesystem::exists(only));

  // Bad calls through the typed templates, alike on every rank: idist::Error with the site
  // prefix, raised before anything is sent, so the world and the group stay usable.
  const int rank = idist::get_rank();
  const std::string me = "[idist rank " + std::to_string(rank) + "/3] ";
  auto error_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const idist::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto usable = [&] {
    CHECK(idist::all_reduce(std::int32_t{1}) == kRanks);
    CHECK(idist::all_reduce(std::int32_t{1}, {.group = even}) == (even.is_member() ? 2 : 1));
  };
  const std::vector<float> four(4, 1.0f), three(3, 1.0f);
  std::vector<float> two(2);
  CHECK(error_of([&] { (void)idist::reduce_scatter(four); }) ==
        me + "reduce_scatter(gloo): input holds 4 elements, not a multiple of the group size 3");
  usable();
  CHECK(error_of([&] { idist::reduce_scatter(std::span<const float>(four), std::span<float>(two)); }) ==
        me + "reduce_scatter(gloo): input holds 4 elements; expected group size x output (2)");
  usable();
  // On a group the site names it; outside the group (rank 1) the call is a no-op, as ever.
  CHECK(error_of([&] { (void)idist::reduce_scatter(three, {.group = even}); }) ==
        (even.is_member() ? me + "reduce_scatter on group [0, 2](gloo): input holds 3 elements, not a multiple of the "
                                 "group size 2"
                          : std::string("(no error)")));
  usable();
  CHECK(error_of([&] { idist::all_gather(std::span<const float>(four), std::span<float>(two)); }) ==
        me + "all_gather(gloo): output holds 2 elements; expected group size x input (4)");
  usable();
  CHECK(error_of([&] { (void)idist::iall_gather(std::span<const float>(four), std::span<float>(two)); }) ==
        me + "iall_gather(gloo): output holds 2 elements; expected group size x input (4)");
  usable();
  // The others expect doubles where src sends floats: refused once the value has arrived.
  CHECK(error_of([&] {
          if (rank == 0) (void)idist::broadcast(std::optional<std::vector<float>>(four));
          else (void)idist::broadcast(std::optional<std::vector<double>>());
        }) == (rank == 0 ? std::string("(no error)") : me + "broadcast(gloo): src sent float32, not float64"));
  usable();
  CHECK(error_of([&] { idist::one_rank_only([] {}, {.rank = 3, .with_barrier = true}); }) ==
        me + "one_rank_only(gloo): rank=3 is not a rank (world size 3)");
  usable();
  CHECK(error_of([&] { (void)idist::Tensor::of(four).as<double>(); }) ==
        me + "Tensor::as(gloo): the tensor holds float32, not float64");
  usable();
  idist::finalize();
  std::ofstream(std::filesystem::path(dir) / ("done." + std::to_string(rank)));  // it did run
}

TEST_CASE("3 processes: GradientAverager over every bucket cap and type, groups, rank-first helpers, refusals") {
  if (std::getenv(kChildVariable) != nullptr) return;
  const auto dir = std::filesystem::temp_directory_path() / ("idist-helpers-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    const std::string rank = std::to_string(r), size = std::to_string(kRanks);
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"RANK", rank}, {"LOCAL_RANK", rank}, {"WORLD_SIZE", size}, {"LOCAL_WORLD_SIZE", size},
             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"IDIST_TIMEOUT", "30"},
             {kChildVariable, rank}, {"IDIST_TEST_HELPERS_DIR", dir.string()}})
      env.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe", filter = "--test-case=rank process:*";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    REQUIRE(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0);
    pids.push_back(pid);
  }
  // Each rank's own checks decide its exit status; a hang is cut short.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (std::size_t r = 0; r < pids.size(); ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ::waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CAPTURE(r);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(std::filesystem::exists(dir / ("done." + std::to_string(r))));
  }
  std::filesystem::remove_all(dir);
}

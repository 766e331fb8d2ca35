// "Pytorch - 3 Distributed Computing", distributed synchronous SGD, with what ignite's
// auto_dataloader and auto_model add: a DistributedSampler gives each rank its share of every
// global batch, each rank computes the mean gradient over its share, GradientAverager
// averages the gradients over the ranks (bucketed, as DDP does), and every rank takes the
// same step. Then every rank replays the training in one process, full global batches, and
// checks that the weights agree: data parallelism changes where the work is done, not the
// result.
//
//   distributed_sgd [DIR]     DIR caches the dataset; default: a fresh temporary directory
//
// The dataset is "downloaded" with local_rank_first: local rank 0 generates it into DIR while
// the other ranks of its node wait, then they find it there and load it.
#include <idist/helpers.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "print.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kSamples = 576;  // 12 global batches of 48
constexpr std::size_t kFeatures = 8;
constexpr std::size_t kGlobalBatch = 48;  // splits evenly over 1, 2, 3, 4, 6, 8, ... ranks
constexpr int kSteps = 50;
constexpr float kLearningRate = 0.5f;
constexpr std::uint64_t kShuffleSeed = 7;

struct Dataset {
  std::vector<float> x;  // kSamples x kFeatures, row-major
  std::vector<float> y;
};

// y = x.w + b + noise, with fixed w, b and a fixed seed. The uniform draws use the raw 64-bit
// output (not std::uniform_real_distribution) so the data is the same with every standard library.
Dataset generate() {
  std::mt19937_64 gen(1234);
  auto uniform = [&] { return static_cast<float>(gen() >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f; };
  const float w[kFeatures] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f, -1.0f, 0.25f, 2.0f};
  const float b = 0.3f;
  Dataset d{std::vector<float>(kSamples * kFeatures), std::vector<float>(kSamples)};
  for (std::size_t i = 0; i < kSamples; ++i) {
    float y = b + 0.01f * uniform();
    for (std::size_t j = 0; j < kFeatures; ++j) y += w[j] * (d.x[i * kFeatures + j] = uniform());
    d.y[i] = y;
  }
  return d;
}

// Loads the cached dataset, or generates and caches it: whoever comes first does the work.
// The file appears under its final name only once complete (written aside, then renamed).
Dataset load_or_generate(const fs::path& file, const std::string& who) {
  Dataset d{std::vector<float>(kSamples * kFeatures), std::vector<float>(kSamples)};
  const auto x_bytes = static_cast<std::streamsize>(d.x.size() * sizeof(float));
  const auto y_bytes = static_cast<std::streamsize>(d.y.size() * sizeof(float));
  if (std::ifstream in{file, std::ios::binary}) {
    if (!in.read(reinterpret_cast<char*>(d.x.data()), x_bytes) || !in.read(reinterpret_cast<char*>(d.y.data()), y_bytes))
      throw std::runtime_error("distributed_sgd: " + file.string() + " is truncated");
    examples::say(who + ", loaded the cached dataset");
    return d;
  }
  d = generate();
  fs::create_directories(file.parent_path());
  const fs::path partial = file.string() + ".part" + std::to_string(::getpid());
  {
    std::ofstream out(partial, std::ios::binary);
    out.write(reinterpret_cast<const char*>(d.x.data()), x_bytes);
    out.write(reinterpret_cast<const char*>(d.y.data()), y_bytes);
    if (!out.flush()) throw std::runtime_error("distributed_sgd: cannot write " + partial.string());
  }
  fs::rename(partial, file);
  examples::say(who + ", generated the dataset: " + std::to_string(kSamples) + " samples x " +
                std::to_string(kFeatures) + " features");
  return d;
}

struct Model {
  std::vector<float> w = std::vector<float>(kFeatures, 0.0f);
  std::vector<float> b = std::vector<float>(1, 0.0f);
};

float predict(const Model& m, const Dataset& d, std::size_t i) {
  float p = m.b[0];
  for (std::size_t j = 0; j < kFeatures; ++j) p += m.w[j] * d.x[i * kFeatures + j];
  return p;
}

// The gradient of the mean of (prediction - y)^2 / 2 over the samples: what backward() gives.
void gradient(const Model& m, const Dataset& d, std::span<const std::size_t> samples, Model& grad) {
  std::vector<double> gw(kFeatures, 0.0);
  double gb = 0.0;
  for (std::size_t i : samples) {
    const double error = static_cast<double>(predict(m, d, i)) - d.y[i];
    for (std::size_t j = 0; j < kFeatures; ++j) gw[j] += error * d.x[i * kFeatures + j];
    gb += error;
  }
  const auto n = static_cast<double>(samples.size());
  for (std::size_t j = 0; j < kFeatures; ++j) grad.w[j] = static_cast<float>(gw[j] / n);
  grad.b[0] = static_cast<float>(gb / n);
}

void sgd_step(Model& m, const Model& grad) {
  for (std::size_t j = 0; j < kFeatures; ++j) m.w[j] -= kLearningRate * grad.w[j];
  m.b[0] -= kLearningRate * grad.b[0];
}

double loss(const Model& m, const Dataset& d) {
  double sum = 0.0;
  for (std::size_t i = 0; i < kSamples; ++i) {
    const double e = static_cast<double>(predict(m, d, i)) - d.y[i];
    sum += e * e / 2;
  }
  return sum / kSamples;
}

// Trains for kSteps steps as rank `rank` of `replicas`; with an averager, the gradients are
// averaged over the ranks after each backward(), as DDP does.
Model train(const Dataset& d, int replicas, int rank, std::size_t batch, idist::GradientAverager* averager) {
  idist::DistributedSampler sampler(
      {.dataset_size = kSamples, .num_replicas = replicas, .rank = rank, .shuffle = true, .seed = kShuffleSeed});
  Model m, grad;
  int step = 0;
  for (std::uint64_t epoch = 0; step < kSteps; ++epoch) {
    sampler.set_epoch(epoch);
    const auto indices = sampler.indices();
    for (std::size_t at = 0; at + batch <= indices.size() && step < kSteps; at += batch, ++step) {
      gradient(m, d, std::span(indices).subspan(at, batch), grad);
      if (averager != nullptr) averager->average(std::vector<std::span<float>>{grad.w, grad.b});
      sgd_step(m, grad);
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  idist::init();
  const int rank = idist::get_rank();
  const int world = idist::get_world_size();
  const auto who = "Rank " + std::to_string(rank);
  if (kGlobalBatch % static_cast<std::size_t>(world) != 0)
    throw std::runtime_error("distributed_sgd: the global batch of " + std::to_string(kGlobalBatch) +
                             " does not split evenly over " + std::to_string(world) + " ranks");

  const std::string dir = examples::scratch_dir(argc, argv, "idist-sgd");
  const Dataset data = idist::local_rank_first([&] { return load_or_generate(fs::path(dir) / "regression.bin", who); });

  // ignite's auto_dataloader: the batch size the program asks for is the global one.
  const std::size_t per_rank = idist::per_rank_batch_size(kGlobalBatch);
  idist::GradientAverager averager;
  const Model trained = train(data, world, rank, per_rank, &averager);

  // The same training in one process: one replica, full global batches, no averaging.
  const Model reference = train(data, 1, 0, kGlobalBatch, nullptr);
  float worst = 0.0f;
  bool close = true;
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& want) {
    for (std::size_t j = 0; j < got.size(); ++j) {
      worst = std::max(worst, std::abs(got[j] - want[j]));
      close = close && std::abs(got[j] - want[j]) <= 1e-4f * std::max(1.0f, std::abs(want[j]));
    }
  };
  compare(trained.w, reference.w);
  compare(trained.b, reference.b);
  worst = idist::all_reduce(worst, idist::ReduceOp::MAX);
  // Every rank took the same steps, so every rank holds rank 0's weights bit for bit.
  std::vector<float> rank0 = trained.w;
  idist::broadcast(rank0, 0);
  const bool identical = rank0 == trained.w;
  const bool ok = idist::all_reduce(std::int32_t{close && identical ? 1 : 0}, idist::ReduceOp::MIN) == 1;

  if (rank == 0) {
    const std::string ranks = std::to_string(world) + (world == 1 ? " rank" : " ranks");
    examples::say("distributed_sgd: global batch " + std::to_string(kGlobalBatch) + " = " + ranks + " x " +
                  std::to_string(per_rank) + ", 2 gradient buffers, " +
                  std::to_string(averager.last_collective_count()) + " all_reduce per step");
    examples::say("distributed_sgd: loss " + examples::repr(loss(Model{}, data)) + " -> " +
                  examples::repr(loss(trained, data)));
    examples::say("distributed_sgd: " + ranks + ", " + std::to_string(kSteps) +
                  " steps, max |w - w_ref| = " + examples::repr(worst) +
                  (ok ? " (ok)" : " (MISMATCH)"));
  }
  idist::barrier();  // everyone has loaded the dataset: its cache may go
  if (argc <= 1 && idist::get_local_rank() == 0) fs::remove_all(dir);
  idist::finalize();
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}

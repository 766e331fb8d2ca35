// The articles' CIFAR-10 training (PyTorch-Ignite's examples/cifar10), in C++: a ResNet-18,
// ignite's three calls (auto_dataloader, auto_model, auto_optim), per-epoch loss and accuracy
// computed across ranks, progress as ignite logs it, and ignite's Checkpoint handler: the
// training state saved every epoch by rank 0 (idist::Checkpoint, beside training), and a run
// started again with the same --checkpoint-dir (by hand, or by idist-run --max-restarts after
// a rank died) resumes at the last save instead of step 0.
// The same binary runs unchanged on one process or many:
//
//   train_cifar10                                   one process
//   train_cifar10 --nproc-per-node 2                idist::Parallel starts 2 ranks itself
//   idist-run -n 2 train_cifar10                    srun -n 2 train_cifar10 likewise
//   mpirun -np 2 train_cifar10 --backend mpi
//   idist-run --nnodes 2 --node-rank K --rdzv-endpoint HOST:PORT -n 1 train_cifar10
//   idist-run -n 2 --max-restarts 3 train_cifar10 --checkpoint-dir ckpt
//   idist-run -n 4 train_cifar10 --recover          a lost rank costs one step (idist::Recovery)
//
// At its end rank 0 prints "train_cifar10: done steps=N redone=K resumed_from=S seen=M
// params=P": K the steps done again after a lost rank (--recover), S the step it resumed at (0
// for a fresh start), M the training samples used by every rank since (each global batch once),
// P every parameter summed as float64.
//
// --data DIR reads CIFAR-10's binary files (data_batch_1.bin ... data_batch_5.bin,
// test_batch.bin); without it, a synthetic set of the same shapes that can be learned (each
// class a fixed pattern under noise), the same on every rank.
#include <idist/checkpoint.hpp>
#include <idist/launch.hpp>
#include <idist/recovery.hpp>
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "resnet.hpp"

namespace fs = std::filesystem;

namespace {

struct Config {
  std::string data;
  std::string output = "checkpoints";
  std::string backend = "gloo";
  std::optional<int> nproc_per_node;  // set: start that many ranks here (no launcher)
  int epochs = 3;
  std::size_t batch_size = 64;   // global, as in ignite's config
  double learning_rate = 0.05;
  std::int64_t width = 64;        // 64: ResNet-18; smaller is the same network, narrower
  std::int64_t samples = 2048;    // synthetic training set (a fifth more for validation)
  int log_every = 10;
  std::int64_t steps = 0;         // 0: as many as the epochs take
  bool recover = false;           // live recovery: idist::Recovery around the loop
};

// --- data -------------------------------------------------------------------------------------------

// CIFAR-10's binary format: per image one label byte, then 3 x 32 x 32 bytes (planes R, G, B).
std::pair<torch::Tensor, torch::Tensor> read_cifar(const fs::path& dir, bool train) {
  std::vector<std::string> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else {
    files.push_back("test_batch.bin");
  }
  constexpr std::int64_t kRecord = 1 + 3 * 32 * 32;
  std::vector<std::uint8_t> bytes;
  for (const auto& name : files) {
    std::ifstream in(dir / name, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + (dir / name).string() + " (CIFAR-10's binary version)");
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), {});
  }
  const auto n = static_cast<std::int64_t>(bytes.size()) / kRecord;
  auto all = torch::from_blob(bytes.data(), {n, kRecord}, torch::kUInt8).clone();
  auto images = all.slice(1, 1).view({n, 3, 32, 32}).to(torch::kFloat).div_(255);
  const auto mean = torch::tensor({0.4914, 0.4822, 0.4465}).view({1, 3, 1, 1});
  const auto stdev = torch::tensor({0.2470, 0.2435, 0.2616}).view({1, 3, 1, 1});
  return {(images - mean) / stdev, all.select(1, 0).to(torch::kLong)};
}

// Each class a fixed random pattern (the same in both sets), each image that pattern under
// noise: learnable in an epoch or two, and the same on every rank (generators of its own).
std::pair<torch::Tensor, torch::Tensor> synthetic(std::int64_t n, std::uint64_t seed) {
  const auto patterns = torch::randn({10, 3, 32, 32}, at::detail::createCPUGenerator(0));
  auto generator = at::detail::createCPUGenerator(seed);
  const auto labels = torch::randint(10, {n}, generator, torch::kLong);
  return {patterns.index_select(0, labels) + 1.5 * torch::randn({n, 3, 32, 32}, generator), labels};
}

// --- training ----------------------------------------------------------------------------------------

void log0(const std::string& line) {
  if (idist::get_rank() != 0) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string fixed(double value, int digits = 4) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

template <class Loader>
std::pair<double, double> evaluate(examples::ResNet18& model, Loader& loader) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto sums = torch::zeros({3}, torch::kDouble);  // loss x samples, right guesses, samples
  for (auto& batch : *loader) {
    const torch::Tensor output = model(batch.data);
    const torch::Tensor target = batch.target;
    const auto n = static_cast<double>(target.size(0));
    sums[0] += torch::cross_entropy_loss(output, target).item<double>() * n;
    sums[1] += output.argmax(1).eq(target).sum().item<double>();
    sums[2] += n;
  }
  model->train();
  idist::all_reduce(sums);  // over every rank's shard
  return {sums[0].item<double>() / sums[2].item<double>(), sums[1].item<double>() / sums[2].item<double>()};
}

struct Labelled : torch::data::datasets::Dataset<Labelled> {
  torch::Tensor x, y;
  Labelled(torch::Tensor images, torch::Tensor labels) : x(std::move(images)), y(std::move(labels)) {}
  torch::data::Example<> get(std::size_t i) override {
    return {x[static_cast<std::int64_t>(i)], y[static_cast<std::int64_t>(i)]};
  }
  c10::optional<std::size_t> size() const override { return static_cast<std::size_t>(x.size(0)); }
};

auto loader_of(const torch::Tensor& x, const torch::Tensor& y, const idist::AutoDataLoaderOptions& options) {
  return idist::auto_dataloader(Labelled(x, y).map(torch::data::transforms::Stack<>()), options);
}

// Rank 0's last line, which the tests read.
void report(std::int64_t step, std::int64_t redone, std::int64_t resumed_from, std::int64_t seen,
            examples::ResNet18& model) {
  double params = 0;
  for (const auto& p : model->parameters()) params += p.to(torch::kDouble).sum().item<double>();
  char line[200];
  std::snprintf(line, sizeof line, "train_cifar10: done steps=%lld redone=%lld resumed_from=%lld seen=%lld params=%.10g",
                static_cast<long long>(step), static_cast<long long>(redone), static_cast<long long>(resumed_from),
                static_cast<long long>(seen), params);
  log0(line);
}

template <class Optimizer, class Loader>
void start_recovery(std::optional<idist::Recovery>& recovery, examples::ResNet18& model,
                    const std::shared_ptr<Optimizer>& optimizer, const std::unique_ptr<Loader>& loader,
                    std::int64_t step) {
  auto& r = recovery.emplace(model, optimizer, loader, idist::RecoveryOptions{.steps = step});
  r.on_reform([&r](const idist::ReformResult& result) {
    log0("Re-formed: generation " + std::to_string(result.generation) + ", world of " +
         std::to_string(result.world_size) + ", after step " + std::to_string(r.steps()));
  });
}

// The cores shared among this node's ranks, unless OMP_NUM_THREADS says how many (torch reads
// it: a job that sets it gets the same arithmetic on every rank, whatever each node runs); the
// first line.
void start_rank(int local_rank) {
  const auto cores = std::max(1u, std::thread::hardware_concurrency());
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    torch::set_num_threads(std::max(1, static_cast<int>(cores) / idist::get_nproc_per_node()));
  log0("train_cifar10: " + std::to_string(idist::get_world_size()) + " rank(s), backend " + idist::backend() +
       ", local rank " + std::to_string(local_rank) + " of rank 0");
}

void training(int local_rank, const Config& config) {
  start_rank(local_rank);

  auto [train_x, train_y] = config.data.empty() ? synthetic(config.samples, 1) : read_cifar(config.data, true);
  auto [test_x, test_y] = config.data.empty() ? synthetic(config.samples / 5, 2) : read_cifar(config.data, false);
  auto train_loader = loader_of(train_x, train_y, {.batch_size = config.batch_size, .shuffle = true, .drop_last = true});
  auto test_loader = loader_of(test_x, test_y, {.batch_size = config.batch_size, .shuffle = false});
  // The training set's accuracy through a loader of its own, so that the training loader's
  // epochs are the training's only.
  auto train_eval_loader = loader_of(train_x, train_y, {.batch_size = config.batch_size, .shuffle = false});

  torch::manual_seed(0);
  auto model = idist::auto_model(examples::ResNet18(10, config.width));
  auto optimizer = idist::auto_optim(std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(config.learning_rate).momentum(0.9).weight_decay(5e-4)));

  const auto iterations = train_x.size(0) / static_cast<std::int64_t>(config.batch_size);
  if (iterations == 0)
    throw std::runtime_error("--batch-size " + std::to_string(config.batch_size) + " is larger than the training set (" +
                             std::to_string(train_x.size(0)) + " samples)");
  const auto max_steps = config.steps > 0 ? config.steps : iterations * config.epochs;
  std::int64_t step = 0, epoch = 0, seen = 0;
  idist::Checkpoint checkpoint({.dir = config.output});
  checkpoint.add("model", model).add("optimizer", optimizer).add("train_loader", train_loader);
  checkpoint.add("step", step).add("epoch", epoch);
  const auto resumed_from = checkpoint.load_latest().value_or(0);
  if (resumed_from > 0) log0("Resumed from " + config.output + " at step " + std::to_string(resumed_from));
  // --recover: a lost rank costs the step it interrupted; the collectives between steps run
  // again after a re-form (retry).
  std::optional<idist::Recovery> recovery;
  if (config.recover) {
    start_recovery(recovery, model, optimizer, train_loader, step);
    step = recovery->steps();  // a rank started in a lost one's place: where the others are
  }
  const auto between = [&](auto&& collective) { return recovery ? recovery->retry(collective) : collective(); };
  double accuracy = 0;
  // Epochs are counted in steps (each is `iterations` global batches at any world size), so that
  // a run stopped by --steps inside an epoch resumes inside it.
  while (step / iterations < config.epochs && step < max_steps) {
    epoch = step / iterations + 1;
    const auto start = std::chrono::steady_clock::now();
    int iteration = 0;
    for (auto& batch : *train_loader) {
      torch::Tensor loss;
      const auto train_step = [&] {
        optimizer->zero_grad();
        loss = torch::cross_entropy_loss(model(batch.data), batch.target);
        loss.backward();
        optimizer->step();
      };
      if (!recovery) {
        train_step();
        seen += batch.data.size(0);
        ++step;
      } else if (!recovery->step(train_step)) {
        step = recovery->steps();  // re-formed: the next batch is this one's, re-split
        if (step >= max_steps) break;
        continue;
      } else {
        step = recovery->steps();
      }
      if ((++iteration % config.log_every == 0 || iteration == iterations) && loss.defined())
        log0("Epoch[" + std::to_string(epoch) + "] Iteration[" + std::to_string(iteration) + "/" +
             std::to_string(iterations) + "] Loss: " + fixed(loss.item<double>()));
      if (step == max_steps) break;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto [train_loss, train_accuracy] = between([&] { return evaluate(model, train_eval_loader); });
    const auto [test_loss, test_accuracy] = between([&] { return evaluate(model, test_loader); });
    accuracy = test_accuracy;
    log0("Train Epoch[" + std::to_string(epoch) + "] Avg accuracy: " + fixed(train_accuracy) +
         " Avg loss: " + fixed(train_loss) + " (" + fixed(seconds, 1) + " s)");
    log0("Validation Epoch[" + std::to_string(epoch) + "] Avg accuracy: " + fixed(test_accuracy) +
         " Avg loss: " + fixed(test_loss));
    checkpoint.save(step);  // rank 0 writes it beside the next epoch
    log0("Checkpoint: step " + std::to_string(step) + " to " + config.output);
  }
  checkpoint.wait();
  log0("Final validation accuracy: " + fixed(accuracy));
  const auto all_seen = recovery ? recovery->samples() : between([&] { return idist::all_reduce(seen); });
  report(step, recovery ? recovery->redone() : 0, resumed_from, all_seen, model);
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app("ResNet-18 on CIFAR-10, data-parallel with idist::torch (ignite's cifar10 example)", "train_cifar10");
  app.add_option("--data", config.data, "CIFAR-10's binary files (default: a synthetic set)")->check(CLI::ExistingDirectory);
  app.add_option("--checkpoint-dir,--output-path", config.output,
                 "Where rank 0 saves the training state every epoch, and whence a new run resumes")
      ->capture_default_str();
  app.add_option("--steps", config.steps, "Stop after this many steps in all (0: the epochs' steps)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", config.backend, "gloo, mpi or nccl")->capture_default_str();
  app.add_flag("--recover", config.recover,
               "Live recovery: a lost rank costs the step it interrupted, the others go on (under idist-run -n N)");
  app.add_option("--nproc-per-node", config.nproc_per_node, "Ranks to start here, when no launcher started this one")
      ->check(CLI::PositiveNumber);
  app.add_option("--epochs", config.epochs)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", config.batch_size, "The global batch, divided among the ranks")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--learning-rate", config.learning_rate)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--width", config.width, "Channels of the first stage (64: ResNet-18)")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--samples", config.samples, "Size of the synthetic training set")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--log-every", config.log_every, "Iterations between progress lines")->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    // ignite's `with idist.Parallel(backend, nproc_per_node) as parallel: parallel.run(training, config)`
    idist::Parallel({.backend = config.backend, .nproc_per_node = config.nproc_per_node, .recovery = config.recover})
        .run(training, config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_cifar10: %s\n", e.what());
    return 1;
  }
  return 0;
}

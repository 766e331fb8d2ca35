// idist::Checkpoint on real ranks (checkpoint.sh):
//
//   checkpoint_check train DIR STEPS EVERY [DIE_AT]   an MLP trained with auto_model, SGD with
//       momentum and a shuffled auto_dataloader (8 batches an epoch), saved every EVERY steps
//       and resumed from DIR's newest checkpoint; with DIE_AT, the last rank is killed (SIGKILL)
//       at that step of the first attempt (IDIST_RESTART_COUNT unset or 0). Rank 0 prints
//       "done steps=N resumed_from=S seen=M params=P" (M: samples used by every rank since the
//       start or the resume; P: every parameter summed as float64, %.17g).
//   checkpoint_check blocking DIR WIDTH               how long save() blocks against copying the
//       same state by hand (clones of the parameters and the momentum), the best of 7 rounds each.
#include <idist/checkpoint.hpp>
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "small_task.hpp"

namespace {

using small_task::Data;
using small_task::Net;

double parameter_sum(torch::nn::Module& model) {
  double sum = 0;
  for (const auto& p : model.parameters()) sum += p.to(torch::kDouble).sum().item<double>();
  return sum;
}

int train(const std::string& dir, std::int64_t steps, std::int64_t every, std::int64_t die_at) {
  torch::manual_seed(0);
  auto model = idist::auto_model(std::make_shared<Net>(8, 32, 4));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto loader = idist::auto_dataloader(Data(96, 7).map(torch::data::transforms::Stack<>()), {.batch_size = 12, .seed = 3});
  std::int64_t step = 0;
  idist::Checkpoint checkpoint({.dir = dir, .keep = 2});
  checkpoint.add("model", model).add("optimizer", optimizer).add("loader", loader).add("step", step);
  const auto resumed = checkpoint.load_latest().value_or(0);
  const char* attempt = std::getenv("IDIST_RESTART_COUNT");
  const bool first_attempt = attempt == nullptr || std::string(attempt) == "0";
  const bool dies = die_at > 0 && first_attempt && idist::get_rank() == idist::get_world_size() - 1;
  std::int64_t seen = 0;
  while (step < steps) {
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      torch::mse_loss(model->forward(batch.data), batch.target).backward();
      optimizer.step();
      seen += batch.data.size(0);
      ++step;
      if (step % every == 0) checkpoint.save(step);
      if (dies && step == die_at) std::raise(SIGKILL);
      if (step == steps) break;
    }
  }
  checkpoint.wait();
  const auto all_seen = idist::all_reduce(seen);
  if (idist::get_rank() == 0)
    std::printf("done steps=%lld resumed_from=%lld seen=%lld params=%.17g\n", static_cast<long long>(step),
                static_cast<long long>(resumed), static_cast<long long>(all_seen), parameter_sum(*model));
  return 0;
}

template <class F>
double seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int blocking(const std::string& dir, int width) {
  torch::manual_seed(0);
  auto model = std::make_shared<Net>(width, width, width);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  optimizer.zero_grad();
  model->forward(torch::randn({4, width})).sum().backward();
  optimizer.step();  // the momentum exists
  idist::Checkpoint checkpoint({.dir = dir, .keep = 1});
  checkpoint.add("model", model).add("optimizer", optimizer);
  // Alternating rounds (the machine is noisy), the best of each: a copy by hand of what save()
  // copies, and save() itself (after waiting for the last round's write, which is not its cost).
  std::vector<torch::Tensor> copies;
  double copy = 1e9;
  double blocked = 1e9;
  for (int i = 0; i < 7; ++i) {
    copy = std::min(copy, seconds([&] {
      copies.clear();
      for (const auto& p : model->parameters()) copies.push_back(p.detach().clone());
      for (const auto& entry : optimizer.state())
        copies.push_back(static_cast<torch::optim::SGDParamState&>(*entry.second).momentum_buffer().clone());
    }));
    checkpoint.wait();
    blocked = std::min(blocked, seconds([&] { checkpoint.save(i); }));
  }
  checkpoint.wait();
  const double mib = 2.0 * static_cast<double>(2 * width * width + 2 * width) * 4 / (1 << 20);
  std::printf("blocking: state %.1f MiB: a copy by hand %.4f s, save() blocked %.4f s: %.2fx\n", mib, copy, blocked,
              blocked / copy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  idist::init();
  int rc = 2;
  if (mode == "train" && (argc == 5 || argc == 6)) {
    rc = train(argv[2], std::stoll(argv[3]), std::stoll(argv[4]), argc == 6 ? std::stoll(argv[5]) : 0);
  } else if (mode == "blocking" && argc == 4) {
    rc = blocking(argv[2], std::stoi(argv[3]));
  } else {
    std::fprintf(stderr, "usage: checkpoint_check train DIR STEPS EVERY [DIE_AT] | blocking DIR WIDTH\n");
  }
  idist::finalize();
  return rc;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_check: %s\n", e.what());
  return 1;
}

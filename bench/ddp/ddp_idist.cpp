// One data-parallel training step, timed: the C++ side of bench/ddp/run.sh, beside PyTorch's
// DDP (ddp_torch.py) on the same network, batch and threads.
//
//   idist-run -n 2 ddp_idist --model resnet18 --batch 16 --mode auto_model
//   idist-run -n 2 ddp_idist --model mlp --batch 8 --mode after_backward   # dist-mnist's way
//   ddp_idist --model resnet18 --batch 16 --mode single                    # no communication
//
// Each step: zero_grad, forward, loss, backward, SGD step, on data made once (random images
// and labels; the timing does not depend on their values). One intra-op thread. Rank 0
// prints one JSON line: the median step and every step, in milliseconds.
#include <idist/recovery.hpp>
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <optional>
#include <chrono>
#include <cstdio>

#include "resnet.hpp"

namespace {

struct MlpImpl : torch::nn::Module {
  // DESIGN.md's reference shape: two 4096 x 4096 layers, 33.6 M parameters.
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(4096, 4096))), fc2(register_module("fc2", torch::nn::Linear(4096, 4096))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// --recover's loader: Recovery needs one made by auto_dataloader; the steps never read it.
struct Unread : torch::data::datasets::Dataset<Unread> {
  torch::data::Example<> get(std::size_t) override { return {torch::zeros(1), torch::zeros(1)}; }
  c10::optional<std::size_t> size() const override { return std::size_t{1} << 16; }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "resnet18";
  std::string mode = "auto_model";
  std::int64_t batch = 16;
  int steps = 20;
  int warmup = 3;
  bool recovery = false;
  bool recover = false;
  CLI::App app("Times data-parallel training steps with idist::torch", "ddp_idist");
  app.add_option("--model", model_name, "resnet18 or mlp")->check(CLI::IsMember({"resnet18", "mlp"}));
  app.add_option("--mode", mode, "auto_model, after_backward (an AVG all_reduce per gradient after backward), or single")
      ->check(CLI::IsMember({"auto_model", "after_backward", "single"}));
  app.add_option("--batch", batch, "Samples per rank and step")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "Timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_flag("--recovery", recovery, "init() with InitOptions::recovery (live recovery's heartbeat and cascade), "
                                       "to measure what opting in costs (bench/ddp/recovery_cost.sh)");
  app.add_flag("--recover", recover, "Each step through idist::Recovery::step (implies --recovery; auto_model only)");
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(1);
  recovery = recovery || recover;
  if (recover && mode != "auto_model") {
    std::fprintf(stderr, "ddp_idist: --recover needs --mode auto_model\n");
    return 2;
  }
  idist::init(idist::InitOptions{.recovery = recovery});
  if (mode == "single" && idist::get_world_size() != 1) {
    std::fprintf(stderr, "ddp_idist: --mode single runs as one process, without a launcher\n");
    return 2;
  }
  torch::manual_seed(idist::get_rank());

  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor()> loss;
  examples::ResNet18 resnet{nullptr};
  Mlp mlp{nullptr};
  torch::Tensor x, y;
  if (model_name == "resnet18") {
    resnet = examples::ResNet18();
    x = torch::randn({batch, 3, 32, 32});
    y = torch::randint(10, {batch}, torch::kLong);
    if (mode == "auto_model") resnet = idist::auto_model(resnet);
    module = resnet.ptr();
    loss = [&] { return torch::cross_entropy_loss(resnet(x), y); };
  } else {
    mlp = Mlp();
    x = torch::randn({batch, 4096});
    y = torch::randn({batch, 4096});
    if (mode == "auto_model") mlp = idist::auto_model(mlp);
    module = mlp.ptr();
    loss = [&] { return torch::mse_loss(mlp(x), y); };
  }
  auto optimizer_ptr = std::make_shared<torch::optim::SGD>(module->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto& optimizer = *optimizer_ptr;
  auto unread = idist::auto_dataloader(Unread(), {.batch_size = static_cast<std::size_t>(idist::get_world_size())});
  std::optional<idist::Recovery> recovering;
  if (recover) recovering.emplace(module, optimizer_ptr, unread);
  std::size_t parameters = 0;
  for (const auto& p : module->parameters()) parameters += static_cast<std::size_t>(p.numel());

  std::vector<double> times;
  std::vector<double> exposed;  // auto_model: from backward's end to the last bucket's
  // Each step's phases, for the profile beside the totals: zero_grad, forward (with the loss),
  // backward (with auto_model's waits; after_backward's all_reduces apart), the optimizer.
  std::array<std::vector<double>, 5> phases;
  const char* phase_names[] = {"zero_grad", "forward", "backward", "all_reduce_after", "step"};
  for (int step = 0; step < warmup + steps; ++step) {
    using Clock = std::chrono::steady_clock;
    std::array<Clock::time_point, 6> at;
    const auto one_step = [&] {
      optimizer.zero_grad();
      at[1] = Clock::now();
      auto l = loss();
      at[2] = Clock::now();
      l.backward();
      at[3] = Clock::now();
      if (mode == "after_backward")
        for (auto& p : module->parameters()) idist::all_reduce(p.grad(), idist::ReduceOp::AVG);
      at[4] = Clock::now();
      optimizer.step();
    };
    at[0] = Clock::now();
    if (recovering)
      recovering->step(one_step);
    else
      one_step();
    at[5] = Clock::now();
    const double ms = std::chrono::duration<double, std::milli>(at[5] - at[0]).count();
    if (step >= warmup) {
      times.push_back(ms);
      for (std::size_t i = 0; i < phases.size(); ++i)
        phases[i].push_back(std::chrono::duration<double, std::milli>(at[i + 1] - at[i]).count());
    }
    if (step >= warmup && mode == "auto_model") {
      const auto s = idist::data_parallel_stats(*module);
      exposed.push_back((s.reduced - s.backward_ended) * 1e3);
    }
  }
  auto sorted = times;
  std::sort(sorted.begin(), sorted.end());
  if (idist::get_rank() == 0) {
    std::printf("{\"impl\": \"idist\", \"mode\": \"%s\", \"model\": \"%s\", \"parameters\": %zu, \"ranks\": %d, "
                "\"recovery\": %s, \"recover\": %s, \"batch_per_rank\": %ld, \"step_ms_median\": %.3f, \"step_ms\": [",
                mode.c_str(), model_name.c_str(), parameters, idist::get_world_size(), recovery ? "true" : "false", recover ? "true" : "false",
                static_cast<long>(batch), sorted[sorted.size() / 2]);
    for (std::size_t i = 0; i < times.size(); ++i) std::printf("%s%.3f", i ? ", " : "", times[i]);
    std::printf("]");
    std::printf(", \"phase_ms_median\": {");
    for (std::size_t i = 0; i < phases.size(); ++i) {
      std::sort(phases[i].begin(), phases[i].end());
      std::printf("%s\"%s\": %.3f", i ? ", " : "", phase_names[i], phases[i][phases[i].size() / 2]);
    }
    std::printf("}");
    if (!exposed.empty()) {
      std::sort(exposed.begin(), exposed.end());
      std::printf(", \"wait_after_backward_ms_median\": %.3f", exposed[exposed.size() / 2]);
    }
    std::printf("}\n");
  }
  idist::finalize();
  return 0;
}

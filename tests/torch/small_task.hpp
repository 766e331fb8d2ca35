#pragma once
// The small task checkpoint_check and shares_check train: a two-layer MLP, and a random
// regression set of 8 inputs and 4 targets per sample, the same on every rank for a seed.
#include <torch/torch.h>

#include <cstdint>

namespace small_task {

struct Net : torch::nn::Module {
  Net(std::int64_t in, std::int64_t hidden, std::int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

struct Data : torch::data::datasets::Dataset<Data> {
  torch::Tensor x, y;
  Data(std::int64_t samples, std::uint64_t seed) {
    auto g = torch::make_generator<at::CPUGeneratorImpl>(seed);
    x = torch::randn({samples, 8}, g);
    y = torch::randn({samples, 4}, g);
  }
  torch::data::Example<> get(std::size_t i) override {
    return {x[static_cast<std::int64_t>(i)], y[static_cast<std::int64_t>(i)]};
  }
  c10::optional<std::size_t> size() const override { return static_cast<std::size_t>(x.size(0)); }
};

}  // namespace small_task

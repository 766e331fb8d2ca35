// A data-parallel step with idist::torch, from a project outside the tree (install.sh, deb.sh).
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <cstdio>

int main() {
  idist::init();
  const int n = idist::get_world_size();
  auto t = torch::full({2}, idist::get_rank() + 1.0);
  idist::all_reduce(t);
  auto model = idist::auto_model(torch::nn::Linear(4, 1));
  torch::mse_loss(model(torch::ones({2, 4}) * idist::get_rank()), torch::zeros({2, 1})).backward();
  const auto grads = idist::all_gather(model->weight.grad().unsqueeze(0));
  const bool right = t[0].item<double>() == n * (n + 1) / 2.0 && grads[0].equal(grads[n - 1]);
  std::printf("torch consumer: %d ranks, %s\n", n, right ? "all_reduce and auto_model right" : "WRONG");
  idist::finalize();
  return right ? 0 : 1;
}

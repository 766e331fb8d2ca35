// A global batch the world size does not divide (shares.sh): auto_dataloader gives each rank a
// share of every global batch (64 on 3 ranks: 22, 21, 21) and auto_model weighs each rank's
// gradient by its share, so that training follows the global batch's mean as one process does.
//
//   shares_check STEPS BATCH    rank 0 prints "shares steps=S batch=B share=N params=P loss=L":
//                               N its own share, P every parameter summed as float64 (%.17g),
//                               L the last step's loss over the global batch
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "small_task.hpp"

using small_task::Data;
using small_task::Net;

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::fprintf(stderr, "usage: shares_check STEPS BATCH\n");
    return 2;
  }
  const auto steps = std::stoll(argv[1]);
  const auto batch = static_cast<std::size_t>(std::stoll(argv[2]));
  idist::init();
  torch::manual_seed(0);
  auto model = idist::auto_model(std::make_shared<Net>(8, 32, 4));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  // drop_last: one process's last batch of an epoch is short, the shares' is padded.
  auto loader = idist::auto_dataloader(Data(200, 11).map(torch::data::transforms::Stack<>()),
                                       {.batch_size = batch, .drop_last = true, .seed = 5});
  long long step = 0, share = 0;
  double loss_sum = 0;
  while (step < steps) {
    for (auto& b : *loader) {
      optimizer.zero_grad();
      auto loss = torch::mse_loss(model->forward(b.data), b.target);
      loss.backward();
      optimizer.step();
      share = b.data.size(0);
      // The global batch's mean loss: each rank's mean weighted by its share.
      loss_sum = idist::all_reduce(loss.detach().to(torch::kDouble) * static_cast<double>(share)).item<double>() /
                 static_cast<double>(batch);
      if (++step == steps) break;
    }
  }
  double params = 0;
  for (const auto& p : model->parameters()) params += p.to(torch::kDouble).sum().item<double>();
  if (idist::get_rank() == 0)
    std::printf("shares steps=%lld batch=%zu share=%lld params=%.17g loss=%.17g\n", step, batch, share, params, loss_sum);
  idist::finalize();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "shares_check: %s\n", e.what());
  return 1;
}

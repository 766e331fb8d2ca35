// pytorch/examples' cpp/distributed/dist-mnist.cpp, written with idist::torch: the same network,
// data, batch (64 in all) and SGD, without the MPI process group, the sampler arithmetic and
// the gradient loop. auto_model averages the gradients while backward runs (the original
// all_reduces them after backward, and notes that this lags behind DDP); every rank sees the
// same accuracy, computed across ranks; any launcher.
//
//   idist-run -n 2 dist_mnist DATA_DIR [EPOCHS]     DATA_DIR holds MNIST's four idx files
//   mpirun -np 2 idist-run --backend mpi dist_mnist DATA_DIR
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>

struct Model : torch::nn::Module {
  Model() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop(conv2(x)), 2));
    x = torch::relu(fc1(x.view({-1, 320})));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2(x), 1);
  }
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 10, 5)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(10, 20, 5)};
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1{320, 50};
  torch::nn::Linear fc2{50, 10};
};

int main(int argc, char* argv[]) try {
  const std::string root = argc > 1 ? argv[1] : "../data";
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 10;
  idist::init({.backend = "gloo"});  // idist-run --backend (IDIST_BACKEND) chooses another
  using namespace torch::data;

  auto train = datasets::MNIST(root).map(transforms::Normalize<>(0.1307, 0.3081)).map(transforms::Stack<>());
  auto loader = idist::auto_dataloader(std::move(train), {.batch_size = 64});
  torch::manual_seed(0);
  auto model = idist::auto_model(std::make_shared<Model>());
  torch::optim::SGD optimizer(model->parameters(), 1e-2);

  for (int epoch = 1; epoch <= epochs; ++epoch) {
    auto correct = torch::zeros({2}, torch::kDouble);  // right guesses, samples seen
    for (auto& batch : *loader) {
      auto target = batch.target.to(torch::kLong);
      optimizer.zero_grad();
      auto prediction = model->forward(batch.data);
      torch::nll_loss(prediction, target).backward();
      optimizer.step();
      correct[0] += prediction.argmax(1).eq(target).sum().item<double>();
      correct[1] += static_cast<double>(target.size(0));
    }
    idist::all_reduce(correct);
    if (idist::get_rank() == 0)
      std::printf("Accuracy in epoch %d - %.2f\n", epoch, 100.0 * correct[0].item<double>() / correct[1].item<double>());
  }

  if (idist::get_rank() == 0) {  // testing on rank 0 only, as the original
    auto test = datasets::MNIST(root, datasets::MNIST::Mode::kTest)
                    .map(transforms::Normalize<>(0.1307, 0.3081))
                    .map(transforms::Stack<>());
    const auto samples = test.size().value();
    model->eval();
    torch::NoGradGuard no_grad;
    std::int64_t correct = 0;
    auto test_loader = make_data_loader(std::move(test), samples);
    for (auto& batch : *test_loader) {
      auto target = batch.target.to(torch::kLong);
      auto prediction = model->forward(batch.data);
      std::printf("Test loss - %.4f\n", torch::nll_loss(prediction, target).item<float>());
      correct += prediction.argmax(1).eq(target).sum().item<std::int64_t>();
    }
    std::printf("Num correct - %ld\nTest Accuracy - %.2f\n", static_cast<long>(correct), 100.0 * correct / samples);
  }
  idist::finalize();
} catch (const c10::Error& e) {  // libtorch's, e.g. a missing data file: its message, not its stack
  std::fprintf(stderr, "dist_mnist: %s\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dist_mnist: %s\n", e.what());
  return 1;
}

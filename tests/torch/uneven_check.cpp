// auto_model where the ranks differ (issue 44), one case per run, under idist-run or mpirun:
//
//   uneven_check CASE [--backend mpi]
//
// Cases whose ranks build different models (auto_model must refuse them on every rank):
//   transposed  rank 0's fc1.weight is [4, 6], the others' [6, 4] (the same element count)
//   hidden      rank 0's hidden layer has 50 units, the others' 60
//   extra       the last rank has one more layer
//   dtype       the last rank's model is float64
//   buffers     the last rank has a buffer the others lack
// Cases whose ranks have different numbers of batches (rank 0 has the most):
//   uneven      no join: the short ranks call finalize() while rank 0 waits in auto_model's
//               all_reduce; every rank must fail at once, naming what happened
//   join        idist::join: trains; rank 0 prints the final parameters (--out FILE writes them)
//   join_world  the same with divide_by_initial_world_size = false
//
// Each rank prints one line: "rank R: ok" or "rank R: error S s after wrap: <what>", and exits
// 0 or 3.
// The model and data are made from formulas, not a generator, so that tests/torch/ddp_join.py
// (PyTorch's DDP with model.join()) trains exactly the same thing.
#include <idist/torch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;
Clock::time_point wrapped;  // when auto_model was called: how long a refusal took

constexpr int kIn = 12;
constexpr int kOut = 3;

struct Net : torch::nn::Module {
  Net(int in, int hidden, bool extra, bool transposed_fc1) {
    fc1 = register_module("fc1", transposed_fc1 ? torch::nn::Linear(hidden, in) : torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, kOut));
    if (extra) fc3 = register_module("fc3", torch::nn::Linear(kOut, kOut));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(fc1->forward(x));
    x = fc2->forward(x);
    return fc3 ? fc3->forward(x) : x;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// Every parameter from a formula (ddp_join.py writes the same).
void fill(Net& net) {
  torch::NoGradGuard no_grad;
  int layer = 0;
  for (auto& p : net.parameters()) {
    auto flat = torch::arange(p.numel(), torch::kDouble);
    p.copy_((torch::sin(flat * 0.37 + layer) * 0.3).view(p.sizes()).to(p.scalar_type()));
    ++layer;
  }
}

// Rank r's batch b: 4 samples.
std::pair<torch::Tensor, torch::Tensor> batch(int r, int b) {
  const auto base = static_cast<double>(r * 100 + b);
  auto i = torch::arange(4 * kIn, torch::kDouble).view({4, kIn});
  auto x = torch::cos(i * 0.07 + base).to(torch::kFloat);
  auto y = torch::sin(torch::arange(4 * kOut, torch::kDouble).view({4, kOut}) * 0.11 + base).to(torch::kFloat);
  return {x, y};
}

int batches_of(int r) { return r == 0 ? 8 : 6 - (r - 1); }  // 8, 6, 5, ...

void train(Net& net, torch::optim::SGD& sgd, int rank) {
  for (int b = 0; b < batches_of(rank); ++b) {
    auto [x, y] = batch(rank, b);
    sgd.zero_grad();
    torch::mse_loss(net.forward(x), y).backward();
    sgd.step();
  }
}

void write_parameters(Net& net, const std::string& path) {
  std::ofstream out(path);
  out.precision(9);
  for (const auto& item : net.named_parameters()) {
    const auto flat = item.value().detach().to(torch::kDouble).flatten();
    for (std::int64_t i = 0; i < flat.numel(); ++i) out << item.key() << ' ' << flat[i].item<double>() << '\n';
  }
}

int run(const std::string& what, const std::string& out) {
  const int rank = idist::get_rank();
  const int last = idist::get_world_size() - 1;
  const bool other = rank != 0;
  auto net = std::make_shared<Net>(kIn, what == "hidden" && other ? 60 : (what == "hidden" ? 50 : 16),
                                   what == "extra" && rank == last, what == "transposed" && other);
  if (what == "dtype" && rank == last) net->to(torch::kDouble);
  if (what == "buffers" && rank == last) net->register_buffer("running", torch::zeros({2}));
  fill(*net);
  wrapped = Clock::now();
  net = idist::auto_model(net);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  if (what == "join" || what == "join_world") {
    idist::join(net, [&] { train(*net, sgd, rank); },
                {.divide_by_initial_world_size = what == "join"});
    if (rank == 0 && !out.empty()) write_parameters(*net, out);
    double sum = 0;
    for (const auto& p : net->parameters()) sum += p.detach().to(torch::kDouble).sum().item<double>();
    std::printf("rank %d: parameters sum %.10g\n", rank, sum);
  } else {
    train(*net, sgd, rank);
  }
  idist::finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = argc > 1 ? argv[1] : "";
  std::string backend = "gloo";
  std::string out;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
    if (std::string(argv[i]) == "--out") out = argv[i + 1];
  }
  int rank = -1;
  try {
    idist::init({.backend = backend});
    rank = idist::get_rank();
    run(what, out);
    std::printf("rank %d: ok\n", rank);
    return 0;
  } catch (const std::exception& e) {
    const auto after = std::chrono::duration<double>(Clock::now() - wrapped).count();
    std::printf("rank %d: error %.3f s after wrap: %s\n", rank, after, e.what());
    std::fflush(stdout);
    return 3;
  }
}

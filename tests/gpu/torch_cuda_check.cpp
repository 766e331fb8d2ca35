// idist::torch on one GPU: the tensor collectives on CUDA tensors through the nccl backend (a
// world of one still runs NCCL's path), the refusals of a CPU tensor on nccl and a CUDA tensor
// on gloo, and a short CUDA training loop with auto_model, auto_optim and an AVG of the loss.
// One line per case, then "torch_cuda_check: N checks, M failed" (exit 0 when none failed);
// without a GPU, "SKIPPED: ..." and exit 77.
//
// Built by tests/gpu/run_on_gpu.sh against the GPU machine's own libtorch (with CUDA); here,
// where Debian's libtorch has no CUDA, only compiled.
#include <idist/torch.hpp>
#include <torch/torch.h>

#include "../check_cases.hpp"

#include <cstdio>
#include <functional>
#include <string>

namespace {

using check_cases::run_case;

std::string differs(const torch::Tensor& got, const torch::Tensor& want, double tolerance = 0) {
  if (!got.is_cuda()) return "the result is on " + got.device().str() + ", not the GPU";
  const auto g = got.cpu().to(torch::kDouble);
  const auto w = want.cpu().to(torch::kDouble);
  if (!g.sizes().equals(w.sizes())) return "shape " + c10::str(g.sizes()) + ", want " + c10::str(w.sizes());
  const double error = (g - w).abs().max().item<double>();
  return error <= tolerance ? std::string() : "max difference " + std::to_string(error);
}

std::string refused(const std::function<void()>& call, const std::string& words) {
  try {
    call();
  } catch (const idist::Error& e) {
    const std::string text = e.what();
    return text.find(words) != std::string::npos ? std::string() : "the error does not say '" + words + "': " + text;
  }
  return "no error";
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("torch_cuda_check: SKIPPED: torch sees no CUDA device\n");
    return 77;
  }
  idist::init({.backend = "nccl"});
  std::printf("torch_cuda_check: backend %s, torch %s, world %d\n", idist::backend().c_str(), TORCH_VERSION,
              idist::get_world_size());
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);

  for (const auto dtype : {torch::kUInt8, torch::kInt8, torch::kInt32, torch::kInt64, torch::kHalf, torch::kBFloat16,
                           torch::kFloat, torch::kDouble}) {
    run_case(std::string("all_reduce SUM, MAX on CUDA ") + c10::toString(dtype), [&] {
      auto t = (torch::arange(1000, cuda) % 7).to(dtype);
      const auto want = t.clone();
      if (auto d = differs(idist::all_reduce(t), want); !d.empty()) return "SUM: " + d;
      return differs(idist::all_reduce(t, idist::ReduceOp::MAX), want);
    });
  }
  run_case("all_reduce AVG (ncclAvg) on float32, float16, bfloat16", [&] {
    for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
      auto t = torch::full({4096}, 3.0, cuda.dtype(dtype));
      if (auto d = differs(idist::all_reduce(t, idist::ReduceOp::AVG), torch::full({4096}, 3.0)); !d.empty()) return d;
    }
    return std::string();
  });
  run_case("all_reduce on bool (SUM as or) and on a non-contiguous CUDA tensor", [&] {
    auto b = torch::tensor({true, false, true}, cuda.dtype(torch::kBool));
    if (auto d = differs(idist::all_reduce(b), torch::tensor({1, 0, 1})); !d.empty()) return "bool: " + d;
    auto base = torch::arange(12, cuda.dtype(torch::kFloat)).view({3, 4});
    auto t = base.t();
    idist::all_reduce(t);
    return differs(base, torch::arange(12).view({3, 4}));
  });
  run_case("all_gather, all_gather_into_tensor, reduce_scatter_tensor, broadcast safe mode", [&] {
    auto in = torch::arange(6, cuda.dtype(torch::kFloat)).view({2, 3});
    if (auto d = differs(idist::all_gather(in), in); !d.empty()) return "all_gather: " + d;
    auto out = torch::empty({6}, cuda.dtype(torch::kFloat));
    idist::all_gather_into_tensor(out, in.flatten());
    if (auto d = differs(out, in.flatten()); !d.empty()) return "into_tensor: " + d;
    idist::reduce_scatter_tensor(out, in.flatten());
    if (auto d = differs(out, in.flatten()); !d.empty()) return "reduce_scatter: " + d;
    auto got = idist::broadcast(std::optional<torch::Tensor>(in), {.src = 0});
    return differs(got, in);
  });
  run_case("a CPU tensor on nccl is refused, naming its device", [] {
    return refused([] { idist::all_reduce(torch::ones({2})); }, "a tensor on cpu on the nccl backend");
  });
  run_case("a short training loop on the GPU: auto_model (a world of one: untouched), loss averaged", [&] {
    torch::manual_seed(0);
    auto model = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
    model->to(torch::kCUDA);
    model = idist::auto_model(model);
    auto optimizer = idist::auto_optim(std::make_shared<torch::optim::SGD>(model->parameters(), 0.05));
    auto x = torch::randn({256, 32}, cuda);
    auto y = x.sum(1, true);
    double first = 0, last = 0;
    for (int step = 0; step < 50; ++step) {
      optimizer->zero_grad();
      auto loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
      optimizer->step();
      const double mean = idist::all_reduce(loss.detach(), idist::ReduceOp::AVG).item<double>();
      if (step == 0) first = mean;
      last = mean;
    }
    std::printf("     loss %.4f -> %.4f\n", first, last);
    return last < first / 2 ? std::string() : "the loss did not fall";
  });
  idist::finalize();

  // With a libtorch that carries its own gloo (PyTorch's wheels), init(gloo) itself refuses:
  // two gloos in one process hung here once (tests/gpu/README.md).
  std::string refusal;
  try {
    idist::init({.backend = "gloo"});
  } catch (const idist::Error& e) {
    refusal = e.what();
  }
  if (refusal.empty()) {
    run_case("a CUDA tensor on gloo is refused, naming its device", [&] {
      return refused([&] { idist::all_reduce(torch::ones({2}, cuda)); }, "on the gloo backend, which takes CPU tensors");
    });
    idist::finalize();
  } else {
    run_case("init(gloo) refuses this libtorch's own copy of gloo, in one line", [&] {
      std::printf("     %s\n", refusal.c_str());
      return refusal.find("another copy of gloo") != std::string::npos ? std::string() : "another error: " + refusal;
    });
  }
  return check_cases::finish("torch_cuda_check");
}

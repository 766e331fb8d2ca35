#pragma once
// ResNet-18 for 32x32 images (CIFAR-10): torchvision's resnet18 with the stem of the CIFAR
// papers (one 3x3 convolution, no max-pool), about 11.2 M parameters. Used by train_cifar10
// and by bench/ddp, which builds the same network in Python (bench/ddp/ddp_torch.py) to time
// PyTorch's DDP against auto_model on identical work.
#include <torch/torch.h>

namespace examples {

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module("shortcut", torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// widths: 64, 128, 256, 512 for ResNet-18; a smaller `width` gives the same shape, cheaper.
struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(std::int64_t classes = 10, std::int64_t width = 64)
      : stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, width, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(width))),
        fc(register_module("fc", torch::nn::Linear(8 * width, classes))) {
    std::int64_t in = width;
    for (int stage = 0; stage < 4; ++stage) {
      const std::int64_t out = width << stage;
      for (int block = 0; block < 2; ++block) {
        const std::int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        layers->push_back(BasicBlock(in, out, stride));
        in = out;
      }
    }
    register_module("layers", layers);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn(stem(x)));
    y = layers->forward(y);
    y = torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
    return fc(y);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential layers;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet18);

}  // namespace examples

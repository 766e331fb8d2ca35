#include "module_archive.hpp"

#include <torch/torch.h>

#include "torch_errors.hpp"

namespace idist::detail {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

void write_module(OutputArchive& archive, const torch::nn::Module& module) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) archive.write(p.key(), p.value().detach().clone());
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    archive.write(b.key(), b.value().detach().clone(), /*is_buffer=*/true);
  for (const auto& child : module.named_children()) {
    OutputArchive sub(archive.compilation_unit());
    write_module(sub, *child.value());
    archive.write(child.key(), sub);
  }
}

void read_module(InputArchive& archive, torch::nn::Module& module, const std::string& path) {
  torch::NoGradGuard no_grad;
  const auto read_into = [&](const std::string& key, torch::Tensor& into, bool buffer) {
    torch::Tensor saved;
    if (!archive.try_read(key, saved, buffer))
      refuse("checkpoint", "the checkpoint has no " + path + key + ": was it saved from another model?");
    if (saved.sizes() != into.sizes() || saved.scalar_type() != into.scalar_type())
      refuse("checkpoint", path + key + " is " + c10::str(saved.sizes()) + " " + c10::toString(saved.scalar_type()) +
                               " in the checkpoint and " + c10::str(into.sizes()) + " " +
                               c10::toString(into.scalar_type()) + " here: was it saved from another model?");
    into.copy_(saved);
  };
  for (auto& p : module.named_parameters(false)) read_into(p.key(), p.value(), false);
  for (auto& b : module.named_buffers(false)) read_into(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    InputArchive sub;
    if (!archive.try_read(child.key(), sub)) refuse("checkpoint", "the checkpoint has no " + path + child.key());
    read_module(sub, *child.value(), path + child.key() + ".");
  }
}

}  // namespace idist::detail

#pragma once
// What Recovery (recovery.cpp) needs from auto_model and from auto_dataloader's sampler, inside
// idist::torch only.
#include <torch/nn/module.h>

#include <cstdint>

#include "idist/torch.hpp"

namespace idist::detail {

// auto_model after a re-form: no iteration in flight, the same buckets on every rank (a
// collective of the new world). Nothing for a module auto_model left as it was.
void after_reform(const torch::nn::Module& module);
bool is_data_parallel(const torch::nn::Module& module);
// Whether the last step's buckets said, alike on every rank, that a replacement waits to join
// (idist::replacement_waiting on any rank); cleared by asking.
bool replacement_agreed(const torch::nn::Module& module);
// Whether replicas' buffers are equal after each step (AutoModelOptions::broadcast_buffers).
bool broadcasts_buffers(const torch::nn::Module& module);

// Where a loader is in its epoch, in samples of the permutation every rank shares (the global
// position a checkpoint keeps); at_end: the epoch was read to its end.
struct SamplerMark {
  std::uint64_t epoch = 0;
  std::uint64_t global = 0;
  bool at_end = false;
};

struct SamplerAccess {
  static SamplerMark mark(const TorchDistributedSampler& sampler);
  // This rank's share of each global batch of the new world, from `at` on (a mark of the same
  // epoch, or the end of the one before where this rank's loader began the next).
  static void resplit(const TorchDistributedSampler& sampler, const SamplerMark& at);
  // Every auto_dataloader's loader splits its next epoch over the world of now (after a re-form).
  static void follow_world();
};

}  // namespace idist::detail

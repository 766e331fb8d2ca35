#pragma once
// auto_model's check at wrap time, DDP's _verify_param_shape_across_processes and friends:
// every rank's module has the same parameters (names, order, shapes, dtypes, requires_grad)
// and the same buffers. Without it, rank 0's bytes are broadcast flat into another rank's
// tensor of the same element count (a [4, 6] weight into a [6, 4] one) and two different
// models train with exit 0.

#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace idist::detail {

// One line per parameter, then per buffer, in registration order: what must agree.
std::vector<std::string> describe_replica(const torch::nn::Module& module);

// The first difference between rank `a`'s description and rank `b`'s, as the user reads it
// ("parameter 'fc1.weight' is [50, 784] on rank 0 and [60, 784] on rank 1"), or "" when they
// are equal.
std::string first_difference(const std::vector<std::string>& a, int rank_a, const std::vector<std::string>& b,
                             int rank_b);

// One all_reduce of a hash of the description; only where the hashes differ, the
// descriptions travel (all_gather) and every rank raises the same line, naming the first
// parameter or buffer that differs and both ranks.
void verify_replicas(const torch::nn::Module& module);

}  // namespace idist::detail

#pragma once

#include "backend.hpp"

namespace idist::detail {

// NCCL on one GPU per rank (device local_rank % visible devices). Buffers may be device
// memory, used in place, or host memory, staged through the GPU. Rank 0 publishes NCCL's
// unique id in the store under init.key_prefix. Throws std::runtime_error when no GPU is visible.
std::unique_ptr<Backend> make_nccl_backend(const BackendInit& init);

}  // namespace idist::detail

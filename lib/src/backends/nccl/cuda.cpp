// The nccl backend's CUDA plumbing (cuda.hpp).

#include "backends/nccl/cuda.hpp"

#include <algorithm>
#include <stdexcept>

#include "in_step_error.hpp"

namespace idist::detail::nccl {

[[noreturn]] void throw_cuda(const char* what, cudaError_t status) {
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")");
}

std::string nccl_error(const char* what, ncclResult_t result) {
  std::string text = std::string(what) + ": " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string("; last NCCL error: ") + last;
  return text;
}

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(nccl_error(what, result));
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

void PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return;
  const auto wanted = std::max(bytes, 2 * capacity_);
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  capacity_ = 0;
  void* fresh = nullptr;
  check_cuda(cudaMallocHost(&fresh, wanted), "cudaMallocHost (staging for host buffers)");
  data_ = static_cast<char*>(fresh);
  capacity_ = wanted;
}

bool on_device(const void* p, int device) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes fail on pointers they do not know: host memory
    return false;
  }
  if (attributes.type == cudaMemoryTypeManaged) return true;
  if (attributes.type != cudaMemoryTypeDevice) return false;
  if (attributes.device != device)
    throw InStepError("the buffer is memory of GPU " + std::to_string(attributes.device) +
                      " but this rank's NCCL communicator uses GPU " + std::to_string(device) +
                      "; allocate it on the device init() selected (local rank % visible GPUs)");
  return true;
}

}  // namespace idist::detail::nccl

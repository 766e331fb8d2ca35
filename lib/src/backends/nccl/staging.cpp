// The nccl backend's staging of host buffers (staging.hpp).

#include "backends/nccl/staging.hpp"

#include <cstring>
#include <utility>

namespace idist::detail::nccl {

Staging::Staging(std::shared_ptr<Communicator> comm, std::shared_ptr<PinnedBuffer> pinned, std::vector<Operand> operands)
    : comm_(std::move(comm)), pinned_(std::move(pinned)), slots_(operands.size()), device_{comm_} {
  constexpr std::size_t kAlignment = 256;  // cudaMalloc's alignment, which NCCL's fast paths expect
  std::size_t total = 0;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    auto& slot = slots_[i];
    slot.operand = operands[i];
    if (slot.operand.bytes == 0 || on_device(slot.operand.user, comm_->device())) continue;
    slot.staged = true;
    slot.offset = total;
    total += (slot.operand.bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  if (total == 0) return;
  pinned_->reserve(total);
  device_.data = static_cast<char*>(comm_->allocate(total));
  for (auto& slot : slots_) {
    if (!slot.staged || slot.operand.access == Access::write) continue;
    std::memcpy(pinned_->data() + slot.offset, slot.operand.user, slot.operand.bytes);
    check_cuda(cudaMemcpyAsync(device_.data + slot.offset, pinned_->data() + slot.offset, slot.operand.bytes,
                               cudaMemcpyHostToDevice, comm_->stream()),
               "cudaMemcpyAsync (host buffer to the GPU)");
  }
}

void Staging::copy_out() {
  for (auto& slot : slots_) {
    if (!slot.staged || slot.operand.access == Access::read) continue;
    check_cuda(cudaMemcpyAsync(pinned_->data() + slot.offset, device_.data + slot.offset, slot.operand.bytes,
                               cudaMemcpyDeviceToHost, comm_->stream()),
               "cudaMemcpyAsync (result back to the host)");
  }
}

void Staging::copy_back() {
  for (auto& slot : slots_) {
    if (!slot.staged || slot.operand.access == Access::read) continue;
    std::memcpy(const_cast<void*>(slot.operand.user), pinned_->data() + slot.offset, slot.operand.bytes);
  }
}

}  // namespace idist::detail::nccl

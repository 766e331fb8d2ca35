#pragma once
// The nccl backend's staging of host buffers: NCCL reads and writes device memory only.

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "backends/nccl/communicator.hpp"
#include "backends/nccl/cuda.hpp"

namespace idist::detail::nccl {

enum class Access { read, write, read_write };

// A user buffer as one operation uses it. Zero bytes: not used on this rank.
struct Operand {
  const void* user = nullptr;
  std::size_t bytes = 0;
  Access access = Access::read;
};

// An operation's buffers as NCCL sees them: device memory in place; host memory through a
// device copy, filled (via pinned memory) before the operation if it reads the buffer and
// copied back after it if it writes the buffer.
class Staging {
 public:
  Staging(std::shared_ptr<Communicator> comm, std::shared_ptr<PinnedBuffer> pinned, std::vector<Operand> operands);
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Where NCCL finds operand i.
  void* operator[](std::size_t i) const {
    const auto& slot = slots_[i];
    return slot.staged ? device_.data + slot.offset : const_cast<void*>(slot.operand.user);
  }

  // Queues the results' way back to pinned memory, behind the operation.
  void copy_out();

  // Once the stream has passed copy_out(): the results into the user's buffers.
  void copy_back();

 private:
  struct Slot {
    Operand operand;
    bool staged = false;
    std::size_t offset = 0;
  };
  // Released (in stream order) also when the constructor fails half-way.
  struct Allocation {
    explicit Allocation(std::shared_ptr<Communicator> owner) : comm(std::move(owner)) {}
    Allocation(const Allocation&) = delete;
    Allocation& operator=(const Allocation&) = delete;
    std::shared_ptr<Communicator> comm;
    char* data = nullptr;
    ~Allocation() {
      if (data == nullptr) return;
      cudaSetDevice(comm->device());
      comm->release(data);
    }
  };
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<PinnedBuffer> pinned_;
  std::vector<Slot> slots_;
  Allocation device_;
};

}  // namespace idist::detail::nccl

#pragma once
// The nccl backend's CUDA plumbing: status checks (one for CUDA, one for NCCL), the device a
// call runs on, events, pinned host memory, and whether a buffer is the device's.

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <string>

namespace idist::detail::nccl {

[[noreturn]] void throw_cuda(const char* what, cudaError_t status);

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda(what, status);
}

// "ncclAllReduce: unhandled cuda error (...); last NCCL error: ...". NCCL keeps its detailed
// message per thread, so it is read here, on the thread that got the result, before an abort.
std::string nccl_error(const char* what, ncclResult_t result);

void check_nccl(ncclResult_t result, const char* what);

// The current device is per thread, and calls arrive on the caller's thread, on ProcessGroup's
// async workers and on completion threads: each call selects the communicator's device and
// gives the caller's own back.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

// A point on a stream, one per operation, so that a completion on another thread waits for
// its own transfer and not for whatever was queued after it.
class Event {
 public:
  explicit Event(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    if (const auto status = cudaEventRecord(event_, stream); status != cudaSuccess) {
      cudaEventDestroy(event_);
      throw_cuda("cudaEventRecord", status);
    }
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory: a copy from or to pageable memory may block the calling thread until
// the stream has drained (the driver stages it), which no timeout could bound. Copies through
// pinned memory are truly asynchronous; the CPU moves the bytes between it and the user's buffer.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Left to the process's end: cudaFreeHost waits for the whole device, which work that is not
  // ours may hold (see Communicator::abort).
  void abandon() {
    data_ = nullptr;
    capacity_ = 0;
  }

  // Grows (contents lost) to at least `bytes`; only between operations.
  void reserve(std::size_t bytes);
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Whether NCCL can use `p` as it is: memory of `device`, or managed memory. Anything else is
// host memory (pageable, pinned or unknown to CUDA), which is staged.
bool on_device(const void* p, int device);

}  // namespace idist::detail::nccl

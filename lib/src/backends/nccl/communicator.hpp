#pragma once
// The nccl backend's communicator: one NCCL communicator with its stream, every call bounded by
// the timeout.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <future>
#include <mutex>
#include <string>

#include "backends/nccl/cuda.hpp"
#include "common/wait.hpp"

namespace idist::detail::nccl {

using Clock = std::chrono::steady_clock;

// One NCCL communicator with its stream, shared by the backend and by the completions of the
// transfers it posted (which may outlive a call). NCCL runs nonblocking: every call returns
// at once, possibly with ncclInProgress, and this class polls until done, so that init,
// collectives and transfers are all bounded by the timeout. On a timeout or an error it aborts
// the communicator, which is then dead for good. The mutex keeps that abort, which may come
// from a completion thread, away from a call in progress on another.
class Communicator {
 public:
  Communicator(int device, std::chrono::milliseconds timeout);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Whether no abort is in progress, after waiting at most the timeout for one (once; later
  // calls answer at once). What the backend's teardown asks before it frees anything that
  // waits for the device.
  bool abort_settled();

  // Joins the clique of `size` ranks named by `id` as `rank`.
  void connect(const ncclUniqueId& id, int size, int rank);

  // Makes one operation's NCCL calls: `calls(comm, stream)` returns the first failure, or the
  // last result (which, on a nonblocking communicator, may be ncclInProgress: then this waits
  // until NCCL has queued the work). The work follows what was queued before on the legacy
  // default stream, where kernels launched without a stream run, so that a buffer such a
  // kernel fills is complete; work on other streams is the caller's to synchronise.
  template <class F>
  void issue(const char* what, Clock::time_point deadline, F&& calls) {
    std::lock_guard lock(mu_);
    check_alive(what);
    check_cuda(cudaEventRecord(default_stream_done_, cudaStreamLegacy), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, default_stream_done_, 0), "cudaStreamWaitEvent");
    settle(what, calls(comm_, stream_), deadline);
  }

  // Blocks until the stream has passed `event`. Polls rather than synchronising, since
  // cudaEventSynchronize cannot be bounded, and watches NCCL's own error state meanwhile.
  void wait(cudaEvent_t event, const char* what, Clock::time_point deadline);

  // Device memory for staging, in stream order where the device has memory pools: the free is
  // queued behind the work that uses the memory, so neither call waits for the device. Under
  // the mutex, since a completion thread may free while another thread issues.
  void* allocate(std::size_t bytes);
  void release(void* p);

 private:
  // The shared waiting policy (common/wait.hpp), yielding from the first test: a small
  // collective is done within microseconds, a long wait then costs no CPU.
  struct Backoff : detail::Backoff {
    Backoff() : detail::Backoff(BackoffPolicy{.spin = {}, .yield = std::chrono::milliseconds(2)}) {}
  };

  // The rest run with mu_ held.

  void check_alive(const char* what) const;
  // Waits out ncclInProgress, then throws on any failure.
  void settle(const char* what, ncclResult_t result, Clock::time_point deadline);
  [[noreturn]] void fail(const char* what, ncclResult_t result);
  [[noreturn]] void time_out(const char* what);

  // ncclCommAbort frees NCCL's device memory, and cudaFree waits for everything queued on the
  // device: where the GPU is held by work that is not NCCL's (a kernel that never ends, a host
  // function on the default stream), the abort waits with it. Measured on an H200: a stream
  // held 20 s made a 5 s timeout raise after 20 s. So the abort runs on a thread of its own,
  // and the caller raises on time; the communicator is dead from here on either way.
  void abort(const std::string& why);

  int device_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t default_stream_done_ = nullptr;
  bool stream_ordered_ = false;
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  std::string dead_;  // why the communicator was aborted; empty while it lives
  std::shared_future<void> aborted_;  // ready once the abort's thread is done; invalid: none
  std::mutex aborting_mu_;            // an abort from a completion thread, during the teardown
  bool abort_waited_ = false;
};

}  // namespace idist::detail::nccl

// The nccl backend's communicator (communicator.hpp).

#include "backends/nccl/communicator.hpp"

#include <stdexcept>
#include <thread>
#include <utility>

#include "common/duration.hpp"
#include "store/store.hpp"

namespace idist::detail::nccl {

Communicator::Communicator(int device, std::chrono::milliseconds timeout) : device_(device), timeout_(timeout) {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (const auto status = cudaEventCreateWithFlags(&default_stream_done_, cudaEventDisableTiming);
      status != cudaSuccess) {
    cudaStreamDestroy(stream_);
    throw_cuda("cudaEventCreateWithFlags", status);
  }
  int pools = 0;
  stream_ordered_ = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess && pools != 0;
}

Communicator::~Communicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize flushes what is still queued and may need the peers: bounded, then destroy;
    // abort when it fails or the peers are gone.
    bool finalized = false;
    auto result = ncclCommFinalize(comm_);
    if (result == ncclInProgress || result == ncclSuccess) {
      const auto deadline = Clock::now() + timeout_;
      for (Backoff backoff;; backoff.pause()) {
        if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) break;
        if (result != ncclInProgress || Clock::now() >= deadline) break;
      }
      finalized = result == ncclSuccess;
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  // An abort still waiting for the device may hold the driver's lock for it: the stream and the
  // event (a few bytes) are left, rather than this destructor waiting with it.
  if (!abort_settled()) return;
  cudaEventDestroy(default_stream_done_);
  cudaStreamDestroy(stream_);
}

bool Communicator::abort_settled() {
  std::lock_guard lock(aborting_mu_);
  if (!aborted_.valid()) return true;
  const auto wait = abort_waited_ ? std::chrono::milliseconds(0) : timeout_;
  abort_waited_ = true;
  return aborted_.wait_for(wait) == std::future_status::ready;
}

void Communicator::connect(const ncclUniqueId& id, int size, int rank) {
  const auto deadline = Clock::now() + timeout_;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::lock_guard lock(mu_);
  ncclUniqueId copy = id;
  const auto result = ncclCommInitRankConfig(&comm_, size, copy, rank, &config);
  if (comm_ == nullptr) check_nccl(result == ncclSuccess ? ncclInternalError : result, "ncclCommInitRankConfig");
  settle("ncclCommInitRankConfig", result, deadline);
}

void Communicator::wait(cudaEvent_t event, const char* what, Clock::time_point deadline) {
  for (Backoff backoff;; backoff.pause()) {
    const auto done = cudaEventQuery(event);
    std::lock_guard lock(mu_);
    // An abort from another thread ends NCCL's kernels early: the event passes, the data is void.
    check_alive(what);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) {
      const std::string text = std::string(what) + ": " + cudaGetErrorString(done) + " (" + cudaGetErrorName(done) + ")";
      abort(text);
      throw std::runtime_error(text);
    }
    ncclResult_t state = ncclSuccess;
    const auto query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state != ncclSuccess && state != ncclInProgress) fail(what, state);
    if (Clock::now() >= deadline) time_out(what);
  }
}

void* Communicator::allocate(std::size_t bytes) {
  std::lock_guard lock(mu_);
  void* p = nullptr;
  check_cuda(stream_ordered_ ? cudaMallocAsync(&p, bytes, stream_) : cudaMalloc(&p, bytes),
             "cudaMalloc (staging for host buffers)");
  return p;
}

void Communicator::release(void* p) {
  std::lock_guard lock(mu_);
  if (stream_ordered_) {
    cudaFreeAsync(p, stream_);
  } else {
    cudaFree(p);
  }
}

void Communicator::check_alive(const char* what) const {
  if (!dead_.empty())
    throw std::runtime_error(std::string(what) + ": the NCCL communicator was aborted after an earlier failure (" +
                             dead_ + ")");
}

void Communicator::settle(const char* what, ncclResult_t result, Clock::time_point deadline) {
  for (Backoff backoff; result == ncclInProgress; backoff.pause()) {
    if (const auto query = ncclCommGetAsyncError(comm_, &result); query != ncclSuccess) result = query;
    if (result == ncclInProgress && Clock::now() >= deadline) time_out(what);
  }
  if (result != ncclSuccess) fail(what, result);
}

void Communicator::fail(const char* what, ncclResult_t result) {
  const auto text = nccl_error(what, result);
  abort(text);
  throw std::runtime_error(text);
}

void Communicator::time_out(const char* what) {
  const auto text =
      timed_out(what, timeout_, "a peer never called it, or is stuck; the NCCL communicator is aborted");
  abort(text);
  throw TimeoutFailure(text);
}

void Communicator::abort(const std::string& why) {
  dead_ = why;
  if (comm_ == nullptr) return;
  std::promise<void> done;
  {
    std::lock_guard lock(aborting_mu_);
    aborted_ = done.get_future().share();
  }
  std::thread([comm = std::exchange(comm_, nullptr), device = device_, done = std::move(done)]() mutable {
    cudaSetDevice(device);
    ncclCommAbort(comm);
    done.set_value();
  }).detach();
}

}  // namespace idist::detail::nccl

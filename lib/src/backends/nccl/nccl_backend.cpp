#include "backends/nccl/nccl_backend.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "in_step_error.hpp"
#include "backends/plugin.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <future>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace idist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// --- status checks: one for CUDA, one for NCCL ---------------------------------------------------

[[noreturn]] void throw_cuda(const char* what, cudaError_t status) {
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")");
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda(what, status);
}

// "ncclAllReduce: unhandled cuda error (...); last NCCL error: ...". NCCL keeps its detailed
// message per thread, so it is read here, on the thread that got the result, before an abort.
std::string nccl_error(const char* what, ncclResult_t result) {
  std::string text = std::string(what) + ": " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string("; last NCCL error: ") + last;
  return text;
}

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(nccl_error(what, result));
}

// --- the one switch over dtypes, and the reduce ops NCCL has --------------------------------------

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::int8: return ncclInt8;
    case DType::uint8: return ncclUint8;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
    case DType::float16: return ncclFloat16;
    case DType::bfloat16: return ncclBfloat16;
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
  }
  throw InStepError("unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::PRODUCT: return ncclProd;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::AVG: return ncclAvg;
    case ReduceOp::AND:
    case ReduceOp::OR:
    case ReduceOp::XOR: break;
  }
  throw InStepError("nccl does not support " + std::string(to_string(op)) +
                    " (NCCL reduces with SUM, PRODUCT, MIN, MAX and AVG only); use gloo or mpi for bitwise reductions");
}

// Bytes travel as NCCL's char.
constexpr ncclDataType_t kBytes = ncclChar;

// --- CUDA plumbing ------------------------------------------------------------------------------

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
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Left to the process's end: cudaFreeHost waits for the whole device, which work that is not
  // ours may hold (see Communicator::abort).
  void abandon() {
    data_ = nullptr;
    capacity_ = 0;
  }

  // Grows (contents lost) to at least `bytes`; only between operations.
  void reserve(std::size_t bytes) {
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
  char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Whether NCCL can use `p` as it is: memory of `device`, or managed memory. Anything else is
// host memory (pageable, pinned or unknown to CUDA), which is staged.
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

// --- the communicator ---------------------------------------------------------------------------

// One NCCL communicator with its stream, shared by the backend and by the completions of the
// transfers it posted (which may outlive a call). NCCL runs nonblocking: every call returns
// at once, possibly with ncclInProgress, and this class polls until done, so that init,
// collectives and transfers are all bounded by the timeout. On a timeout or an error it aborts
// the communicator, which is then dead for good. The mutex keeps that abort, which may come
// from a completion thread, away from a call in progress on another.
class Communicator {
 public:
  Communicator(int device, std::chrono::milliseconds timeout) : device_(device), timeout_(timeout) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (const auto status = cudaEventCreateWithFlags(&default_stream_done_, cudaEventDisableTiming);
        status != cudaSuccess) {
      cudaStreamDestroy(stream_);
      throw_cuda("cudaEventCreateWithFlags", status);
    }
    int pools = 0;
    stream_ordered_ = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess && pools != 0;
  }

  ~Communicator() {
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
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Whether no abort is in progress, after waiting at most the timeout for one (once; later
  // calls answer at once). What the backend's teardown asks before it frees anything that
  // waits for the device.
  bool abort_settled() {
    std::lock_guard lock(aborting_mu_);
    if (!aborted_.valid()) return true;
    const auto wait = abort_waited_ ? std::chrono::milliseconds(0) : timeout_;
    abort_waited_ = true;
    return aborted_.wait_for(wait) == std::future_status::ready;
  }

  // Joins the clique of `size` ranks named by `id` as `rank`.
  void connect(const ncclUniqueId& id, int size, int rank) {
    const auto deadline = Clock::now() + timeout_;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::lock_guard lock(mu_);
    ncclUniqueId copy = id;
    const auto result = ncclCommInitRankConfig(&comm_, size, copy, rank, &config);
    if (comm_ == nullptr) check_nccl(result == ncclSuccess ? ncclInternalError : result, "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig", result, deadline);
  }

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
  void wait(cudaEvent_t event, const char* what, Clock::time_point deadline) {
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

  // Device memory for staging, in stream order where the device has memory pools: the free is
  // queued behind the work that uses the memory, so neither call waits for the device. Under
  // the mutex, since a completion thread may free while another thread issues.
  void* allocate(std::size_t bytes) {
    std::lock_guard lock(mu_);
    void* p = nullptr;
    check_cuda(stream_ordered_ ? cudaMallocAsync(&p, bytes, stream_) : cudaMalloc(&p, bytes),
               "cudaMalloc (staging for host buffers)");
    return p;
  }
  void release(void* p) {
    std::lock_guard lock(mu_);
    if (stream_ordered_) {
      cudaFreeAsync(p, stream_);
    } else {
      cudaFree(p);
    }
  }

 private:
  // The shared waiting policy (common/wait.hpp), yielding from the first test: a small
  // collective is done within microseconds, a long wait then costs no CPU.
  struct Backoff : detail::Backoff {
    Backoff() : detail::Backoff(BackoffPolicy{.spin = {}, .yield = std::chrono::milliseconds(2)}) {}
  };

  // The rest run with mu_ held.

  void check_alive(const char* what) const {
    if (!dead_.empty())
      throw std::runtime_error(std::string(what) + ": the NCCL communicator was aborted after an earlier failure (" +
                               dead_ + ")");
  }

  // Waits out ncclInProgress, then throws on any failure.
  void settle(const char* what, ncclResult_t result, Clock::time_point deadline) {
    for (Backoff backoff; result == ncclInProgress; backoff.pause()) {
      if (const auto query = ncclCommGetAsyncError(comm_, &result); query != ncclSuccess) result = query;
      if (result == ncclInProgress && Clock::now() >= deadline) time_out(what);
    }
    if (result != ncclSuccess) fail(what, result);
  }

  [[noreturn]] void fail(const char* what, ncclResult_t result) {
    const auto text = nccl_error(what, result);
    abort(text);
    throw std::runtime_error(text);
  }

  [[noreturn]] void time_out(const char* what) {
    const auto text =
        timed_out(what, timeout_, "a peer never called it, or is stuck; the NCCL communicator is aborted");
    abort(text);
    throw TimeoutFailure(text);
  }

  // ncclCommAbort frees NCCL's device memory, and cudaFree waits for everything queued on the
  // device: where the GPU is held by work that is not NCCL's (a kernel that never ends, a host
  // function on the default stream), the abort waits with it. Measured on an H200: a stream
  // held 20 s made a 5 s timeout raise after 20 s. So the abort runs on a thread of its own,
  // and the caller raises on time; the communicator is dead from here on either way.
  void abort(const std::string& why) {
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

// --- staging host buffers -----------------------------------------------------------------------

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
  Staging(std::shared_ptr<Communicator> comm, std::shared_ptr<PinnedBuffer> pinned, std::vector<Operand> operands)
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
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Where NCCL finds operand i.
  void* operator[](std::size_t i) const {
    const auto& slot = slots_[i];
    return slot.staged ? device_.data + slot.offset : const_cast<void*>(slot.operand.user);
  }

  // Queues the results' way back to pinned memory, behind the operation.
  void copy_out() {
    for (auto& slot : slots_) {
      if (!slot.staged || slot.operand.access == Access::read) continue;
      check_cuda(cudaMemcpyAsync(pinned_->data() + slot.offset, device_.data + slot.offset, slot.operand.bytes,
                                 cudaMemcpyDeviceToHost, comm_->stream()),
                 "cudaMemcpyAsync (result back to the host)");
    }
  }

  // Once the stream has passed copy_out(): the results into the user's buffers.
  void copy_back() {
    for (auto& slot : slots_) {
      if (!slot.staged || slot.operand.access == Access::read) continue;
      std::memcpy(const_cast<void*>(slot.operand.user), pinned_->data() + slot.offset, slot.operand.bytes);
    }
  }

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

// NCCL calls that must progress together (a rank's sends and receives, or one broadcast per
// rank) go between ncclGroupStart and ncclGroupEnd, which launches them. `calls` returns its
// first failure; the group is ended either way, as NCCL requires.
template <class F>
ncclResult_t grouped(F&& calls) {
  if (const auto start = ncclGroupStart(); start != ncclSuccess) return start;
  const auto first = calls();
  const auto end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

void keep_first(ncclResult_t& first, ncclResult_t result) {
  if (first == ncclSuccess) first = result;
}

ncclUniqueId exchange_unique_id(const BackendInit& init) {
  const std::string key = init.key_prefix + "nccl/unique_id";
  ncclUniqueId id{};
  if (init.rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    init.store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    return id;
  }
  const auto bytes = init.store.get(key);
  if (bytes.size() != sizeof(id.internal))
    throw std::runtime_error("the store holds " + std::to_string(bytes.size()) + " bytes under '" + key +
                             "', not an NCCL unique id (" + std::to_string(sizeof(id.internal)) + " bytes)");
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

// --- the backend --------------------------------------------------------------------------------

class NcclBackend final : public Backend {
 public:
  ~NcclBackend() override {
    if (!comm_->abort_settled()) pinned_->abandon();
  }

  NcclBackend(const BackendInit& init, int device)
      : rank_(init.rank), size_(init.size), timeout_(init.timeout) {
    DeviceScope scope(device);
    comm_ = std::make_shared<Communicator>(device, timeout_);
    comm_->connect(exchange_unique_id(init), size_, rank_);
  }

  std::string_view name() const override { return "nccl"; }
  // A group of one goes through NCCL like any other: the one path a single GPU can test.
  BackendTraits traits() const override {
    return {.skip_group_of_one = false, .device_buffers = true, .native_avg = true};
  }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    DeviceScope scope(comm_->device());
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
  }

  // A fresh clique among the members, from a unique id of its own: only members get here, so
  // ncclCommSplit, a collective over the parent, is not an option.
  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<NcclBackend>(group.init, comm_->device());
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const auto type = nccl_type(dtype);
    const auto reduction = nccl_op(op);
    collective("ncclAllReduce", {{data, count * dtype_size(dtype), Access::read_write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllReduce(s[0], s[0], count, type, reduction, comm, stream);
               });
  }

  // Non-root ranks pass no receive buffer (NCCL allows that), so their data stays as it was.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    const auto type = nccl_type(dtype);
    const auto reduction = nccl_op(op);
    const bool is_root = rank_ == root;
    collective("ncclReduce", {{data, count * dtype_size(dtype), is_root ? Access::read_write : Access::read}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclReduce(s[0], is_root ? s[0] : nullptr, count, type, reduction, root, comm, stream);
               });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const auto type = nccl_type(dtype);
    const auto reduction = nccl_op(op);
    const auto block = count * dtype_size(dtype);
    collective("ncclReduceScatter", {{in, block * ranks(), Access::read}, {out, block, Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclReduceScatter(s[0], s[1], count, type, reduction, comm, stream);
               });
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    collective("ncclAllGather", {{in, bytes_per_rank, Access::read}, {out, bytes_per_rank * ranks(), Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllGather(s[0], s[1], bytes_per_rank, kBytes, comm, stream);
               });
  }

  // One broadcast per rank that contributes, each into its place in the output.
  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    for (auto bytes : bytes_per_rank) {
      offsets.push_back(total);
      total += bytes;
    }
    const auto mine = bytes_per_rank[static_cast<std::size_t>(rank_)];
    collective("all_gather_v (ncclBroadcast)", {{in, mine, Access::read}, {out, total, Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 auto* all = static_cast<char*>(s[1]);
                 return grouped([&] {
                   ncclResult_t first = ncclSuccess;
                   for (int r = 0; r < size_; ++r) {
                     const auto i = static_cast<std::size_t>(r);
                     if (bytes_per_rank[i] == 0) continue;
                     // Only the root's send buffer is read; the others receive in place.
                     const void* send = r == rank_ ? s[0] : all + offsets[i];
                     keep_first(first, ncclBroadcast(send, all + offsets[i], bytes_per_rank[i], kBytes, r, comm, stream));
                   }
                   return first;
                 });
               });
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const bool is_root = rank_ == root;
    collective("gather (ncclSend/ncclRecv)",
               {{in, bytes_per_rank, Access::read}, {out, is_root ? bytes_per_rank * ranks() : 0, Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 if (!is_root) return ncclSend(s[0], bytes_per_rank, kBytes, root, comm, stream);
                 auto* blocks = static_cast<char*>(s[1]);
                 check_cuda(cudaMemcpyAsync(blocks + bytes_per_rank * static_cast<std::size_t>(root), s[0],
                                            bytes_per_rank, cudaMemcpyDeviceToDevice, stream),
                            "cudaMemcpyAsync (own block)");
                 return grouped([&] {
                   ncclResult_t first = ncclSuccess;
                   for (int r = 0; r < size_; ++r) {
                     if (r == root) continue;
                     keep_first(first, ncclRecv(blocks + bytes_per_rank * static_cast<std::size_t>(r), bytes_per_rank,
                                                kBytes, r, comm, stream));
                   }
                   return first;
                 });
               });
  }

  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const bool is_root = rank_ == root;
    collective("scatter (ncclSend/ncclRecv)",
               {{in, is_root ? bytes_per_rank * ranks() : 0, Access::read}, {out, bytes_per_rank, Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 if (!is_root) return ncclRecv(s[1], bytes_per_rank, kBytes, root, comm, stream);
                 const auto* blocks = static_cast<const char*>(s[0]);
                 check_cuda(cudaMemcpyAsync(s[1], blocks + bytes_per_rank * static_cast<std::size_t>(root),
                                            bytes_per_rank, cudaMemcpyDeviceToDevice, stream),
                            "cudaMemcpyAsync (own block)");
                 return grouped([&] {
                   ncclResult_t first = ncclSuccess;
                   for (int r = 0; r < size_; ++r) {
                     if (r == root) continue;
                     keep_first(first, ncclSend(blocks + bytes_per_rank * static_cast<std::size_t>(r), bytes_per_rank,
                                                kBytes, r, comm, stream));
                   }
                   return first;
                 });
               });
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    collective("ncclBroadcast", {{data, bytes, rank_ == src ? Access::read : Access::write}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclBroadcast(s[0], s[0], bytes, kBytes, src, comm, stream);
               });
  }

  // An all-reduce of one int, staged to the device like any host buffer.
  void barrier() override {
    std::int32_t word = 0;
    collective("barrier (ncclAllReduce)", {{&word, sizeof(word), Access::read}},
               [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllReduce(s[0], s[0], 1, ncclInt32, ncclSum, comm, stream);
               });
  }

  // NCCL has no tags: a send matches the peer's next receive from this rank, in posting order
  // (all transfers share one stream), and `tag` is ignored. The receiver must pass the
  // sender's length. A transfer holds up the stream, collectives included, until the peer
  // posts its side, so two ranks that both send to each other first, then receive, wait for
  // each other until the timeout: one of them must post its receive first. The first transfer
  // between two ranks also connects them, and returns only once the peer has posted its side.
  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t /*tag*/) override {
    return point_to_point("ncclSend", {data, bytes, Access::read},
                          [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                            return ncclSend(s[0], bytes, kBytes, dst, comm, stream);
                          });
  }

  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t /*tag*/) override {
    return point_to_point("ncclRecv", {data, bytes, Access::write},
                          [&](const Staging& s, ncclComm_t comm, cudaStream_t stream) {
                            return ncclRecv(s[0], bytes, kBytes, src, comm, stream);
                          });
  }

 private:
  std::size_t ranks() const { return static_cast<std::size_t>(size_); }

  // Stage, call, wait, unstage. Collectives run one at a time (the mutex guards the shared
  // pinned buffer against a caller that breaks that contract from two threads).
  template <class F>
  void collective(const char* what, std::vector<Operand> operands, F&& calls) {
    std::lock_guard lock(collective_mu_);
    DeviceScope scope(comm_->device());
    const auto deadline = Clock::now() + timeout_;
    Staging staging(comm_, pinned_, std::move(operands));
    comm_->issue(what, deadline, [&](ncclComm_t comm, cudaStream_t stream) { return calls(staging, comm, stream); });
    staging.copy_out();
    const Event done(comm_->stream());
    comm_->wait(done.get(), what, deadline);
    staging.copy_back();
  }

  // As collective(), but the wait and the unstaging happen in the completion, which owns
  // its own staging (several transfers may be in flight) and the communicator's lifetime.
  template <class F>
  Completion point_to_point(const char* what, Operand operand, F&& calls) {
    DeviceScope scope(comm_->device());
    auto staging = std::make_shared<Staging>(comm_, std::make_shared<PinnedBuffer>(), std::vector<Operand>{operand});
    comm_->issue(what, Clock::now() + timeout_,
                 [&](ncclComm_t comm, cudaStream_t stream) { return calls(*staging, comm, stream); });
    staging->copy_out();
    auto done = std::make_shared<const Event>(comm_->stream());
    return [comm = comm_, staging, done, what] {
      DeviceScope scope(comm->device());
      comm->wait(done->get(), what, Clock::now() + comm->timeout());
      staging->copy_back();
    };
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<PinnedBuffer> pinned_ = std::make_shared<PinnedBuffer>();
  std::mutex collective_mu_;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const BackendInit& init) {
  int count = 0;
  const auto status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    const std::string why = status != cudaSuccess ? std::string(cudaGetErrorString(status)) + " (" +
                                                        cudaGetErrorName(status) + ")"
                                                  : std::string("0 devices");
    (void)cudaGetLastError();
    throw std::runtime_error("no CUDA device is visible (cudaGetDeviceCount: " + why +
                             "); the nccl backend needs one GPU per rank: use gloo on CPU");
  }
  // One GPU per rank on a node; where the launcher already narrowed CUDA_VISIBLE_DEVICES to
  // one GPU per rank, that one.
  const int device = init.contract.local_rank % count;
  // Left selected for the program, so that its own allocations land on the rank's GPU.
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return std::make_unique<NcclBackend>(init, device);
}

}  // namespace idist::detail

IDIST_BACKEND_PLUGIN(nccl, idist::detail::make_nccl_backend, nullptr)

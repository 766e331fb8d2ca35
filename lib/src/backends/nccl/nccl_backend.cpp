// The nccl backend: every collective and point-to-point through NCCL, on device buffers in
// place and on host buffers through a device copy. Its parts:
//   cuda.cpp          status checks, the device a call runs on, events, pinned host memory
//   communicator.cpp  one NCCL communicator with its stream, every call bounded by the timeout
//   staging.cpp       host buffers staged through device memory
//   this file         the Backend: NCCL's types and ops, the calls, the plugin

#include "backends/nccl/nccl_backend.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "in_step_error.hpp"
#include "backends/plugin.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backends/nccl/communicator.hpp"
#include "backends/nccl/cuda.hpp"
#include "backends/nccl/staging.hpp"

namespace idist::detail {
namespace {

using namespace nccl;

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


// The ucx backend: UCP's tag API between the members of a group. Its parts, as Gloo keeps its
// transport apart from its algorithms:
//   context.cpp    UCX's context, one per process, and what it is given of this host
//   comm.cpp       the transport: a group's worker, endpoints and TCP lanes (tcp_lanes.cpp),
//                  transfers waited for against a deadline, errors naming the peer
//   ring.cpp, tree.cpp, direct.cpp   the collectives, built from its sends and receives
//                  (algorithms.hpp)
//   this file      the Backend: which algorithm each call runs, point-to-point, the plugin
//
// Where UCX reaches another host over TCP alone, a collective's messages of 64 KiB or more to
// it take a TCP lane instead (tcp_lanes.hpp: no copy through UCX's buffers); the rest, and
// point-to-point, stay on UCX.

#include "backends/ucx/ucx_backend.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "backends/plugin.hpp"
#include "backends/ucx/algorithms.hpp"
#include "backends/ucx/comm.hpp"
#include "backends/ucx/context.hpp"
#include "common/scratch.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

using ucx::Call;
using ucx::Clock;
using ucx::Op;

// Below this many bytes, all_reduce runs recursive doubling (log2(n) rounds of whole
// messages); from it, a ring (reduce-scatter then all-gather: 2(n-1) rounds of 1/n each).
// Measured across two network namespaces over TCP (docs/BENCHMARKS.md, "UCX between hosts");
// IDIST_UCX_RING_FROM (bytes) overrides it, to measure it again elsewhere.
constexpr std::size_t kRingFrom = 256 * 1024;

class UcxBackend final : public Backend {
 public:
  UcxBackend(const BackendInit& init, std::shared_ptr<ucx::Context> context)
      : timeout_(init.timeout),
        ring_from_(init.contract.tuning.ucx_ring_from.value_or(kRingFrom)),
        context_(context),
        comm_(std::make_shared<ucx::Comm>(init, std::move(context))) {
    const auto deadline = Clock::now() + init.timeout;
    comm_->connect(init.store, init.key_prefix + "ucx/", init.contract, deadline);
    // Every member reached once, so that a peer that cannot be reached says so here, at
    // creation, within the timeout, rather than in the first collective.
    dissemination_barrier(Call{*comm_, next_tag(), deadline, "connecting"});
  }

  std::string_view name() const override { return "ucx"; }

  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<UcxBackend>(group.init, context_);
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const auto call = begin("all_reduce");
    const auto fn = reduce_kernel(dtype, op);
    if (count * dtype_size(dtype) < ring_from_ || count < static_cast<std::size_t>(size())) {
      ucx::recursive_doubling(call, static_cast<char*>(data), count, dtype, fn, tmp_);
    } else {
      ring_reduce_scatter(call, static_cast<char*>(data), ucx::Blocks{count, size()}, dtype, fn, 0, tmp_);
      ring_all_gather(call, static_cast<char*>(data), ucx::Blocks{count, size()}, dtype, 0);
    }
  }

  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    binomial_reduce(begin("reduce"), data, count, dtype, reduce_kernel(dtype, op), root, acc_, tmp_);
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const auto block = count * dtype_size(dtype);
    const auto n = static_cast<std::size_t>(size());
    char* all = grown_scratch(rs_, block * n);
    std::memcpy(all, in, block * n);
    if (block * n < ring_from_) {
      all_reduce(all, count * n, dtype, op);
    } else {
      // shift -1: the block this rank ends with is its own.
      ring_reduce_scatter(begin("reduce_scatter"), all, ucx::Blocks{count * n, size()}, dtype, reduce_kernel(dtype, op),
                          -1, tmp_);
    }
    std::memcpy(out, all + block * static_cast<std::size_t>(rank()), block);
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    std::vector<std::size_t> sizes(static_cast<std::size_t>(size()), bytes_per_rank);
    exchange(begin("all_gather"), in, out, sizes);
  }
  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    exchange(begin("all_gather_v"), in, out, bytes_per_rank);
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    direct_gather(begin("gather"), in, out, bytes_per_rank, root);
  }

  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    direct_scatter(begin("scatter"), in, out, bytes_per_rank, root);
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    binomial_broadcast(begin("broadcast"), data, bytes, src);
  }

  void barrier() override { dissemination_barrier(begin("barrier")); }

  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    auto op = std::make_shared<Op>(comm_->send(data, bytes, dst, ucx::make_tag(ucx::kP2pKind, rank(), tag)));
    return [comm = comm_, op, timeout = timeout_] {
      comm->wait({op.get(), 1}, Clock::now() + timeout, "send");
    };
  }

  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    auto op = std::make_shared<Op>(comm_->recv(data, bytes, src, ucx::make_tag(ucx::kP2pKind, src, tag)));
    comm_->track(op);
    return [comm = comm_, op, bytes, src, tag, timeout = timeout_] {
      try {
        comm->wait({op.get(), 1}, Clock::now() + timeout, "recv");
      } catch (const std::runtime_error&) {
        // A longer message than the buffer: UCX has consumed it (truncated), so the ranks
        // are still in step, as on gloo.
        if (op->status != UCS_ERR_MESSAGE_TRUNCATED) throw;
      }
      if (op->status == UCS_ERR_MESSAGE_TRUNCATED || op->length != bytes)
        throw InStepError(comm->who(src) + " sent " +
                          (op->length > bytes || op->status != UCS_ERR_MESSAGE_TRUNCATED ? std::to_string(op->length)
                                                                                         : "more") +
                          " bytes (tag " + std::to_string(tag) + ") but the receive buffer holds " +
                          std::to_string(bytes) + "; pass a buffer of the sender's length");
    };
  }

 private:
  void cancel_transfers() override { comm_->cancel_pending(); }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  std::uint64_t next_tag() { return ucx::make_tag(ucx::kCollectiveKind, rank(), sequence_++); }
  // A collective call: the group's next tag, and the call's deadline.
  Call begin(std::string_view what) { return Call{*comm_, next_tag(), call_deadline(timeout_), what}; }

  std::chrono::milliseconds timeout_;
  std::size_t ring_from_;  // all_reduce by ring from this many bytes
  std::shared_ptr<ucx::Context> context_;
  std::shared_ptr<ucx::Comm> comm_;
  std::uint32_t sequence_ = 0;
  std::vector<char> tmp_, acc_, rs_;  // scratch, kept between calls (common/scratch.hpp)
};

}  // namespace

std::string ucx_probe(const env::Contract& contract) {
  std::string why;
  return ucx::shared_context(contract, why) ? std::string() : why;
}

std::unique_ptr<Backend> make_ucx_backend(const BackendInit& init) {
  std::string why;
  auto context = ucx::shared_context(init.contract, why);
  if (!context) throw std::runtime_error("ucx: " + why);
  return std::make_unique<UcxBackend>(init, std::move(context));
}

}  // namespace idist::detail

IDIST_BACKEND_PLUGIN_PROBED(ucx, &idist::detail::make_ucx_backend, nullptr, &idist::detail::ucx_probe)

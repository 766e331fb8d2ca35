#pragma once
// idist::torch: libidist for libtorch programs. ignite's three calls that make a training
// script data-parallel, and the collectives on torch tensors:
//
//   idist::init();                                              // as any idist program
//   auto model = idist::auto_model(std::make_shared<Net>());    // DDP: replicas start equal,
//                                                               // gradients averaged during backward
//   auto optimizer = idist::auto_optim(std::make_shared<torch::optim::SGD>(model->parameters(), 0.1));
//   auto loader = idist::auto_dataloader(dataset, {.batch_size = 128});  // 128 in all: 128/N per rank
//   for (auto& batch : *loader) {
//     optimizer->zero_grad();
//     auto loss = torch::nll_loss(model->forward(batch.data), batch.target);
//     loss.backward();                                          // buckets reduced while it runs
//     optimizer->step();
//   }
//   auto mean_loss = idist::all_reduce(loss.detach(), idist::ReduceOp::AVG);
//
// In a world of one, auto_model returns the module untouched and the loader is a plain one,
// as ignite does. The ordering contract of <idist/idist.hpp> holds: every rank makes the same
// calls in the same order. Errors are idist::Error, naming rank, op and backend.
//
// Tensors and backends: gloo and mpi take CPU tensors, nccl takes CUDA tensors (of the
// rank's GPU); anything else is refused in one line naming the tensor's device or dtype and
// the backend. Dtypes: uint8, int8, int32, int64, float16, bfloat16, float32, float64, and
// bool as torch treats it (SUM is a logical or, PRODUCT a logical and). Complex, sparse and
// quantized tensors are refused. A non-contiguous tensor works through a contiguous copy,
// written back after the call; the asynchronous calls (iall_reduce, isend, irecv) refuse it,
// since nothing would copy it back when they end.
//
// Note: in namespace idist, `Tensor` is libidist's own type-erased buffer; write at::Tensor
// (or torch::Tensor) for torch's.

#include <torch/data.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "idist/helpers.hpp"
#include "idist/idist.hpp"

namespace idist {

// --- collectives on tensors ---------------------------------------------------------------------
// The in-place ones return the tensor they were given, for chaining.

IDIST_API at::Tensor all_reduce(const at::Tensor& tensor, const AllReduceOptions& options);
inline at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) {
  return all_reduce(tensor, AllReduceOptions{.op = op});
}
[[nodiscard]] IDIST_API Work iall_reduce(const at::Tensor& tensor, const AllReduceOptions& options = {});
// dst gets the reduction; the other ranks keep their tensor.
IDIST_API at::Tensor reduce(const at::Tensor& tensor, const ReduceOptions& options = {});

// ignite's all_gather: every rank's tensor concatenated along dim 0, in group-rank order. The
// ranks' tensors may differ in dim 0 (zero included), not in the other dims or the dtype.
[[nodiscard]] IDIST_API at::Tensor all_gather(const at::Tensor& tensor, const GroupOptions& options = {});
// torch.distributed.all_gather: one tensor per rank, each of this rank's tensor's shape.
[[nodiscard]] IDIST_API std::vector<at::Tensor> all_gather_list(const at::Tensor& tensor,
                                                                 const GroupOptions& options = {});
// torch's all_gather_into_tensor: output holds group size x input's elements (dim 0 grown).
IDIST_API void all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                                      const GroupOptions& options = {});
// torch's reduce_scatter_tensor: input holds group size x output's elements; rank r gets the
// reduction of every rank's r-th block.
IDIST_API void reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                     const AllReduceOptions& options = {});
// The same, returning the block: input's dim 0 divided by the group size.
[[nodiscard]] IDIST_API at::Tensor reduce_scatter(const at::Tensor& input, const AllReduceOptions& options = {});

// In place: every rank passes a tensor of src's shape and dtype.
IDIST_API at::Tensor broadcast(const at::Tensor& tensor, const BroadcastOptions& options);
inline at::Tensor broadcast(const at::Tensor& tensor, int src = 0) {
  return broadcast(tensor, BroadcastOptions{.src = src});
}
// ignite's safe_mode: only src has a tensor; its dtype and shape travel first, and every rank
// returns a new tensor (on the rank's GPU with nccl, else on the CPU).
[[nodiscard]] IDIST_API at::Tensor broadcast(const std::optional<at::Tensor>& tensor,
                                             const BroadcastOptions& options = {});

// dst gets one tensor per rank (each of dst's tensor's shape), the others an empty list.
[[nodiscard]] IDIST_API std::vector<at::Tensor> gather(const at::Tensor& tensor, const GatherOptions& options = {});
// src passes one tensor per rank (each of output's shape); the others pass an empty list.
IDIST_API void scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                       const ScatterOptions& options = {});

IDIST_API void send(const at::Tensor& tensor, int dst, int tag = 0);
IDIST_API void recv(const at::Tensor& tensor, int src, int tag = 0);
[[nodiscard]] IDIST_API Work isend(const at::Tensor& tensor, int dst, int tag = 0);
[[nodiscard]] IDIST_API Work irecv(const at::Tensor& tensor, int src, int tag = 0);

// The DType libidist carries a torch dtype as (bool as uint8); throws idist::Error for the
// others, naming the dtype.
IDIST_API DType dtype_of_tensor(const at::Tensor& tensor);

// --- auto_model: DistributedDataParallel ----------------------------------------------------------

struct AutoModelOptions {
  // DDP's buckets: the first (the last layers' gradients, ready first) small so that
  // communication starts early, the others up to the cap.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  // Parameters that get no gradient in an iteration are reduced as zeros. Without it, such a
  // parameter makes backward() raise on every rank, naming it.
  bool find_unused_parameters = false;
  // Rank 0's buffers (BatchNorm's running statistics) reach every rank at each backward's end,
  // so that every replica's next forward uses the same (DDP broadcasts them before forward).
  bool broadcast_buffers = true;
};

struct JoinOptions {
  // DDP's divide_by_initial_world_size: true (the default) divides the gradients by the world
  // size, so that a rank that has run out of data counts as a zero contribution; false divides
  // them by the ranks still training at that step.
  bool divide_by_initial_world_size = true;
};

namespace detail {
IDIST_API void make_data_parallel(torch::nn::Module& module, const AutoModelOptions& options);
IDIST_API void set_gradient_sync(const torch::nn::Module& module, bool enabled);
IDIST_API void join(const torch::nn::Module& module, const std::function<void()>& loop, const JoinOptions& options);
}  // namespace detail

// ignite's auto_model, DistributedDataParallel's behaviour on the same module object: in a
// world of more than one, parameters and buffers are broadcast from rank 0, and each
// backward() averages the gradients over the ranks while it runs: a hook per parameter marks
// its gradient ready, buckets of gradients (reverse registration order at first, then the
// order of the first iteration, agreed by every rank) are all_reduced (AVG) as soon as they
// are complete, and backward's end waits for them, so that the optimizer's step() right after
// backward() sees averaged gradients. The gradients live in the buckets from the first
// backward on (param.grad() is made over its bucket's memory; zero_grad() keeps it). In a world of
// one, the module is returned untouched.
template <class M>
  requires std::derived_from<M, torch::nn::Module>
std::shared_ptr<M> auto_model(std::shared_ptr<M> model, const AutoModelOptions& options = {}) {
  detail::make_data_parallel(*model, options);
  return model;
}
// The same for a module holder (torch::nn::Linear, TORCH_MODULE(Net)).
template <class H>
  requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
H auto_model(H holder, const AutoModelOptions& options = {}) {
  detail::make_data_parallel(*holder.ptr(), options);
  return holder;
}

// DDP's join (model.join(), torch.distributed.algorithms.Join) for ranks with uneven data:
// runs `loop` (this rank's training loop over its batches); a rank whose loop ends before the
// others' keeps answering their gradient all_reduces (contributing zeros) and buffer
// broadcasts until every rank's loop has ended; then the model of the last rank to finish
// reaches every rank, and all return together. Inside the loop, auto_model's collectives must
// be the only ones (as with DDP's join): a rank that has joined cannot answer another
// collective. Without it, a rank that runs out of data first makes its peers fail in
// auto_model's next all_reduce, naming it. A module auto_model left as it was (a world of one)
// just runs the loop.
//
//   idist::join(model, [&] {
//     for (auto& batch : *loader) { optimizer.zero_grad(); loss(batch).backward(); optimizer.step(); }
//   });
template <class M, class F>
  requires std::derived_from<M, torch::nn::Module>
void join(const std::shared_ptr<M>& model, F&& loop, const JoinOptions& options = {}) {
  detail::join(*model, std::function<void()>(std::forward<F>(loop)), options);
}
template <class H, class F>
  requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
void join(const H& holder, F&& loop, const JoinOptions& options = {}) {
  detail::join(*holder.ptr(), std::function<void()>(std::forward<F>(loop)), options);
}

// DDP's no_sync(): while the guard lives, backward() reduces nothing and gradients
// accumulate locally; the first backward() after it reduces the accumulated gradients.
class NoSync {
 public:
  explicit NoSync(const torch::nn::Module& module) : module_(&module) { detail::set_gradient_sync(module, false); }
  ~NoSync() { detail::set_gradient_sync(*module_, true); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  const torch::nn::Module* module_;
};
template <class M>
  requires std::derived_from<M, torch::nn::Module>
[[nodiscard]] NoSync no_sync(const std::shared_ptr<M>& model) {
  return NoSync(*model);
}
template <class H>
  requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
[[nodiscard]] NoSync no_sync(const H& holder) {
  return NoSync(*holder.ptr());
}

// What auto_model did in its last iteration, for tests and for the curious: times in seconds
// from the first gradient's hook of that backward.
struct DataParallelStats {
  std::size_t iterations = 0;        // backward passes that reduced
  std::size_t bucket_rebuilds = 0;   // 1 once the first iteration's order is in use
  std::vector<std::size_t> bucket_bytes;
  std::vector<std::vector<std::string>> bucket_parameters;  // names, in bucket order
  std::vector<double> bucket_started;  // each bucket's all_reduce started
  double backward_ended = 0;           // the engine's final callback began
  double reduced = 0;                  // every bucket's all_reduce had ended (exposed: reduced - backward_ended)
};
// Throws idist::Error when the module is not data-parallel (not wrapped, or a world of one).
IDIST_API DataParallelStats data_parallel_stats(const torch::nn::Module& module);

// --- auto_optim -----------------------------------------------------------------------------------

// ignite's auto_optim: with native backends the optimizer needs nothing, since auto_model's
// gradients arrive averaged. Returns it as it is.
template <class O>
O& auto_optim(O& optimizer) {
  return optimizer;
}
template <class O>
std::shared_ptr<O> auto_optim(std::shared_ptr<O> optimizer) {
  return optimizer;
}

// --- auto_dataloader ------------------------------------------------------------------------------

struct AutoDataLoaderOptions {
  // The global batch: each rank loads batch_size / world size, or, where the world size does
  // not divide it, a share of each global batch (the first batch_size % world size ranks one
  // more), auto_model weighting each rank's gradient by its share so that the average is the
  // global batch's (an elastic job keeps its batch when its world grows from 2 to 3).
  std::size_t batch_size = 1;
  bool shuffle = true;         // a new order every epoch, the same on every rank
  bool drop_last = false;      // else the last shard is padded with samples from the start
  std::uint64_t seed = 0;
  std::size_t num_workers = 0;  // for the node: each rank gets ceil(num_workers / ranks per node)
};

class TorchDistributedSampler;
namespace detail {
struct SamplerAccess;  // Recovery's re-split (torch/src/recovery_parts.hpp)
// Which sampler an auto_dataloader's loader holds (libtorch's loaders do not say), for
// Checkpoint; nullptr for another loader, or one already destroyed.
IDIST_API void remember_sampler(const void* loader, const TorchDistributedSampler& sampler);
IDIST_API std::unique_ptr<TorchDistributedSampler> loader_sampler(const void* loader);
}  // namespace detail

// A libtorch sampler over idist::DistributedSampler: this rank's disjoint share of the data
// set, shuffled per epoch from seed + epoch. Each reset() (the data loader's begin(), once per
// epoch) starts the next epoch, unless set_epoch() chose one or load() restored a position
// (then the epoch resumes there). Copies share one position: the data loader holds one, and
// Checkpoint reaches it through the loader (detail::loader_sampler).
class IDIST_API TorchDistributedSampler final : public torch::data::samplers::Sampler<> {
 public:
  // With global_batch, a world size that does not divide it: this rank's share of each global
  // batch of the permutation (padded from its start to whole global batches, or cut with
  // drop_last), whatever batch size the loader asks for.
  explicit TorchDistributedSampler(const DistributedSamplerOptions& options, std::size_t global_batch = 0);
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const;
  // c10::optional: std::optional from libtorch 2.0 on, its own type in 1.13.
  void reset(c10::optional<std::size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;
  // The epoch and the samples of it handed out so far. Exact with num_workers = 0; worker
  // threads read ahead (2 batches each), which a position saved meanwhile counts as read.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  std::size_t size() const;

  struct State;

 private:
  friend void detail::remember_sampler(const void* loader, const TorchDistributedSampler& sampler);
  friend std::unique_ptr<TorchDistributedSampler> detail::loader_sampler(const void* loader);
  friend struct detail::SamplerAccess;
  explicit TorchDistributedSampler(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

namespace detail {
// The rank's batch size (its share of the global batch) and workers, after the checks (a batch
// smaller than the world: idist::Error).
IDIST_API std::size_t rank_batch_size(std::size_t global_batch);
IDIST_API std::size_t rank_workers(std::size_t num_workers);
}  // namespace detail

// ignite's auto_dataloader: a data loader over this rank's shard, with a batch size of
// options.batch_size / world size (an indivisible batch size is refused in one line). With
// one rank, a plain loader over the whole set. `dataset` is a map-style libtorch data set of
// known size, transforms applied (e.g. dataset.map(torch::data::transforms::Stack<>())).
template <class Dataset>
auto auto_dataloader(Dataset dataset, const AutoDataLoaderOptions& options = {}) {
  const auto size = dataset.size();
  if (!size) throw Error({get_rank(), get_world_size(), "auto_dataloader", backend()}, "the data set has no size()");
  TorchDistributedSampler sampler(
      {.dataset_size = *size, .shuffle = options.shuffle, .seed = options.seed, .drop_last = options.drop_last},
      options.batch_size);
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions()
                                                  .batch_size(detail::rank_batch_size(options.batch_size))
                                                  .workers(detail::rank_workers(options.num_workers))
                                                  .drop_last(options.drop_last));
  detail::remember_sampler(loader.get(), sampler);
  return loader;
}

}  // namespace idist

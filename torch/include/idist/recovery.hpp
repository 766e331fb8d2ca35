#pragma once
// idist::Recovery: live recovery (docs/RECOVERY.md) for a libtorch training loop. Where a rank
// is lost mid-run (killed, crashed, or frozen and stopped by idist-run's heartbeat watch), the
// survivors keep their processes and memory, re-form as a smaller world, and redo at most the
// one step the loss interrupted, on the same global batch split over the ranks that are left:
//
//   idist::init({.recovery = true});              // or idist::Parallel({.recovery = true})
//   auto model = idist::auto_model(...);
//   auto optimizer = idist::auto_optim(...);
//   auto loader = idist::auto_dataloader(dataset, {.batch_size = 64});
//   idist::Recovery recovery(model, optimizer, loader);
//   while (recovery.steps() < max_steps) {
//     for (auto& batch : *loader) {
//       recovery.step([&] { optimizer->zero_grad(); loss(batch).backward(); optimizer->step(); });
//       if (recovery.steps() == max_steps) break;
//     }
//     auto accuracy = recovery.retry([&] { return evaluate(model); });  // collectives between steps
//   }
//
// step(fn) runs one training step. A loss inside it (PeerLostError) is recovered there: the
// world re-forms (idist::reform), the survivors agree on the last step any of them committed
// (one whose last all_reduce completed may have stepped while another's raised), those behind
// get that step's model and optimizer from one that has it, over the collective transport
// (step() then returns true: their step is committed), the others undo what the interrupted
// step changed and return false, and the loader is re-split at the batch after the last
// committed step: the loop's next batch is the one to train on, this rank's share of it in the
// new world. So each global batch is trained on exactly once, replicas stay bitwise equal
// (checked at each re-form: unequal ones raise), and get_rank()/get_world_size() say the new
// world. Every rank goes on with rank 0's CPU generator, as after a checkpoint restart. The
// program's other auto_dataloader loaders split their next epoch over the new world.
//
// What fn may hold: one step of auto_model's training, with its collectives before the
// optimizer's step() (a collective after it, such as an all_reduce of the loss for logging,
// belongs in retry()). retry(fn) runs collectives between steps that may be run again
// (evaluation, metrics): on a loss it re-forms and runs fn again. A loss that lets a retry()
// block complete on some ranks and raise on others cannot be recovered from (they cannot run
// it again alone): every rank raises, saying so.
//
// Replacements (idist-run -n N --max-restarts K): idist-run starts a rank in a lost one's place,
// running the same program. Its Recovery's construction takes the job's state (model, optimizer,
// loader position, steps() and samples()) from a running rank, once the running ranks admit it
// at a step boundary they agree on (the next step() does, before its fn, and returns false: the
// loop's next batch is the one to train, split over the world with it); its loop then goes on
// from steps(), at that batch, as after a checkpoint's resume. Before the construction it
// must make no collective of its own (auto_model skips its wrap-time ones there, and
// Checkpoint::load_latest() loads nothing); its on_reform callback runs at its first step() or
// retry(), where the running ranks ran theirs. What Recovery does not carry (a scheduler's
// state, an EMA model, counters of the program's own) starts afresh there: bring it over in
// on_reform (ReformResult::joined names the replacements). Programs that call reform()
// themselves, without Recovery, admit none: idist-run stops such replacements at the job's end.
//
// Refused at construction: loader worker threads (they read ahead of a re-split), the nccl
// backend and CUDA models (no re-form yet); inside a step, idist::join and no_sync across
// steps are not supported. Without idist-run's recovery
// (no InitOptions::recovery, another launcher, --recovery off) a loss raises as it always
// does, saying why it was not recovered. Code that caches get_rank() refreshes it in
// on_reform().
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "idist/torch.hpp"

namespace idist {

struct RecoveryOptions {
  std::int64_t steps = 0;  // steps committed before (a run resumed from a Checkpoint at that step)
};

class IDIST_API Recovery {
 public:
  template <class Model, class Optimizer, class Loader>
  Recovery(const Model& model, const std::shared_ptr<Optimizer>& optimizer, const std::unique_ptr<Loader>& loader,
           const RecoveryOptions& options = {})
      : Recovery(module_of(model), *optimizer, detail::loader_sampler(loader.get()), loader->options().workers,
                 options) {}
  ~Recovery();
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // One training step: true once it is committed (fn returned, or a peer lost meanwhile and
  // this rank took the step from one that committed it); false where the world re-formed and
  // the step is to be done again (the loop's next batch is the one to train on).
  bool step(const std::function<void()>& fn);

  // fn, run again after a re-form where a peer is lost inside it; its result.
  template <class F>
  auto retry(F&& fn) -> std::invoke_result_t<F&> {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      retry_void([&] { fn(); });
    } else {
      std::optional<std::invoke_result_t<F&>> result;
      retry_void([&] { result.emplace(fn()); });
      return std::move(*result);
    }
  }

  // Steps committed by the job (the same on every rank; from RecoveryOptions::steps), steps
  // done again after a loss, samples trained on by all ranks together since the start (each
  // global batch once), re-forms so far.
  std::int64_t steps() const;
  std::int64_t redone() const;
  std::int64_t samples() const;
  std::int64_t reforms() const;

  // Called after each re-form, with this rank's place in the new world: on every rank at the
  // same point, so it may make collectives (a loss inside one re-forms again).
  void on_reform(std::function<void(const ReformResult&)> callback);

  // The last re-form, for logs and benchmarks: seconds in reform() (the new world connected)
  // and in the reconcile after it, and the bytes this rank took from one ahead (0: none).
  struct Times {
    double reform = 0;
    double reconcile = 0;
    std::size_t caught_up_bytes = 0;
  };
  Times last_recovery() const;

 private:
  Recovery(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
           std::unique_ptr<TorchDistributedSampler> sampler, std::size_t workers, const RecoveryOptions& options);
  void retry_void(const std::function<void()>& fn);

  template <class M>
    requires std::derived_from<M, torch::nn::Module>
  static torch::nn::Module& module_of(const std::shared_ptr<M>& model) {
    return *model;
  }
  template <class H>
    requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
  static torch::nn::Module& module_of(const H& holder) {
    return *holder.ptr();
  }

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idist

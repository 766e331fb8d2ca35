// Recovery (recovery.hpp): a step that a lost peer interrupted, recovered in place. After
// idist::reform(), reconcile() is the part the library's re-form cannot do: the survivors may be
// one step apart (a step's last all_reduce can complete on one rank and raise on another, and
// the first then steps), so they agree on the highest step committed, bring the ranks behind
// level with it from one that has it, and re-split the loaders at the batch after it.
#include "idist/recovery.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "module_archive.hpp"
#include "recovery_parts.hpp"
#include "torch_errors.hpp"

namespace idist {
namespace {

using detail::refuse;
using detail::SamplerAccess;
using detail::SamplerMark;

// Parameters, and buffers where auto_model keeps them equal, bit for bit (FNV-1a over 8-byte
// words, then the tail): replicas at the same step must agree on it.
std::int64_t replica_hash(const torch::nn::Module& module) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto mix = [&](const at::Tensor& t) {
    const auto c = t.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const auto n = static_cast<std::size_t>(c.nbytes());
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      h = (h ^ word) * 1099511628211ULL;
    }
    for (; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  };
  for (const auto& p : module.parameters()) mix(p);
  if (detail::broadcasts_buffers(module))
    for (const auto& b : module.buffers()) mix(b);
  return std::bit_cast<std::int64_t>(h);
}

// SGD's momentum buffers in the order of its parameters (none where it keeps no state); nullopt
// for another optimizer, or one whose parameters do not all have a buffer yet. Those travel in
// place; anything else in an archive, whose serialization costs more than the transfer.
std::optional<std::vector<at::Tensor>> sgd_momenta(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> momenta;
  for (auto& group : optimizer.param_groups())
    if (dynamic_cast<const torch::optim::SGDOptions*>(&group.options()) == nullptr) return std::nullopt;
  if (optimizer.state().empty()) return momenta;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      const auto it = optimizer.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == optimizer.state().end()) return std::nullopt;
      auto* state = dynamic_cast<torch::optim::SGDParamState*>(it->second.get());
      if (state == nullptr || !state->momentum_buffer().defined()) return std::nullopt;
      momenta.push_back(state->momentum_buffer());
    }
  return momenta;
}

// SGD's parameters, in all its groups; -1 for another optimizer.
std::int64_t sgd_params(torch::optim::Optimizer& optimizer) {
  std::int64_t n = 0;
  for (auto& group : optimizer.param_groups()) {
    if (dynamic_cast<const torch::optim::SGDOptions*>(&group.options()) == nullptr) return -1;
    n += static_cast<std::int64_t>(group.params().size());
  }
  return n;
}

// A replacement's optimizer has no momenta until its first step: zeros for each parameter, so
// that the running ranks' arrive in place rather than in an archive (its serialization and
// back took most of the catch-up).
void make_sgd_momenta(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(torch::zeros_like(p));
      optimizer.state()[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(state);
    }
}

// SGD's options per group (lr, momentum, dampening, weight decay, nesterov): a scheduler may
// have changed them, and the in-place catch-up carries no archive that would.
at::Tensor sgd_options(torch::optim::Optimizer& optimizer) {
  std::vector<double> values;
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    values.insert(values.end(), {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov() ? 1.0 : 0.0});
  }
  return torch::tensor(values, torch::kDouble);
}

void set_sgd_options(torch::optim::Optimizer& optimizer, const at::Tensor& values) {
  const auto* v = values.data_ptr<double>();
  for (auto& group : optimizer.param_groups()) {
    auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    o.lr(v[0]).momentum(v[1]).dampening(v[2]).weight_decay(v[3]).nesterov(v[4] != 0);
    v += 5;
  }
}

// `tensors` (the same shapes on every rank) from `source`, straight into each rank's own: no
// flat copy on either side, whose fresh memory costs more than the transfer (the first touch of
// 269 MB took 1.0-1.2 s on a 2-core guest, the transfer into memory in use 0.1 s). The bytes
// sent. A loss meanwhile leaves a rank behind part-way: Impl::transferring says so.
std::size_t receive_in_place(const std::vector<at::Tensor>& tensors, int source) {
  torch::NoGradGuard no_grad;
  std::size_t bytes = 0;
  for (const auto& t : tensors) {
    auto target = t.detach();
    if (target.is_contiguous()) {
      broadcast(target, source);
    } else {
      auto staged = target.contiguous();
      broadcast(staged, source);
      target.copy_(staged);
    }
    bytes += static_cast<std::size_t>(target.nbytes());
  }
  return bytes;
}

// What each rank says after a re-form, in one all_gather. A unit is a committed step or a
// completed retry() block: every rank runs the same sequence of them, and a loss can leave one
// rank a unit ahead of another (a collective that completed here and raised there).
struct Said {
  std::int64_t units, last_was_step, steps, in_step, hash, epoch, global, at_end, samples, redone, momenta;
  std::int64_t transferring;  // a catch-up to this many units was cut short here (0: none)
  std::int64_t fresh;         // a replacement: none of the job's state yet (it takes it all)
  std::int64_t params;        // its SGD's parameters (-1: another optimizer)
  static constexpr std::int64_t kFields = 14;
};

}  // namespace

struct Recovery::Impl {
  torch::nn::Module* module;
  torch::optim::Optimizer* optimizer;
  std::shared_ptr<TorchDistributedSampler> sampler;
  std::int64_t steps = 0, redone = 0, samples = 0, reforms = 0;
  std::int64_t units = 0;      // steps committed and retry() blocks completed (Said)
  // A catch-up in place writes into the model and optimizer as it receives: while it runs (and
  // after a loss cut it short) the units it brings this rank to; 0 otherwise.
  std::int64_t transferring = 0;
  bool last_was_step = false;  // the last unit
  bool fresh = false;          // a replacement that has not taken the job's state yet
  SamplerMark mark;  // the loader after the last committed step
  // The buffers and the CPU generator as the last committed step left them: a step's forward
  // updates them (BatchNorm's running statistics, dropout's draws) before its collectives, so
  // a step a loss interrupted is undone here, and its redo draws what it would have drawn.
  std::vector<at::Tensor> buffers, saved;
  at::Tensor saved_rng;
  std::function<void(const ReformResult&)> on_reform;
  // A replacement's join, whose on_reform comes at its first step() or retry(): the running
  // ranks call theirs at the end of the re-form that admitted it, and it may hold collectives.
  std::optional<ReformResult> joined;
  ReformResult last_reform;
  Recovery::Times times;

  void commit();
  void save_step_start();
  void undo_step();
  // `lost`: what raised, where a loss interrupted this rank; null where it admits a replacement.
  bool recover(const PeerLostError* lost, bool in_step);
  void join_running();
  void joined_call();
  bool reconcile(bool in_step);
  std::function<void()> receive(int source, bool in_place);
  at::Tensor generator_of(int source);
  void set_generator(const at::Tensor& state);
  // SGD's momenta a rank has (the in-place catch-up needs the same on every rank); -1: another kind.
  std::int64_t momenta_count() const {
    const auto momenta = sgd_momenta(*optimizer);
    return momenta ? static_cast<std::int64_t>(momenta->size()) : -1;
  }
  std::string state_bytes() const;
  void load_state(const std::string& bytes);
};

void Recovery::Impl::save_step_start() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers.size(); ++i) saved[i].copy_(buffers[i]);
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  saved_rng = generator.get_state();
}

void Recovery::Impl::undo_step() {
  torch::NoGradGuard no_grad;
  // The interrupted backward's gradients, some averaged and some not: a step that zeroes them
  // at its end rather than its start must not redo on top of them.
  for (auto& p : module->parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  generator.set_state(saved_rng);
}

void Recovery::Impl::commit() {
  const auto now = SamplerAccess::mark(*sampler);
  samples += static_cast<std::int64_t>(now.epoch == mark.epoch ? now.global - mark.global : now.global);
  mark = now;
  ++steps;
  ++units;
  last_was_step = true;
}

// The re-form, then the reconcile, again as long as peers keep being lost meanwhile. True where
// the step this rank was in was committed by another, and this rank took it from there.
bool Recovery::Impl::recover(const PeerLostError* lost, bool in_step) {
  bool caught_up = false;
  bool admitting = lost == nullptr;
  for (;;) {
    try {
      ReformResult result;
      const auto start = std::chrono::steady_clock::now();
      try {
        result = admitting ? admit_replacements() : reform();
      } catch (const PeerLostError&) {
        throw;
      } catch (const Error& e) {
        if (lost == nullptr) throw;
        throw Error(lost->site(), lost->detail() + " (not recovered: " + e.detail() + ")");
      }
      ++reforms;
      const auto formed = std::chrono::steady_clock::now();
      caught_up = reconcile(in_step) || caught_up;
      in_step = false;  // reconciled: a later pass (another loss) neither redoes nor counts it again
      detail::after_reform(*module);
      times.reform = std::chrono::duration<double>(formed - start).count();
      times.reconcile = std::chrono::duration<double>(std::chrono::steady_clock::now() - formed).count();
      last_reform = result;
      if (on_reform) on_reform(result);
      return caught_up;
    } catch (const PeerLostError&) {
      admitting = false;  // another peer lost while re-forming: re-form again, without it
      continue;
    }
  }
}

// A replacement (idist::is_replacement), at its Recovery's construction: the running ranks
// admit it at a step boundary (step()) or in a re-form after a loss, and reconcile with it
// there; it takes the whole state from one of them, as a rank behind does.
void Recovery::Impl::join_running() {
  fresh = true;
  const auto start = std::chrono::steady_clock::now();
  // Asks to join now, set up: the running ranks admit it at their next step boundary.
  joined = replacement_joined();
  const auto admitted = std::chrono::steady_clock::now();
  try {
    reconcile(/*in_step=*/false);
    detail::after_reform(*module);
    times.reform = std::chrono::duration<double>(admitted - start).count();
    times.reconcile = std::chrono::duration<double>(std::chrono::steady_clock::now() - admitted).count();
  } catch (const PeerLostError& lost) {
    recover(&lost, /*in_step=*/false);  // re-forms, and reconciles as fresh again
    joined = last_reform;
    joined->old_rank = -1;
    joined->lost.clear();
    joined->joined = {get_rank()};
    replacement_caught_up();
    return;
  }
  replacement_caught_up();
}

bool Recovery::Impl::reconcile(bool in_step) {
  const std::vector<std::int64_t> mine{units, last_was_step ? 1 : 0, steps, in_step ? 1 : 0, replica_hash(*module),
                                       static_cast<std::int64_t>(mark.epoch), static_cast<std::int64_t>(mark.global),
                                       mark.at_end ? 1 : 0, samples, redone,
                                       static_cast<std::int64_t>(momenta_count()), transferring, fresh ? 1 : 0,
                                       sgd_params(*optimizer)};
  const auto all = all_gather(torch::tensor(mine)).contiguous();
  std::vector<Said> said(static_cast<std::size_t>(all.numel() / Said::kFields));
  std::memcpy(said.data(), all.data_ptr<std::int64_t>(), said.size() * sizeof(Said));
  int source = -1;  // the first rank of those furthest on (a replacement is never one)
  for (std::size_t r = 0; r < said.size(); ++r)
    if (said[r].fresh == 0 && (source < 0 || said[r].units > said[static_cast<std::size_t>(source)].units))
      source = static_cast<int>(r);
  if (source < 0)
    refuse("Recovery", "internal: every rank of the world is a replacement, and none has the job's state");
  const auto top = said[static_cast<std::size_t>(source)];
  const auto name = [&](std::size_t r) { return "rank " + std::to_string(r); };
  bool behind = false, redo = false, in_place = true;
  for (std::size_t r = 0; r < said.size(); ++r) {
    const auto& s = said[r];
    const bool makes_momenta = s.fresh != 0 && s.momenta == 0 && s.params == top.momenta;  // make_sgd_momenta
    in_place = in_place && s.momenta >= 0 && (s.momenta == top.momenta || makes_momenta);
    if (s.fresh != 0) {  // takes everything, whatever its counters say
      behind = true;
      continue;
    }
    if (s.transferring > top.units)
      refuse("Recovery", name(r) + " was taking step " + std::to_string(s.transferring) + " in place when the ranks " +
                             "that had it were lost: its model is part-way between two steps, and no rank can send " +
                             "it again, so the job cannot go on (idist-run --max-restarts restarts it from its last " +
                             "checkpoint)");
    if (s.units < top.units - 1)
      refuse("Recovery", name(r) + " is " + std::to_string(top.units - s.units) + " steps or retry() blocks behind rank " +
                             std::to_string(source) + " (a retry() block with no collective lets ranks drift apart), " +
                             "which it cannot run alone: the job cannot go on");
    if (s.units == top.units - 1 && top.last_was_step == 0)
      refuse("Recovery", "a peer was lost while a retry() block completed on rank " + std::to_string(source) +
                             " and raised on " + name(r) + ", which cannot run it again alone: the job cannot go on " +
                             "(idist-run --max-restarts restarts it from its last checkpoint)");
    if (s.units == top.units && s.hash != top.hash)
      refuse("Recovery", "the replicas differ after step " + std::to_string(top.steps) + ": " + name(r) +
                             "'s parameters are not rank " + std::to_string(source) +
                             "'s (was a collective run after optimizer.step() inside step()?)");
    behind = behind || s.units < top.units;
    redo = redo || (s.units == top.units && s.in_step != 0);
  }
  // In place, a rank behind receives straight into its model and optimizer, and says so
  // (transferring) until its counters follow: a loss that cuts the transfer short leaves it
  // part-way, which the next reconcile sends again from a rank that has the step, or refuses
  // where none is left. Through the archive everything arrives before anything is applied.
  times.caught_up_bytes = 0;
  const bool caught_up = fresh || units < top.units;
  if (caught_up && in_place) transferring = top.units;
  if (fresh && in_place && momenta_count() == 0 && top.momenta > 0) make_sgd_momenta(*optimizer);
  std::function<void()> apply;
  if (behind) apply = receive(source, in_place);
  auto rng = generator_of(source);
  if (caught_up) apply();
  set_generator(rng);
  transferring = 0;
  fresh = false;
  units = top.units;
  last_was_step = top.last_was_step != 0;
  steps = top.steps;
  samples = top.samples;
  redone = top.redone + (redo ? 1 : 0);
  mark = {.epoch = static_cast<std::uint64_t>(top.epoch), .global = static_cast<std::uint64_t>(top.global),
          .at_end = top.at_end != 0};
  SamplerAccess::follow_world();  // the program's other loaders, at their next epoch
  SamplerAccess::resplit(*sampler, mark);
  // Every rank raises where the step taken does not match (a collective, so none goes on alone).
  const bool wrong = caught_up && replica_hash(*module) != top.hash;
  if (behind && all_reduce(std::int64_t{wrong ? 1 : 0}, ReduceOp::MAX) != 0)
    refuse("Recovery", "internal: the step taken from rank " + std::to_string(source) + " does not match its hash");
  return caught_up;
}

// Every rank goes on with the CPU generator of `source` (rank 0 unless it was behind), as after
// a restart from a Checkpoint, which loads the writer's everywhere: the ranks drew from their own
// for shares of unequal sizes, which the new world splits otherwise.
at::Tensor Recovery::Impl::generator_of(int source) {
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard lock(generator.mutex());
    state = generator.get_state();
  }
  broadcast(state, source);
  return state;
}

void Recovery::Impl::set_generator(const at::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  generator.set_state(state);
}

// What the ranks behind need of the last step, from `source`, over the collective transport:
// in place where every rank's optimizer is SGD with momenta for all (no serialization), else in
// torch's archive. Returns what applies it on a rank behind.
std::function<void()> Recovery::Impl::receive(int source, bool in_place) {
  std::size_t bytes = 0;
  std::function<void()> apply;
  if (in_place) {
    std::vector<at::Tensor> tensors;
    for (const auto& p : module->parameters()) tensors.push_back(p);
    for (const auto& b : module->buffers()) tensors.push_back(b);
    const auto momenta = sgd_momenta(*optimizer);  // every rank has them (reconcile)
    tensors.insert(tensors.end(), momenta->begin(), momenta->end());
    bytes = receive_in_place(tensors, source);
    auto options = sgd_options(*optimizer);
    broadcast(options, source);
    apply = [this, options] { set_sgd_options(*optimizer, options); };
  } else {
    std::string state;
    if (get_rank() == source) state = state_bytes();
    auto size = torch::tensor({static_cast<std::int64_t>(state.size())});
    broadcast(size, source);
    state.resize(static_cast<std::size_t>(size.item<std::int64_t>()));
    broadcast(torch::from_blob(state.data(), {size.item<std::int64_t>()}, torch::kUInt8), source);
    bytes = state.size();
    apply = [this, state = std::move(state)] { load_state(state); };
  }
  return [this, bytes, apply = std::move(apply)] {
    apply();
    times.caught_up_bytes = bytes;
  };
}

std::string Recovery::Impl::state_bytes() const {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model(archive.compilation_unit()), optim(archive.compilation_unit());
  detail::write_module(model, *module);
  optimizer->save(optim);
  archive.write("model", model);
  archive.write("optimizer", optim);
  std::string bytes;
  archive.save_to([&](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

void Recovery::Impl::load_state(const std::string& bytes) {
  torch::serialize::InputArchive archive, model, optim;
  archive.load_from(bytes.data(), bytes.size());
  archive.read("model", model);
  archive.read("optimizer", optim);
  detail::read_module(model, *module, "model: ");
  optimizer->load(optim);
}

Recovery::Recovery(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                   std::unique_ptr<TorchDistributedSampler> sampler, std::size_t workers,
                   const RecoveryOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (!sampler)
    refuse("Recovery", "the loader is not one made by idist::auto_dataloader: its batches cannot be re-split");
  if (workers > 0)
    refuse("Recovery", "the loader has " + std::to_string(workers) +
                           " worker thread(s), which read ahead of a re-split: make it with num_workers = 0");
  if (get_world_size() > 1 && !detail::is_data_parallel(module))
    refuse("Recovery", "the model is not data-parallel: wrap it with idist::auto_model first");
  // Live recovery re-forms worlds gloo carries (docs/RECOVERY.md); nccl has no abort to re-form with yet.
  if (backend() == "nccl")
    refuse("Recovery", "live recovery runs on the gloo backend (CPU tensors); the nccl backend cannot re-form a world yet");
  for (const auto& p : module.parameters())
    if (!p.device().is_cpu())
      refuse("Recovery", "a parameter is on " + p.device().str() + ": live recovery runs on CPU tensors (the gloo backend)");
  if (options.steps < 0) refuse("Recovery", "RecoveryOptions::steps is " + std::to_string(options.steps) + ", below 0");
  impl_->steps = options.steps;
  impl_->module = &module;
  impl_->optimizer = &optimizer;
  impl_->sampler = std::move(sampler);
  impl_->mark = SamplerAccess::mark(*impl_->sampler);
  for (const auto& b : module.buffers()) {
    impl_->buffers.push_back(b);
    impl_->saved.push_back(b.detach().clone());
  }
  // Its step() admits replacements: idist-run may start one in a lost rank's place. Said before
  // a replacement joins, so that it counts as admitting once it is a member.
  will_admit_replacements();
  if (is_replacement()) impl_->join_running();
}

Recovery::~Recovery() { will_admit_replacements(false); }

void Recovery::Impl::joined_call() {
  if (!joined) return;
  const auto result = *std::exchange(joined, std::nullopt);
  if (on_reform) on_reform(result);
}

bool Recovery::step(const std::function<void()>& fn) {
  impl_->joined_call();
  // A replacement waits, as every rank heard in the last step's buckets: admitted here, before
  // this step, as a re-form (false: the loop's next batch is this one, split over the world
  // with it). The replacement's loop starts at the same batch (join_running).
  if (detail::replacement_agreed(*impl_->module)) {
    impl_->recover(nullptr, /*in_step=*/false);
    return false;
  }
  impl_->save_step_start();
  try {
    fn();
  } catch (const PeerLostError& lost) {
    impl_->undo_step();
    // Caught up: the step was committed by a rank that got further, and taken from it.
    return impl_->recover(&lost, /*in_step=*/true);
  }
  impl_->commit();
  return true;
}

void Recovery::retry_void(const std::function<void()>& fn) {
  impl_->joined_call();
  for (;;) {
    try {
      fn();
      ++impl_->units;
      impl_->last_was_step = false;
      return;
    } catch (const PeerLostError& lost) {
      impl_->recover(&lost, /*in_step=*/false);
    }
  }
}

std::int64_t Recovery::steps() const { return impl_->steps; }
std::int64_t Recovery::redone() const { return impl_->redone; }
std::int64_t Recovery::samples() const { return impl_->samples; }
std::int64_t Recovery::reforms() const { return impl_->reforms; }
Recovery::Times Recovery::last_recovery() const { return impl_->times; }
void Recovery::on_reform(std::function<void(const ReformResult&)> callback) { impl_->on_reform = std::move(callback); }

}  // namespace idist

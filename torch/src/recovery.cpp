// Recovery (recovery.hpp): a step that a lost peer interrupted, recovered in place. After
// idist::reform(), reconcile() is the part the library's re-form cannot do: the survivors may be
// one step apart (a step's last all_reduce can complete on one rank and raise on another, and
// the first then steps), so they agree on the highest step committed, bring the ranks behind
// level with it from one that has it, and re-split the loaders at the batch after it.
#include "idist/recovery.hpp"

#include <torch/serialize.h>

#include <bit>
#include <cstring>
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

// Parameters and buffers, bit for bit (FNV-1a over 8-byte words, then the tail): replicas at
// the same step must agree on it.
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
  for (const auto& b : module.buffers()) mix(b);
  return std::bit_cast<std::int64_t>(h);
}

// What each rank says after a re-form, in one all_gather.
struct Said {
  std::int64_t steps, in_step, hash, epoch, global, at_end, samples, redone;
  static constexpr std::int64_t kFields = 8;
};

}  // namespace

struct Recovery::Impl {
  torch::nn::Module* module;
  torch::optim::Optimizer* optimizer;
  std::shared_ptr<TorchDistributedSampler> sampler;
  std::int64_t steps = 0, redone = 0, samples = 0, reforms = 0;
  SamplerMark mark;  // the loader after the last committed step
  // The buffers as the last committed step left them: a step's forward updates them (BatchNorm's
  // running statistics) before its collectives, so a step a loss interrupted is undone here.
  std::vector<at::Tensor> buffers, saved;
  std::function<void(const ReformResult&)> on_reform;

  void commit();
  void save_buffers();
  void restore_buffers();
  void recover(const PeerLostError& lost, bool in_step);
  void reconcile(bool in_step);
  std::string state_bytes() const;
  void load_state(const std::string& bytes);
};

void Recovery::Impl::save_buffers() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers.size(); ++i) saved[i].copy_(buffers[i]);
}

void Recovery::Impl::restore_buffers() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
}

void Recovery::Impl::commit() {
  const auto now = SamplerAccess::mark(*sampler);
  samples += static_cast<std::int64_t>(now.epoch == mark.epoch ? now.global - mark.global : now.global);
  mark = now;
  ++steps;
}

// The re-form, then the reconcile, again as long as peers keep being lost meanwhile.
void Recovery::Impl::recover(const PeerLostError& lost, bool in_step) {
  for (;;) {
    try {
      ReformResult result;
      try {
        result = reform();
      } catch (const PeerLostError&) {
        throw;
      } catch (const Error& e) {
        throw Error(lost.site(), lost.detail() + " (not recovered: " + e.detail() + ")");
      }
      ++reforms;
      reconcile(in_step);
      detail::after_reform(*module);
      if (on_reform) on_reform(result);
      return;
    } catch (const PeerLostError&) {
      continue;  // another peer lost while re-forming: re-form again
    }
  }
}

void Recovery::Impl::reconcile(bool in_step) {
  const auto hash = replica_hash(*module);
  const Said mine{steps, in_step ? 1 : 0, hash, static_cast<std::int64_t>(mark.epoch),
                  static_cast<std::int64_t>(mark.global), mark.at_end ? 1 : 0, samples, redone};
  const auto all = all_gather(torch::tensor({mine.steps, mine.in_step, mine.hash, mine.epoch, mine.global, mine.at_end,
                                             mine.samples, mine.redone}));
  std::vector<Said> said(static_cast<std::size_t>(all.numel() / Said::kFields));
  std::memcpy(said.data(), all.contiguous().data_ptr<std::int64_t>(), said.size() * sizeof(Said));
  int source = 0;
  for (std::size_t r = 0; r < said.size(); ++r)
    if (said[r].steps > said[static_cast<std::size_t>(source)].steps) source = static_cast<int>(r);
  const auto& top = said[static_cast<std::size_t>(source)];
  bool behind = false, redo = false;
  for (std::size_t r = 0; r < said.size(); ++r) {
    const auto& s = said[r];
    if (s.steps < top.steps - 1)
      refuse("Recovery", "internal: rank " + std::to_string(r) + " has committed " + std::to_string(s.steps) +
                             " steps and rank " + std::to_string(source) + " " + std::to_string(top.steps) +
                             ": more than one step apart");
    if (s.steps == top.steps && s.hash != top.hash)
      refuse("Recovery", "the replicas differ after step " + std::to_string(top.steps) + ": rank " + std::to_string(r) +
                             "'s parameters and buffers are not rank " + std::to_string(source) +
                             "'s (was a collective run after optimizer.step() inside step()?)");
    behind = behind || s.steps < top.steps;
    redo = redo || (s.steps == top.steps && s.in_step != 0);
  }
  if (behind) {
    // The ranks behind take the step from the source, over the collective transport.
    std::string bytes;
    if (get_rank() == source) bytes = state_bytes();
    auto size = torch::tensor({static_cast<std::int64_t>(bytes.size())});
    broadcast(size, source);
    bytes.resize(static_cast<std::size_t>(size.item<std::int64_t>()));
    broadcast(torch::from_blob(bytes.data(), {size.item<std::int64_t>()}, torch::kUInt8), source);
    if (steps < top.steps) {
      load_state(bytes);
      if (replica_hash(*module) != top.hash)
        refuse("Recovery", "internal: the step taken from rank " + std::to_string(source) + " does not match its hash");
    }
  }
  steps = top.steps;
  samples = top.samples;
  redone = top.redone + (redo ? 1 : 0);
  mark = {.epoch = static_cast<std::uint64_t>(top.epoch), .global = static_cast<std::uint64_t>(top.global),
          .at_end = top.at_end != 0};
  SamplerAccess::resplit(*sampler, mark);
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
}

Recovery::~Recovery() = default;

bool Recovery::step(const std::function<void()>& fn) {
  impl_->save_buffers();
  try {
    fn();
  } catch (const PeerLostError& lost) {
    impl_->restore_buffers();
    impl_->recover(lost, /*in_step=*/true);
    return false;
  }
  impl_->commit();
  return true;
}

void Recovery::retry_void(const std::function<void()>& fn) {
  for (;;) {
    try {
      fn();
      return;
    } catch (const PeerLostError& lost) {
      impl_->recover(lost, /*in_step=*/false);
    }
  }
}

std::int64_t Recovery::steps() const { return impl_->steps; }
std::int64_t Recovery::redone() const { return impl_->redone; }
std::int64_t Recovery::samples() const { return impl_->samples; }
std::int64_t Recovery::reforms() const { return impl_->reforms; }
void Recovery::on_reform(std::function<void(const ReformResult&)> callback) { impl_->on_reform = std::move(callback); }

}  // namespace idist

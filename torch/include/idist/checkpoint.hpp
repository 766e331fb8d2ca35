#pragma once
// idist::Checkpoint: ignite's Checkpoint handler for libtorch programs. It saves the training
// state (modules, optimizers, auto_dataloader's position in its epoch, counters such as the
// step, and the CPU random generator) written by one rank, and loads it on every rank:
//
//   idist::Checkpoint checkpoint({.dir = "ckpt", .keep = 2});
//   std::int64_t step = 0;
//   checkpoint.add("model", model).add("optimizer", optimizer).add("loader", loader).add("step", step);
//   checkpoint.load_latest();                 // a restart resumes where the last save left it
//   for (...) { ...; ++step; if (step % 100 == 0) checkpoint.save(step); }
//
// save() blocks only while it copies the state in memory; the writer rank then writes the copy
// beside training, to a temporary file renamed into place once it is on disk (a crash leaves
// the previous checkpoints whole), and removes all but the newest `keep`. One write at a time:
// a save() while the last write is still going waits for it first. A write that failed raises
// at the next save() or wait(); one nobody waited for ends the process with exit 1 and one
// line, rather than exit 0 with a checkpoint missing.
//
// load_latest() is a collective: the writer rank reads the newest checkpoint that loads (a
// damaged one is skipped with a warning) and broadcasts it, so the other ranks need not see
// the directory (no shared file system needed) and every replica gets the same bytes. A rank
// idist-run started in a lost one's place (idist::is_replacement) loads nothing: the running
// ranks call none of it, and idist::Recovery gives it their state.
//
// Files are <prefix>_<step>.pt, each an archive torch::load can read: one entry per name
// added, a module's entry laid out as Module::save lays it out.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "idist/torch.hpp"

namespace idist {

struct CheckpointOptions {
  std::filesystem::path dir;          // created at the first save
  std::size_t keep = 2;               // ignite's n_saved: the newest ones kept
  std::string prefix = "checkpoint";  // the files: <prefix>_<step>.pt
  int writer = 0;                     // the rank that writes, and reads for load_latest()
};

class IDIST_API Checkpoint {
 public:
  explicit Checkpoint(CheckpointOptions options);
  ~Checkpoint();  // waits for the write in flight
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // What is saved, by name (the same names in the same program: they are the file's keys).
  // The objects must outlive the Checkpoint.
  Checkpoint& add(const std::string& name, torch::nn::Module& module);
  Checkpoint& add(const std::string& name, torch::optim::Optimizer& optimizer);
  Checkpoint& add(const std::string& name, std::int64_t& counter);
  template <class M>
    requires std::derived_from<M, torch::nn::Module> || std::derived_from<M, torch::optim::Optimizer>
  Checkpoint& add(const std::string& name, const std::shared_ptr<M>& object) {
    return add(name, *object);
  }
  template <class H>
    requires std::derived_from<H, torch::nn::ModuleHolder<typename H::ContainedType>>
  Checkpoint& add(const std::string& name, const H& holder) {
    return add(name, *holder.ptr());
  }
  // A loader made by auto_dataloader: its epoch and position in it (exact with num_workers 0).
  template <class Loader>
  Checkpoint& add(const std::string& name, const std::unique_ptr<Loader>& loader) {
    return add_loader(name, detail::loader_sampler(loader.get()));
  }

  // Call on every rank at the same step: the writer copies and writes; the others return.
  void save(std::int64_t step);
  // Every rank: restores the newest checkpoint and returns its step; nullopt (nothing changed)
  // when the directory holds none.
  std::optional<std::int64_t> load_latest();
  // The write in flight is on disk (raises if it failed).
  void wait();
  // The seconds the last save() blocked, and those its copy took (for the curious and tests).
  double last_save_blocked() const;
  double last_copy() const;

 private:
  Checkpoint& add_loader(const std::string& name, std::unique_ptr<TorchDistributedSampler> sampler);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idist

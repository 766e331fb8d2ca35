// Checkpoint (checkpoint.hpp): the copy that save() blocks for, the write beside training, and
// load_latest()'s read on one rank and broadcast to the others.
//
// The copy: a module's parameters and buffers are cloned. An optimizer writes its state into
// the archive by reference (Optimizer::save), and the live optimizer is then given clones of
// those tensors, so that training goes on in the clones while the archive keeps tensors
// nobody touches any more: one copy either way. For an optimizer whose state we do not know
// (LBFGS, one of the program's own) its archive is serialized at once instead, which blocks
// longer but is as correct.
#include "idist/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/optim.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>
#include <regex>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

#include "checkpoint_files.hpp"
#include "module_archive.hpp"
#include "torch_errors.hpp"

namespace idist {
namespace {

using detail::read_module;
using detail::refuse;
using detail::write_module;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;
using Clock = std::chrono::steady_clock;

constexpr const char* kStepKey = "idist_step";
constexpr const char* kRngKey = "idist_rng";
constexpr const char* kBytesKey = "idist_bytes";  // an optimizer serialized at once

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Calls f on each tensor of an optimizer state of a kind we know (the accessors return
// references); false, calling nothing, for another kind.
template <class F>
bool each_tensor(torch::optim::OptimizerParamState& state, F&& f) {
  using namespace torch::optim;
  if (auto* s = dynamic_cast<SGDParamState*>(&state)) {
    f(s->momentum_buffer());
  } else if (auto* a = dynamic_cast<AdamParamState*>(&state)) {
    f(a->exp_avg()), f(a->exp_avg_sq()), f(a->max_exp_avg_sq());
  } else if (auto* w = dynamic_cast<AdamWParamState*>(&state)) {
    f(w->exp_avg()), f(w->exp_avg_sq()), f(w->max_exp_avg_sq());
  } else if (auto* g = dynamic_cast<AdagradParamState*>(&state)) {
    f(g->sum());
  } else if (auto* r = dynamic_cast<RMSpropParamState*>(&state)) {
    f(r->square_avg()), f(r->momentum_buffer()), f(r->grad_avg());
  } else {
    return false;
  }
  return true;
}

bool known_state(torch::optim::Optimizer& optimizer) {
  return std::all_of(optimizer.state().begin(), optimizer.state().end(),
                     [](auto& entry) { return each_tensor(*entry.second, [](torch::Tensor&) {}); });
}

// Gives the live optimizer clones of its state's tensors (see the header); its states are of
// the kinds known_state() knows.
void detach_state(torch::optim::Optimizer& optimizer) {
  for (auto& entry : optimizer.state())
    each_tensor(*entry.second, [](torch::Tensor& t) {
      if (t.defined()) t = t.clone();
    });
}

void write_optimizer(OutputArchive& archive, const std::string& name, torch::optim::Optimizer& optimizer) {
  OutputArchive sub(archive.compilation_unit());
  if (known_state(optimizer)) {
    optimizer.save(sub);
    detach_state(optimizer);
  } else {
    std::string bytes;
    OutputArchive own;
    optimizer.save(own);
    own.save_to([&](const void* data, std::size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    sub.write(kBytesKey, torch::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, torch::kUInt8).clone(),
              true);
  }
  archive.write(name, sub);
}

void read_optimizer(InputArchive& sub, torch::optim::Optimizer& optimizer) {
  torch::Tensor bytes;
  if (!sub.try_read(kBytesKey, bytes, true)) return optimizer.load(sub);
  InputArchive own;
  own.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  optimizer.load(own);
}

struct Counter {
  std::int64_t* value;
};
using Object = std::variant<torch::nn::Module*, torch::optim::Optimizer*, Counter, std::shared_ptr<TorchDistributedSampler>>;

}  // namespace

struct Checkpoint::Impl {
  CheckpointOptions options;
  std::vector<std::pair<std::string, Object>> objects;
  std::thread writer;
  std::mutex mu;
  std::exception_ptr failed;  // the last write's, not yet raised
  double blocked = 0;
  double copied = 0;

  bool is_writer() const { return get_rank() == options.writer; }

  void join() {
    if (writer.joinable()) writer.join();
  }
  void raise_failure() {
    std::exception_ptr e;
    {
      std::lock_guard lock(mu);
      std::swap(e, failed);
    }
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        refuse("checkpoint", x.what());
      }
    }
  }
  void add(const std::string& name, Object object);
  std::shared_ptr<OutputArchive> copy(std::int64_t step);
  void apply(InputArchive& archive, const std::string& file);
};

void Checkpoint::Impl::add(const std::string& name, Object object) {
  static const std::regex valid("[A-Za-z_][A-Za-z0-9_]*");
  if (!std::regex_match(name, valid) || name.rfind("idist_", 0) == 0)
    refuse("checkpoint", "the name '" + name + "' is not usable: letters, digits and _ (not starting with idist_)");
  for (const auto& o : objects)
    if (o.first == name) refuse("checkpoint", "the name '" + name + "' was added twice");
  objects.emplace_back(name, std::move(object));
}

std::shared_ptr<OutputArchive> Checkpoint::Impl::copy(std::int64_t step) {
  auto archive = std::make_shared<OutputArchive>();
  archive->write(kStepKey, torch::tensor(step), true);
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    archive->write(kRngKey, generator.get_state(), true);
  }
  for (auto& [name, object] : objects) {
    if (auto* m = std::get_if<torch::nn::Module*>(&object)) {
      OutputArchive sub(archive->compilation_unit());
      write_module(sub, **m);
      archive->write(name, sub);
    } else if (auto* o = std::get_if<torch::optim::Optimizer*>(&object)) {
      write_optimizer(*archive, name, **o);
    } else if (auto* c = std::get_if<Counter>(&object)) {
      archive->write(name, torch::tensor(*c->value), true);
    } else {
      OutputArchive sub(archive->compilation_unit());
      std::get<std::shared_ptr<TorchDistributedSampler>>(object)->save(sub);
      archive->write(name, sub);
    }
  }
  return archive;
}

void Checkpoint::Impl::apply(InputArchive& archive, const std::string& file) {
  for (auto& [name, object] : objects) {
    const auto missing = [&] { refuse("checkpoint", file + " has no '" + name + "': was it saved by this program?"); };
    if (auto* c = std::get_if<Counter>(&object)) {
      torch::Tensor value;
      if (!archive.try_read(name, value, true)) missing();
      *c->value = value.item<std::int64_t>();
      continue;
    }
    InputArchive sub;
    if (!archive.try_read(name, sub)) missing();
    if (auto* m = std::get_if<torch::nn::Module*>(&object)) {
      read_module(sub, **m, name + ": ");
    } else if (auto* o = std::get_if<torch::optim::Optimizer*>(&object)) {
      read_optimizer(sub, **o);
    } else {
      std::get<std::shared_ptr<TorchDistributedSampler>>(object)->load(sub);
    }
  }
  torch::Tensor rng;
  if (archive.try_read(kRngKey, rng, true)) {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    generator.set_state(rng);
  }
}

Checkpoint::Checkpoint(CheckpointOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.dir.empty()) refuse("checkpoint", "CheckpointOptions::dir is empty: name the directory to write to");
  if (options.keep == 0) refuse("checkpoint", "CheckpointOptions::keep is 0: keep at least the newest checkpoint");
  if (options.writer < 0 || options.writer >= get_world_size())
    refuse("checkpoint", "CheckpointOptions::writer is " + std::to_string(options.writer) + ", not a rank of this world of " +
                             std::to_string(get_world_size()));
  impl_->options = std::move(options);
  // As ignite's DiskSaver: a directory that cannot be made is told now, not at the first save.
  if (impl_->is_writer()) {
    try {
      checkpoint_files::make_directory(impl_->options.dir);
    } catch (const std::exception& e) {
      refuse("checkpoint", e.what());
    }
  }
}

Checkpoint::~Checkpoint() {
  impl_->join();
  std::lock_guard lock(impl_->mu);
  if (impl_->failed) {
    // A destructor cannot raise, and exit 0 with a checkpoint missing would be a lie.
    try {
      std::rethrow_exception(impl_->failed);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[idist rank %d/%d] checkpoint: %s: exiting with 1 (call Checkpoint::wait() to catch it)\n",
                   get_rank(), get_world_size(), e.what());
    }
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

Checkpoint& Checkpoint::add(const std::string& name, torch::nn::Module& module) {
  impl_->add(name, &module);
  return *this;
}
Checkpoint& Checkpoint::add(const std::string& name, torch::optim::Optimizer& optimizer) {
  impl_->add(name, &optimizer);
  return *this;
}
Checkpoint& Checkpoint::add(const std::string& name, std::int64_t& counter) {
  impl_->add(name, Counter{&counter});
  return *this;
}
Checkpoint& Checkpoint::add_loader(const std::string& name, std::unique_ptr<TorchDistributedSampler> sampler) {
  if (!sampler)
    refuse("checkpoint", "'" + name + "' is not a loader made by idist::auto_dataloader (or it was destroyed): " +
                             "its position cannot be saved");
  impl_->add(name, std::shared_ptr<TorchDistributedSampler>(std::move(sampler)));
  return *this;
}

void Checkpoint::save(std::int64_t step) {
  if (!impl_->is_writer()) return;
  const auto start = Clock::now();
  impl_->join();
  impl_->raise_failure();
  const auto copy_start = Clock::now();
  auto archive = impl_->copy(step);
  impl_->copied = seconds_since(copy_start);
  impl_->writer = std::thread([impl = impl_.get(), archive, step] {
    try {
      checkpoint_files::write(impl->options.dir, impl->options.prefix, step, *archive);
      checkpoint_files::keep_newest(impl->options.dir, impl->options.prefix, impl->options.keep);
    } catch (const std::exception&) {
      std::lock_guard lock(impl->mu);
      impl->failed = std::current_exception();
    }
  });
  impl_->blocked = seconds_since(start);
}

void Checkpoint::wait() {
  impl_->join();
  impl_->raise_failure();
}

double Checkpoint::last_save_blocked() const { return impl_->blocked; }
double Checkpoint::last_copy() const { return impl_->copied; }

std::optional<std::int64_t> Checkpoint::load_latest() {
  wait();
  // A replacement joins ranks that loaded long ago and call none of this: idist::Recovery
  // gives it their state instead.
  if (is_replacement()) return std::nullopt;
  const bool alone = get_world_size() == 1;
  std::string bytes;
  std::string file;
  std::int64_t size = -1;
  if (impl_->is_writer()) {
    if (auto found = checkpoint_files::newest_loadable(impl_->options.dir, impl_->options.prefix)) {
      bytes = std::move(found->bytes);
      file = found->path.filename().string();
      size = static_cast<std::int64_t>(bytes.size());
    }
  }
  if (!alone) {
    auto header = torch::tensor({size});
    broadcast(header, impl_->options.writer);
    size = header[0].item<std::int64_t>();
    if (size >= 0) {
      if (!impl_->is_writer()) bytes.assign(static_cast<std::size_t>(size), '\0');
      broadcast(torch::from_blob(bytes.data(), {size}, torch::kUInt8), impl_->options.writer);
    }
  }
  if (size < 0) return std::nullopt;
  if (file.empty()) file = "the checkpoint from rank " + std::to_string(impl_->options.writer);
  InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  impl_->apply(archive, file);
  torch::Tensor step;
  archive.read(kStepKey, step, true);
  return step.item<std::int64_t>();
}

}  // namespace idist

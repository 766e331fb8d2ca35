// auto_model: what DistributedDataParallel's Reducer does (torch/csrc/distributed/c10d/
// reducer.cpp, and the VLDB 2020 paper), on libidist's collectives.
//
// Each parameter's gradient lives in a slot of a flat bucket: param.grad() is a tensor made
// over the bucket's memory (from_blob, not a view, so that libtorch's zero_grad(), which
// detaches in place, accepts it), so the autograd engine accumulates straight into the
// bucket and nothing is copied in the steady state. A post-hook on each parameter's gradient
// accumulator marks the parameter ready; the bucket whose last parameter is ready is
// all_reduced (AVG) asynchronously, buckets strictly in order so that every rank issues the
// same collectives in the same order; the engine's final callback launches what is left,
// waits for every bucket, and checks for parameters that got no gradient.
//
// Unused parameters: a rank learns that a parameter got no gradient only at backward's end.
// Every bucket carries one more element, the count of ranks that found an unused parameter in
// it, averaged with the rest: after the waits, every rank sees the same flags, so every rank
// either raises (naming the parameter) or reduces the unused ones as zeros, never a hang.
// And one more, non-zero where a rank heard of a replacement waiting to join (live recovery):
// every rank then sees it after the same step, which is where idist::Recovery admits it.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "idist/torch.hpp"
#include "batch_weight.hpp"
#include "replica_check.hpp"
#include "torch_errors.hpp"

namespace idist {
namespace {

using Clock = std::chrono::steady_clock;
using detail::refuse;
using detail::verify_replicas;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A failure inside auto_model's own collectives, named as the user knows them: "auto_model
// bucket 0 (fc2.weight, fc2.bias, ...): <why>", kept a TimeoutError or a PeerLostError where
// it was one.
[[noreturn]] void rethrow_in(const Error& e, const std::string& what) {
  const auto detail = what + ": " + e.detail();
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) throw TimeoutError(e.site(), detail);
  if (const auto* lost = dynamic_cast<const PeerLostError*>(&e)) throw PeerLostError(e.site(), detail, lost->lost_rank());
  throw Error(e.site(), detail);
}

template <class F>
void labelled(const std::string& what, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    rethrow_in(e, what);
  }
}

std::string first_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < std::min<std::size_t>(names.size(), 3); ++i) out += (i ? ", " : "") + names[i];
  return names.size() > 3 ? out + ", ..." : out;
}

// Tensors of one dtype and device, broadcast as one flat tensor from rank 0: replicas'
// parameters at wrap, buffers after every backward.
class Coalesced {
 public:
  explicit Coalesced(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
    std::int64_t total = 0;
    for (const auto& t : tensors_) total += t.numel();
    flat_ = at::empty({total}, tensors_.front().options().requires_grad(false));
  }
  void broadcast_from(int src) {
    at::NoGradGuard no_grad;
    std::int64_t at = 0;
    const bool source = get_rank() == src;
    if (source)
      for (const auto& t : tensors_) {
        flat_.narrow(0, at, t.numel()).copy_(t.reshape({-1}));
        at += t.numel();
      }
    idist::broadcast(flat_, src);
    if (source) return;
    at = 0;
    for (const auto& t : tensors_) {
      t.copy_(flat_.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }

 private:
  std::vector<at::Tensor> tensors_;
  at::Tensor flat_;
};

std::vector<Coalesced> coalesce(const std::vector<at::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors)
    if (t.numel() > 0) groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  std::vector<Coalesced> out;
  for (auto& [key, group] : groups) out.emplace_back(std::move(group));
  return out;
}

class Reducer {
 public:
  Reducer(torch::nn::Module& module, const AutoModelOptions& options) : options_(options) {
    // A replacement joins a job whose ranks wrapped long ago and call none of this: it takes
    // their model when idist::Recovery brings it level.
    const bool replacement = idist::is_replacement();
    if (!replacement) verify_replicas(module);
    std::unordered_set<const void*> seen;
    std::vector<at::Tensor> frozen;  // parameters without a gradient: not reduced, but made equal
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const auto& p = item.value();
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      if (!p.requires_grad()) {
        frozen.push_back(p);
        continue;
      }
      check_parameter(item.key(), p);
      auto& param = params_.emplace_back();
      param.tensor = p;
      param.name = item.key();
    }
    if (params_.empty()) refuse("auto_model", "the module has no parameter that requires a gradient");
    std::vector<at::Tensor> buffers;
    for (const auto& item : module.named_buffers(/*recurse=*/true))
      if (seen.insert(item.value().unsafeGetTensorImpl()).second) buffers.push_back(item.value());
    if (options_.broadcast_buffers && !buffers.empty()) buffers_ = coalesce(buffers);

    // Replicas start equal: rank 0's parameters and buffers everywhere.
    std::vector<at::Tensor> all;
    for (const auto& p : params_) all.push_back(p.tensor);
    all.insert(all.end(), frozen.begin(), frozen.end());
    all.insert(all.end(), buffers.begin(), buffers.end());
    if (!replacement)
      labelled("auto_model's broadcast of rank 0's parameters and buffers at wrap", [&] {
        for (auto& c : coalesce(all)) c.broadcast_from(0);
      });
    replica_ = std::move(all);

    // Reverse registration order: roughly the order in which backward produces gradients.
    std::vector<std::size_t> order(params_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
    initial_order_ = order;
    assign_buckets(order);

    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(params_[i].tensor);
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            on_gradient(i);
            return outputs;
          }));
      params_[i].accumulator = std::move(accumulator);  // kept, or the hook goes with it
    }
  }

  void set_sync(bool enabled) {
    std::lock_guard lock(mu_);
    sync_ = enabled;
  }

  // --- idist::join: DDP's Join (torch/distributed/algorithms/join.py and DDP's join hook) ---
  // While a join is on, every synced backward begins with an all_gather of who is still in
  // its loop; a rank whose loop has ended answers it, and shadows the iteration's gradient
  // all_reduces (with zeros) and buffer broadcasts, until none is left in its loop.
  void begin_join(const JoinOptions& options) {
    std::lock_guard lock(mu_);
    if (join_) refuse("join", "a join is already on for this model");
    join_ = JoinState{.options = options};
  }
  void abandon_join() {
    std::lock_guard lock(mu_);
    join_.reset();
  }
  // One iteration of the ranks still in their loop, shadowed; false once every rank has joined.
  bool shadow_iteration() {
    std::lock_guard lock(mu_);
    if (!agree_on_active(false)) return false;
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      buckets_[i].flat.zero_();  // this rank contributes nothing; its own gradients are not used
      buckets_[i].work = idist::iall_reduce(buckets_[i].flat, {.op = ReduceOp::AVG});
    }
    finish_iteration({});
    return true;
  }
  // DDP's _sync_final_model: the highest rank among the last to join holds the model every
  // rank ends with (the others stopped stepping when their loop ended).
  void finish_join(bool last_joiner) {
    std::lock_guard lock(mu_);
    join_.reset();
    const auto authority = idist::all_reduce(std::int64_t{last_joiner ? get_rank() : -1}, ReduceOp::MAX);
    labelled("join's broadcast of the final model from rank " + std::to_string(authority), [&] {
      for (auto& c : coalesce(replica_)) c.broadcast_from(static_cast<int>(authority));
    });
  }

  // After a re-form (Recovery): no iteration is in flight, and every rank of the new world has
  // the same buckets. The first iteration ends with a broadcast of the bucket order, which can
  // complete on its source and fail elsewhere; where any rank has not rebuilt, all go back to
  // the first layout and rebuild together at the next iteration.
  void after_reform() {
    std::lock_guard lock(mu_);
    if (join_) refuse("Recovery", "a peer was lost inside idist::join, which live recovery does not support");
    reset_iteration();
    sync_ = true;
    admit_ = false;
    const auto all_rebuilt = idist::all_reduce(std::int64_t{stats_.iterations > 0 ? 1 : 0}, ReduceOp::MIN);
    if (all_rebuilt == 0 && stats_.iterations > 0) {
      assign_buckets(initial_order_);
      stats_.iterations = 0;
      stats_.bucket_rebuilds = 0;
    }
  }

  bool broadcasts_buffers() const { return options_.broadcast_buffers; }

  // Whether the last synced backward's buckets said that a replacement waits (on every rank
  // alike), cleared by asking.
  bool take_admission() {
    std::lock_guard lock(mu_);
    return std::exchange(admit_, false);
  }

  DataParallelStats stats() const {
    std::lock_guard lock(mu_);
    DataParallelStats s = stats_;
    s.bucket_bytes.clear();
    s.bucket_parameters.clear();
    for (const auto& b : buckets_) {
      s.bucket_bytes.push_back(static_cast<std::size_t>(b.flat.nbytes()) - 2 * b.flat.element_size());
      auto& names = s.bucket_parameters.emplace_back();
      for (auto i : b.params) names.push_back(params_[i].name);
    }
    return s;
  }

 private:
  struct Param {
    at::Tensor tensor;
    std::string name;
    std::shared_ptr<torch::autograd::Node> accumulator;
    std::size_t bucket = 0;
    at::Tensor slot;  // the gradient's place in its bucket, the parameter's shape
    bool ready = false;
  };
  struct Bucket {
    std::vector<std::size_t> params;
    at::Tensor flat;  // the slots, then the unused-parameter flag, then the replacement's
    at::Tensor flag;
    at::Tensor admit;
    std::size_t pending = 0;
    Work work;
  };

  void check_parameter(const std::string& name, const at::Tensor& p) const {
    if (p.is_sparse()) refuse("auto_model", "parameter '" + name + "' is sparse, which auto_model does not reduce");
    if (!p.is_floating_point())
      refuse("auto_model", "parameter '" + name + "' has dtype " + c10::toString(p.scalar_type()) +
                               ", not a floating one");
    const bool nccl = backend() == "nccl";
    if (nccl != p.is_cuda())
      refuse("auto_model", "parameter '" + name + "' is on " + p.device().str() + ", and the " + backend() +
                               " backend takes " + (nccl ? "CUDA" : "CPU") + " tensors: move the model first (" +
                               (nccl ? "model->to(torch::kCUDA)" : "model->to(torch::kCPU)") + ")");
  }

  // Buckets over params in `order`: one per dtype and device at a time, closed when it reaches
  // its limit (the first one per key first_bucket_bytes, the next ones bucket_cap_bytes).
  // Each parameter's gradient then lives in its slot; a gradient that exists is carried over.
  void assign_buckets(const std::vector<std::size_t>& order) {
    struct Open {
      std::vector<std::size_t> params;
      std::size_t bytes = 0;
      std::size_t limit = 0;
    };
    std::map<std::pair<int, std::string>, Open> open;
    std::vector<std::vector<std::size_t>> assignment;
    for (auto i : order) {
      const auto& p = params_[i].tensor;
      auto [it, fresh] = open.try_emplace({static_cast<int>(p.scalar_type()), p.device().str()});
      if (fresh) it->second.limit = options_.first_bucket_bytes;
      auto& bucket = it->second;
      bucket.params.push_back(i);
      bucket.bytes += static_cast<std::size_t>(p.nbytes());
      if (bucket.bytes >= bucket.limit) {
        assignment.push_back(std::move(bucket.params));
        bucket = Open{};
        bucket.limit = options_.bucket_cap_bytes;
      }
    }
    for (auto& [key, bucket] : open)
      if (!bucket.params.empty()) assignment.push_back(std::move(bucket.params));

    at::NoGradGuard no_grad;
    std::vector<Bucket> buckets;
    for (auto& members : assignment) {
      Bucket b;
      std::int64_t total = 0;
      for (auto i : members) total += params_[i].tensor.numel();
      const auto& first = params_[members.front()].tensor;
      b.flat = at::zeros({total + 2}, first.options().requires_grad(false));
      b.flag = b.flat.narrow(0, total, 1);
      b.admit = b.flat.narrow(0, total + 1, 1);
      std::int64_t offset = 0;
      auto* base = static_cast<char*>(b.flat.data_ptr());
      for (auto i : members) {
        auto& p = params_[i];
        // Keeps the bucket's memory alive for as long as any slot is referenced.
        p.slot = at::from_blob(base + offset * b.flat.element_size(), p.tensor.sizes(),
                               [keep = b.flat](void*) {}, b.flat.options());
        auto& grad = p.tensor.mutable_grad();
        if (grad.defined()) p.slot.copy_(grad);
        grad = p.slot;
        p.bucket = buckets.size();
        offset += p.tensor.numel();
      }
      b.params = std::move(members);
      b.pending = b.params.size();
      buckets.push_back(std::move(b));
    }
    buckets_ = std::move(buckets);
  }

  // The post-hook of parameter i's gradient accumulator, on the thread running backward.
  void on_gradient(std::size_t i) {
    std::lock_guard lock(mu_);
    if (!sync_) return;  // no_sync(): accumulate locally
    // A world that lost a peer cannot complete this step (its buckets would raise at the end):
    // the rest of the backward would be work thrown away before the re-form, a good part of a
    // step on a large model. (Every hook runs on one thread for a model on one device, so none
    // launches a bucket after this.)
    if (idist::peer_lost()) stop_backward(params_[i].name);
    if (!in_backward_) begin_backward();
    auto& p = params_[i];
    if (p.ready)
      refuse("auto_model", "parameter '" + p.name +
                               "' got a gradient twice in one backward (a reentrant backward?), which DDP refuses too");
    adopt_gradient(p);
    p.ready = true;
    if (stats_.iterations == 0) ready_order_.push_back(i);
    if (--buckets_[p.bucket].pending == 0) launch_ready();
  }

  // The launched buckets end first (the groups are being aborted, so at once): Recovery zeroes
  // the gradients next, which a bucket still being reduced would write into.
  [[noreturn]] void stop_backward(const std::string& at) {
    for (std::size_t b = 0; b < next_bucket_; ++b) {
      try {
        buckets_[b].work.wait();
      } catch (const Error&) {
        // the loss this rank already knows of
      }
    }
    reset_iteration();
    throw PeerLostError({get_rank(), get_world_size(), "auto_model", idist::backend()},
                        "this rank's world lost a peer: backward stopped at parameter '" + at + "'", -1);
  }

  void begin_backward() {
    if (join_) agree_on_active(true);
    in_backward_ = true;
    waiting_ = idist::replacement_waiting();
    admit_ = false;
    started_ = Clock::now();
    ready_order_.clear();  // a first backward that raised leaves its order behind
    stats_.bucket_started.assign(buckets_.size(), -1);
    torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
  }

  // The gradient into the slot, where zero_grad(set_to_none) or the user put another tensor.
  void adopt_gradient(Param& p) {
    auto& grad = p.tensor.mutable_grad();
    if (grad.defined() && grad.data_ptr() == p.slot.data_ptr()) return;
    if (grad.defined()) {
      if (grad.is_sparse()) refuse("auto_model", "parameter '" + p.name + "' got a sparse gradient");
      p.slot.copy_(grad);
    } else {
      p.slot.zero_();
    }
    grad = p.slot;
  }

  // Buckets start strictly in order, the same on every rank.
  void launch_ready() {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) launch(next_bucket_++);
  }

  void launch(std::size_t index, bool unused = false) {
    auto& b = buckets_[index];
    b.flag.fill_(unused ? 1 : 0);
    b.admit.fill_(waiting_ ? 1 : 0);
    // A share of a batch the world size does not divide (batch_weight.hpp); the flag only
    // needs to stay non-zero.
    if (const double weight = detail::batch_weight(); weight != 1.0) b.flat.mul_(weight);
    b.work = idist::iall_reduce(b.flat, {.op = ReduceOp::AVG});
    stats_.bucket_started[index] = seconds(Clock::now() - started_);
  }

  // The engine's final callback: what is left, then every bucket's end.
  void end_backward() {
    std::lock_guard lock(mu_);
    stats_.backward_ended = seconds(Clock::now() - started_);
    std::vector<std::size_t> unused;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (p.ready) continue;
      unused.push_back(i);
      adopt_gradient(p);  // its slot may hold an earlier gradient: it contributes zeros
      p.slot.zero_();
      --buckets_[p.bucket].pending;
    }
    std::vector<bool> has_unused(buckets_.size(), false);
    for (auto i : unused) has_unused[params_[i].bucket] = true;
    while (next_bucket_ < buckets_.size()) {
      launch(next_bucket_, has_unused[next_bucket_]);
      ++next_bucket_;
    }
    finish_iteration(unused);
    mark_step();
  }

  // Every rank, in its loop or shadowing: the buckets' ends, the unused-parameter verdict, the
  // first iteration's rebuild, then the buffers, in the same order.
  void finish_iteration(const std::vector<std::size_t>& unused) {
    bool any_unused = false, admit = false;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      try {
        buckets_[i].work.wait();
      } catch (const Error& e) {
        reset_iteration();
        rethrow_in(e, bucket_label(i));
      }
      if (buckets_[i].flag.item<double>() != 0) any_unused = true;
      if (buckets_[i].admit.item<double>() != 0) admit = true;
    }
    stats_.reduced = seconds(Clock::now() - started_);
    if (any_unused && !options_.find_unused_parameters) {
      const auto why = name_unused(unused);
      reset_iteration();
      refuse("auto_model", why);
    }
    if (join_ && !join_->options.divide_by_initial_world_size && join_->active < get_world_size()) {
      // Divided by the ranks still training, not the world (DDP's divide_by_initial_world_size=False).
      at::NoGradGuard no_grad;
      for (auto& b : buckets_) b.flat.mul_(static_cast<double>(get_world_size()) / join_->active);
    }
    const int source = join_ ? join_->authority : 0;
    if (stats_.iterations == 0) rebuild_buckets(unused, source);
    ++stats_.iterations;
    reset_iteration();
    labelled("auto_model's broadcast of rank " + std::to_string(source) + "'s buffers", [&] {
      for (auto& c : buffers_) c.broadcast_from(source);
    });
    admit_ = admit;  // only where the whole iteration completed: so alike on every rank
  }

  // Every rank's unused parameters meet, so that the line names the first parameter any rank
  // skipped and which ranks skipped it (torch names them too).
  std::string name_unused(const std::vector<std::size_t>& unused) {
    std::vector<std::uint8_t> mine(params_.size(), 0);
    for (auto i : unused) mine[i] = 1;
    const auto all = idist::all_gather(mine);
    const auto n = params_.size();
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<int> ranks;
      for (std::size_t r = 0; r * n < all.size(); ++r)
        if (all[r * n + i] != 0) ranks.push_back(static_cast<int>(r));
      if (ranks.empty()) continue;
      std::string list;
      for (auto r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
      return "parameter '" + params_[i].name + "' got no gradient in this backward on rank" +
             (ranks.size() == 1 ? " " : "s ") + list +
             ": if some parameters are not used in every iteration, pass .find_unused_parameters = true to auto_model";
    }
    return "a parameter got no gradient in this backward (auto_model lost track of which)";
  }

  std::string bucket_label(std::size_t i) const {
    std::vector<std::string> names;
    for (auto p : buckets_[i].params) names.push_back(params_[p].name);
    return "auto_model bucket " + std::to_string(i) + " (" + first_names(names) + ")";
  }

  // Who is still in its loop: every rank says, in one all_gather; false when nobody is.
  bool agree_on_active(bool me) {
    std::vector<std::int8_t> all;
    labelled("idist::join's agreement on who is still in its loop (inside a join, auto_model's collectives must be "
             "the loop's only ones)",
             [&] { all = idist::all_gather(std::int8_t{me ? std::int8_t{1} : std::int8_t{0}}); });
    join_->active = 0;
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r] != 0) {
        ++join_->active;
        join_->authority = static_cast<int>(r);  // the highest, as DDP's authoritative rank
      }
    if (join_->active > 0 && !me && !in_backward_) begin_shadow();
    return join_->active > 0;
  }
  void begin_shadow() {
    started_ = Clock::now();
    stats_.bucket_started.assign(buckets_.size(), -1);
  }

  // After the first iteration: the buckets in the order gradients became ready, rank 0's
  // order on every rank (DDP's rebuild), the gradients carried over.
  void rebuild_buckets(const std::vector<std::size_t>& unused, int source) {
    std::vector<std::int64_t> order(params_.size());
    if (get_rank() == source) {
      order.assign(ready_order_.begin(), ready_order_.end());
      for (auto i : unused) order.push_back(static_cast<std::int64_t>(i));
      if (order.size() != params_.size())
        refuse("auto_model", "internal: " + std::to_string(order.size()) + " parameters ordered of " +
                                 std::to_string(params_.size()));
    }
    labelled("auto_model's bucket order from rank " + std::to_string(source),
             [&] { idist::broadcast(std::span<std::int64_t>(order), source); });
    std::vector<std::size_t> agreed(order.begin(), order.end());
    if (agreed != initial_order_) {
      assign_buckets(agreed);
      stats_.bucket_rebuilds = 1;
    }
    ready_order_.clear();
  }

  void reset_iteration() {
    for (auto& p : params_) p.ready = false;
    for (auto& b : buckets_) {
      b.pending = b.params.size();
      b.work = Work();
    }
    next_bucket_ = 0;
    in_backward_ = false;
  }

  struct JoinState {
    JoinOptions options;
    int active = 0;     // ranks still in their loop at this iteration
    int authority = 0;  // the highest of them: buffers come from it
  };

  AutoModelOptions options_;
  std::vector<at::Tensor> replica_;  // what wrap made equal: parameters, then buffers
  std::optional<JoinState> join_;
  bool waiting_ = false;  // this backward: a replacement waits, as this rank heard
  bool admit_ = false;    // the last backward's buckets: one waits, as any rank heard
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<Coalesced> buffers_;
  std::vector<std::size_t> initial_order_;
  std::vector<std::size_t> ready_order_;
  std::size_t next_bucket_ = 0;
  bool in_backward_ = false;
  bool sync_ = true;
  Clock::time_point started_;
  DataParallelStats stats_;
  mutable std::mutex mu_;
};

// The reducers of the data-parallel modules, for no_sync() and the stats. A reducer holds its
// parameters and their gradient accumulators, whose hooks point back into it; the module
// does not know of it. So an entry lives while its module does: once the module is gone (its
// weak pointer expired), the next lookup drops the entry, and with it the reducer, the
// accumulators and the parameters. Never destroyed itself: exit-time order does not matter.
struct Entry {
  std::weak_ptr<torch::nn::Module> module;
  std::unique_ptr<Reducer> reducer;
};
std::mutex registry_mu;
auto* const registry = new std::unordered_map<const torch::nn::Module*, Entry>;

// With registry_mu held.
void drop_expired() {
  std::erase_if(*registry, [](const auto& item) { return item.second.module.expired(); });
}

Reducer* find(const torch::nn::Module& module) {
  std::lock_guard lock(registry_mu);
  drop_expired();
  const auto it = registry->find(&module);
  return it == registry->end() ? nullptr : it->second.reducer.get();
}

}  // namespace

namespace detail {

void make_data_parallel(torch::nn::Module& module, const AutoModelOptions& options) {
  if (!is_initialized()) refuse("auto_model", "idist::init() has not been called");
  if (get_world_size() == 1) return;
  std::weak_ptr<torch::nn::Module> owner;
  try {
    owner = module.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    refuse("auto_model", "the module is not owned by a std::shared_ptr: make it with std::make_shared or a module holder");
  }
  if (find(module) != nullptr) refuse("auto_model", "the module is data-parallel already");
  auto reducer = std::make_unique<Reducer>(module, options);
  std::lock_guard lock(registry_mu);
  (*registry)[&module] = Entry{std::move(owner), std::move(reducer)};
}

void set_gradient_sync(const torch::nn::Module& module, bool enabled) {
  if (auto* reducer = find(module)) reducer->set_sync(enabled);
}

void after_reform(const torch::nn::Module& module) {
  if (auto* reducer = find(module)) reducer->after_reform();
}

bool is_data_parallel(const torch::nn::Module& module) { return find(module) != nullptr; }

bool replacement_agreed(const torch::nn::Module& module) {
  auto* reducer = find(module);
  return reducer != nullptr && reducer->take_admission();
}

bool broadcasts_buffers(const torch::nn::Module& module) {
  const auto* reducer = find(module);
  return reducer == nullptr || reducer->broadcasts_buffers();
}

void join(const torch::nn::Module& module, const std::function<void()>& loop, const JoinOptions& options) {
  auto* reducer = find(module);
  if (reducer == nullptr) {
    if (is_initialized() && get_world_size() > 1)
      refuse("join", "the module is not data-parallel: wrap it with auto_model first");
    loop();
    return;
  }
  reducer->begin_join(options);
  try {
    loop();
    bool last_joiner = true;
    while (reducer->shadow_iteration()) last_joiner = false;
    reducer->finish_join(last_joiner);
  } catch (...) {
    reducer->abandon_join();
    throw;
  }
}

}  // namespace detail

DataParallelStats data_parallel_stats(const torch::nn::Module& module) {
  auto* reducer = find(module);
  if (reducer == nullptr) refuse("data_parallel_stats", "the module is not data-parallel (auto_model, world size > 1)");
  return reducer->stats();
}

}  // namespace idist

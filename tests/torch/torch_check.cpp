// idist::torch on N ranks (run under idist-run, mpirun or by hand): the tensor collectives on
// every dtype, auto_model against one process training the whole batch, no_sync, unused
// parameters, BatchNorm, mixed dtypes, overlap, auto_dataloader's shards, and the bad inputs'
// one-line errors. One line per case ("ok   ..." or "FAIL ...: why"), then
// "torch_check: N checks, M failed" (exit 0 when none failed).
//
//   idist-run -n 3 torch_check                  # everything
//   torch_check --backend mpi [PART...]          # under mpirun; PART: collectives ddp loader errors
#include <idist/torch.hpp>
#include <torch/torch.h>

#include "../check_cases.hpp"

#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace {

using check_cases::run_case;
int rank = 0;
int world = 1;

// The error a call raises, or "" when it raises none.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const idist::Error& e) {
    return e.what();
  }
  return "";
}

std::string expect_error(const std::function<void()>& call, const std::string& words) {
  const auto text = error_of(call);
  if (text.empty()) return "no error";
  if (text.find(words) == std::string::npos) return "the error does not say '" + words + "': " + text;
  if (text.find('\n') != std::string::npos) return "the error is more than one line: " + text;
  return "";
}

std::string differs(const torch::Tensor& got, const torch::Tensor& want, double tolerance = 0) {
  if (!got.sizes().equals(want.sizes())) return "shape " + c10::str(got.sizes()) + ", want " + c10::str(want.sizes());
  if (got.scalar_type() != want.scalar_type())
    return std::string("dtype ") + c10::toString(got.scalar_type()) + ", want " + c10::toString(want.scalar_type());
  const auto g = got.to(torch::kDouble);
  const auto w = want.to(torch::kDouble);
  const double error = (g - w).abs().max().item<double>();
  if (error > tolerance * std::max(1.0, w.abs().max().item<double>()))
    return "max difference " + std::to_string(error) + " (got " + c10::str(got.flatten().slice(0, 0, 4)) + ")";
  return "";
}

// --- tensor collectives --------------------------------------------------------------------------

// What rank r holds: small integers, exact in every dtype; bool: true on odd ranks.
torch::Tensor input(torch::ScalarType dtype, int r, std::int64_t n = 6) {
  if (dtype == torch::kBool) return torch::full({n}, r % 2 == 1, torch::kBool);
  return (torch::arange(n) % 3 + r + 1).to(dtype);
}

void check_collectives() {
  const std::vector<torch::ScalarType> dtypes = {torch::kUInt8, torch::kInt8,     torch::kInt32, torch::kInt64,
                                                 torch::kHalf,  torch::kBFloat16, torch::kFloat, torch::kDouble};
  for (const auto dtype : dtypes) {
    const std::string name = c10::toString(dtype);
    const bool floating = c10::isFloatingType(dtype);
    run_case("all_reduce SUM/MAX/MIN/PRODUCT " + name, [&] {
      auto want_sum = torch::zeros({6}, torch::kDouble);
      auto want_prod = torch::ones({6}, torch::kDouble);
      for (int r = 0; r < world; ++r) {
        want_sum += input(torch::kDouble, r);
        want_prod *= input(torch::kDouble, r);
      }
      auto t = input(dtype, rank);
      if (auto d = differs(idist::all_reduce(t), want_sum.to(dtype)); !d.empty()) return "SUM: " + d;
      if (auto d = differs(idist::all_reduce(input(dtype, rank), idist::ReduceOp::MAX), input(dtype, world - 1));
          !d.empty())
        return "MAX: " + d;
      if (auto d = differs(idist::all_reduce(input(dtype, rank), idist::ReduceOp::MIN), input(dtype, 0)); !d.empty())
        return "MIN: " + d;
      if (world <= 3)
        if (auto d = differs(idist::all_reduce(input(dtype, rank), idist::ReduceOp::PRODUCT), want_prod.to(dtype));
            !d.empty())
          return "PRODUCT: " + d;
      return std::string();
    });
    if (floating)
      run_case("all_reduce AVG " + name, [&] {
        auto want = torch::zeros({6}, torch::kDouble);
        for (int r = 0; r < world; ++r) want += input(torch::kDouble, r);
        return differs(idist::all_reduce(input(dtype, rank), idist::ReduceOp::AVG), (want / world).to(dtype), 1e-2);
      });
  }
  run_case("all_reduce on bool: SUM is or, PRODUCT is and, as torch", [&] {
    const bool any_odd = world > 1;
    if (auto d = differs(idist::all_reduce(input(torch::kBool, rank)), torch::full({6}, any_odd, torch::kBool));
        !d.empty())
      return "SUM: " + d;
    // Rank 0 holds false.
    return differs(idist::all_reduce(input(torch::kBool, rank), idist::ReduceOp::PRODUCT), torch::zeros({6}, torch::kBool));
  });
  run_case("all_reduce of a non-contiguous tensor (a transpose) writes every element back", [&] {
    auto base = torch::arange(12, torch::kFloat).view({3, 4}) + rank;
    auto t = base.t();
    idist::all_reduce(t);
    auto want = torch::zeros({3, 4});
    for (int r = 0; r < world; ++r) want += torch::arange(12, torch::kFloat).view({3, 4}) + r;
    return differs(base, want);
  });
  run_case("reduce to the last rank; the others keep theirs", [&] {
    auto t = input(torch::kFloat, rank);
    idist::reduce(t, {.dst = world - 1});
    auto want = torch::zeros({6});
    for (int r = 0; r < world; ++r) want += input(torch::kFloat, r);
    return differs(t, rank == world - 1 ? want : input(torch::kFloat, rank));
  });
  run_case("all_gather (ignite's): dim 0 differs per rank, concatenated in rank order", [&] {
    auto mine = torch::full({rank + 1, 2}, static_cast<float>(rank));
    auto got = idist::all_gather(mine);
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(torch::full({r + 1, 2}, static_cast<float>(r)));
    return differs(got, torch::cat(parts));
  });
  run_case("all_gather of a scalar tensor: one per rank", [&] {
    return differs(idist::all_gather(torch::tensor(static_cast<double>(rank), torch::kDouble)), torch::arange(world, torch::kDouble));
  });
  run_case("all_gather_list and all_gather_into_tensor", [&] {
    auto list = idist::all_gather_list(input(torch::kInt64, rank));
    if (static_cast<int>(list.size()) != world) return std::string("list of ") + std::to_string(list.size());
    for (int r = 0; r < world; ++r)
      if (auto d = differs(list[static_cast<std::size_t>(r)], input(torch::kInt64, r)); !d.empty()) return d;
    auto out = torch::empty({world, 6}, torch::kInt64);
    idist::all_gather_into_tensor(out, input(torch::kInt64, rank));
    return differs(out, torch::stack(list));
  });
  run_case("reduce_scatter and reduce_scatter_tensor", [&] {
    auto in = torch::arange(world * 4, torch::kFloat).view({world * 2, 2}) + rank;
    auto got = idist::reduce_scatter(in);
    auto want = torch::zeros({world * 2, 2});
    for (int r = 0; r < world; ++r) want += torch::arange(world * 4, torch::kFloat).view({world * 2, 2}) + r;
    if (auto d = differs(got, want.slice(0, rank * 2, rank * 2 + 2)); !d.empty()) return d;
    auto out = torch::empty({4}, torch::kFloat);
    idist::reduce_scatter_tensor(out, in.flatten(), {.op = idist::ReduceOp::AVG});
    return differs(out, want.flatten().slice(0, rank * 4, rank * 4 + 4) / world, 1e-6);
  });
  run_case("broadcast in place, and safe mode: only src has the tensor", [&] {
    auto t = torch::full({2, 3}, static_cast<double>(rank));
    idist::broadcast(t, world - 1);
    if (auto d = differs(t, torch::full({2, 3}, static_cast<double>(world - 1))); !d.empty()) return d;
    std::optional<torch::Tensor> mine;
    if (rank == 0) mine = torch::arange(10, torch::kInt16).to(torch::kBFloat16).view({2, 5});
    auto got = idist::broadcast(mine, {.src = 0});
    return differs(got, torch::arange(10).to(torch::kBFloat16).view({2, 5}));
  });
  run_case("gather to rank 0 and scatter from rank 0", [&] {
    auto got = idist::gather(input(torch::kInt32, rank));
    if (rank == 0) {
      if (static_cast<int>(got.size()) != world) return std::string("gathered ") + std::to_string(got.size());
      for (int r = 0; r < world; ++r)
        if (auto d = differs(got[static_cast<std::size_t>(r)], input(torch::kInt32, r)); !d.empty()) return d;
    } else if (!got.empty()) {
      return std::string("a non-dst rank got tensors");
    }
    std::vector<torch::Tensor> parts;
    if (rank == 0)
      for (int r = 0; r < world; ++r) parts.push_back(torch::full({3}, r * 10));
    auto out = torch::empty({3}, torch::kLong);
    idist::scatter(out, parts);
    return differs(out, torch::full({3}, rank * 10));
  });
  run_case("send/recv around a ring, recv into a non-contiguous tensor", [&] {
    if (world == 1) return std::string();
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    auto out = torch::arange(6, torch::kFloat).view({2, 3}) + rank;
    auto in = torch::zeros({3, 2}).t();  // 2 x 3, not contiguous
    if (rank % 2 == 0) {
      idist::send(out, next);
      idist::recv(in, prev);
    } else {
      idist::recv(in, prev);
      idist::send(out, next);
    }
    return differs(in, torch::arange(6, torch::kFloat).view({2, 3}) + prev);
  });
  run_case("isend/irecv and iall_reduce with wait()", [&] {
    auto t = input(torch::kDouble, rank);
    auto work = idist::iall_reduce(t);
    work.wait();
    auto want = torch::zeros({6}, torch::kDouble);
    for (int r = 0; r < world; ++r) want += input(torch::kDouble, r);
    if (auto d = differs(t, want); !d.empty()) return d;
    if (world == 1) return std::string();
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    auto in = torch::zeros({6}, torch::kDouble);
    const auto out = input(torch::kDouble, rank);  // alive until wait(), as for any buffer
    auto r = idist::irecv(in, prev);
    auto s = idist::isend(out, next);
    s.wait();
    r.wait();
    return differs(in, input(torch::kDouble, prev));
  });
}

// --- bad inputs: one line each ---------------------------------------------------------------------

void check_errors() {
  run_case("a complex tensor is refused, naming its dtype", [] {
    return expect_error([] { idist::all_reduce(torch::zeros({2}, torch::kComplexFloat)); }, "ComplexFloat");
  });
  run_case("an int16 tensor is refused, naming its dtype", [] {
    return expect_error([] { idist::all_reduce(torch::zeros({2}, torch::kInt16)); }, "Short");
  });
  run_case("a sparse tensor is refused", [] {
    return expect_error([] { idist::all_reduce(torch::zeros({2, 2}).to_sparse()); }, "sparse");
  });
  run_case("a quantized tensor is refused", [] {
    auto q = torch::quantize_per_tensor(torch::zeros({2}), 0.1, 0, torch::kQInt8);
    return expect_error([&] { idist::all_reduce(q); }, "quantized");
  });
  run_case("AVG of an integer tensor is refused", [] {
    return expect_error([] { idist::all_reduce(torch::zeros({2}, torch::kInt32), idist::ReduceOp::AVG); },
                        "AVG is defined on floating dtypes only, not int32");
  });
  run_case("AVG of a bool tensor is refused", [] {
    return expect_error([] { idist::all_reduce(torch::zeros({2}, torch::kBool), idist::ReduceOp::AVG); }, "bool");
  });
  run_case("an async call on a non-contiguous tensor is refused", [] {
    auto t = torch::zeros({3, 2}).t();
    return expect_error([&] { (void)idist::iall_reduce(t); }, "not contiguous");
  });
  run_case("the error names rank, op and backend", [] {
    const auto text = error_of([] { idist::all_reduce(torch::zeros({2}, torch::kInt16)); });
    const auto prefix = "[idist rank " + std::to_string(rank) + "/" + std::to_string(world) + "] all_reduce(";
    return text.rfind(prefix, 0) == 0 ? std::string() : "not '" + prefix + "...': " + text;
  });
  run_case("all_gather of tensors that differ beyond dim 0 raises on every rank", [] {
    if (world == 1) return std::string();
    return expect_error([] { (void)idist::all_gather(torch::zeros({1, rank + 1})); }, "differ in more than their first dim");
  });
  run_case("data_parallel_stats of a module that is not data-parallel", [] {
    torch::nn::Linear plain(2, 2);
    return expect_error([&] { (void)idist::data_parallel_stats(*plain); }, "not data-parallel");
  });
  run_case("auto_dataloader: a batch size smaller than the world", [] {
    if (world == 1) return std::string();
    auto data = torch::data::datasets::TensorDataset(torch::zeros({10, 1})).map(torch::data::transforms::Stack<torch::data::TensorExample>());
    return expect_error([&] { (void)idist::auto_dataloader(data, {.batch_size = static_cast<std::size_t>(world - 1)}); },
                        "is smaller than the world size");
  });
  if (world > 1)
    run_case("auto_model twice on one module", [] {
      auto model = idist::auto_model(torch::nn::Linear(2, 2));
      return expect_error([&] { (void)idist::auto_model(model); }, "data-parallel already");
    });
}

// --- auto_model -------------------------------------------------------------------------------------

struct MlpImpl : torch::nn::Module {
  MlpImpl(std::int64_t in, std::int64_t hidden, std::int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// The whole data set, the same on every rank.
struct Data {
  torch::Tensor x, y;
};
Data make_data(std::int64_t n, std::int64_t in, std::int64_t out) {
  torch::manual_seed(1234);
  return {torch::randn({n, in}), torch::randn({n, out})};
}

// A hash of every parameter's bytes, all_gathered: equal on every rank means bitwise replicas.
std::string replicas_equal(torch::nn::Module& model) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& p : model.parameters()) {
    auto c = p.detach().contiguous().cpu();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (std::size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  }
  const auto all = idist::all_gather(static_cast<std::int64_t>(h));
  for (int r = 1; r < world; ++r)
    if (all[static_cast<std::size_t>(r)] != all[0]) return "rank " + std::to_string(r) + "'s parameters differ from rank 0's";
  return "";
}

std::string params_close(torch::nn::Module& a, torch::nn::Module& b, double tolerance) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const double scale = std::max(1e-3, pb[i].abs().max().item<double>());
    const double error = (pa[i] - pb[i]).abs().max().item<double>() / scale;
    if (error > tolerance) return "parameter " + std::to_string(i) + " differs by " + std::to_string(error) + " (relative)";
  }
  return "";
}

// N ranks with per-rank batch B/N end where one process with batch B ends, replicas bitwise
// equal after every step.
std::string equivalence(const idist::AutoModelOptions& options, int steps) {
  const std::int64_t batch = 12, in = 20, hidden = 32, out = 5;
  const auto data = make_data(batch * steps, in, out);
  torch::manual_seed(7);
  Mlp reference(in, hidden, out);
  torch::manual_seed(7 + rank);  // different on every rank: auto_model must broadcast rank 0's
  Mlp model(in, hidden, out);
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < model->parameters().size(); ++i)
      if (rank == 0) model->parameters()[i].copy_(reference->parameters()[i]);
  }
  model = idist::auto_model(model, options);
  if (auto d = replicas_equal(*model); !d.empty()) return "after auto_model: " + d;
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  const std::int64_t mine = batch / world;
  for (int step = 0; step < steps; ++step) {
    auto x = data.x.slice(0, step * batch, (step + 1) * batch);
    auto y = data.y.slice(0, step * batch, (step + 1) * batch);
    opt.zero_grad();
    torch::mse_loss(model(x.slice(0, rank * mine, (rank + 1) * mine)), y.slice(0, rank * mine, (rank + 1) * mine))
        .backward();
    opt.step();
    ref_opt.zero_grad();
    torch::mse_loss(reference(x), y).backward();
    ref_opt.step();
    if (auto d = replicas_equal(*model); !d.empty()) return "step " + std::to_string(step) + ": " + d;
  }
  return params_close(*model, *reference, 1e-5);
}

struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : a(register_module("a", torch::nn::Linear(4, 4))), extra(register_module("extra", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    auto h = a(x);
    return use_extra ? extra(h) : h;
  }
  torch::nn::Linear a, extra;
};
TORCH_MODULE(Branchy);

// Registered in the opposite order to the one it runs in: reverse registration order is not
// the order backward produces gradients, so the first iteration's order must replace it.
struct SwappedImpl : torch::nn::Module {
  SwappedImpl()
      : late(register_module("late", torch::nn::Linear(4, 4))), early(register_module("early", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return late(torch::relu(early(x))); }
  torch::nn::Linear late, early;
};
TORCH_MODULE(Swapped);

struct MixedImpl : torch::nn::Module {
  MixedImpl()
      : f32(register_module("f32", torch::nn::Linear(8, 8))), b16(register_module("b16", torch::nn::Linear(8, 4))) {
    b16->to(torch::kBFloat16);
  }
  torch::Tensor forward(torch::Tensor x) { return b16(torch::relu(f32(x)).to(torch::kBFloat16)).to(torch::kFloat); }
  torch::nn::Linear f32, b16;
};
TORCH_MODULE(Mixed);

struct NormedImpl : torch::nn::Module {
  NormedImpl()
      : fc(register_module("fc", torch::nn::Linear(6, 6))),
        bn(register_module("bn", torch::nn::BatchNorm1d(6))),
        out(register_module("out", torch::nn::Linear(6, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return out(torch::relu(bn(fc(x)))); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
  torch::nn::Linear out;
};
TORCH_MODULE(Normed);

void check_ddp() {
  if (world == 1) {
    run_case("world of one: auto_model returns the module untouched", [] {
      Mlp model(2, 2, 2);
      auto same = idist::auto_model(model);
      if (same.ptr() != model.ptr()) return std::string("another module");
      return expect_error([&] { (void)idist::data_parallel_stats(*same); }, "not data-parallel");
    });
    return;
  }
  run_case("equivalence: 20 SGD steps, small buckets (rebuilt after the first step)",
           [] { return equivalence({.first_bucket_bytes = 1024, .bucket_cap_bytes = 4096}, 20); });
  run_case("equivalence: 20 SGD steps, DDP's default buckets", [] { return equivalence({}, 20); });
  run_case("buckets: the first small, then up to the cap, every parameter in one", [] {
    Mlp model(20, 32, 5);  // 660 B in fc3, 4,224 in fc2, 2,688 in fc1
    model = idist::auto_model(model, {.first_bucket_bytes = 512, .bucket_cap_bytes = 2048});
    for (int step = 0; step < 2; ++step) torch::mse_loss(model(torch::ones({3, 20})), torch::zeros({3, 5})).backward();
    const auto s = idist::data_parallel_stats(*model);
    std::size_t params = 0;
    for (const auto& b : s.bucket_parameters) params += b.size();
    if (s.bucket_bytes.size() < 3) return "only " + std::to_string(s.bucket_bytes.size()) + " buckets";
    if (params != model->parameters().size()) return "buckets hold " + std::to_string(params) + " parameters";
    if (s.iterations != 2) return "iterations " + std::to_string(s.iterations);
    return std::string();
  });
  run_case("gradients stay in the buckets' memory from step to step (no allocation per step)", [] {
    Mlp model(20, 32, 5);
    model = idist::auto_model(model, {.first_bucket_bytes = 512, .bucket_cap_bytes = 2048});
    torch::optim::SGD opt(model->parameters(), 0.1);
    std::vector<const void*> before;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      torch::mse_loss(model(torch::ones({3, 20})), torch::zeros({3, 5})).backward();
      opt.step();
      std::vector<const void*> now;
      for (const auto& p : model->parameters()) now.push_back(p.grad().data_ptr());
      if (step >= 1 && now != before) return "step " + std::to_string(step) + ": a gradient moved";  // after the rebuild
      before = now;
    }
    return std::string();
  });
  run_case("buckets rebuilt after the first backward in the order gradients became ready", [] {
    Swapped model;
    model = idist::auto_model(model, {.first_bucket_bytes = 64, .bucket_cap_bytes = 64});
    const auto before = idist::data_parallel_stats(*model).bucket_parameters.front().front();
    model(torch::ones({2, 4})).sum().backward();
    const auto s = idist::data_parallel_stats(*model);
    const auto after = s.bucket_parameters.front().front();
    if (s.bucket_rebuilds != 1) return "rebuilds: " + std::to_string(s.bucket_rebuilds);
    return after.rfind("late.", 0) == 0 && before.rfind("early.", 0) == 0
               ? std::string()
               : "first bucket's first parameter " + before + " before, " + after + " after";
  });
  run_case("overlap: the first bucket's all_reduce starts before backward ends", [] {
    torch::manual_seed(3);
    Mlp model(512, 1024, 512);  // three buckets of 2-4 MiB; backward of the first layer comes last
    model = idist::auto_model(model, {.first_bucket_bytes = std::size_t{1} << 20, .bucket_cap_bytes = std::size_t{4} << 20});
    auto x = torch::randn({64, 512});
    for (int step = 0; step < 3; ++step) torch::mse_loss(model(x), torch::zeros({64, 512})).backward();
    const auto s = idist::data_parallel_stats(*model);
    std::string times;
    for (auto t : s.bucket_started) times += std::to_string(t * 1e3) + " ";
    std::printf("     buckets started at %sms; backward ended at %.3f ms\n", times.c_str(), s.backward_ended * 1e3);
    if (s.bucket_started.empty() || s.bucket_started.front() < 0) return std::string("no bucket started");
    return s.bucket_started.front() < s.backward_ended ? std::string() : std::string("the first bucket started after backward's end");
  });
  run_case("no_sync: 3 accumulated micro-batches equal one batch of 3 times the size", [] {
    const auto data = make_data(6 * world, 20, 5);
    torch::manual_seed(11);
    Mlp a(20, 32, 5);
    torch::manual_seed(11);
    Mlp b(20, 32, 5);
    a = idist::auto_model(a);
    b = idist::auto_model(b);
    auto mine = [&](std::int64_t from, std::int64_t n) { return data.x.slice(0, from, from + n); };
    auto target = [&](std::int64_t from, std::int64_t n) { return data.y.slice(0, from, from + n); };
    const std::int64_t base = rank * 6;
    {
      auto guard = idist::no_sync(a);
      for (int k = 0; k < 2; ++k) (torch::mse_loss(a(mine(base + 2 * k, 2)), target(base + 2 * k, 2)) / 3).backward();
    }
    (torch::mse_loss(a(mine(base + 4, 2)), target(base + 4, 2)) / 3).backward();
    torch::mse_loss(b(mine(base, 6)), target(base, 6)).backward();
    auto ga = a->parameters();
    auto gb = b->parameters();
    for (std::size_t i = 0; i < ga.size(); ++i)
      if (auto d = differs(ga[i].grad(), gb[i].grad(), 1e-5); !d.empty()) return "gradient " + std::to_string(i) + ": " + d;
    if (idist::data_parallel_stats(*a).iterations != 1) return std::string("no_sync reduced");
    return std::string();
  });
  run_case("an unused parameter without find_unused_parameters: backward raises on every rank, naming it and who skipped it", [] {
    Branchy model;
    model = idist::auto_model(model);
    if (auto e = expect_error([&] { model(torch::ones({2, 4}), rank != 0).sum().backward(); },
                              "parameter 'extra.weight' got no gradient in this backward on rank 0:");
        !e.empty())
      return e;
    // The model stays usable: the next backward, every parameter used, reduces.
    model(torch::ones({2, 4}), true).sum().backward();
    return idist::data_parallel_stats(*model).iterations == 1 ? std::string() : std::string("no reduction after the error");
  });
  run_case("an unused parameter with find_unused_parameters: reduced as zeros, replicas equal", [] {
    Branchy model;
    model = idist::auto_model(model, {.find_unused_parameters = true});
    torch::optim::SGD opt(model->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      model(torch::ones({2, 4}) * (rank + 1), rank != 0 || step == 2).sum().backward();
      opt.step();
      if (auto d = replicas_equal(*model); !d.empty()) return "step " + std::to_string(step) + ": " + d;
    }
    return std::string();
  });
  run_case("BatchNorm: rank 0's running statistics on every rank after each backward", [] {
    Normed model;
    model = idist::auto_model(model);
    torch::optim::SGD opt(model->parameters(), 0.05);
    torch::manual_seed(100 + rank);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      model(torch::randn({8, 6})).sum().backward();
      opt.step();
      if (auto d = replicas_equal(*model); !d.empty()) return d;
      const auto mean = model->bn->running_mean.clone();
      const auto all = idist::all_gather(mean.unsqueeze(0));
      for (int r = 1; r < world; ++r)
        if (!all[r].equal(all[0])) return "step " + std::to_string(step) + ": running_mean differs on rank " + std::to_string(r);
    }
    return std::string();
  });
  run_case("float32 and bfloat16 parameters: separate buckets, replicas equal", [] {
    Mixed model;
    model = idist::auto_model(model);
    torch::optim::SGD opt(model->parameters(), 0.1);
    torch::manual_seed(200 + rank);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      model(torch::randn({4, 8})).sum().backward();
      opt.step();
      if (auto d = replicas_equal(*model); !d.empty()) return d;
    }
    for (const auto& bucket : idist::data_parallel_stats(*model).bucket_parameters) {
      std::set<std::string> kinds;
      for (const auto& name : bucket) kinds.insert(name.substr(0, name.find('.')));
      if (kinds.size() != 1) return std::string("a bucket mixes float32 and bfloat16 parameters");
    }
    return std::string();
  });
  run_case("auto_optim returns the optimizer itself", [] {
    auto opt = std::make_shared<torch::optim::SGD>(Mlp(2, 2, 2)->parameters(), 0.1);
    return idist::auto_optim(opt) == opt ? std::string() : std::string("another optimizer");
  });
}

// --- auto_dataloader --------------------------------------------------------------------------------

void check_loader() {
  run_case("auto_dataloader: disjoint shards covering the set, batch / world per rank, a new order each epoch", [] {
    const std::int64_t n = 103;
    auto data = torch::data::datasets::TensorDataset(torch::arange(n).unsqueeze(1)).map(torch::data::transforms::Stack<torch::data::TensorExample>());
    const std::size_t global = static_cast<std::size_t>(6 * world);
    auto loader = idist::auto_dataloader(data, {.batch_size = global, .seed = 5});
    std::vector<std::vector<std::int64_t>> epochs;
    for (int epoch = 0; epoch < 2; ++epoch) {
      auto& seen = epochs.emplace_back();
      for (auto& batch : *loader) {
        if (batch.data.size(0) > 6) return "a batch of " + std::to_string(batch.data.size(0)) + ", want at most 6";
        for (std::int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(batch.data[i][0].item<std::int64_t>());
      }
    }
    for (auto& seen : epochs) {
      const auto all = idist::all_gather(std::vector<std::int64_t>(seen));
      std::set<std::int64_t> distinct(all.begin(), all.end());
      if (static_cast<std::int64_t>(distinct.size()) != n) return "an epoch covers " + std::to_string(distinct.size()) + " of 103";
      if (static_cast<std::int64_t>(all.size()) > n + world) return "shards overlap beyond padding: " + std::to_string(all.size());
    }
    if (epochs[0] == epochs[1]) return std::string("two epochs in the same order");
    return std::string();
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "gloo";
  std::set<std::string> parts;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = argv[++i];
    } else {
      parts.insert(argv[i]);
    }
  }
  if (parts.empty()) parts = {"collectives", "errors", "ddp", "loader"};
  torch::set_num_threads(1);
  idist::init({.backend = backend});
  rank = idist::get_rank();
  world = idist::get_world_size();
  std::printf("torch_check: rank %d of %d, backend %s\n", rank, world, idist::backend().c_str());
  if (parts.count("collectives")) check_collectives();
  if (parts.count("errors")) check_errors();
  if (parts.count("ddp")) check_ddp();
  if (parts.count("loader")) check_loader();
  idist::finalize();
  return check_cases::finish("torch_check");
}

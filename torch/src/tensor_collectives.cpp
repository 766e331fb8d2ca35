// The collectives of <idist/idist.hpp> on torch tensors: each checks the tensor against the
// backend, maps its dtype, makes it contiguous where it is not (writing the result back), and
// calls libidist's type-erased entry points.
#include <ATen/ATen.h>

#include <numeric>
#include <string>

#include "idist/torch.hpp"
#include "torch_errors.hpp"

namespace idist {
namespace {

using detail::refuse;

std::size_t count_of(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// The DType a tensor travels as; bool as uint8 0/1.
DType dtype_for(std::string_view op, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kByte:
    case at::kBool: return DType::uint8;
    case at::kChar: return DType::int8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kFloat: return DType::float32;
    case at::kDouble: return DType::float64;
    default: break;
  }
  const std::string name = c10::toString(t.scalar_type());
  if (t.is_complex())
    refuse(op, "a tensor of dtype " + name + " is not supported (complex): pass torch::view_as_real(tensor) instead");
  refuse(op, "a tensor of dtype " + name +
                 " is not supported: use uint8, int8, int32, int64, float16, bfloat16, float32, float64 or bool "
                 "(e.g. .to(torch::kInt32))");
}

// gloo and mpi read host memory, nccl the rank's GPU; anything else is one line. Returns the
// DType the tensor travels as.
DType check_tensor(std::string_view op, const at::Tensor& t) {
  if (!t.defined()) refuse(op, "the tensor is undefined");
  if (t.is_sparse()) refuse(op, "a sparse tensor is not supported: call .to_dense() first");
  if (t.is_quantized())
    refuse(op, "a quantized tensor (dtype " + std::string(c10::toString(t.scalar_type())) +
                   ") is not supported: dequantize it first");
  const auto dtype = dtype_for(op, t);
  const auto name = backend();
  if (name == "nccl" && !t.is_cuda())
    refuse(op, "a tensor on " + t.device().str() +
                   " on the nccl backend, which takes CUDA tensors: move it to the rank's GPU (.to(torch::kCUDA))");
  if (name != "nccl" && !t.is_cpu())
    refuse(op, "a tensor on " + t.device().str() + " on the " + name +
                   " backend, which takes CPU tensors: use the nccl backend, or .cpu()");
  return dtype;
}

// Two tensors of one call agree in dtype and device.
void check_same(std::string_view op, const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  if (a.scalar_type() != b.scalar_type())
    refuse(op, std::string(b_name) + " has dtype " + c10::toString(b.scalar_type()) + ", " + a_name + " " +
                   c10::toString(a.scalar_type()));
  if (a.device() != b.device())
    refuse(op, std::string(b_name) + " is on " + b.device().str() + ", " + a_name + " on " + a.device().str());
}

// A contiguous tensor to hand to libidist: the caller's own, or a copy that write_back()
// copies into the caller's after the call.
class Contiguous {
 public:
  explicit Contiguous(const at::Tensor& t) : original_(t), work_(t.is_contiguous() ? t : t.contiguous()) {}
  void* data() const { return work_.data_ptr(); }
  void write_back() const {
    if (!work_.is_same(original_)) original_.copy_(work_);
  }

 private:
  at::Tensor original_;
  at::Tensor work_;
};

void require_contiguous(std::string_view op, const at::Tensor& t) {
  if (!t.is_contiguous())
    refuse(op, "the tensor is not contiguous, and an asynchronous call cannot copy its result back: pass "
               "tensor.contiguous() and keep it until wait() returns");
}

// `whole` holds n blocks of `block`'s elements (all_gather_into_tensor, reduce_scatter_tensor).
// Returns their DType.
DType check_whole_and_block(std::string_view op, const at::Tensor& whole, const char* whole_name,
                            const at::Tensor& block, const char* block_name, std::int64_t n) {
  const auto dtype = check_tensor(op, block);
  check_tensor(op, whole);
  check_same(op, block, block_name, whole, whole_name);
  if (whole.numel() != n * block.numel())
    refuse(op, std::string(whole_name) + " holds " + std::to_string(whole.numel()) + " elements; expected group size x " +
                   block_name + " (" + std::to_string(n) + " x " + std::to_string(block.numel()) + ")");
  return dtype;
}

// n tensors of `shape` over the rows of `flat` (n x elements).
std::vector<at::Tensor> rows_of(const at::Tensor& flat, at::IntArrayRef shape) {
  std::vector<at::Tensor> out;
  for (std::int64_t r = 0; r < flat.size(0); ++r) out.push_back(flat[r].view(shape));
  return out;
}

// torch reduces bool as a logical or (SUM) and and (PRODUCT); as uint8 0/1 that is MAX and MIN.
ReduceOp op_for(std::string_view name, const at::Tensor& t, ReduceOp op) {
  if (t.scalar_type() != at::kBool) return op;
  if (op == ReduceOp::AVG) refuse(name, "AVG of a bool tensor is not defined (torch refuses it too)");
  if (op == ReduceOp::SUM) return ReduceOp::MAX;
  if (op == ReduceOp::PRODUCT) return ReduceOp::MIN;
  return op;
}

// Every rank's size along dim 0, after checking that the rest of the shape and the dtype
// agree on every rank (one all_gather of four numbers per rank).
std::vector<std::int64_t> gather_first_dims(std::string_view op, const at::Tensor& t, const Group& group) {
  const bool scalar = t.dim() == 0;
  std::int64_t trailing_hash = 1469598103934665603LL;  // FNV-1a over the dims after the first
  for (std::int64_t d = 1; d < t.dim(); ++d) trailing_hash = (trailing_hash ^ t.size(d)) * 1099511628211LL;
  const std::int64_t mine[4] = {scalar ? 1 : t.size(0), scalar ? 1 : t.dim(), trailing_hash,
                                static_cast<std::int64_t>(t.scalar_type())};
  const auto n = static_cast<std::size_t>(detail::group_size(group));
  std::vector<std::int64_t> all(4 * n);
  idist::all_gather(std::span<const std::int64_t>(mine, 4), std::span<std::int64_t>(all), {.group = group});
  std::vector<std::int64_t> first(n);
  for (std::size_t r = 0; r < n; ++r) {
    const auto* other = &all[4 * r];
    if (other[1] != mine[1] || other[2] != mine[2] || other[3] != mine[3])
      refuse(op, "the tensors differ in more than their first dim: group rank " + std::to_string(r) +
                     " has " + std::to_string(other[1]) + " dims of dtype " +
                     c10::toString(static_cast<at::ScalarType>(other[3])) + ", this rank " + std::to_string(mine[1]) +
                     " of " + c10::toString(t.scalar_type()) + " (all ranks must agree but on dim 0)");
    first[r] = other[0];
  }
  return first;
}

}  // namespace

DType dtype_of_tensor(const at::Tensor& t) { return dtype_for("dtype_of_tensor", t); }

at::Tensor all_reduce(const at::Tensor& tensor, const AllReduceOptions& options) {
  const auto dtype = check_tensor("all_reduce", tensor);
  const Contiguous work(tensor);
  detail::all_reduce(work.data(), count_of(tensor), dtype,
                     {.op = op_for("all_reduce", tensor, options.op), .group = options.group});
  work.write_back();
  return tensor;
}

Work iall_reduce(const at::Tensor& tensor, const AllReduceOptions& options) {
  const auto dtype = check_tensor("iall_reduce", tensor);
  require_contiguous("iall_reduce", tensor);
  return detail::iall_reduce(tensor.data_ptr(), count_of(tensor), dtype,
                             {.op = op_for("iall_reduce", tensor, options.op), .group = options.group});
}

at::Tensor reduce(const at::Tensor& tensor, const ReduceOptions& options) {
  const auto dtype = check_tensor("reduce", tensor);
  const Contiguous work(tensor);
  auto o = options;
  o.op = op_for("reduce", tensor, options.op);
  detail::reduce(work.data(), count_of(tensor), dtype, o);
  work.write_back();
  return tensor;
}

at::Tensor all_gather(const at::Tensor& tensor, const GroupOptions& options) {
  check_tensor("all_gather", tensor);
  const auto first = gather_first_dims("all_gather", tensor, options.group);
  const auto rows = std::accumulate(first.begin(), first.end(), std::int64_t{0});
  auto shape = tensor.sizes().vec();
  if (shape.empty()) shape.push_back(1);  // a scalar from each rank: a vector of them
  shape[0] = rows;
  std::int64_t per_row = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) per_row *= shape[d];
  auto out = at::empty(shape, tensor.options());
  std::vector<std::size_t> counts;
  for (auto f : first) counts.push_back(static_cast<std::size_t>(f * per_row));
  const Contiguous in(tensor);
  detail::all_gather_v(in.data(), count_of(tensor), counts, out.data_ptr(), tensor.element_size(), options.group);
  return out;
}

std::vector<at::Tensor> all_gather_list(const at::Tensor& tensor, const GroupOptions& options) {
  const auto dtype = check_tensor("all_gather", tensor);
  auto flat = at::empty({detail::group_size(options.group), tensor.numel()}, tensor.options());
  const Contiguous in(tensor);
  detail::all_gather(in.data(), count_of(tensor), dtype, flat.data_ptr(), options.group);
  return rows_of(flat, tensor.sizes());
}

void all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const GroupOptions& options) {
  const auto dtype = check_whole_and_block("all_gather_into_tensor", output, "the output", input, "the input",
                                           detail::group_size(options.group));
  const Contiguous in(input);
  const Contiguous out(output);
  detail::all_gather(in.data(), count_of(input), dtype, out.data(), options.group);
  out.write_back();
}

void reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, const AllReduceOptions& options) {
  const auto dtype = check_whole_and_block("reduce_scatter", input, "the input", output, "the output",
                                           detail::group_size(options.group));
  const Contiguous in(input);
  const Contiguous out(output);
  detail::reduce_scatter(in.data(), out.data(), count_of(output), dtype,
                         {.op = op_for("reduce_scatter", input, options.op), .group = options.group});
  out.write_back();
}

at::Tensor reduce_scatter(const at::Tensor& input, const AllReduceOptions& options) {
  check_tensor("reduce_scatter", input);
  const auto n = detail::group_size(options.group);
  if (input.dim() == 0 || input.size(0) % n != 0)
    refuse("reduce_scatter", "the input's dim 0 (" + std::string(input.dim() == 0 ? "none" : std::to_string(input.size(0))) +
                                 ") is not a multiple of the group size " + std::to_string(n));
  auto shape = input.sizes().vec();
  shape[0] /= n;
  auto output = at::empty(shape, input.options());
  reduce_scatter_tensor(output, input, options);
  return output;
}

at::Tensor broadcast(const at::Tensor& tensor, const BroadcastOptions& options) {
  const auto dtype = check_tensor("broadcast", tensor);
  const Contiguous work(tensor);
  detail::broadcast(work.data(), count_of(tensor), dtype, options);
  work.write_back();
  return tensor;
}

at::Tensor broadcast(const std::optional<at::Tensor>& tensor, const BroadcastOptions& options) {
  // src's dtype and shape first; a src without a tensor makes every rank raise there.
  std::optional<std::vector<std::int64_t>> meta;
  if (tensor) {
    check_tensor("broadcast", *tensor);
    meta.emplace();
    meta->push_back(static_cast<std::int64_t>(tensor->scalar_type()));
    for (auto d : tensor->sizes()) meta->push_back(d);
  }
  const auto got = idist::broadcast(meta, options);
  BroadcastOptions plain = options;
  plain.safe_mode = false;  // the metadata is agreed now
  if (get_rank() == options.src) return broadcast(*tensor, plain);
  const std::vector<std::int64_t> shape(got.begin() + 1, got.end());
  auto where = at::TensorOptions().dtype(static_cast<at::ScalarType>(got.at(0)));
  if (backend() == "nccl") where = where.device(at::kCUDA);  // the rank's GPU, current since init()
  auto out = at::empty(shape, where);
  detail::broadcast(out.data_ptr(), count_of(out), dtype_for("broadcast", out), plain);
  return out;
}

std::vector<at::Tensor> gather(const at::Tensor& tensor, const GatherOptions& options) {
  const auto dtype = check_tensor("gather", tensor);
  auto flat = at::empty({detail::group_size(options.group), tensor.numel()}, tensor.options());
  const Contiguous in(tensor);
  if (!detail::gather(in.data(), count_of(tensor), dtype, flat.data_ptr(), options)) return {};
  return rows_of(flat, tensor.sizes());
}

void scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, const ScatterOptions& options) {
  const auto dtype = check_tensor("scatter", output);
  const auto n = detail::group_size(options.group);
  at::Tensor flat;
  if (get_rank() == options.src) {
    if (static_cast<std::int64_t>(inputs.size()) != n)
      refuse("scatter", "src passes " + std::to_string(inputs.size()) + " tensors; expected one per rank of the group (" +
                            std::to_string(n) + ")");
    std::vector<at::Tensor> rows;
    for (const auto& in : inputs) {
      check_tensor("scatter", in);
      check_same("scatter", output, "the output", in, "an input");
      if (in.numel() != output.numel())
        refuse("scatter", "an input holds " + std::to_string(in.numel()) + " elements, the output " +
                              std::to_string(output.numel()));
      rows.push_back(in.reshape({-1}));
    }
    flat = at::cat(rows);
  }
  const Contiguous out(output);
  detail::scatter(flat.defined() ? flat.data_ptr() : nullptr, flat.defined() ? count_of(flat) : 0, out.data(),
                  count_of(output), dtype, options);
  out.write_back();
}

void send(const at::Tensor& tensor, int dst, int tag) {
  check_tensor("send", tensor);
  const Contiguous in(tensor);
  detail::send(in.data(), tensor.nbytes(), dst, tag);
}

void recv(const at::Tensor& tensor, int src, int tag) {
  check_tensor("recv", tensor);
  const Contiguous out(tensor);
  detail::recv(out.data(), tensor.nbytes(), src, tag);
  out.write_back();
}

Work isend(const at::Tensor& tensor, int dst, int tag) {
  check_tensor("isend", tensor);
  require_contiguous("isend", tensor);
  return detail::isend(tensor.data_ptr(), tensor.nbytes(), dst, tag);
}

Work irecv(const at::Tensor& tensor, int src, int tag) {
  check_tensor("irecv", tensor);
  require_contiguous("irecv", tensor);
  return detail::irecv(tensor.data_ptr(), tensor.nbytes(), src, tag);
}

}  // namespace idist

// auto_model's check that every rank wraps the same model (replica_check.hpp).
#include "replica_check.hpp"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <cstdint>
#include <sstream>

#include "torch_errors.hpp"

namespace idist::detail {
namespace {

// A description line: kind, name, shape, dtype and, for parameters, requires_grad, split by
// tabs (names never hold one: libtorch's are dotted identifiers).
struct Entry {
  std::string kind, name, shape, dtype;
  bool requires_grad = false;
};

Entry parse(const std::string& line) {
  Entry e;
  std::istringstream in(line);
  std::string flag;
  std::getline(in, e.kind, '\t');
  std::getline(in, e.name, '\t');
  std::getline(in, e.shape, '\t');
  std::getline(in, e.dtype, '\t');
  std::getline(in, flag, '\t');
  e.requires_grad = flag == "1";
  return e;
}

std::string line_of(const std::string& kind, const std::string& name, const at::Tensor& t) {
  return kind + '\t' + name + '\t' + c10::str(t.sizes()) + '\t' + c10::toString(t.scalar_type()) + '\t' +
         (t.requires_grad() ? "1" : "0");
}

std::vector<Entry> of_kind(const std::vector<std::string>& lines, const std::string& kind) {
  std::vector<Entry> out;
  for (const auto& line : lines)
    if (auto e = parse(line); e.kind == kind) out.push_back(std::move(e));
  return out;
}

std::string plural(std::size_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// The first difference among one kind of entries (parameters or buffers), or "".
std::string differ(const std::vector<Entry>& a, int ra, const std::vector<Entry>& b, int rb) {
  const auto on = [&](const std::string& x, const std::string& y) {
    return x + " on rank " + std::to_string(ra) + " and " + y + " on rank " + std::to_string(rb);
  };
  const std::string kind = a.empty() ? (b.empty() ? "" : b.front().kind) : a.front().kind;
  const auto counts = a.size() == b.size() ? std::string()
                                           : " (rank " + std::to_string(ra) + " has " + plural(a.size(), kind) +
                                                 ", rank " + std::to_string(rb) + " has " + plural(b.size(), kind) +
                                                 ")";
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const auto& x = a[i];
    const auto& y = b[i];
    if (x.name != y.name)
      return kind + " #" + std::to_string(i + 1) + " is " + on("'" + x.name + "'", "'" + y.name + "'") + counts;
    if (x.shape != y.shape) return kind + " '" + x.name + "' is " + on(x.shape, y.shape);
    if (x.dtype != y.dtype) return kind + " '" + x.name + "' is " + on(x.dtype, y.dtype);
    if (x.requires_grad != y.requires_grad)
      return kind + " '" + x.name + "' " + (x.requires_grad ? "requires" : "does not require") +
             " a gradient on rank " + std::to_string(ra) + " but " + (y.requires_grad ? "does" : "not") +
             " on rank " + std::to_string(rb);
  }
  if (a.size() == b.size()) return "";
  const bool a_longer = a.size() > b.size();
  const auto& extra = a_longer ? a[b.size()] : b[a.size()];
  return "rank " + std::to_string(ra) + " has " + plural(a.size(), kind) + " and rank " + std::to_string(rb) + " has " +
         std::to_string(b.size()) + ": '" + extra.name + "' " + extra.shape + " is on rank " +
         std::to_string(a_longer ? ra : rb) + " only";
}

std::uint64_t fnv1a(const std::vector<std::string>& lines) {
  std::uint64_t h = 14695981039346656037ull;
  for (const auto& line : lines) {
    for (const unsigned char c : line) h = (h ^ c) * 1099511628211ull;
    h = (h ^ '\n') * 1099511628211ull;
  }
  return h;
}

}  // namespace

std::vector<std::string> describe_replica(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    lines.push_back(line_of("parameter", item.key(), item.value()));
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    lines.push_back(line_of("buffer", item.key(), item.value()));
  return lines;
}

std::string first_difference(const std::vector<std::string>& a, int rank_a, const std::vector<std::string>& b,
                             int rank_b) {
  for (const std::string kind : {"parameter", "buffer"})
    if (auto d = differ(of_kind(a, kind), rank_a, of_kind(b, kind), rank_b); !d.empty()) return d;
  return "";
}

void verify_replicas(const torch::nn::Module& module) {
  const auto mine = describe_replica(module);
  // MAX of the hash and of its complement is the largest and (complemented) the smallest:
  // one collective says whether every rank has the same.
  const auto h = static_cast<std::int64_t>(fnv1a(mine));
  std::vector<std::int64_t> extremes = {h, ~h};
  idist::all_reduce(extremes, ReduceOp::MAX);
  if (extremes[0] == ~extremes[1]) return;
  std::string joined;
  for (const auto& line : mine) joined += line + '\n';
  const auto all = idist::all_gather(joined);
  const auto lines_of = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  // Every rank compares the same texts in the same order, so every rank raises the same line.
  const auto first = lines_of(all.front());
  for (std::size_t r = 1; r < all.size(); ++r)
    if (auto d = first_difference(first, 0, lines_of(all[r]), static_cast<int>(r)); !d.empty())
      refuse("auto_model", "the replicas differ: " + d +
                               "; every rank must build the same model (DDP refuses this too)");
  refuse("auto_model", "the replicas differ (their descriptions hash differently but read alike)");
}

}  // namespace idist::detail

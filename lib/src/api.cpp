// The public free functions: each forwards to the default runtime's world group. Queries
// answer for a world of one before init(), as ignite's do, so rank-agnostic code can ask
// them anywhere; collectives before init() are an error.

#include <unistd.h>

#include <climits>
#include <iostream>

#include "idist/idist.hpp"
#include "runtime.hpp"

namespace idist {
namespace {

const env::Contract& contract_or_serial() {
  static const env::Contract serial;
  auto* rt = detail::runtime_if_initialized();
  return rt != nullptr ? rt->contract() : serial;
}

}  // namespace

int get_rank() { return contract_or_serial().rank; }
int get_world_size() { return contract_or_serial().world_size; }
int get_local_rank() { return contract_or_serial().local_rank; }
int get_nproc_per_node() { return contract_or_serial().local_world_size; }
int get_nnodes() { return contract_or_serial().nnodes; }
int get_node_rank() { return contract_or_serial().node_rank; }

std::string backend() {
  auto* rt = detail::runtime_if_initialized();
  return rt != nullptr ? std::string(rt->world().backend_name()) : std::string();
}

std::string hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

void show_config(std::ostream& out) {
  const auto b = backend();
  out << "idist configuration:\n"
      << "  backend: " << (b.empty() ? "none (not initialized)" : b) << "\n"
      << "  hostname: " << hostname() << "\n"
      << "  world_size: " << get_world_size() << "\n"
      << "  rank: " << get_rank() << "\n"
      << "  local_rank: " << get_local_rank() << "\n"
      << "  nproc_per_node: " << get_nproc_per_node() << "\n"
      << "  nnodes: " << get_nnodes() << "\n"
      << "  node_rank: " << get_node_rank() << "\n";
}

void show_config() { show_config(std::cout); }

std::vector<std::string> all_gather(const std::string& value) {
  return detail::runtime("all_gather").world().all_gather(value);
}

std::string broadcast(const std::string& value, int src) {
  return detail::runtime("broadcast").world().broadcast(value, src);
}

void barrier() { detail::runtime("barrier").world().barrier(); }

namespace detail {

void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  runtime("all_reduce").world().all_reduce(data, count, dtype, op);
}

void send(const void* data, std::size_t bytes, int dst, int tag) { runtime("send").world().send(data, bytes, dst, tag); }
void recv(void* data, std::size_t bytes, int src, int tag) { runtime("recv").world().recv(data, bytes, src, tag); }
Work isend(const void* data, std::size_t bytes, int dst, int tag) {
  return runtime("isend").world().isend(data, bytes, dst, tag);
}
Work irecv(void* data, std::size_t bytes, int src, int tag) {
  return runtime("irecv").world().irecv(data, bytes, src, tag);
}

std::vector<std::size_t> all_gather_counts(std::size_t count) {
  return runtime("all_gather").world().all_gather_counts(count);
}

void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                  std::size_t element_size) {
  runtime("all_gather").world().all_gather_v(in, count, counts, out, element_size);
}

void broadcast(void* data, std::size_t bytes, int src, const char* op_name) {
  runtime(op_name).world().broadcast(data, bytes, src, op_name);
}

}  // namespace detail
}  // namespace idist

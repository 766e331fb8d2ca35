#pragma once
// libidist: ignite.distributed's API, in C++.
//
//   idist::init();                                   // reads the env contract set by idist-run
//   std::vector<int64_t> t = {1 + 2 * r, 2 + 2 * r};
//   idist::all_reduce(t);                            // SUM by default, in place
//   auto all = idist::all_gather(2.0 * r);           // one value per rank, in rank order
//   auto msg = idist::broadcast(std::string("hi"), 0);
//   idist::barrier();
//   idist::finalize();
//
// Ordering contract (as in every collective library): all ranks call the same collectives in
// the same order with matching arguments (same op, dtype and element count for all_reduce,
// same src and size for broadcast). Sizes may differ between ranks only for all_gather.
// Calls are blocking and not thread-safe: use one thread per rank for collectives.
//
// Errors are idist::Error (idist::TimeoutError when peers do not arrive within IDIST_TIMEOUT),
// and their message starts with "[idist rank r/n] op(backend): ".

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "idist/errors.hpp"
#include "idist/types.hpp"
#include "idist/work.hpp"

namespace idist {

struct InitOptions {
  // The backend the program asks for: "gloo" (CPU, default), "nccl" or "mpi". IDIST_BACKEND,
  // set by `idist-run --backend`, overrides it (with a one-line notice) so that a program
  // written for GPUs can be smoke-tested on CPU.
  std::string backend = "gloo";
};

// Reads the env contract (RANK, WORLD_SIZE, ..., see env_contract.hpp), joins the rendezvous
// at MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and connects the backend. With no variable
// set, runs as a world of one. Throws Error naming the variable when the environment is bad.
void init(const InitOptions& options = {});
// Waits for every rank to arrive (bounded by the timeout), then tears down. Safe to call twice.
void finalize();
bool is_initialized();

int get_rank();
int get_world_size();
int get_local_rank();
int get_nproc_per_node();  // ranks on this node (LOCAL_WORLD_SIZE)
int get_nnodes();
int get_node_rank();
std::string backend();  // "gloo", ...
std::string hostname();
// Prints backend, hostname, world size, ranks and node layout, one "key: value" per line.
void show_config(std::ostream& out);
void show_config();

namespace detail {
// Type-erased entry points behind the templates below; they validate and dispatch.
void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op);
std::vector<std::size_t> all_gather_counts(std::size_t count);
void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                  std::size_t element_size);
void broadcast(void* data, std::size_t bytes, int src, const char* op_name);
void send(const void* data, std::size_t bytes, int dst, int tag);
void recv(void* data, std::size_t bytes, int src, int tag);
Work isend(const void* data, std::size_t bytes, int dst, int tag);
Work irecv(void* data, std::size_t bytes, int src, int tag);
}  // namespace detail

// --- all_reduce: every rank ends with op applied across ranks, element-wise. --------------

template <Element T>
void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::SUM) {
  detail::all_reduce(data.data(), data.size(), dtype_of<T>, op);
}
template <Element T>
void all_reduce(std::vector<T>& data, ReduceOp op = ReduceOp::SUM) {
  all_reduce(std::span<T>(data), op);
}
template <Element T>
[[nodiscard]] T all_reduce(T value, ReduceOp op = ReduceOp::SUM) {
  detail::all_reduce(&value, 1, dtype_of<T>, op);
  return value;
}

// --- all_gather: the concatenation of every rank's input, in rank order. -------------------
// Inputs may have different lengths on different ranks, zero included.

template <Element T>
[[nodiscard]] std::vector<T> all_gather(std::span<const T> data) {
  const auto counts = detail::all_gather_counts(data.size());
  std::vector<T> out(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  detail::all_gather_v(data.data(), data.size(), counts, out.data(), sizeof(T));
  return out;
}
template <Element T>
[[nodiscard]] std::vector<T> all_gather(const std::vector<T>& data) {
  return all_gather(std::span<const T>(data));
}
// One value per rank.
template <Element T>
[[nodiscard]] std::vector<T> all_gather(T value) {
  return all_gather(std::span<const T>(&value, 1));
}
// One string per rank.
[[nodiscard]] std::vector<std::string> all_gather(const std::string& value);

// --- broadcast: src's value reaches every rank. -------------------------------------------
// For buffers every rank passes the same length.

template <Element T>
void broadcast(std::span<T> data, int src = 0) {
  detail::broadcast(data.data(), data.size_bytes(), src, "broadcast");
}
template <Element T>
void broadcast(std::vector<T>& data, int src = 0) {
  broadcast(std::span<T>(data), src);
}
template <Element T>
[[nodiscard]] T broadcast(T value, int src = 0) {
  detail::broadcast(&value, sizeof(T), src, "broadcast");
  return value;
}
// Strings may differ in length: the length travels first.
[[nodiscard]] std::string broadcast(const std::string& value, int src = 0);

// --- barrier: returns once every rank has entered it. ---------------------------------------
void barrier();

// --- point-to-point: one rank's buffer to another's. ---------------------------------------
// The receiver passes a buffer of the sender's length. Between two ranks, transfers with the
// same tag (>= 0) arrive in the order they were sent. send/recv block; isend/irecv return a
// Work at once, and the buffer must stay untouched until its wait() returns.

template <Element T>
void send(std::span<const T> data, int dst, int tag = 0) {
  detail::send(data.data(), data.size_bytes(), dst, tag);
}
template <Element T>
void send(const std::vector<T>& data, int dst, int tag = 0) {
  send(std::span<const T>(data), dst, tag);
}
template <Element T>
void recv(std::span<T> data, int src, int tag = 0) {
  detail::recv(data.data(), data.size_bytes(), src, tag);
}
template <Element T>
void recv(std::vector<T>& data, int src, int tag = 0) {
  recv(std::span<T>(data), src, tag);
}
template <Element T>
[[nodiscard]] Work isend(std::span<const T> data, int dst, int tag = 0) {
  return detail::isend(data.data(), data.size_bytes(), dst, tag);
}
template <Element T>
[[nodiscard]] Work isend(const std::vector<T>& data, int dst, int tag = 0) {
  return isend(std::span<const T>(data), dst, tag);
}
template <Element T>
[[nodiscard]] Work irecv(std::span<T> data, int src, int tag = 0) {
  return detail::irecv(data.data(), data.size_bytes(), src, tag);
}
template <Element T>
[[nodiscard]] Work irecv(std::vector<T>& data, int src, int tag = 0) {
  return irecv(std::span<T>(data), src, tag);
}

}  // namespace idist

// raw_gloo: the reference for idist over gloo. Gloo called directly, the way libidist's gloo
// backend calls it (lib/src/backends/gloo/gloo_backend.cpp): one rendezvous::Context over a
// TCP device, bootstrapped from the same TCP store (rank 0 serves it at MASTER_ADDR:MASTER_PORT,
// IDIST_JOB_TOKEN checked), and per collective the same Gloo algorithm with the same options:
//
//   all_reduce      gloo::allreduce, in place, Gloo's own sum/product/min/max kernels
//   reduce          gloo::reduce; a non-root rank reduces into scratch, leaving its input as is
//   reduce_scatter  Gloo 2022 has none with the options API: all_reduce a copy of the input,
//                   keep this rank's block (idist's algorithm; the copy's scratch is kept
//                   between calls, as a careful user of raw Gloo would)
//   all_gather      gloo::allgather
//   broadcast       gloo::broadcast
//   barrier         gloo::barrier
//   send_recv       an UnboundBuffer per buffer, send/recv + waitSend/waitRecv (no length
//                   header: raw Gloo trusts the receiver's size; idist sends one first)
//
// It takes idist-bench's options and prints its columns (the harness is shared), so
//   idist-run -n 2 raw_gloo -b 8 -e 64M      and      idist-run -n 2 idist-bench -b 8 -e 64M
// are comparable line by line. It links libidist only for the element types and the store.
#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <idist/env_contract.hpp>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "backends/gloo/gloo_store.hpp"
#include "idist/common/addresses.hpp"
#include "harness.hpp"
#include "store/memory_store.hpp"
#include "store/tcp_store.hpp"
#include "idist_store/server.hpp"

namespace bench = idist::bench;
using bench::Collective;
using idist::DType;
using idist::ReduceOp;

namespace {

// The address of the interface that routes towards MASTER_ADDR (a UDP connect sends nothing),
// as libidist picks it; 127.0.0.1 on one host.
std::string local_address_towards(const std::string& host) {
  idist::common::AddressesTried tried;
  auto address = idist::common::local_address_towards(host, 9, tried);
  if (!tried.resolved) throw std::runtime_error("cannot resolve " + host);
  if (address.empty()) throw std::runtime_error("no route to " + host);
  return address;
}

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

template <class T>
ReduceFn gloo_kernel(ReduceOp op) {
  if constexpr (std::is_arithmetic_v<T>) {
    switch (op) {
      case ReduceOp::SUM: return static_cast<ReduceFn>(&gloo::sum<T>);
      case ReduceOp::PRODUCT: return static_cast<ReduceFn>(&gloo::product<T>);
      case ReduceOp::MIN: return static_cast<ReduceFn>(&gloo::min<T>);
      case ReduceOp::MAX: return static_cast<ReduceFn>(&gloo::max<T>);
      default: break;
    }
  }
  // unsupported() keeps these out: bitwise ops, and the 16-bit floats Gloo would sum as integers
  throw std::invalid_argument("raw Gloo has no built-in kernel for this op and type");
}

class RawGloo {
 public:
  explicit RawGloo(const idist::env::Contract& c) : timeout_(c.timeout) {
    namespace detail = idist::detail;
    if (c.world_size == 1) {
      store_ = std::make_unique<detail::MemoryStore>(c.timeout);
    } else {
      if (c.rank == 0)
        server_ = std::make_unique<detail::TcpStoreServer>(detail::StoreServerOptions{
            .host = c.master_addr, .port = c.master_port, .token = c.job_token, .bind_all = c.store_bind_all});
      store_ = std::make_unique<detail::TcpStore>(
          detail::TcpStoreOptions{c.master_addr, c.master_port, c.job_token, c.timeout});
    }
    gloo::transport::tcp::attr attr;
    if (!c.gloo_socket_ifname.empty()) {
      attr.iface = c.gloo_socket_ifname;
    } else {
      attr.hostname = local_address_towards(c.master_addr);
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(c.rank, c.world_size);
    context_->setTimeout(timeout_);
    detail::GlooStore adapter(*store_, detail::GlooStore::Clock::now() + timeout_);
    gloo::rendezvous::PrefixStore prefixed("raw_gloo/", adapter);
    context_->connectFullMesh(prefixed, device);
  }

  int rank() const { return context_->rank; }
  int size() const { return context_->size; }

  std::optional<std::string> unsupported(Collective, DType dtype, std::optional<ReduceOp> op) const {
    if (dtype == DType::float16 || dtype == DType::bfloat16) return "raw Gloo has no bfloat16, and idist's float16 is not gloo::float16";
    if (op && idist::is_bitwise(*op)) return "Gloo has no built-in bitwise reductions";
    return std::nullopt;
  }

  template <class T>
  void all_reduce(T* data, std::size_t count, ReduceOp op) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(gloo_kernel<T>(op));
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  }

  template <class T>
  void reduce(T* data, std::size_t count, ReduceOp op, int root) {
    gloo::ReduceOptions opts(context_);
    opts.setInput(data, count);
    opts.setOutput(rank() == root ? data : scratch<T>(count), count);
    opts.setRoot(root);
    opts.setReduceFunction(gloo_kernel<T>(op));
    opts.setTimeout(timeout_);
    gloo::reduce(opts);
  }

  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t block, ReduceOp op) {
    const auto count = block * static_cast<std::size_t>(size());
    T* all = scratch<T>(count);
    std::memcpy(all, in, count * sizeof(T));
    all_reduce(all, count, op);
    std::memcpy(out, all + block * static_cast<std::size_t>(rank()), block * sizeof(T));
  }

  template <class T>
  void all_gather(const T* in, T* out, std::size_t block) {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<T*>(in), block);
    opts.setOutput(out, block * static_cast<std::size_t>(size()));
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  }

  template <class T>
  void broadcast(T* data, std::size_t count, int root) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  }

  void barrier() {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

  template <class T>
  void send(const T* data, std::size_t count, int peer) {
    auto& buffer = unbound(const_cast<T*>(data), count * sizeof(T));
    buffer.send(peer, kSlot);
    buffer.waitSend(timeout_);
  }

  template <class T>
  void recv(T* data, std::size_t count, int peer) {
    auto& buffer = unbound(data, count * sizeof(T));
    buffer.recv(peer, kSlot);
    buffer.waitRecv(timeout_);
  }

  std::vector<double> all_gather_doubles(std::span<const double> mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size()));
    all_gather(mine.data(), all.data(), mine.size());
    return all;
  }

 private:
  static constexpr std::uint64_t kSlot = 0x42;

  // Scratch space kept between calls.
  template <class T>
  T* scratch(std::size_t count) {
    if (scratch_.size() < count * sizeof(T)) scratch_.resize(count * sizeof(T));
    return reinterpret_cast<T*>(scratch_.data());
  }

  // One UnboundBuffer per user buffer, made once: what a program reusing its buffers does.
  gloo::transport::UnboundBuffer& unbound(void* data, std::size_t bytes) {
    auto& slot = unbound_[{data, bytes}];
    if (!slot) slot = context_->createUnboundBuffer(data, bytes);
    return *slot;
  }

  std::chrono::milliseconds timeout_;
  std::unique_ptr<idist::detail::TcpStoreServer> server_;
  std::unique_ptr<idist::detail::Store> store_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<char> scratch_;
  std::map<std::pair<void*, std::size_t>, std::unique_ptr<gloo::transport::UnboundBuffer>> unbound_;
};

}  // namespace

int main(int argc, char** argv) {
  bench::Options options;
  CLI::App app("Gloo called directly, timed and checked as idist-bench does (the reference for idist over gloo)",
               "raw_gloo");
  bench::CommandLine command_line(app, options);
  if (auto code = command_line.parse(argc, argv)) return *code;
  try {
    RawGloo comm(idist::env::read_contract());
    if (options.root >= comm.size())
      return bench::usage_error("raw_gloo", "--root " + std::to_string(options.root) + " is not a rank (world size " +
                                                std::to_string(comm.size()) + ")");
    bench::HostMemory memory;
    bench::Report report({"raw_gloo", "raw", "gloo", "host"}, options, comm.rank(), comm.size());
    report.start();
    bench::Runner<RawGloo>(comm, memory, options, report).run();
    // Every rank is done before rank 0 takes the store away (and its connections with it).
    comm.barrier();
    return report.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raw_gloo: %s\n", e.what());
    return 1;
  }
}

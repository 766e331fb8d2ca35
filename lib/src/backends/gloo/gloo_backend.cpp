#include "backends/gloo/gloo_backend.hpp"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "backends/gloo/gloo_store.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

// Gloo's own kernels for the classical ops on native types (vectorised); ours for the 16-bit
// floats, which Gloo would otherwise sum as integers, and for the bitwise ops it lacks.
template <class T>
ReduceFn gloo_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return static_cast<ReduceFn>(&gloo::sum<T>);
    case ReduceOp::PRODUCT: return static_cast<ReduceFn>(&gloo::product<T>);
    case ReduceOp::MIN: return static_cast<ReduceFn>(&gloo::min<T>);
    case ReduceOp::MAX: return static_cast<ReduceFn>(&gloo::max<T>);
    default: return nullptr;
  }
}

ReduceFn reducer(DType dtype, ReduceOp op) {
  ReduceFn fn = nullptr;
  switch (dtype) {
    case DType::int8: fn = gloo_kernel<std::int8_t>(op); break;
    case DType::uint8: fn = gloo_kernel<std::uint8_t>(op); break;
    case DType::int32: fn = gloo_kernel<std::int32_t>(op); break;
    case DType::int64: fn = gloo_kernel<std::int64_t>(op); break;
    case DType::float32: fn = gloo_kernel<float>(op); break;
    case DType::float64: fn = gloo_kernel<double>(op); break;
    case DType::float16:
    case DType::bfloat16: break;
  }
  return fn != nullptr ? fn : reduce_kernel(dtype, op);
}

// The one switch over dtypes in this backend: calls f.template operator()<E>() with a type of
// the dtype's size (what Gloo needs to count elements; the reduce function does the typing).
template <class F>
void with_bytes(DType dtype, F&& f) {
  switch (dtype) {
    case DType::int8: return f.template operator()<std::int8_t>();
    case DType::uint8: return f.template operator()<std::uint8_t>();
    case DType::float16:
    case DType::bfloat16: return f.template operator()<std::uint16_t>();
    case DType::int32: return f.template operator()<std::int32_t>();
    case DType::float32: return f.template operator()<float>();
    case DType::int64: return f.template operator()<std::int64_t>();
    case DType::float64: return f.template operator()<double>();
  }
  throw std::invalid_argument("unknown dtype");
}

// The address of the interface this host uses to reach `host`: what the other ranks can
// reach us at. On one node (MASTER_ADDR=127.0.0.1) that is loopback. A UDP connect sends
// nothing; it only asks the kernel for a route.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list) != 0)
    throw std::runtime_error("cannot resolve MASTER_ADDR '" + host + "'");
  std::string address;
  for (auto* ai = list; ai != nullptr && address.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) address = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(list);
  if (address.empty()) throw std::runtime_error("no route from this host to MASTER_ADDR '" + host + "'");
  return address;
}

class GlooBackend final : public Backend {
 public:
  // Every group has its own context (its own connections and slots), all on one device.
  GlooBackend(const BackendInit& init, std::shared_ptr<gloo::transport::Device> device)
      : timeout_(init.timeout), device_(std::move(device)) {
    context_ = std::make_shared<gloo::rendezvous::Context>(init.rank, init.size);
    context_->setTimeout(timeout_);
    GlooStore adapter(init.store);
    gloo::rendezvous::PrefixStore prefixed(init.key_prefix + "gloo", adapter);
    guard([&] { context_->connectFullMesh(prefixed, device_); });
  }

  static std::shared_ptr<gloo::transport::Device> make_device(const env::Contract& contract) {
    gloo::transport::tcp::attr attr;
    if (!contract.gloo_socket_ifname.empty()) {
      attr.iface = contract.gloo_socket_ifname;
    } else {
      attr.hostname = local_address_towards(contract.master_addr, contract.master_port);
    }
    return gloo::transport::tcp::CreateDevice(attr);
  }

  std::string_view name() const override { return "gloo"; }

  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<GlooBackend>(group.init, device_);
  }

  // Gloo reduces raw bytes with the function it is given: the element type only sets sizes.
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    gloo::AllreduceOptions opts(context_);
    with_bytes(dtype, [&]<class E>() { opts.setOutput(static_cast<E*>(data), count); });
    opts.setReduceFunction(reducer(dtype, op));
    opts.setTimeout(timeout_);
    guard([&] { gloo::allreduce(opts); });
  }

  // Gloo's reduce uses its output as scratch space on every rank; a non-root rank's buffer is
  // its input only, and it reduces into a copy, so the caller's data stays as it was.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    gloo::ReduceOptions opts(context_);
    std::vector<char> scratch(context_->rank == root ? 0 : count * dtype_size(dtype));
    with_bytes(dtype, [&]<class E>() {
      opts.setInput(static_cast<E*>(data), count);
      opts.setOutput(scratch.empty() ? static_cast<E*>(data) : reinterpret_cast<E*>(scratch.data()), count);
    });
    opts.setRoot(root);
    opts.setReduceFunction(reducer(dtype, op));
    opts.setTimeout(timeout_);
    guard([&] { gloo::reduce(opts); });
  }

  // Gloo 2022 has no reduce_scatter with the options API (only the old algorithm classes,
  // which must not share a context with it): all_reduce a copy, keep this rank's block.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const auto block = count * dtype_size(dtype);
    std::vector<char> all(static_cast<const char*>(in), static_cast<const char*>(in) + block * static_cast<std::size_t>(context_->size));
    all_reduce(all.data(), count * static_cast<std::size_t>(context_->size), dtype, op);
    std::memcpy(out, all.data() + block * static_cast<std::size_t>(context_->rank), block);
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    gloo::GatherOptions opts(context_);
    opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes_per_rank);
    if (context_->rank == root)
      opts.setOutput(static_cast<char*>(out), bytes_per_rank * static_cast<std::size_t>(context_->size));
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    guard([&] { gloo::gather(opts); });
  }

  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    gloo::ScatterOptions opts(context_);
    if (context_->rank == root) {
      std::vector<char*> blocks;
      for (int r = 0; r < context_->size; ++r)
        blocks.push_back(const_cast<char*>(static_cast<const char*>(in)) + bytes_per_rank * static_cast<std::size_t>(r));
      opts.setInputs(blocks, bytes_per_rank);
    }
    opts.setOutput(static_cast<char*>(out), bytes_per_rank);
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    guard([&] { gloo::scatter(opts); });
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes_per_rank);
    opts.setOutput(static_cast<char*>(out), bytes_per_rank * static_cast<std::size_t>(context_->size));
    opts.setTimeout(timeout_);
    guard([&] { gloo::allgather(opts); });
  }

  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    gloo::AllgathervOptions opts(context_);
    // An empty contribution still needs a valid pointer for gloo's buffer bookkeeping.
    char empty = 0;
    const auto mine = bytes_per_rank[static_cast<std::size_t>(context_->rank)];
    opts.setInput(mine == 0 ? &empty : const_cast<char*>(static_cast<const char*>(in)), mine);
    opts.setOutput(static_cast<char*>(out), std::vector<std::size_t>(bytes_per_rank.begin(), bytes_per_rank.end()));
    opts.setTimeout(timeout_);
    guard([&] { gloo::allgatherv(opts); });
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(data), bytes);
    opts.setRoot(src);
    opts.setTimeout(timeout_);
    guard([&] { gloo::broadcast(opts); });
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    guard([&] { gloo::barrier(opts); });
  }

  // Gloo's unbound buffers: posting never blocks; waiting does. A receive smaller than the
  // message aborts the receiving process inside Gloo (an enforce on its I/O thread), so every
  // message is preceded by its length, and the receiver posts the payload only once it knows
  // it fits. Both travel on slots of their own, numbered per (peer, tag) in posting order, so
  // that payloads posted later, from other threads, still land in the right buffers.
  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    const auto seq = next_sequence(send_sequence_, dst, tag);
    auto length = std::make_shared<std::uint64_t>(bytes);
    std::shared_ptr<gloo::transport::UnboundBuffer> header = context_->createUnboundBuffer(length.get(), sizeof(*length));
    std::shared_ptr<gloo::transport::UnboundBuffer> payload =
        context_->createUnboundBuffer(const_cast<void*>(data), bytes);
    guard([&] {
      header->send(dst, p2p_slot(kHeaderSlot, tag, seq));
      payload->send(dst, p2p_slot(kPayloadSlot, tag, seq));
    });
    return [length, header, payload, timeout = timeout_] {
      guard([&] {
        header->waitSend(timeout);
        payload->waitSend(timeout);
      });
    };
  }

  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    const auto seq = next_sequence(recv_sequence_, src, tag);
    auto length = std::make_shared<std::uint64_t>(0);
    std::shared_ptr<gloo::transport::UnboundBuffer> header = context_->createUnboundBuffer(length.get(), sizeof(*length));
    guard([&] { header->recv(src, p2p_slot(kHeaderSlot, tag, seq)); });
    return [context = context_, length, header, data, bytes, src, tag, seq, timeout = timeout_] {
      guard([&] {
        header->waitRecv(timeout);
        const bool fits = *length == bytes;
        // A mismatch is still received (into scratch space) so the channel stays in step.
        std::vector<char> scratch(fits ? 0 : *length);
        auto payload = context->createUnboundBuffer(fits ? data : scratch.data(), fits ? bytes : scratch.size());
        payload->recv(src, p2p_slot(kPayloadSlot, tag, seq));
        payload->waitRecv(timeout);
        if (!fits)
          throw std::invalid_argument("rank " + std::to_string(src) + " sent " + std::to_string(*length) +
                                      " bytes (tag " + std::to_string(tag) + ") but the receive buffer holds " +
                                      std::to_string(bytes) + "; pass a buffer of the sender's length");
      });
    };
  }

 private:
  // Gloo reports a timeout as an IoException whose text says so (there is no
  // TimeoutException in this version) and argument errors as EnforceNotMet, which is not a
  // gloo::Exception: catch std::exception and sort out timeouts by their text.
  template <class F>
  static void guard(F&& f) {
    try {
      f();
    } catch (const gloo::IoException& e) {
      if (std::strstr(e.what(), "Timed out") != nullptr || std::strstr(e.what(), "timed out") != nullptr)
        throw TimeoutFailure(e.what());
      throw std::runtime_error(e.what());
    }
  }

  // Slots: top byte a kind of our own (gloo's collectives use 0x01 to 0x08), then the tag, then
  // a 24-bit message number.
  static constexpr std::uint64_t kHeaderSlot = 0x70;
  static constexpr std::uint64_t kPayloadSlot = 0x71;
  static std::uint64_t p2p_slot(std::uint64_t kind, std::uint32_t tag, std::uint32_t seq) {
    return kind << 56 | static_cast<std::uint64_t>(tag) << 24 | (seq & 0xffffffu);
  }
  using Sequences = std::map<std::pair<int, std::uint32_t>, std::uint32_t>;
  static std::uint32_t next_sequence(Sequences& sequences, int peer, std::uint32_t tag) {
    return sequences[{peer, tag}]++;
  }
  Sequences send_sequence_;  // posted from the caller's thread only (calls are not thread-safe)
  Sequences recv_sequence_;

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendInit& init) {
  return std::make_unique<GlooBackend>(init, GlooBackend::make_device(init.contract));
}

}  // namespace idist::detail

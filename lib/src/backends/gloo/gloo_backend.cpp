#include "backends/gloo/gloo_backend.hpp"
#include "backends/gloo/enforce.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
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
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "backends/gloo/gloo_store.hpp"
#include "backends/gloo/sockets.hpp"
#include "common/scratch.hpp"
#include "idist/common/addresses.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

// Gloo's own kernels for the classical ops on native types (vectorised); ours for the 16-bit
// floats, which Gloo would otherwise sum as integers, for the bitwise ops it lacks, and for MIN
// and MAX on floats (Gloo's keep or drop a NaN by the order in which it meets the ranks).
template <class T>
ReduceFn gloo_kernel(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return static_cast<ReduceFn>(&gloo::sum<T>);
    case ReduceOp::PRODUCT: return static_cast<ReduceFn>(&gloo::product<T>);
    case ReduceOp::MIN:
      if constexpr (std::is_floating_point_v<T>) return nullptr;
      return static_cast<ReduceFn>(&gloo::min<T>);
    case ReduceOp::MAX:
      if constexpr (std::is_floating_point_v<T>) return nullptr;
      return static_cast<ReduceFn>(&gloo::max<T>);
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
  throw InStepError("unknown dtype");
}

// The address the other ranks can reach us at: our interface towards MASTER_ADDR (loopback
// on one node), with messages that name MASTER_ADDR.
std::string local_address_towards(const std::string& host, int port) {
  common::AddressesTried tried;
  auto address = common::local_address_towards(host, port, tried);
  if (!tried.resolved) throw std::runtime_error("cannot resolve MASTER_ADDR '" + host + "'");
  if (address.empty()) throw std::runtime_error("no route from this host to MASTER_ADDR '" + host + "'");
  return address;
}

// Point-to-point frames (see GlooBackend::send): the length of a message, then, for messages
// of up to kInline bytes, the data.
constexpr std::size_t kInline = 64 * 1024;
constexpr std::size_t kLengthBytes = sizeof(std::uint64_t);
constexpr std::size_t kFrameBytes = kLengthBytes + kInline;

// A frame buffer and Gloo's UnboundBuffer over it, made once and reused for message after
// message: destroying an UnboundBuffer spins (sched_yield) until Gloo's I/O thread has let go
// of it, which happens only just after the waiting thread has woken up, so a buffer made and
// destroyed per message cost a few context switches each time.
struct Frame {
  std::unique_ptr<char[]> bytes;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // after bytes: destroyed first
  bool reusable = false;  // set once the transfer it served has completed
};

class FramePool : public std::enable_shared_from_this<FramePool> {
 public:
  explicit FramePool(std::shared_ptr<gloo::rendezvous::Context> context) : context_(std::move(context)) {}

  // A frame for one message, back in the pool when the last handle goes, if its transfer
  // completed (after a failure Gloo may still hold it: then it is destroyed, which waits).
  std::shared_ptr<Frame> take() {
    std::unique_ptr<Frame> frame;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        frame = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (!frame) {
      frame = std::make_unique<Frame>();
      frame->bytes.reset(new char[kFrameBytes]);
      frame->buffer = context_->createUnboundBuffer(frame->bytes.get(), kFrameBytes);
    }
    return {frame.release(), [pool = shared_from_this()](Frame* f) { pool->give(std::unique_ptr<Frame>(f)); }};
  }

 private:
  static constexpr std::size_t kKept = 64;  // 4 MiB at most, for as many messages in flight

  void give(std::unique_ptr<Frame> frame) {
    if (!frame->reusable) return;
    frame->reusable = false;
    std::lock_guard lock(mu_);
    if (free_.size() < kKept) free_.push_back(std::move(frame));
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Frame>> free_;
};

// Gloo's TCP device runs an event loop on a thread of its own, which waits in epoll_wait with
// a 10 ms timeout; closing a connection waits for the loop's next turn, and so does the end of
// the loop's thread. Idle, that is up to 10 ms per peer whenever a group is torn down, and 10
// more when the device goes: finalize() took 20-30 ms at 2 ranks and 80-120 ms at 8, most of a
// short job's life (docs/BENCHMARKS.md). So the device comes with a bell: an eventfd
// registered with its loop, level-triggered, readable only while rung. Rung, epoll_wait
// returns at once, and the handler only yields the processor (on a busy machine a loop turning
// for nothing must not take the core from the threads doing the teardown): the loop turns
// without waiting for as long as a teardown lasts, then goes back to sleep. Launches of
// init + barrier + exit took half the time with it, from 1 to 64 ranks.
// PyTorch's wheels carry a copy of gloo and export its symbols. In a process that loads one
// (a libtorch program linking idist::torch), that copy comes before libgloo.so.0 in the
// dynamic linker's search, and libidist's calls into gloo reach it: two gloos, objects made by
// one and used by the other. Seen on the GPU machine (PyTorch 2.11): the device's teardown hung
// in the other copy's Loop::shutdown. Refused before anything is made. (Debian's libtorch uses
// libgloo.so.0 itself: one gloo.)
void check_one_gloo() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&gloo::transport::tcp::CreateDevice), &info) == 0 || info.dli_fname == nullptr)
    return;
  const std::string where = info.dli_fname;
  if (where.find("libgloo") != std::string::npos) return;
  throw std::runtime_error("gloo's functions in this process come from " + where +
                           " (another copy of gloo, as PyTorch's wheels carry), not from the libgloo.so.0 libidist "
                           "was built with, and two gloos in one process hang or corrupt data: with that libtorch, "
                           "use the nccl or mpi backend, or build against Debian's libtorch-dev (one gloo)");
}

class TcpDevice {
 public:
  explicit TcpDevice(const gloo::transport::tcp::attr& attr)
      : device_(gloo::transport::tcp::CreateDevice(attr)),
        tcp_(dynamic_cast<gloo::transport::tcp::Device*>(device_.get())),
        bell_fd_(tcp_ != nullptr ? ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1) {
    if (bell_fd_ >= 0) tcp_->registerDescriptor(bell_fd_, EPOLLIN, &bell_);
  }

  ~TcpDevice() {
    if (bell_fd_ < 0) return;
    ring();  // the loop's thread ends at its next turn: now
    // Still used elsewhere, its loop goes on after us: then the bell is taken away first.
    if (device_.use_count() > 1) tcp_->unregisterDescriptor(bell_fd_, &bell_);
    device_.reset();
    ::close(bell_fd_);
  }

  TcpDevice(const TcpDevice&) = delete;
  TcpDevice& operator=(const TcpDevice&) = delete;

  std::shared_ptr<gloo::transport::Device>& device() { return device_; }

  // Between ring() and silence(), the loop turns without waiting. Nested and concurrent
  // teardowns (groups, the world) each ring once; the last silence() quiets it.
  void ring() {
    std::lock_guard lock(mu_);
    if (bell_fd_ >= 0 && rings_++ == 0) {
      const std::uint64_t one = 1;
      [[maybe_unused]] const auto n = ::write(bell_fd_, &one, sizeof(one));
    }
  }
  void silence() {
    std::lock_guard lock(mu_);
    if (bell_fd_ >= 0 && --rings_ == 0) {
      std::uint64_t count = 0;
      [[maybe_unused]] const auto n = ::read(bell_fd_, &count, sizeof(count));
    }
  }

 private:
  struct Bell final : gloo::transport::tcp::Handler {
    void handleEvents(int) override { std::this_thread::yield(); }
  };

  std::shared_ptr<gloo::transport::Device> device_;
  gloo::transport::tcp::Device* tcp_;
  Bell bell_;
  int bell_fd_;
  std::mutex mu_;
  int rings_ = 0;
};

class GlooBackend final : public Backend {
  static constexpr int kConnectAttemptsInGloo = 5;  // tcp::Pair::waitUntil's "timeout_ * 5"

 public:
  // Every group has its own context (its own connections and slots), all on one device.
  GlooBackend(const BackendInit& init, std::shared_ptr<TcpDevice> device)
      : timeout_(init.timeout), device_(std::move(device)) {
    // Connecting is bounded by the user's timeout, as every other wait. This Gloo waits for a
    // pair's initial connection 5x its context's timeout (tcp/pair.h, waitUntil: 25 s at
    // IDIST_TIMEOUT=5), and the pairs keep the timeout they were made with. So: half the
    // timeout for the peers' addresses to appear in the store, pairs made with a tenth (5 x
    // 1/10 = the other half), then the full timeout again for the collectives.
    context_ = std::make_shared<gloo::rendezvous::Context>(init.rank, init.size);
    context_->setTimeout(std::max(std::chrono::milliseconds(1), timeout_ / kConnectAttemptsInGloo / 2));
    GlooStore adapter(init.store, GlooStore::Clock::now() + timeout_ / 2);
    gloo::rendezvous::PrefixStore prefixed(init.key_prefix + "gloo", adapter);
    // Sub-groups number their members from 0; the error is wrapped with the group's name.
    const auto name_peers = [&] {
      peer_names_ = std::make_shared<const PeerNames>(
          PeerNames{named(init, peer_ranks(adapter.got(), init.key_prefix + "gloo/", init.rank, init.size)),
                    member_word(init), aborted_});
    };
    try {
      context_->connectFullMesh(prefixed, device_->device());
    } catch (const gloo::IoException&) {
      name_peers();  // the addresses read so far name the peer that did not connect
      guard("init", [] { throw; });
    }
    name_peers();
    ends_ = socket_ends(adapter.got(), init.key_prefix + "gloo/", init.rank, init.size);
    auto accepted = named(init, accepted_peers(adapter.got(), init.key_prefix + "gloo/", init.rank, init.size));
    if (!accepted.empty()) {
      auto names = *peer_names_;
      names.by_address.insert(names.by_address.end(), accepted.begin(), accepted.end());
      peer_names_ = std::make_shared<const PeerNames>(std::move(names));
    }
    context_->setTimeout(timeout_);
    frames_ = std::make_shared<FramePool>(context_);
  }

  // The connections close with the device's event loop kept turning (see TcpDevice).
  ~GlooBackend() override {
    device_->ring();
    frames_.reset();  // its buffers hold the connections too
    context_.reset();
    device_->silence();
  }

  GlooBackend(const GlooBackend&) = delete;
  GlooBackend& operator=(const GlooBackend&) = delete;

  static std::shared_ptr<TcpDevice> make_device(const env::Contract& contract) {
    check_one_gloo();
    gloo_enforce::install(contract.rank, contract.world_size);
    gloo::transport::tcp::attr attr;
    if (!contract.gloo_socket_ifname.empty()) {
      attr.iface = contract.gloo_socket_ifname;
    } else {
      attr.hostname = local_address_towards(contract.master_addr, contract.master_port);
    }
    return std::make_shared<TcpDevice>(attr);
  }

  std::string_view name() const override { return "gloo"; }

  // The group's sockets shut down (sockets.hpp); waits here then raise the abort's words
  // (guard_with).
  void abort(const std::string& why) noexcept override {
    {
      std::lock_guard lock(aborted_->mu);
      if (aborted_->set.load()) return;
      try {
        aborted_->why = why;
      } catch (...) {
        // Out of memory: the waits here end without the words.
      }
      aborted_->set.store(true, std::memory_order_release);
    }
    try {
      gloo_sockets::shut_down_sockets(ends_);
    } catch (...) {
      // Out of memory: the peers' waits on this rank end at their timeout.
    }
  }

  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<GlooBackend>(group.init, device_);
  }

  // Gloo reduces raw bytes with the function it is given: the element type only sets sizes.
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    gloo::AllreduceOptions opts(context_);
    with_bytes(dtype, [&]<class E>() { opts.setOutput(static_cast<E*>(data), count); });
    opts.setReduceFunction(reducer(dtype, op));
    opts.setTimeout(call_timeout(timeout_));
    guard("all_reduce", [&] { gloo::allreduce(opts); });
  }

  // Gloo's reduce uses its output as scratch space on every rank; a non-root rank's buffer is
  // its input only, and it reduces into scratch space, so the caller's data stays as it was.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    gloo::ReduceOptions opts(context_);
    char* out = context_->rank == root ? static_cast<char*>(data) : scratch(count * dtype_size(dtype));
    with_bytes(dtype, [&]<class E>() {
      opts.setInput(static_cast<E*>(data), count);
      opts.setOutput(reinterpret_cast<E*>(out), count);
    });
    opts.setRoot(root);
    opts.setReduceFunction(reducer(dtype, op));
    opts.setTimeout(call_timeout(timeout_));
    guard("reduce", [&] { gloo::reduce(opts); });
  }

  // Gloo 2022 has no reduce_scatter with the options API (only the old algorithm classes,
  // which must not share a context with it): all_reduce a copy, keep this rank's block.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const auto block = count * dtype_size(dtype);
    const auto size = static_cast<std::size_t>(context_->size);
    char* all = scratch(block * size);
    std::memcpy(all, in, block * size);
    all_reduce(all, count * size, dtype, op);
    std::memcpy(out, all + block * static_cast<std::size_t>(context_->rank), block);
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    gloo::GatherOptions opts(context_);
    opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes_per_rank);
    if (context_->rank == root)
      opts.setOutput(static_cast<char*>(out), bytes_per_rank * static_cast<std::size_t>(context_->size));
    opts.setRoot(root);
    opts.setTimeout(call_timeout(timeout_));
    guard("gather", [&] { gloo::gather(opts); });
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
    opts.setTimeout(call_timeout(timeout_));
    guard("scatter", [&] { gloo::scatter(opts); });
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes_per_rank);
    opts.setOutput(static_cast<char*>(out), bytes_per_rank * static_cast<std::size_t>(context_->size));
    opts.setTimeout(call_timeout(timeout_));
    guard("all_gather", [&] { gloo::allgather(opts); });
  }

  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    gloo::AllgathervOptions opts(context_);
    // An empty contribution still needs a valid pointer for gloo's buffer bookkeeping.
    char empty = 0;
    const auto mine = bytes_per_rank[static_cast<std::size_t>(context_->rank)];
    opts.setInput(mine == 0 ? &empty : const_cast<char*>(static_cast<const char*>(in)), mine);
    opts.setOutput(static_cast<char*>(out), std::vector<std::size_t>(bytes_per_rank.begin(), bytes_per_rank.end()));
    opts.setTimeout(call_timeout(timeout_));
    guard("all_gather", [&] { gloo::allgatherv(opts); });
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(data), bytes);
    opts.setRoot(src);
    opts.setTimeout(call_timeout(timeout_));
    guard("broadcast", [&] { gloo::broadcast(opts); });
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(call_timeout(timeout_));
    guard("barrier", [&] { gloo::barrier(opts); });
  }

  // Gloo's unbound buffers: posting never blocks; waiting does. A receive smaller than the
  // message aborts the receiving process inside Gloo (an enforce on its I/O thread), so a
  // receiver must never post less than what may come; and Gloo moves data only once the
  // receiver has posted, so a transfer the receiver posts late costs two more trips (its
  // "ready" to the sender, then the data). Hence every message starts with a frame that the
  // receiver posts at once, sized for any frame: the message's length, followed, for messages
  // of up to kInline bytes, by the data itself. A small message is one transfer into a buffer
  // posted in advance, as with a raw Gloo send of known size (a separate payload transfer
  // made it three trips: 3-4x raw Gloo's ping-pong time, docs/BENCHMARKS.md). A larger one
  // follows on a payload slot, posted once the receiver knows it fits; a message of another
  // length than the receive buffer is drained (into scratch space, or by not copying the
  // inline data) so the channel stays in step. Frames and payloads travel on slots of their
  // own, numbered per (peer, tag) in posting order, so that messages posted later, from
  // other threads, still land in the right buffers.
  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    const auto seq = next_sequence(send_sequence_, dst, tag);
    const bool inline_data = bytes <= kInline;
    const auto frame_bytes = kLengthBytes + (inline_data ? bytes : 0);
    auto frame = frames_->take();
    const std::uint64_t length = bytes;
    std::memcpy(frame->bytes.get(), &length, kLengthBytes);
    if (inline_data) std::memcpy(frame->bytes.get() + kLengthBytes, data, bytes);
    std::shared_ptr<gloo::transport::UnboundBuffer> payload;
    if (!inline_data) payload = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
    guard("send", [&] {
      frame->buffer->send(dst, p2p_slot(kHeaderSlot, tag, seq), 0, frame_bytes);
      if (payload) payload->send(dst, p2p_slot(kPayloadSlot, tag, seq));
    });
    return [frame, payload, timeout = timeout_, names = peer_names_] {
      guard_with(names.get(), [&] {
        frame->buffer->waitSend(timeout);
        if (payload) payload->waitSend(timeout);
      });
      frame->reusable = true;
    };
  }

  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    const auto seq = next_sequence(recv_sequence_, src, tag);
    auto frame = frames_->take();
    guard("recv", [&] { frame->buffer->recv(src, p2p_slot(kHeaderSlot, tag, seq)); });
    return [context = context_, frame, data, bytes, src, tag, seq, timeout = timeout_, names = peer_names_] {
      guard_with(names.get(), [&] {
        frame->buffer->waitRecv(timeout);
        frame->reusable = true;
        std::uint64_t length = 0;
        std::memcpy(&length, frame->bytes.get(), kLengthBytes);
        const bool fits = length == bytes;
        if (length <= kInline) {
          if (fits) std::memcpy(data, frame->bytes.get() + kLengthBytes, bytes);
        } else {
          std::vector<char> scratch(fits ? 0 : length);
          auto payload = context->createUnboundBuffer(fits ? data : scratch.data(), fits ? bytes : scratch.size());
          payload->recv(src, p2p_slot(kPayloadSlot, tag, seq));
          payload->waitRecv(timeout);
        }
        if (!fits)
          throw InStepError("rank " + std::to_string(src) + " sent " + std::to_string(length) + " bytes (tag " +
                            std::to_string(tag) + ") but the receive buffer holds " + std::to_string(bytes) +
                            "; pass a buffer of the sender's length");
      });
    };
  }

 private:
  // Gloo reports a timeout as an IoException whose text says so (there is no
  // TimeoutException in this version) and argument errors as EnforceNotMet, which is not a
  // gloo::Exception: catch std::exception and sort out timeouts by their text.
  // A connection error names the peer's address ("Connection closed by peer
  // [127.0.0.1]:20904"); the rank behind it is what a user can act on.
  // Set by abort(): every wait here then ends in its words. Shared with completions.
  struct Aborted {
    std::mutex mu;
    std::string why;
    std::atomic<bool> set{false};
  };
  struct PeerNames {
    std::vector<std::pair<std::string, int>> by_address;  // gloo's address of each peer -> its group rank
    std::string word;                                      // "rank " or "group rank "
    std::shared_ptr<Aborted> aborted;
  };
  // This group's listening addresses, as the store holds them (sockets.hpp).
  static gloo_sockets::SocketEnds socket_ends(const std::map<std::string, std::vector<char>>& got,
                                              const std::string& prefix, int rank, int size) {
    gloo_sockets::SocketEnds ends;
    for (const auto& [address, peer] : peer_ranks(got, prefix, rank, size)) ends.theirs.insert(address);
    const auto own = got.find(prefix + std::to_string(rank));
    if (size < 2 || own == got.end() || own->second.size() % static_cast<std::size_t>(size - 1) != 0) return ends;
    const auto one = own->second.size() / static_cast<std::size_t>(size - 1);
    for (std::size_t at = 0; at + one <= own->second.size(); at += one) {
      try {
        const auto begin = own->second.begin() + static_cast<long>(at);
        ends.ours.insert(gloo::transport::tcp::Address(std::vector<char>(begin, begin + static_cast<long>(one))).str());
      } catch (const std::exception&) {
        // Another gloo's layout: this side's accepted sockets are left to their peers.
      }
    }
    return ends;
  }

  template <class F>
  static void guard_with(const PeerNames* names, F&& f) {
    try {
      f();
    } catch (const gloo::IoException& e) {
      if (names != nullptr && names->aborted && names->aborted->set.load(std::memory_order_acquire)) {
        std::lock_guard lock(names->aborted->mu);
        throw AbortedFailure(-1, "this rank aborted the group: " + names->aborted->why);
      }
      if (std::strstr(e.what(), "Timed out") != nullptr || std::strstr(e.what(), "timed out") != nullptr)
        throw TimeoutFailure(e.what());
      const std::string what = e.what();
      const bool connecting = what.find("Connect timeout") != std::string::npos;
      std::string who = "a peer";
      int seen = -1;
      if (names != nullptr)
        for (const auto& [address, peer] : names->by_address)
          if (what.find(address) != std::string::npos) who = names->word + std::to_string(peer), seen = peer;
      // Not found (a gloo whose keys look otherwise, IPv6): "a peer", and the launcher's
      // summary names who died.
      if (connecting)
        throw std::runtime_error(who + " did not complete its connection in time: stopped, or unreachable from here? (gloo: " +
                                 what + ")");
      // Which member, the runtime finds out from what each said as it left (-1: any).
      throw PeerLostFailure(-1, "connection to " + who + " lost: did it exit, crash or call finalize()? (gloo: " + what + ")",
                            seen);
    }
  }
  template <class F>
  void guard(const char* op, F&& f) const {
    gloo_enforce::calling(op);
    // Aborted before the call: its sockets are shut down, and a send posted on a pair that
    // already failed is never completed by Gloo (it waits out the call's timeout: a survivor
    // held 60 s in e2e.reform over TCP, the abort having come just before its all_reduce).
    if (aborted_->set.load(std::memory_order_acquire)) {
      std::lock_guard lock(aborted_->mu);
      throw AbortedFailure(-1, "this rank aborted the group: " + aborted_->why);
    }
    guard_with(peer_names_.get(), std::forward<F>(f));
  }

  // The pairs that accepted their connection know the peer by the port it connected from,
  // which no store key holds. The kernel knows: an established socket whose local end is our
  // pair's listening address for peer p (our own key, at p's index) has p's port as its
  // remote end. Read once, after connecting, from /proc/net/tcp (IPv4; gloo binds IPv4 here).
  static std::vector<std::pair<std::string, int>> accepted_peers(const std::map<std::string, std::vector<char>>& got,
                                                                 const std::string& prefix, int rank, int size) {
    std::vector<std::pair<std::string, int>> out;
    const auto own = got.find(prefix + std::to_string(rank));
    if (size < 2 || own == got.end() || own->second.size() % static_cast<std::size_t>(size - 1) != 0) return out;
    const auto one = own->second.size() / static_cast<std::size_t>(size - 1);
    std::map<std::pair<std::uint32_t, int>, int> listening;  // (address as /proc writes it, port) -> peer
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const auto begin = own->second.begin() + static_cast<long>(static_cast<std::size_t>(peer < rank ? peer : peer - 1) * one);
      try {
        const gloo::transport::tcp::Address address(std::vector<char>(begin, begin + static_cast<long>(one)));
        const auto& ss = address.getSockaddr();
        if (ss.ss_family != AF_INET) continue;
        const auto& in = reinterpret_cast<const sockaddr_in&>(ss);
        listening[{in.sin_addr.s_addr, ntohs(in.sin_port)}] = peer;
      } catch (const std::exception&) {
        return out;
      }
    }
    std::ifstream table("/proc/net/tcp");
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      unsigned slot = 0, local_ip = 0, local_port = 0, remote_ip = 0, remote_port = 0, state = 0;
      if (std::sscanf(line.c_str(), " %u: %8X:%4X %8X:%4X %2X", &slot, &local_ip, &local_port, &remote_ip, &remote_port,
                      &state) != 6 || state != 1 /* ESTABLISHED */)
        continue;
      // /proc writes the address as the host reads the network-order word.
      const auto it = listening.find({local_ip, static_cast<int>(local_port)});
      if (it == listening.end()) continue;
      // Written by gloo's own Address::str(), whatever its quirks, so that it matches gloo's
      // messages character for character.
      sockaddr_in remote{};
      remote.sin_family = AF_INET;
      remote.sin_addr.s_addr = remote_ip;
      remote.sin_port = htons(static_cast<std::uint16_t>(remote_port));
      out.emplace_back(
          gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&remote), sizeof(remote)).str(), it->second);
    }
    return out;
  }

  // The members as the user knows them (BackendInit::names).
  static std::vector<std::pair<std::string, int>> named(const BackendInit& init,
                                                        std::vector<std::pair<std::string, int>> peers) {
    for (auto& [address, peer] : peers) peer = name_of(init, peer);
    return peers;
  }

  // Each peer's address for its connection to us, as gloo's connectFullMesh read it from the
  // store: key "<prefix><peer>" holds the peer's addresses for its connections to every other
  // rank in rank order, all of one size, ours at our index among them.
  static std::vector<std::pair<std::string, int>> peer_ranks(const std::map<std::string, std::vector<char>>& got,
                                                             const std::string& prefix, int rank, int size) {
    std::vector<std::pair<std::string, int>> out;
    for (int peer = 0; peer < size; ++peer) {
      const auto it = got.find(prefix + std::to_string(peer));
      if (peer == rank || it == got.end() || it->second.size() % static_cast<std::size_t>(size - 1) != 0) continue;
      const auto one = it->second.size() / static_cast<std::size_t>(size - 1);
      const auto index = static_cast<std::size_t>(rank < peer ? rank : rank - 1);
      const auto begin = it->second.begin() + static_cast<long>(index * one);
      try {
        out.emplace_back(gloo::transport::tcp::Address(std::vector<char>(begin, begin + static_cast<long>(one))).str(),
                         peer);
      } catch (const std::exception&) {
        // Another gloo's layout: errors then name the address alone.
      }
    }
    return out;
  }

  // Scratch space for reduce and reduce_scatter (common/scratch.hpp).
  char* scratch(std::size_t bytes) { return grown_scratch(scratch_, bytes); }
  std::vector<char> scratch_;

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
  std::shared_ptr<FramePool> frames_;
  Sequences send_sequence_;  // posted from the caller's thread only (calls are not thread-safe)
  Sequences recv_sequence_;

  std::chrono::milliseconds timeout_;
  std::shared_ptr<TcpDevice> device_;
  std::shared_ptr<Aborted> aborted_ = std::make_shared<Aborted>();
  gloo_sockets::SocketEnds ends_;  // this group's sockets, for abort()
  std::shared_ptr<const PeerNames> peer_names_;  // shared with completions, which may outlive us
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const BackendInit& init) {
  return std::make_unique<GlooBackend>(init, GlooBackend::make_device(init.contract));
}

}  // namespace idist::detail

#include "process_group.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "device_memory.hpp"
#include "in_step_error.hpp"
#include "recorder.hpp"
#include "reduce/kernels.hpp"
#include "work_state.hpp"

namespace idist::detail {

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  defers_entry_ = ring_.active() && backend_->traits().runs_before_wait;
  // Errors name the backend the program chose (gloo), even where another carries it (shm).
  if (options_.site.backend.empty()) options_.site.backend = std::string(backend_->name());
}

ErrorSite ProcessGroup::site(std::string_view op) const {
  ErrorSite s = options_.site;
  s.op = std::string(op);
  if (options_.description != "world") s.op += " on " + options_.description;
  return s;
}

ProcessGroup::~ProcessGroup() {
  // In finalize(), this rank's own async collectives end first: a peer told that this rank
  // has left must not find it gone from a call it still makes.
  if (finalizing() && tail_.valid()) tail_.wait();
  if (backend_) backend_->cancel_transfers();
  for (auto& done : in_flight_) done.wait();
}

template <class Where, class F>
void ProcessGroup::run(Health& health, const std::vector<int>& members, Where&& where, F&& f) {
  if (health.failed.load(std::memory_order_acquire)) {
    std::lock_guard lock(health.mu);
    // Aborted (live recovery's cascade, on whichever thread saw the loss): a loss, so that the
    // program's handler for one (reform()) sees it whichever call it is in.
    if (health.broken.rfind("aborted: ", 0) == 0)
      throw PeerLostError(where(), "unusable after an earlier failure: " + health.broken, -1);
    throw Error(where(), "unusable after an earlier failure: " + health.broken);
  }
  auto mark_broken = [&](const char* why) {
    std::lock_guard lock(health.mu);
    if (health.broken.empty()) health.broken = why;
    health.failed.store(true, std::memory_order_release);
  };
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const TimeoutFailure& e) {
    mark_broken(e.what());
    throw TimeoutError(where(), e.what());
  } catch (const PeerLostFailure& e) {
    mark_broken(e.what());
    const int peer = e.member() >= 0 ? e.member() : e.seen();
    const bool known = peer >= 0 && (members.empty() || static_cast<std::size_t>(peer) < members.size());
    throw PeerLostError(where(), e.what(), !known ? -1 : members.empty() ? peer : members[static_cast<std::size_t>(peer)]);
  } catch (const InStepError& e) {
    // An argument check that every rank made alike (or a receive of the wrong size, which the
    // backend drained): the connections are still in step, so the group stays usable.
    throw Error(where(), e.what());
  } catch (const std::exception& e) {
    mark_broken(e.what());
    throw Error(where(), e.what());
  }
}

void ProcessGroup::abort(const std::string& why) {
  {
    std::lock_guard lock(health_->mu);
    if (health_->broken.empty()) health_->broken = "aborted: " + why;
    health_->failed.store(true, std::memory_order_release);
  }
  backend_->abort(why);
}

// --- argument checks, on the caller's thread, before anything is sent -----------------------

void ProcessGroup::check_root(std::string_view op, std::string_view role, int root) const {
  if (root < 0 || root >= size())
    throw Error(site(op), fmt::format("{}={} is not a rank ({} size {})", role, root,
                                      options_.description == "world" ? "world" : "group", size()));
}

void ProcessGroup::check_buffer(std::string_view op, const void* data, std::size_t count) const {
  if (count > 0 && data == nullptr) throw Error(site(op), "null buffer with count > 0");
  // gloo and mpi would read device memory as host memory: a crash, or silent garbage.
  if (count > 0 && !backend_->traits().device_buffers && is_device_memory(data))
    throw Error(site(op), "the buffer is GPU memory, which the " + options_.site.backend +
                              " backend cannot read; use the nccl backend, or copy it to the host first");
}

void ProcessGroup::check_reduce(std::string_view op, DType dtype, ReduceOp reduce) const {
  try {
    check_reduce_op(dtype, reduce);
  } catch (const InStepError& e) {
    throw Error(site(op), e.what());
  }
}

void ProcessGroup::check_peer(std::string_view op, std::string_view role, int peer, int tag, const void* data,
                              std::size_t bytes) const {
  if (peer < 0 || peer >= size())
    throw Error(site(op), fmt::format("{}={} is not a rank (world size {})", role, peer, size()));
  if (peer == rank())
    throw Error(site(op), fmt::format("{}={} is this rank: a transfer to itself would never complete", role, peer));
  if (tag < 0) throw Error(site(op), fmt::format("tag={} is negative", tag));
  if (const auto most = backend_->traits().max_tag; tag > most)
    throw Error(site(op), fmt::format("tag={} is above the largest tag the {} backend allows, {}", tag,
                                      options_.site.backend, most));
  check_buffer(op, data, bytes);
}

// --- IDIST_DEBUG: every rank states what it is about to call -----------------------------------

namespace {

// A signature on the wire: fixed size, so one all_gather carries every rank's.
struct WireSignature {
  char op[24] = {};
  std::uint8_t dtype = 0;
  std::uint8_t reduce = 0;
  std::uint8_t invalid = 0;  // this rank's own arguments failed their checks
  std::uint8_t pad = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  char why[64] = {};  // the check that failed, cut short
};

std::string describe(const WireSignature& s, std::uint64_t any_count) {
  std::string op(s.op, strnlen(s.op, sizeof(s.op)));
  if (op == "barrier") return op;
  std::string out = op + "(" + std::string(to_string(static_cast<DType>(s.dtype)));
  if (s.count != any_count) out += fmt::format(", count {}", s.count);
  if (op.find("reduce") != std::string::npos) out += ", " + std::string(to_string(static_cast<ReduceOp>(s.reduce)));
  if (s.root >= 0) out += fmt::format(", root {}", s.root);
  return out + ")";
}

}  // namespace

void ProcessGroup::check_signatures(const Signature& mine, const std::string& invalid) {
  WireSignature wire;
  wire.invalid = invalid.empty() ? 0 : 1;
  std::memcpy(wire.why, invalid.data(), std::min(invalid.size(), sizeof(wire.why) - 1));
  const auto name = mine.name();
  std::memcpy(wire.op, name.data(), std::min(name.size(), sizeof(wire.op) - 1));
  wire.dtype = static_cast<std::uint8_t>(mine.dtype);
  wire.reduce = static_cast<std::uint8_t>(mine.reduce);
  wire.root = mine.root;
  wire.count = mine.count;
  std::vector<WireSignature> all(static_cast<std::size_t>(size()));
  run(name, [&] {
    backend_->all_gather(&wire, all.data(), sizeof(wire));
    for (int r = 0; r < size(); ++r) {
      const auto& s = all[static_cast<std::size_t>(r)];
      if (s.invalid != 0)
        throw InStepError(fmt::format("IDIST_DEBUG: rank {} called {} with invalid arguments ({})", r,
                                      describe(s, kAnyCount), std::string(s.why, strnlen(s.why, sizeof(s.why)))));
    }
    for (int r = 1; r < size(); ++r) {
      if (std::memcmp(&all[0], &all[static_cast<std::size_t>(r)], sizeof(wire)) == 0) continue;
      // Every rank sees the same table, so every rank raises the same error.
      throw InStepError(fmt::format("IDIST_DEBUG: ranks call different collectives: rank {} calls {} but rank 0 calls {}",
                                    r, describe(all[static_cast<std::size_t>(r)], kAnyCount), describe(all[0], kAnyCount)));
    }
  });
}

template <class Checks>
void ProcessGroup::validate(const Signature& signature, Checks&& checks) {
  try {
    checks();
  } catch (const Error& e) {
    if (options_.debug && !alone()) {
      if (tail_.valid()) tail_.wait();
      ++collectives_;  // numbered as on the ranks that run it
      try {
        check_signatures(signature, e.detail());
      } catch (const Error&) {
        // Everyone raises now; this rank with its own, more precise, message.
      }
    }
    throw;
  }
}

// --- running: blocking on this thread, async on a chain of workers ----------------------------

// A collective in the flight recorder. Entered where the backend runs the group's wait work,
// once the call has posted its part (Backend::before_wait), else at once; entered in any case,
// and left, when the call ends.
class ProcessGroup::CallRecord {
 public:
  CallRecord(ProcessGroup& group, const Signature& sig, std::uint64_t number, std::uint64_t bytes)
      : group_(group), sig_(sig), number_(number), bytes_(bytes) {
    if (group.defers_entry_)
      group.backend_->defer_to_wait({&CallRecord::enter, this});
    else
      enter(this);
  }
  CallRecord(const CallRecord&) = delete;
  CallRecord& operator=(const CallRecord&) = delete;
  ~CallRecord() {
    group_.backend_->before_wait();  // a call that ended before any wait
    RecorderRing::leave(mark_, ok_);
  }
  void succeeded() { ok_ = true; }

 private:
  static void enter(void* self) noexcept {
    auto& r = *static_cast<CallRecord*>(self);
    const auto& o = r.group_.options_;
    r.group_.ring_.enter_into(r.mark_, o.epoch, o.group_id, r.number_, r.sig_.op, r.sig_.dtype, r.sig_.count,
                              r.sig_.root, r.sig_.reduce, r.group_.history_, r.bytes_);
  }

  ProcessGroup& group_;
  const Signature& sig_;
  std::uint64_t number_;
  std::uint64_t bytes_;
  RecorderRing::Mark mark_;
  bool ok_ = false;
};

void ProcessGroup::run_body(const Call& call) {
  const auto number = collectives_++;
  if (options_.debug) check_signatures(call.signature);
  if (!call.body) return;
  const auto& sig = call.signature;
  history_ = common::recorder::fold_call(history_, sig.op, static_cast<std::uint8_t>(sig.dtype), sig.count, sig.root,
                                         static_cast<std::uint8_t>(sig.reduce));
  CallRecord record(*this, sig, number, call.bytes);
  run(sig.name(), [&] {
    try {
      call.body();
    } catch (const TimeoutFailure& e) {
      if (!options_.explain_timeout) throw;
      std::string why;
      try {
        const auto& s = call.signature;
        WireSignature wire;
        const auto name = s.name();
        std::memcpy(wire.op, name.data(), std::min(name.size(), sizeof(wire.op) - 1));
        wire.dtype = static_cast<std::uint8_t>(s.dtype);
        wire.reduce = static_cast<std::uint8_t>(s.reduce);
        wire.root = s.root;
        wire.count = s.count;
        why = options_.explain_timeout(s.name(), describe(wire, kAnyCount), number);
      } catch (const std::exception& ex) {
        why = std::string("could not find out which ranks are missing: ") + ex.what();
      }
      throw TimeoutFailure(why.empty() ? std::string(e.what()) : std::string(e.what()) + "; " + why);
    } catch (const PeerLostFailure& e) {
      const bool own_abort = dynamic_cast<const AbortedFailure*>(&e) != nullptr;
      // Before the departure is looked up in the store: a survivor waiting on this rank is
      // freed now, not after the lookup (which may wait for a store that went with rank 0).
      if (options_.on_peer_lost && !own_abort) options_.on_peer_lost();
      if (!options_.explain_departure || own_abort) throw;
      std::string why;
      try {
        why = options_.explain_departure(e.member(), call.signature.name(), number);
      } catch (const std::exception&) {
        // The transport's own words stand.
      }
      if (why.empty()) throw;
      throw PeerLostFailure(e.member(), why, e.seen());
    }
  });
  record.succeeded();
}

void ProcessGroup::execute(const Call& call) {
  if (alone()) return;
  if (tail_.valid()) tail_.wait();  // the async collectives called before this one go first
  run_body(call);
}

Work ProcessGroup::enqueue(Call call) {
  if (alone()) return Work();
  auto where = site(call.signature.name());
  auto done = std::async(std::launch::async, [this, previous = tail_, call = std::move(call)] {
                if (previous.valid()) previous.wait();
                run_body(call);
              }).share();
  tail_ = done;
  return track(std::move(done), std::move(where));
}

Work ProcessGroup::track(std::shared_future<void> done, ErrorSite where) {
  auto state = std::make_shared<WorkState>();
  state->site = std::move(where);
  state->done = std::move(done);
  std::erase_if(in_flight_, [](const auto& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  in_flight_.push_back(state->done);
  return Work(std::move(state));
}

// --- reductions --------------------------------------------------------------------------------

// AVG: shared memory divides each chunk while it is in cache, nccl has ncclAvg; for the other
// backends the sum, in host memory, is divided here, one more pass over it.
ReduceOp ProcessGroup::backend_op(ReduceOp op) const {
  return op == ReduceOp::AVG && !backend_->traits().native_avg ? ReduceOp::SUM : op;
}

void ProcessGroup::average(ReduceOp op, void* data, std::size_t count, DType dtype) const {
  if (op == ReduceOp::AVG && backend_op(op) != op) divide(data, count, dtype, size());
}

ProcessGroup::Call ProcessGroup::all_reduce_call(void* data, std::size_t count, DType dtype, ReduceOp op) {
  Call call{{Op::all_reduce, dtype, count, op, -1}, {}};
  validate(call.signature, [&] {
    check_buffer("all_reduce", data, count);
    check_reduce("all_reduce", dtype, op);
  });
  if (count > 0)
    call.body = [this, data, count, dtype, op] {
      backend_->all_reduce(data, count, dtype, backend_op(op));
      average(op, data, count, dtype);
    };
  return call;
}

void ProcessGroup::all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  execute(all_reduce_call(data, count, dtype, op));
}

Work ProcessGroup::iall_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  return enqueue(all_reduce_call(data, count, dtype, op));
}

ProcessGroup::Call ProcessGroup::reduce_call(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  Call call{{Op::reduce, dtype, count, op, root}, {}};
  validate(call.signature, [&] {
    check_root("reduce", "dst", root);
    check_buffer("reduce", data, count);
    check_reduce("reduce", dtype, op);
  });
  if (count > 0)
    call.body = [this, data, count, dtype, op, root] {
      backend_->reduce(data, count, dtype, backend_op(op), root);
      if (rank() == root) average(op, data, count, dtype);
    };
  return call;
}

void ProcessGroup::reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  execute(reduce_call(data, count, dtype, op, root));
}

Work ProcessGroup::ireduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  return enqueue(reduce_call(data, count, dtype, op, root));
}

void ProcessGroup::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
  Call call{{Op::reduce_scatter, dtype, count, op, -1}, {}};
  validate(call.signature, [&] {
    check_buffer("reduce_scatter", in, count);
    check_buffer("reduce_scatter", out, count);
    check_reduce("reduce_scatter", dtype, op);
  });
  if (alone()) return backend_->copy(out, in, count * dtype_size(dtype));
  if (count > 0)
    call.body = [&] {
      backend_->reduce_scatter(in, out, count, dtype, backend_op(op));
      average(op, out, count, dtype);
    };
  execute(call);
}

// --- gathers -----------------------------------------------------------------------------------

std::vector<std::size_t> ProcessGroup::all_gather_counts(std::size_t count, DType dtype) {
  if (alone()) return {count};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(size()));
  const std::uint64_t mine = count;
  execute({{Op::all_gather, dtype, kAnyCount, ReduceOp::SUM, -1},
           [&] { backend_->all_gather(&mine, counts.data(), sizeof(mine)); }, sizeof(mine)});
  return {counts.begin(), counts.end()};
}

void ProcessGroup::all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                                std::size_t element_size) {
  if (counts.size() != static_cast<std::size_t>(size()) || counts[static_cast<std::size_t>(rank())] != count)
    throw Error(site("all_gather"), "counts do not match this group");
  check_buffer("all_gather", in, count);
  const auto total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (total == 0) return;
  if (alone()) return backend_->copy(out, in, count * element_size);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](auto c) { return c == count; });
  // The counts were just exchanged, so every rank takes the same branch; no second check.
  if (equal) return run("all_gather", [&] { backend_->all_gather(in, out, count * element_size); });
  std::vector<std::size_t> bytes(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * element_size;
  run("all_gather", [&] { backend_->all_gather_v(in, out, bytes); });
}

ProcessGroup::Call ProcessGroup::all_gather_call(const void* in, std::size_t count, DType dtype, void* out) {
  Call call{{Op::all_gather, dtype, count, ReduceOp::SUM, -1}, {}};
  validate(call.signature, [&] {
    check_buffer("all_gather", in, count);
    check_buffer("all_gather", out, count);
  });
  const auto bytes = count * dtype_size(dtype);
  if (count > 0) call.body = [this, in, out, bytes] { backend_->all_gather(in, out, bytes); };
  return call;
}

void ProcessGroup::all_gather(const void* in, std::size_t count, DType dtype, void* out) {
  const auto call = all_gather_call(in, count, dtype, out);
  if (alone()) return backend_->copy(out, in, count * dtype_size(dtype));
  execute(call);
}

Work ProcessGroup::iall_gather(const void* in, std::size_t count, DType dtype, void* out) {
  auto call = all_gather_call(in, count, dtype, out);
  if (alone()) {
    backend_->copy(out, in, count * dtype_size(dtype));
    return Work();
  }
  return enqueue(std::move(call));
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& value) {
  const auto counts = all_gather_counts(value.size());
  std::string joined(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), '\0');
  all_gather_v(value.data(), value.size(), counts, joined.data(), 1);
  std::vector<std::string> out;
  out.reserve(counts.size());
  std::size_t offset = 0;
  for (auto c : counts) {
    out.push_back(joined.substr(offset, c));
    offset += c;
  }
  return out;
}

void ProcessGroup::gather(const void* in, std::size_t count, DType dtype, void* out, int root) {
  Call call{{Op::gather, dtype, count, ReduceOp::SUM, root}, {}};
  validate(call.signature, [&] {
    check_root("gather", "dst", root);
    check_buffer("gather", in, count);
    if (rank() == root) check_buffer("gather", out, count);
  });
  const auto bytes = count * dtype_size(dtype);
  if (alone()) return backend_->copy(out, in, bytes);
  if (count > 0) call.body = [&] { backend_->gather(in, out, bytes, root); };
  execute(call);
}

void ProcessGroup::scatter(const void* in, std::size_t in_count, void* out, std::size_t count, DType dtype, int root) {
  Call call{{Op::scatter, dtype, count, ReduceOp::SUM, root}, {}};
  validate(call.signature, [&] {
    check_root("scatter", "src", root);
    check_buffer("scatter", out, count);
    if (rank() != root) return;
    check_buffer("scatter", in, in_count);
    if (in_count != count * static_cast<std::size_t>(size()))
      throw Error(site("scatter"), fmt::format("src's input holds {} elements; expected group size {} x output {}",
                                               in_count, size(), count));
  });
  const auto bytes = count * dtype_size(dtype);
  if (alone()) return backend_->copy(out, in, bytes);
  if (count > 0) call.body = [&] { backend_->scatter(in, out, bytes, root); };
  execute(call);
}

// --- broadcast ---------------------------------------------------------------------------------

ProcessGroup::Call ProcessGroup::broadcast_call(void* data, std::size_t count, DType dtype, int src) {
  Call call{{Op::broadcast, dtype, count, ReduceOp::SUM, src}, {}};
  validate(call.signature, [&] {
    check_root("broadcast", "src", src);
    check_buffer("broadcast", data, count);
  });
  const auto bytes = count * dtype_size(dtype);
  if (bytes > 0) call.body = [this, data, bytes, src] { backend_->broadcast(data, bytes, src); };
  return call;
}

void ProcessGroup::broadcast(void* data, std::size_t count, DType dtype, int src, bool checked) {
  auto call = broadcast_call(data, count, dtype, src);
  if (checked && !alone()) {
    // Every rank's (dtype, count) to every rank, so that all of them see a mismatch and raise.
    struct Meta {
      std::uint64_t count;
      std::uint64_t dtype;
    } mine{count, static_cast<std::uint64_t>(dtype)};
    std::vector<Meta> all(static_cast<std::size_t>(size()));
    execute({{Op::broadcast, DType::uint8, kAnyCount, ReduceOp::SUM, src},
             [&] { backend_->all_gather(&mine, all.data(), sizeof(Meta)); }});
    const auto& want = all[static_cast<std::size_t>(src)];
    for (int r = 0; r < size(); ++r) {
      const auto& got = all[static_cast<std::size_t>(r)];
      if (got.count != want.count || got.dtype != want.dtype)
        throw Error(site("broadcast"),
                    fmt::format("rank {} passes {} {} elements but src rank {} sends {} {}", r, got.count,
                                to_string(static_cast<DType>(got.dtype)), src, want.count,
                                to_string(static_cast<DType>(want.dtype))));
    }
    call.bytes = call.signature.count * element_bytes(dtype);
    call.signature.count = kAnyCount;  // already compared, more precisely
  }
  execute(call);
}

Work ProcessGroup::ibroadcast(void* data, std::size_t count, DType dtype, int src) {
  return enqueue(broadcast_call(data, count, dtype, src));
}

std::string ProcessGroup::broadcast(const std::string& value, int src) {
  check_root("broadcast", "src", src);
  std::uint64_t length = value.size();
  broadcast(&length, 1, DType::int64, src);
  std::string out = rank() == src ? value : std::string(length, '\0');
  broadcast(out.data(), out.size(), DType::uint8, src);
  return out;
}

Tensor ProcessGroup::broadcast(const std::optional<Tensor>& value, int src) {
  check_root("broadcast", "src", src);
  // (has a value, dtype, element count) from src first: the others learn what to expect.
  std::uint64_t meta[3] = {0, 0, 0};
  if (rank() == src && value) meta[0] = 1, meta[1] = static_cast<std::uint64_t>(value->dtype), meta[2] = value->count();
  broadcast(meta, 3, DType::int64, src);
  if (meta[0] == 0) throw Error(site("broadcast"), fmt::format("src rank {} passed no value", src));
  Tensor out{static_cast<DType>(meta[1]), {}};
  if (rank() == src) {
    out.bytes = value->bytes;
  } else {
    out.bytes.resize(meta[2] * dtype_size(out.dtype));
  }
  broadcast(out.bytes.data(), meta[2], out.dtype, src);
  return out;
}

// --- barrier -----------------------------------------------------------------------------------

void ProcessGroup::barrier() {
  execute({{Op::barrier, DType::uint8, 0, ReduceOp::SUM, -1}, [this] { backend_->barrier(); }});
}

Work ProcessGroup::ibarrier() {
  return enqueue({{Op::barrier, DType::uint8, 0, ReduceOp::SUM, -1}, [this] { backend_->barrier(); }});
}

// --- sub-groups --------------------------------------------------------------------------------

std::unique_ptr<ProcessGroup> ProcessGroup::make_group(const std::vector<int>& members, BackendInit init,
                                                       ProcessGroupOptions options) {
  if (tail_.valid()) tail_.wait();
  std::unique_ptr<Backend> backend;
  run("new_group", [&] { backend = backend_->make_group(GroupInit{members, init}); });
  return std::make_unique<ProcessGroup>(std::move(backend), std::move(options));
}

// --- point-to-point ----------------------------------------------------------------------------

// A point-to-point call in the flight recorder, entered now and left when `ok` says how.
class ProcessGroup::P2pRecord {
 public:
  P2pRecord(const ProcessGroupOptions& o, Op op, int peer, int tag, std::size_t bytes)
      : mark_(RecorderRing::shared(stat_backend(o.site.backend))
                  .enter(o.epoch, o.group_id, static_cast<std::uint64_t>(tag), op, DType::uint8, bytes, peer,
                         ReduceOp::SUM, 0, bytes, common::recorder::Kind::p2p)) {}
  void leave(bool ok) { RecorderRing::leave(mark_, ok); }
  // Runs `body` between the entry and the end it had.
  template <class Body>
  void around(Body&& body) {
    try {
      body();
    } catch (...) {
      leave(false);
      throw;
    }
    leave(true);
  }

 private:
  RecorderRing::Mark mark_;
};

void ProcessGroup::send(const void* data, std::size_t bytes, int dst, int tag) {
  check_peer("send", "dst", dst, tag, data, bytes);
  if (bytes == 0) return;
  P2pRecord(options_, Op::send, dst, tag, bytes).around([&] {
    run("send", [&] { backend_->send(data, bytes, dst, static_cast<std::uint32_t>(tag))(); });
  });
}

void ProcessGroup::recv(void* data, std::size_t bytes, int src, int tag) {
  check_peer("recv", "src", src, tag, data, bytes);
  if (bytes == 0) return;
  P2pRecord(options_, Op::recv, src, tag, bytes).around([&] {
    run("recv", [&] { backend_->recv(data, bytes, src, static_cast<std::uint32_t>(tag))(); });
  });
}

Work ProcessGroup::isend(const void* data, std::size_t bytes, int dst, int tag) {
  check_peer("isend", "dst", dst, tag, data, bytes);
  if (bytes == 0) return Work();
  Backend::Completion completion;
  run("isend", [&] { completion = backend_->send(data, bytes, dst, static_cast<std::uint32_t>(tag)); });
  return start("isend", std::move(completion), P2pRecord(options_, Op::isend, dst, tag, bytes));
}

Work ProcessGroup::irecv(void* data, std::size_t bytes, int src, int tag) {
  check_peer("irecv", "src", src, tag, data, bytes);
  if (bytes == 0) return Work();
  Backend::Completion completion;
  run("irecv", [&] { completion = backend_->recv(data, bytes, src, static_cast<std::uint32_t>(tag)); });
  return start("irecv", std::move(completion), P2pRecord(options_, Op::irecv, src, tag, bytes));
}

Work ProcessGroup::start(std::string_view op, Backend::Completion completion, P2pRecord record) {
  // The posted transfer proceeds in the backend; a thread waits for it so that is_completed()
  // can be asked without disturbing it (a short wait on a Gloo buffer that times out breaks
  // the whole context).
  auto where = site(op);
  auto done = std::async(std::launch::async, [health = health_, members = options_.members, where,
                                              completion = std::move(completion), record]() mutable {
                record.around([&] { run(*health, members, [&] { return where; }, completion); });
              }).share();
  return track(std::move(done), std::move(where));
}

}  // namespace idist::detail

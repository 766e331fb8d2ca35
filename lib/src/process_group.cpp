#include "process_group.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "work_state.hpp"

namespace idist::detail {

ProcessGroup::ProcessGroup(int rank, int size, std::unique_ptr<Backend> backend, ErrorSite site)
    : rank_(rank), size_(size), backend_(std::move(backend)), site_(std::move(site)) {
  site_.backend = std::string(backend_->name());
}

ErrorSite ProcessGroup::site(std::string_view op) const {
  ErrorSite s = site_;
  s.op = std::string(op);
  return s;
}

ProcessGroup::~ProcessGroup() {
  for (auto& done : in_flight_) done.wait();
}

template <class F>
void ProcessGroup::run(Health& health, const ErrorSite& site, F&& f) {
  {
    std::lock_guard lock(health.mu);
    if (!health.broken.empty()) throw Error(site, "unusable after an earlier failure: " + health.broken);
  }
  auto mark_broken = [&](const char* why) {
    std::lock_guard lock(health.mu);
    if (health.broken.empty()) health.broken = why;
  };
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const TimeoutFailure& e) {
    mark_broken(e.what());
    throw TimeoutError(site, e.what());
  } catch (const std::invalid_argument& e) {
    // A backend's argument check found by the peer's data (a receive of the wrong size): the
    // backend kept its connections in step, so the group stays usable.
    throw Error(site, e.what());
  } catch (const std::exception& e) {
    mark_broken(e.what());
    throw Error(site, e.what());
  }
}

void ProcessGroup::check_src(std::string_view op, int src) const {
  if (src < 0 || src >= size_)
    throw Error(site(op), "src=" + std::to_string(src) + " is not a rank (world size " + std::to_string(size_) + ")");
}

void ProcessGroup::all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  if (count > 0 && data == nullptr) throw Error(site("all_reduce"), "null buffer with count > 0");
  if (size_ == 1 || count == 0) return;
  run("all_reduce", [&] { backend_->all_reduce(data, count, dtype, op); });
}

std::vector<std::size_t> ProcessGroup::all_gather_counts(std::size_t count) {
  if (size_ == 1) return {count};
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(size_));
  const std::uint64_t mine = count;
  run("all_gather", [&] { backend_->all_gather(&mine, counts.data(), sizeof(mine)); });
  return {counts.begin(), counts.end()};
}

void ProcessGroup::all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                                std::size_t element_size) {
  if (counts.size() != static_cast<std::size_t>(size_) || counts[static_cast<std::size_t>(rank_)] != count)
    throw Error(site("all_gather"), "counts do not match this group");
  if (count > 0 && in == nullptr) throw Error(site("all_gather"), "null input with count > 0");
  const auto total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (total == 0) return;
  if (size_ == 1) {
    std::memcpy(out, in, count * element_size);
    return;
  }
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](auto c) { return c == count; });
  if (equal) return run("all_gather", [&] { backend_->all_gather(in, out, count * element_size); });
  std::vector<std::size_t> bytes(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * element_size;
  run("all_gather", [&] { backend_->all_gather_v(in, out, bytes); });
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

void ProcessGroup::broadcast(void* data, std::size_t bytes, int src, const char* op_name) {
  check_src(op_name, src);
  if (bytes > 0 && data == nullptr) throw Error(site(op_name), "null buffer with size > 0");
  if (size_ == 1 || bytes == 0) return;
  run(op_name, [&] { backend_->broadcast(data, bytes, src); });
}

std::string ProcessGroup::broadcast(const std::string& value, int src) {
  check_src("broadcast", src);
  std::uint64_t length = value.size();
  broadcast(&length, sizeof(length), src);
  std::string out = rank_ == src ? value : std::string(length, '\0');
  broadcast(out.data(), out.size(), src);
  return out;
}

void ProcessGroup::check_peer(std::string_view op, std::string_view role, int peer, int tag, const void* data,
                              std::size_t bytes) const {
  const std::string name(role);
  if (peer < 0 || peer >= size_)
    throw Error(site(op), name + "=" + std::to_string(peer) + " is not a rank (world size " + std::to_string(size_) + ")");
  if (peer == rank_)
    throw Error(site(op), name + "=" + std::to_string(peer) + " is this rank: a transfer to itself would never complete");
  if (tag < 0) throw Error(site(op), "tag=" + std::to_string(tag) + " is negative");
  if (bytes > 0 && data == nullptr) throw Error(site(op), "null buffer with size > 0");
}

void ProcessGroup::send(const void* data, std::size_t bytes, int dst, int tag) {
  check_peer("send", "dst", dst, tag, data, bytes);
  if (bytes == 0) return;
  run("send", [&] { backend_->send(data, bytes, dst, static_cast<std::uint32_t>(tag))(); });
}

void ProcessGroup::recv(void* data, std::size_t bytes, int src, int tag) {
  check_peer("recv", "src", src, tag, data, bytes);
  if (bytes == 0) return;
  run("recv", [&] { backend_->recv(data, bytes, src, static_cast<std::uint32_t>(tag))(); });
}

Work ProcessGroup::isend(const void* data, std::size_t bytes, int dst, int tag) {
  check_peer("isend", "dst", dst, tag, data, bytes);
  if (bytes == 0) return Work();
  Backend::Completion completion;
  run("isend", [&] { completion = backend_->send(data, bytes, dst, static_cast<std::uint32_t>(tag)); });
  return start("isend", std::move(completion));
}

Work ProcessGroup::irecv(void* data, std::size_t bytes, int src, int tag) {
  check_peer("irecv", "src", src, tag, data, bytes);
  if (bytes == 0) return Work();
  Backend::Completion completion;
  run("irecv", [&] { completion = backend_->recv(data, bytes, src, static_cast<std::uint32_t>(tag)); });
  return start("irecv", std::move(completion));
}

Work ProcessGroup::start(std::string_view op, Backend::Completion completion) {
  // The posted transfer proceeds in the backend; a thread waits for it so that is_completed()
  // can be asked without disturbing it (a short wait on a Gloo buffer that times out breaks
  // the whole context).
  auto state = std::make_shared<WorkState>();
  state->site = site(op);
  state->done = std::async(std::launch::async, [health = health_, where = state->site, completion = std::move(completion)] {
                  run(*health, where, completion);
                }).share();
  std::erase_if(in_flight_, [](const auto& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  in_flight_.push_back(state->done);
  return Work(std::move(state));
}

void ProcessGroup::barrier() {
  if (size_ == 1) return;
  run("barrier", [&] { backend_->barrier(); });
}

}  // namespace idist::detail

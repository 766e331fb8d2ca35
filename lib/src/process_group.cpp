#include "process_group.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

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

template <class F>
void ProcessGroup::run(std::string_view op, F&& f) {
  if (!broken_.empty()) throw Error(site(op), "unusable after an earlier failure: " + broken_);
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const TimeoutFailure& e) {
    broken_ = e.what();
    throw TimeoutError(site(op), e.what());
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw Error(site(op), e.what());
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

void ProcessGroup::barrier() {
  if (size_ == 1) return;
  run("barrier", [&] { backend_->barrier(); });
}

}  // namespace idist::detail

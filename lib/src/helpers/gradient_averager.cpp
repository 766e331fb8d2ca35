// GradientAverager: DistributedDataParallel's bucketed gradient all_reduce.
#include <cstring>
#include <string>

#include "idist/helpers.hpp"

namespace idist {

std::vector<Bucket> plan_buckets(std::span<const std::size_t> byte_sizes, std::size_t cap_bytes) {
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < byte_sizes.size(); ++i) {
    const std::size_t bytes = byte_sizes[i];
    // Empty buffers join the open bucket, and a bucket of only empty ones takes the next buffer.
    if (buckets.empty() || (bytes > 0 && buckets.back().bytes > 0 && buckets.back().bytes + bytes > cap_bytes)) {
      buckets.push_back(Bucket{i, i + 1, bytes});
    } else {
      buckets.back().last = i + 1;
      buckets.back().bytes += bytes;
    }
  }
  return buckets;
}

namespace {

template <class T>
void divide_as(void* data, std::size_t count, int divisor) {
  auto* p = static_cast<T*>(data);
  if constexpr (std::is_floating_point_v<T>) {
    const auto d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < count; ++i) p[i] /= d;
  } else {  // float16, bfloat16: arithmetic in float
    const auto d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < count; ++i) p[i] = T(static_cast<float>(p[i]) / d);
  }
}

void divide(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::float32: return divide_as<float>(data, count, divisor);
    case DType::float64: return divide_as<double>(data, count, divisor);
    case DType::float16: return divide_as<float16>(data, count, divisor);
    case DType::bfloat16: return divide_as<bfloat16>(data, count, divisor);
    default: detail::refuse("GradientAverager", std::string(to_string(dtype)) + " is not a gradient type");
  }
}

}  // namespace

GradientAverager::GradientAverager(GradientAveragerOptions options) : options_(std::move(options)) {}

void GradientAverager::average_raw(std::span<const RawBuffer> buffers, DType dtype) {
  const std::size_t element = dtype_size(dtype);
  std::vector<std::size_t> sizes;
  sizes.reserve(buffers.size());
  for (const auto& b : buffers) sizes.push_back(b.count * element);
  last_buckets_ = plan_buckets(sizes, options_.bucket_cap_bytes);
  last_collective_count_ = 0;
  if (!options_.group.is_member()) return;  // a non-member's average is its own gradient
  const int divisor = options_.group.size();

  // A bucket whose bytes all sit in one buffer is reduced in place; the others go through
  // their own slice of one staging area, so that several can be in flight at once.
  auto in_place = [&](const Bucket& bucket) {
    for (std::size_t i = bucket.first; i < bucket.last; ++i)
      if (sizes[i] > 0) return sizes[i] == bucket.bytes ? &buffers[i] : nullptr;
    return static_cast<const RawBuffer*>(nullptr);
  };
  std::size_t staged = 0;
  for (const auto& bucket : last_buckets_)
    if (in_place(bucket) == nullptr) staged += bucket.bytes;
  if (staging_.size() < staged) staging_.resize(staged);

  struct InFlight {
    const Bucket* bucket;
    std::byte* flat;  // nullptr when reduced in place
    Work work;
  };
  std::vector<InFlight> in_flight;
  in_flight.reserve(last_buckets_.size());
  const AllReduceOptions sum{.op = ReduceOp::SUM, .group = options_.group};
  std::size_t offset = 0;
  std::size_t waited = 0;
  try {
    for (const auto& bucket : last_buckets_) {
      if (bucket.bytes == 0) continue;
      if (const RawBuffer* only = in_place(bucket)) {
        in_flight.push_back({&bucket, nullptr, detail::iall_reduce(only->data, only->count, dtype, sum)});
      } else {
        std::byte* flat = staging_.data() + offset;
        offset += bucket.bytes;
        for (std::size_t i = bucket.first, at = 0; i < bucket.last; at += sizes[i], ++i)
          if (sizes[i] > 0) std::memcpy(flat + at, buffers[i].data, sizes[i]);
        in_flight.push_back({&bucket, flat, detail::iall_reduce(flat, bucket.bytes / element, dtype, sum)});
      }
      ++last_collective_count_;
    }
    for (; waited < in_flight.size(); ++waited) {
      auto& f = in_flight[waited];
      f.work.wait();
      if (f.flat == nullptr) {
        const RawBuffer* only = in_place(*f.bucket);
        divide(only->data, only->count, dtype, divisor);
        continue;
      }
      divide(f.flat, f.bucket->bytes / element, dtype, divisor);
      for (std::size_t i = f.bucket->first, at = 0; i < f.bucket->last; at += sizes[i], ++i)
        if (sizes[i] > 0) std::memcpy(buffers[i].data, f.flat + at, sizes[i]);
    }
  } catch (...) {
    // Collectives still in flight write into staging_ and the caller's buffers: let them
    // finish (or fail) before the caller may free either.
    for (; waited < in_flight.size(); ++waited) {
      try {
        in_flight[waited].work.wait();
      } catch (...) {  // the first error is the one reported
      }
    }
    throw;
  }
}

}  // namespace idist

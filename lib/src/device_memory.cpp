#include "device_memory.hpp"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace idist::detail {
namespace {

// The driver API's cuPointerGetAttribute and its constants (cuda.h), declared here so that a
// build without CUDA still has the check.
using CuPointerGetAttribute = int (*)(void* data, int attribute, std::uintptr_t ptr);
constexpr int kMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kIsManaged = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned kDevice = 2;  // CU_MEMORYTYPE_DEVICE

CuPointerGetAttribute driver_query() {
  // Once found, the driver stays loaded. Until then look again, but at most once a second:
  // dlopen(RTLD_NOLOAD) never loads anything, yet costs about 14 us here, and a program may
  // load CUDA only after init().
  static std::atomic<CuPointerGetAttribute> found{nullptr};
  static std::atomic<std::int64_t> next_look{0};
  if (auto f = found.load(std::memory_order_acquire)) return f;
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now < next_look.load(std::memory_order_relaxed)) return nullptr;
  next_look.store(now + std::chrono::steady_clock::duration(std::chrono::seconds(1)).count(), std::memory_order_relaxed);
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return nullptr;
  auto f = reinterpret_cast<CuPointerGetAttribute>(::dlsym(driver, "cuPointerGetAttribute"));
  found.store(f, std::memory_order_release);
  return f;
}

}  // namespace

bool is_device_memory(const void* ptr) {
  if (ptr == nullptr) return false;
  const auto query = driver_query();
  if (query == nullptr) return false;
  unsigned type = 0;
  // Host memory CUDA never saw answers an error (CUDA_ERROR_INVALID_VALUE): host, then.
  if (query(&type, kMemoryType, reinterpret_cast<std::uintptr_t>(ptr)) != 0 || type != kDevice) return false;
  int managed = 0;
  return query(&managed, kIsManaged, reinterpret_cast<std::uintptr_t>(ptr)) != 0 || managed == 0;
}

}  // namespace idist::detail

#pragma once
// Device buffers handed to a backend that reads host memory (gloo, mpi) would crash the
// process or corrupt data silently; they get an error instead. The check asks the CUDA
// driver, but only when the program has loaded it: a process without libcuda has no device
// memory, and idist itself must not pull CUDA into a CPU job.

namespace idist::detail {

// True when the CUDA driver is loaded in this process and says `ptr` is device memory.
// Managed (unified) memory counts as host memory: the CPU may touch it.
bool is_device_memory(const void* ptr);

}  // namespace idist::detail

#pragma once
// MPI's C API as the mpi backend's files call it: error codes turned into exceptions carrying
// MPI's own text, and sizes into MPI's int counts.

// The C API only: mpi.h would otherwise pull in Open MPI's C++ bindings, which need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <spdlog/fmt/fmt.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "in_step_error.hpp"

namespace idist::detail::mpi {

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline void check(int code, std::string_view call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} failed: {}", call, error_text(code)));
}

inline int error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

inline bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// MPI counts in int. Counting in larger units would need derived datatypes, which MPI's
// predefined reduction ops refuse.
inline int to_int(std::size_t n, std::string_view what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw InStepError(fmt::format("{} {} exceed MPI's limit of {} per call; split the buffer", n, what, INT_MAX));
  return static_cast<int>(n);
}

}  // namespace idist::detail::mpi

#pragma once
// libnbc's algorithms, chosen for the nonblocking collectives idist posts.

#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "backends/mpi/calls.hpp"

namespace idist::detail::mpi {

// idist posts MPI's nonblocking collectives (see "waiting" below), which Open MPI runs in its
// libnbc component rather than in the tuned one behind the blocking calls, and libnbc picks
// its algorithms differently: a binomial allreduce (a reduce, then a broadcast) for every
// in-place call, and a chain for a reduce of 64 KiB and up on at most 4 ranks. Both move twice
// the data the blocking calls move: measured at 2 ranks, 2 to 2.5 times the time of
// MPI_Allreduce and MPI_Reduce from 64 KiB on (docs/BENCHMARKS.md). The choice is an MCA
// variable that the MPI tool interface (MPI_T) may set at run time and that libnbc reads when
// a collective is posted. So idist asks, for an allreduce of 64 KiB and up, for Rabenseifner's
// reduce-scatter + allgather (what the blocking calls use at that size), and keeps libnbc's
// default below, where the binomial tree's fewer rounds win; and for a binomial reduce at
// every size. The choice depends on the size alone, so every rank of a collective runs the
// same schedule, as these variables (scope "all") require. A variable the user set (--mca,
// OMPI_MCA_*, a parameter file) is left as it is, and an MPI without these variables
// (MPICH, ...) is left alone.
class NbcAlgorithms {
 public:
  // After MPI has started.
  static NbcAlgorithms& get() {
    static auto* algorithms = new NbcAlgorithms;  // never destroyed: used until MPI ends
    return *algorithms;
  }

  // Posts an allreduce of `bytes` with `post`, having chosen its algorithm; the lock keeps
  // another idist thread from choosing for its own allreduce in between.
  template <class Post>
  int post_allreduce(std::size_t bytes, Post&& post) {
    if (!allreduce_) return post();
    std::lock_guard lock(mu_);
    const int wanted = bytes >= kLarge ? kRedscatAllgather : kDefault;
    if (wanted != allreduce_value_ && MPI_T_cvar_write(*allreduce_, &wanted) == MPI_SUCCESS) allreduce_value_ = wanted;
    return post();
  }

 private:
  static constexpr std::size_t kLarge = 64 * 1024;  // libnbc's own boundary between small and large
  static constexpr int kDefault = 0;                 // libnbc's "ignore": its own choice
  static constexpr int kBinomial = 2;                // coll_libnbc_ireduce_algorithm
  static constexpr int kRedscatAllgather = 3;        // coll_libnbc_iallreduce_algorithm

  NbcAlgorithms() {
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
    allreduce_ = handle("coll_libnbc_iallreduce_algorithm");
    if (auto reduce = handle("coll_libnbc_ireduce_algorithm")) MPI_T_cvar_write(*reduce, &kBinomial);
  }

  // The variable's handle while it holds libnbc's default and the environment does not name it.
  static std::optional<MPI_T_cvar_handle> handle(const char* name) {
    if (std::getenv(("OMPI_MCA_" + std::string(name)).c_str()) != nullptr) return std::nullopt;
    int index = 0;
    int count = 0;
    MPI_T_cvar_handle h = MPI_T_CVAR_HANDLE_NULL;
    if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS ||
        MPI_T_cvar_handle_alloc(index, nullptr, &h, &count) != MPI_SUCCESS)
      return std::nullopt;
    int value = -1;
    if (count != 1 || MPI_T_cvar_read(h, &value) != MPI_SUCCESS || value != kDefault) {
      MPI_T_cvar_handle_free(&h);
      return std::nullopt;
    }
    return h;
  }

  std::mutex mu_;
  std::optional<MPI_T_cvar_handle> allreduce_;
  int allreduce_value_ = kDefault;
};

}  // namespace idist::detail::mpi

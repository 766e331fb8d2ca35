// MPI itself, one per process (process.hpp), and this process's place in MPI's world.

#include "backends/mpi/process.hpp"

#include <cstdlib>

#include "backends/mpi/mpi_backend.hpp"
#include "backends/mpi/nbc.hpp"

namespace idist::detail::mpi {
namespace {

void end_mpi() {
  if (!mpi_finalized()) MPI_Finalize();
}

// MPI started by idist ends when the process does, not at idist::finalize(): MPI cannot start
// twice in a process, and a program may init and finalize idist more than once (as torch
// finalizes MPI only at exit). A program that failed at init ends MPI here too, so that
// mpirun does not report a process that exited without it. Not on a failing exit in the middle
// of the job (a status other than 0 before idist::finalize()): MPI_Finalize waits for every
// rank, and the others may be waiting in a collective for this one, until their timeout. Left
// unended, the process's exit status reaches mpirun, which ends the job at once and names it.
// Nor on one before any backend was built (an init that failed on this rank alone: the others
// wait for it in theirs). After idist::finalize() it does end MPI, whatever the status: the
// others are finishing too, and one still writing its results must not be killed for this
// one's exit.
void end_mpi_at_exit(int status, void*) {
  auto& p = process();
  if (status != 0 && (p.backends.load() > 0 || !p.built.load())) return;
  std::lock_guard lock(p.mu);
  if (p.started_by_us) end_mpi();
}

std::string_view thread_level(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

}  // namespace

MpiProcess& process() {
  static auto* p = new MpiProcess;
  return *p;
}

void free_comm(MPI_Comm& comm) {
  if (comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

void start_mpi() {
  auto& p = process();
  std::lock_guard lock(p.mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (mpi_finalized())
    throw std::runtime_error(
        "MPI has already ended in this process (MPI_Finalize was called), and MPI cannot start twice");
  int provided = MPI_THREAD_SINGLE;
  if (initialized == 0) {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    p.started_by_us = true;
    ::on_exit(&end_mpi_at_exit, nullptr);  // glibc's atexit that is told the status
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error(fmt::format(
          "this MPI library provides only {}; the mpi backend needs MPI_THREAD_MULTIPLE", thread_level(provided)));
  } else {
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error(
          fmt::format("the program started MPI with {}; the mpi backend needs MPI_THREAD_MULTIPLE "
                      "(MPI_Init_thread), or let idist::init() start MPI",
                      thread_level(provided)));
  }
  NbcAlgorithms::get();
}

}  // namespace idist::detail::mpi

namespace idist::detail {
namespace {
using namespace mpi;

// Frees a communicator made for a moment, also on the way out of an exception.
struct ScratchComm {
  MPI_Comm comm = MPI_COMM_NULL;
  ~ScratchComm() { free_comm(comm); }
};

}  // namespace

Layout mpi_layout() {
  start_mpi();
  // On a duplicate, whose errors can be made to return; the world's abort the job.
  ScratchComm world;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world.comm), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(world.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Layout layout;
  check(MPI_Comm_rank(world.comm, &layout.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(world.comm, &layout.size), "MPI_Comm_size");

  ScratchComm node;
  check(MPI_Comm_split_type(world.comm, MPI_COMM_TYPE_SHARED, layout.rank, MPI_INFO_NULL, &node.comm),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(node.comm, &layout.local_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(node.comm, &layout.local_size), "MPI_Comm_size");

  // Nodes are numbered by their first rank's world rank: the leaders (local rank 0) get a
  // communicator of their own, in world order, and tell their node where it stands.
  ScratchComm leaders;
  check(MPI_Comm_split(world.comm, layout.local_rank == 0 ? 0 : MPI_UNDEFINED, layout.rank, &leaders.comm),
        "MPI_Comm_split");
  int place[2] = {0, 1};
  if (leaders.comm != MPI_COMM_NULL) {
    check(MPI_Comm_rank(leaders.comm, &place[0]), "MPI_Comm_rank");
    check(MPI_Comm_size(leaders.comm, &place[1]), "MPI_Comm_size");
  }
  check(MPI_Bcast(place, 2, MPI_INT, 0, node.comm), "MPI_Bcast");
  layout.node_rank = place[0];
  layout.nnodes = place[1];
  return layout;
}

}  // namespace idist::detail

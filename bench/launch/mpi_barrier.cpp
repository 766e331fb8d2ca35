// The MPI equivalent of idist_barrier, started by `mpirun -np N`: MPI_Init, one barrier, exit.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int code = MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return code == MPI_SUCCESS ? 0 : 1;
}

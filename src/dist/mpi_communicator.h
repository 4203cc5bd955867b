// The MPI communicator (CPU backend) and the hooks the other communicators share with it. Only
// in builds with MPI (PTRAIN_HAVE_MPI); this header needs no MPI headers.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace ptrain {

// Initialises MPI (once per process) and returns the world communicator over host tensors.
std::unique_ptr<Communicator> make_mpi_communicator();
// NCCL over MPI for the CUDA backend (dist/nccl_communicator.cpp); throws EnvironmentError in a
// build without NCCL.
std::unique_ptr<Communicator> make_gpu_communicator();
// MPI_Abort on the world if MPI is running; returns otherwise.
void abort_mpi_job(int code);
// This rank's place among the ranks on its node, from MPI's shared-memory split (starts MPI):
// which GPU the rank takes, decided before the CUDA backend is made.
int node_local_rank();

}  // namespace ptrain

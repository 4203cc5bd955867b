// Running the ptrain binary on several ranks under the MPI launcher CMake found
// (PTRAIN_MPIEXEC), for the data-parallel tests (tests/dist on CPUs, tests/multigpu on GPUs).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace ptrain::test {

static_assert(sizeof(PTRAIN_MPIEXEC) > 1, "PTRAIN_MPIEXEC is empty: CMake found MPI but no mpiexec");

// The launcher: the environment's PTRAIN_MPIEXEC where set (a test binary carried to another
// machine, as scripts/gpu-check.sh does), else the one CMake found.
inline std::string mpiexec() {
  const char* path = std::getenv("PTRAIN_MPIEXEC");
  return path && *path ? path : PTRAIN_MPIEXEC;
}

// Where this test process's mpiruns keep their session directories. Open MPI 4 makes
// <base>/ompi.<host>.<uid>/pid.<pid> and an mpirun that ends removes ompi.<host>.<uid> when it
// is empty, so two mpiruns of one base at once can race: one removes it as the other makes its
// pid directory ("A call to mkdir was unable to create the desired directory", seen in CI with
// two test processes side by side). A test process runs its mpiruns one at a time.
inline const std::filesystem::path& mpi_session_base() {
  static const TempDir base("ompi");
  return base.dir;
}

// `ranks` processes of the binary with `args`, as a shell command. Open MPI's flags let two ranks
// share however few cores this machine has and run as root in containers; single-copy (CMA)
// transfers are off because containers often forbid the ptrace access they need.
inline std::string mpi_command(int ranks, const std::string& args) {
  return "OMPI_MCA_orte_tmpdir_base='" + mpi_session_base().string() +
         "' OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none '" + mpiexec() +
         "' --oversubscribe --allow-run-as-root --bind-to none -np " + std::to_string(ranks) + " '" + ptrain_binary() +
         "' " + args;
}

// Runs the binary on `ranks` ranks from `cwd`, stdout and stderr together. One rank runs the
// binary directly, without mpirun: the single-process path every user without MPI takes.
inline CommandResult run_mpi(int ranks, const std::string& args, const std::filesystem::path& cwd) {
  if (ranks == 1) return run_ptrain(args, cwd);
  return run_shell("cd '" + cwd.string() + "' && " + mpi_command(ranks, args));
}

}  // namespace ptrain::test

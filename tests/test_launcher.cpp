// Which GPU of its node a rank takes: the local rank each launcher puts in the environment.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "dist/communicator.h"

namespace {

// Sets the launcher variables a test names and unsets the others, restoring all of them after.
class LauncherEnvironment {
 public:
  explicit LauncherEnvironment(const std::map<std::string, std::string>& set) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      const auto it = set.find(name);
      if (it != set.end())
        setenv(name, it->second.c_str(), 1);
      else
        unsetenv(name);
    }
  }
  ~LauncherEnvironment() {
    for (const auto& [name, value] : saved_)
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
  }
  LauncherEnvironment(const LauncherEnvironment&) = delete;
  LauncherEnvironment& operator=(const LauncherEnvironment&) = delete;

 private:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "PMIX_SIZE", "PMIX_RANK",
                                           "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"};
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace

TEST_CASE("a rank's GPU on its node comes from Open MPI's, MPICH's or Slurm's local rank", "[dist]") {
  {
    INFO("Open MPI's mpirun, 16 ranks over two nodes: rank 11 is the fourth of the second");
    LauncherEnvironment env({{"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_RANK", "11"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}});
    CHECK(ptrain::launcher_world_size() == 16);
    CHECK(ptrain::launcher_rank() == 11);
    CHECK(ptrain::local_rank() == 3);
  }
  {
    INFO("MPICH's Hydra");
    LauncherEnvironment env({{"PMI_SIZE", "8"}, {"PMI_RANK", "6"}, {"MPI_LOCALRANKID", "2"}});
    CHECK(ptrain::launcher_rank() == 6);
    CHECK(ptrain::local_rank() == 2);
  }
  {
    INFO("Slurm's srun");
    LauncherEnvironment env({{"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}});
    CHECK(ptrain::launcher_rank() == 5);
    CHECK(ptrain::local_rank() == 1);
  }
  {
    INFO("mpirun inside a Slurm allocation: the allocation's SLURM_LOCALID is not mpirun's");
    LauncherEnvironment env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "0"}});
    CHECK(ptrain::local_rank() == 3);
  }
  {
    INFO("another launcher inside an sbatch allocation: its SLURM_* variables are the batch step's");
    LauncherEnvironment env({{"PMI_SIZE", "8"}, {"PMI_RANK", "6"}, {"SLURM_STEP_NUM_TASKS", "1"},
                             {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
    CHECK(ptrain::launcher_local_rank() == -1);  // MPI's split of the ranks decides
  }
  {
    INFO("one process, whatever a stale local rank says");
    LauncherEnvironment env({{"OMPI_COMM_WORLD_SIZE", "1"}, {"SLURM_LOCALID", "5"}});
    CHECK(ptrain::launcher_world_size() == 1);
    CHECK(ptrain::local_rank() == 0);
  }
  {
    LauncherEnvironment env({});
    CHECK(ptrain::launcher_local_rank() == -1);
    CHECK(ptrain::local_rank() == 0);
  }
}

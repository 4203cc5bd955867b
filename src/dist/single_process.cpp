// One process, and what every communicator shares: shards, the launcher's environment, and the
// choice of implementation.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/mpi_communicator.h"

namespace ptrain {

Shard shard_of(int64_t n, int rank, int world) {
  const int64_t base = n / world, extra = n % world;
  Shard s;
  s.count = base + (rank < extra ? 1 : 0);
  s.begin = rank * base + (rank < extra ? rank : extra);
  return s;
}

std::vector<Shard> even_parts(int64_t n, int world) {
  std::vector<Shard> parts;
  for (int r = 0; r < world; ++r) parts.push_back(shard_of(n, r, world));
  return parts;
}

namespace {

class SingleProcess final : public Communicator {
 public:
  std::string description() const override { return "one process"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void barrier() override {}
  void all_reduce_sum(double*, size_t) override {}
  void all_reduce_max(float*, size_t) override {}
  std::vector<double> all_gather(double value) override { return {value}; }
  void broadcast(void*, size_t, int) override {}
  void gather_shards(float* full, const float* shard, int64_t n) override {
    if (full != shard) std::copy(shard, shard + n, full);
  }

 protected:
  void sum_tensor(Tensor) override {}
  void reduce_scatter_tensor(Tensor out, Tensor in, const std::vector<Shard>&) override {
    require_same(out, in, "reduce_scatter_sum");
  }
  void gather_tensor(Tensor out, Tensor in, const std::vector<Shard>&) override { require_same(out, in, "all_gather"); }

 private:
  // With one rank the shard is the whole tensor; callers pass it in place.
  static void require_same(const Tensor& out, const Tensor& in, const char* op) {
    PTRAIN_CHECK(out.data == in.data && out.numel() == in.numel(),
                 std::string("single-process ") + op + ": one rank's shard is the tensor itself (pass it in place)");
  }
};

// The first of `names` that is set, as an int; -1 if none is.
int env_int(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}

}  // namespace

// Open MPI's mpirun, MPICH's hydra (and srun --mpi=pmi2) and srun --mpi=pmix set these.
int launcher_world_size() {
  const int n = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"});
  return n > 0 ? n : 1;
}
int launcher_rank() {
  const int r = env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"});
  return r >= 0 && launcher_world_size() > 1 ? r : 0;
}

std::unique_ptr<Communicator> make_single_process_communicator() { return std::make_unique<SingleProcess>(); }

std::unique_ptr<Communicator> make_communicator(Device device) {
  if (launcher_world_size() <= 1) return make_single_process_communicator();
#ifdef PTRAIN_HAVE_MPI
  if (device == Device::cpu) return make_mpi_communicator();
  return make_gpu_communicator();
#else
  (void)device;
  throw EnvironmentError("this process was started by an MPI launcher with " + std::to_string(launcher_world_size()) +
                         " ranks, but ptrain was built without MPI (install libopenmpi-dev and rebuild, or run one "
                         "process without mpirun)");
#endif
}

// Open MPI's mpirun, MPICH's Hydra, then Slurm's srun. A process inside a Slurm allocation
// inherits the allocation's SLURM_* variables, which say nothing of another launcher's ranks:
// SLURM_LOCALID counts only when Slurm's rank and size are the launcher's.
int launcher_local_rank() {
  if (const int local = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}); local >= 0) return local;
  const bool srun = env_int({"SLURM_PROCID"}) == launcher_rank() &&
                    env_int({"SLURM_STEP_NUM_TASKS"}) == launcher_world_size();
  return srun ? env_int({"SLURM_LOCALID"}) : -1;
}

int local_rank() {
  if (launcher_world_size() <= 1) return 0;
  if (const int from_launcher = launcher_local_rank(); from_launcher >= 0) return from_launcher;
#ifdef PTRAIN_HAVE_MPI
  return node_local_rank();
#else
  return 0;
#endif
}

void abort_other_ranks(int code) {
#ifdef PTRAIN_HAVE_MPI
  abort_mpi_job(code);
#else
  (void)code;
#endif
}

}  // namespace ptrain

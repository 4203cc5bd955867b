// How ranks talk. Training code asks its Communicator for its rank and the world size, reduces
// gradients, metrics and FP8 amaxes through it, and shards optimizer state with it (ZeRO-1).
// Three implementations: one process (every collective is the identity), MPI (the CPU backend:
// host tensors, reductions in a fixed rank order so every rank gets bit-identical sums) and NCCL
// (the CUDA backend: device tensors, bootstrapped over MPI; dist/nccl_communicator.cpp).
//
// Which one a run gets: make_communicator() looks at the environment. Under mpirun or srun (an
// MPI launcher's variables are set) in a build with MPI it initialises MPI; otherwise the run is
// one process, so `ptrain train` works the same without any launcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ptrain {

// The contiguous range [begin, begin + count) of n elements that rank `rank` of `world` owns:
// the first n % world ranks own one element more. ZeRO-1's shards, and the reduce-scatter's.
struct Shard {
  int64_t begin = 0, count = 0;
};
Shard shard_of(int64_t n, int rank, int world);
// Every rank's shard_of(n): the parts an even reduce-scatter or all-gather cuts n elements into.
std::vector<Shard> even_parts(int64_t n, int world);

// Bytes of the tensor collectives a rank took part in (host values, such as losses, norms and
// amaxes, are not counted): each all-reduce's tensor, each reduce-scatter's input (the whole
// vector every rank contributes), each all-gather's output (the whole vector every rank
// receives). The payload, not the wire: a ring all-reduce sends about twice its tensor. Only
// with more than one rank.
struct CollectiveBytes {
  int64_t all_reduced = 0, reduce_scattered = 0, all_gathered = 0;
  CollectiveBytes operator-(const CollectiveBytes& o) const {
    return {all_reduced - o.all_reduced, reduce_scattered - o.reduce_scattered, all_gathered - o.all_gathered};
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // One line for the run log, e.g. "MPI (Open MPI v4.1.4), 2 ranks on 1 node".
  virtual std::string description() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_main() const { return rank() == 0; }

  // ---- host values (metrics, flags, norms), the same result on every rank
  virtual void barrier() = 0;
  virtual void all_reduce_sum(double* values, size_t n) = 0;
  double all_reduce_sum(double value) {
    all_reduce_sum(&value, 1);
    return value;
  }
  // Elementwise max; NaN wins (an FP8 amax that is NaN on any rank stays NaN).
  virtual void all_reduce_max(float* values, size_t n) = 0;
  // values[r] = rank r's `value`, on every rank.
  virtual std::vector<double> all_gather(double value) = 0;
  // `bytes` of host memory from `root` to every rank.
  virtual void broadcast(void* bytes, size_t n, int root) = 0;
  // Rank 0 receives every rank's shard_of(n, r, world) of a host float vector into full (n
  // floats, rank 0 only; other ranks may pass null).
  virtual void gather_shards(float* full, const float* shard, int64_t n) = 0;

  // ---- tensors in the backend's memory (float dtypes), in place or by shards; counted in
  // collective_bytes()
  // t = the sum of t over ranks, bit-identical on every rank. A bf16/fp16 tensor is summed in
  // its format, each addition rounded to it (as NCCL reduces such a tensor).
  void all_reduce_sum(Tensor t) {
    count(traffic_.all_reduced, t);
    sum_tensor(t);
  }
  // out = this rank's shard_of(in.numel()) of the sum of `in` over ranks, summed as above.
  // out may be that shard of `in` itself (in place, as ZeRO-1 sums into its gradient shard).
  void reduce_scatter_sum(Tensor out, Tensor in) { reduce_scatter_sum(out, in, even_parts(in.numel(), world_size())); }
  // The same with rank r's part parts[r] of `in` (consecutive, covering it; some may be empty):
  // ZeRO-2's gradient buckets, whose elements each rank owns are any run of them.
  void reduce_scatter_sum(Tensor out, Tensor in, const std::vector<Shard>& parts) {
    count(traffic_.reduce_scattered, in);
    reduce_scatter_tensor(out, in, parts);
  }
  // out (n elements) = every rank's shard_of(n) of it, concatenated; `in` is this rank's shard.
  void all_gather(Tensor out, Tensor in) { all_gather(out, in, even_parts(out.numel(), world_size())); }
  void all_gather(Tensor out, Tensor in, const std::vector<Shard>& parts) {
    count(traffic_.all_gathered, out);
    gather_tensor(out, in, parts);
  }
  // Since this communicator started.
  const CollectiveBytes& collective_bytes() const { return traffic_; }

  // ---- overlap with computation (GPU communicators)
  // The stream the backend computes on (Backend::stream()): collectives start after the work
  // queued on it so far, and work queued on it after wait() starts after them.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  // Sums each tensor of a bucket over ranks. A communicator that overlaps_compute() returns at
  // once (the sums run beside the backward pass) and completes them in wait(); others finish
  // before returning.
  void all_reduce_sum_async(const std::vector<Tensor>& bucket) {
    for (const Tensor& t : bucket) count(traffic_.all_reduced, t);
    start_sums(bucket);
  }
  // reduce_scatter_sum(out, in, parts), started as all_reduce_sum_async starts its sums: `in`
  // must stay as it is, and `out` unread, until wait() (ZeRO-2's gradient buckets).
  void reduce_scatter_sum_async(Tensor out, Tensor in, const std::vector<Shard>& parts) {
    count(traffic_.reduce_scattered, in);
    start_reduce_scatter(out, in, parts);
  }
  virtual void wait() {}
  // all_gather(out, in, parts), started likewise: `out` must stay unread, and `in` unwritten,
  // until wait_gathers() (ZeRO-3's next block's weights, gathered while this block computes).
  void all_gather_async(Tensor out, Tensor in, const std::vector<Shard>& parts) {
    count(traffic_.all_gathered, out);
    start_gather(out, in, parts);
  }
  // Work queued on the compute stream from now on sees every gather started so far; sums started
  // after the last of them may still be running (their wait() is separate).
  virtual void wait_gathers() {}
  virtual bool overlaps_compute() const { return false; }

 protected:
  // What the tensor calls above do, uncounted.
  virtual void sum_tensor(Tensor t) = 0;
  virtual void reduce_scatter_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) = 0;
  virtual void gather_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) = 0;
  virtual void start_sums(const std::vector<Tensor>& bucket) {
    for (const Tensor& t : bucket) sum_tensor(t);
  }
  virtual void start_reduce_scatter(Tensor out, Tensor in, const std::vector<Shard>& parts) {
    reduce_scatter_tensor(out, in, parts);
  }
  virtual void start_gather(Tensor out, Tensor in, const std::vector<Shard>& parts) { gather_tensor(out, in, parts); }

 private:
  void count(int64_t& total, const Tensor& t) {
    if (world_size() > 1) total += static_cast<int64_t>(t.bytes());
  }
  CollectiveBytes traffic_;
};

std::unique_ptr<Communicator> make_single_process_communicator();

// The communicator for a run on `device`: MPI (cpu) or NCCL over MPI (cuda) when this process
// was started by an MPI launcher with more than one rank, else one process. Throws
// EnvironmentError when the launcher asks for ranks this build cannot provide.
std::unique_ptr<Communicator> make_communicator(Device device);

// The rank and world size an MPI launcher gave this process (0 and 1 without one), read from
// the environment before MPI starts: whether to start MPI, and how to name a failing rank.
int launcher_rank();
int launcher_world_size();
// This rank's index on its node as the launcher's environment gives it
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, or srun's SLURM_LOCALID), or -1.
int launcher_local_rank();
// This rank's index on its node: which of the node's visible GPUs it takes (modulo their
// number). Under a launcher, launcher_local_rank(), else MPI's shared-memory split of the
// ranks; 0 without a launcher.
int local_rank();

// A rank that fails takes the whole job down at once (MPI_Abort), so no other rank waits
// forever in a collective; without MPI this returns and the caller exits with `code`.
void abort_other_ranks(int code);

}  // namespace ptrain

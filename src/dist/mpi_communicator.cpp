// MPI on host memory, for the CPU backend. Sums are reduced in a fixed order: each rank receives
// every rank's copy of its own shard (one MPI_Alltoallv) and adds them in rank order, then the
// shards are all-gathered. So every rank holds bit-identical results, independent of the MPI
// library's choice of reduction algorithm, at the cost of one extra copy of the tensor in flight.
#ifdef PTRAIN_HAVE_MPI

#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "precision/formats.h"

namespace ptrain {
namespace {

// MPI is initialised once per process and finalised at exit (unless a rank aborted the job).
struct MpiSession {
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

void start_mpi() { static MpiSession session; }

int split_local_rank(int rank) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  return local;
}

int to_count(int64_t n, const char* what) {
  if (n > INT_MAX)
    throw EnvironmentError(std::string("MPI: ") + what + " of " + std::to_string(n) +
                           " elements exceeds MPI's int counts; use more ranks");
  return static_cast<int>(n);
}

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    start_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    int first_on_node = split_local_rank(rank_) == 0 ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &first_on_node, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    nodes_ = first_on_node;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    library_ = std::string(version, static_cast<size_t>(length));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
  }

  std::string description() const override {
    return "MPI (" + library_ + "), " + std::to_string(world_) + " ranks on " + std::to_string(nodes_) +
           (nodes_ == 1 ? " node" : " nodes");
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

  // Summed in rank order on every rank (an MPI_Allreduce may associate differently per rank).
  void all_reduce_sum(double* values, size_t n) override {
    std::vector<double> all(n * static_cast<size_t>(world_));
    MPI_Allgather(values, to_count(static_cast<int64_t>(n), "a sum"), MPI_DOUBLE, all.data(),
                  static_cast<int>(n), MPI_DOUBLE, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; ++i) {
      double s = all[i];
      for (int r = 1; r < world_; ++r) s += all[static_cast<size_t>(r) * n + i];
      values[i] = s;
    }
  }

  void all_reduce_max(float* values, size_t n) override {
    // MPI_MAX leaves NaN's fate to the library: reduce "any NaN" separately and restore it.
    std::vector<int> nan(n);
    for (size_t i = 0; i < n; ++i) {
      nan[i] = std::isnan(values[i]) ? 1 : 0;
      if (nan[i]) values[i] = -INFINITY;
    }
    const int count = to_count(static_cast<int64_t>(n), "a max");
    MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, nan.data(), count, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; ++i)
      if (nan[i]) values[i] = NAN;
  }

  std::vector<double> all_gather(double value) override {
    std::vector<double> all(static_cast<size_t>(world_));
    MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
    return all;
  }

  void broadcast(void* bytes, size_t n, int root) override {
    char* p = static_cast<char*>(bytes);
    for (size_t done = 0; done < n;) {  // MPI counts are ints
      const int chunk = static_cast<int>(std::min<size_t>(n - done, INT_MAX));
      MPI_Bcast(p + done, chunk, MPI_BYTE, root, MPI_COMM_WORLD);
      done += static_cast<size_t>(chunk);
    }
  }

  // Point to point, in pieces MPI's int counts can hold: a model's shards begin past 2^31
  // elements (an 8B model's fourth of 8), which MPI_Gatherv's int displacements cannot say.
  // Messages from one rank with one tag arrive in order.
  void gather_shards(float* full, const float* shard, int64_t n) override {
    constexpr int64_t kPiece = INT_MAX;
    const Shard mine = shard_of(n, rank_, world_);
    if (rank_ != 0) {
      for (int64_t at = 0; at < mine.count; at += kPiece)
        MPI_Send(shard + at, static_cast<int>(std::min(kPiece, mine.count - at)), MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
      return;
    }
    std::copy(shard, shard + mine.count, full + mine.begin);
    for (int r = 1; r < world_; ++r) {
      const Shard s = shard_of(n, r, world_);
      for (int64_t at = 0; at < s.count; at += kPiece)
        MPI_Recv(full + s.begin + at, static_cast<int>(std::min(kPiece, s.count - at)), MPI_FLOAT, r, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
  }

 protected:
  void sum_tensor(Tensor t) override {
    expect_host_float(t, "all_reduce_sum");
    dispatch(t, [&](auto zero) {
      using T = decltype(zero);
      const Layout l = layout(t.numel());
      std::vector<T> sum(static_cast<size_t>(l.counts[static_cast<size_t>(rank_)]));
      reduce_scatter(t.as<T>(), l, sum.data(), t.format);
      gather(t.as<T>(), sum.data(), l);
    });
  }

  void reduce_scatter_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    expect_host_float(in, "reduce_scatter_sum");
    expect_host_float(out, "reduce_scatter_sum");
    const Layout l = layout(parts, in.numel());
    PTRAIN_CHECK(out.dtype == in.dtype && out.numel() == l.counts[static_cast<size_t>(rank_)],
                 "reduce_scatter_sum: out must be this rank's part of in, of the same dtype");
    dispatch(in, [&](auto zero) {
      using T = decltype(zero);
      reduce_scatter(in.as<T>(), l, out.as<T>(), out.format);
    });
  }
  void gather_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    expect_host_float(in, "all_gather");
    expect_host_float(out, "all_gather");
    const Layout l = layout(parts, out.numel());
    PTRAIN_CHECK(out.dtype == in.dtype && in.numel() == l.counts[static_cast<size_t>(rank_)],
                 "all_gather: in must be this rank's part of out, of the same dtype");
    dispatch(out, [&](auto zero) {
      using T = decltype(zero);
      gather(out.as<T>(), in.as<T>(), l);
    });
  }

 private:
  struct Layout {
    std::vector<int> counts, displs;  // per rank: its part of the tensor, as ints
  };
  Layout layout(int64_t n) const { return layout(even_parts(n, world_), n); }
  Layout layout(const std::vector<Shard>& parts, int64_t n) const {
    PTRAIN_CHECK(static_cast<int>(parts.size()) == world_, "MPI: one part of the tensor per rank");
    Layout l;
    int64_t next = 0;
    for (const Shard& s : parts) {
      PTRAIN_CHECK(s.begin == next && s.count >= 0, "MPI: the ranks' parts must be consecutive");
      l.counts.push_back(to_count(s.count, "a shard"));
      l.displs.push_back(to_count(s.begin, "a tensor"));
      next = s.begin + s.count;
    }
    PTRAIN_CHECK(next == n, "MPI: the ranks' parts must cover the tensor");
    return l;
  }
  // out (this rank's part) = sum over ranks r = 0, 1, ... of rank r's copy of that part. The
  // CPU backend stores bf16/fp16 values as f32: their sum is rounded to the format after each
  // addition, as NCCL reduces a tensor of that type (and the simulated NCCL, in rank order).
  // out may alias this rank's part of in: the copies are received apart.
  template <typename T>
  void reduce_scatter(const T* in, const Layout& l, T* out, Format format) {
    const int mine = l.counts[static_cast<size_t>(rank_)];
    std::vector<int> recv_counts(static_cast<size_t>(world_), mine), recv_displs(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) recv_displs[static_cast<size_t>(r)] = r * mine;
    std::vector<T> copies(static_cast<size_t>(mine) * static_cast<size_t>(world_));
    MPI_Alltoallv(in, l.counts.data(), l.displs.data(), mpi_type<T>(), copies.data(), recv_counts.data(),
                  recv_displs.data(), mpi_type<T>(), MPI_COMM_WORLD);
    const bool narrow = std::is_same_v<T, float> && format != Format::fp32;
    for (int i = 0; i < mine; ++i) {
      T s = copies[static_cast<size_t>(i)];
      for (int r = 1; r < world_; ++r) {
        s += copies[static_cast<size_t>(r) * static_cast<size_t>(mine) + i];
        if (narrow) s = static_cast<T>(round_to_format(static_cast<float>(s), format, false));
      }
      out[i] = s;
    }
  }
  template <typename T>
  void gather(T* out, const T* shard, const Layout& l) {
    // A shard that already sits at its place in `out` is sent from there (MPI forbids aliasing).
    const bool in_place = shard == out + l.displs[static_cast<size_t>(rank_)];
    MPI_Allgatherv(in_place ? MPI_IN_PLACE : shard, l.counts[static_cast<size_t>(rank_)], mpi_type<T>(), out,
                   l.counts.data(), l.displs.data(), mpi_type<T>(), MPI_COMM_WORLD);
  }

  template <typename Fn>
  static void dispatch(const Tensor& t, Fn&& fn) {
    if (t.dtype == DType::f64)
      fn(double{});
    else
      fn(float{});
  }

  static void expect_host_float(const Tensor& t, const char* op) {
    PTRAIN_CHECK(t.device == Device::cpu && (t.dtype == DType::f32 || t.dtype == DType::f64),
                 std::string("MPI ") + op + ": host f32/f64 tensors only (GPU tensors go through NCCL)");
  }

  int rank_ = 0, world_ = 1, nodes_ = 1;
  std::string library_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

int node_local_rank() {
  start_mpi();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return split_local_rank(rank);
}

void abort_mpi_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

#ifndef PTRAIN_HAVE_NCCL
std::unique_ptr<Communicator> make_gpu_communicator() {
  throw EnvironmentError(
      "data-parallel training on GPUs needs NCCL, and this ptrain was built without it (the CUDA toolkit's nccl.h "
      "was not found); run.device: cpu trains over MPI instead");
}
#endif

}  // namespace ptrain

#endif  // PTRAIN_HAVE_MPI

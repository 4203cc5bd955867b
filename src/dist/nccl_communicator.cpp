// NCCL over MPI, for the CUDA backend: tensors stay in device memory and move GPU to GPU (NVLink,
// PCIe or the network, whichever NCCL finds). MPI starts the ranks, hands rank 0's ncclUniqueId
// to the others, and keeps serving the host-side values (metrics, flags, norms, gathered shards):
// this communicator holds the MPI communicator and delegates those to it.
//
// Ordering without blocking the host: NCCL runs on a stream of its own. Each tensor collective
// first makes that stream wait for an event recorded on the compute stream (so it reads what the
// backend has queued so far); the synchronous collectives then make the compute stream wait for
// an event recorded after them, so whatever the caller queues next sees their result. The host
// never waits. all_reduce_sum_async skips that second step, so the sums run beside the backward
// pass until wait() joins the streams; a bucket must not be touched before then. all_gather_async
// skips it too, and records an event of its own after the gather, so that wait_gathers() joins
// the streams there and not behind a sum queued later.
//
// Uneven shards: NCCL's ReduceScatter and AllGather need equal shards, and shard_of gives the
// first n % world ranks one element more. Padding would cost a staging copy of the tensor, so
// when n does not divide evenly each shard is its own Reduce (to its owner) or Broadcast (from
// its owner), all in one NCCL group: NCCL launches them together, and each rank sends about as
// many bytes as in the native (ring) collectives. An even split takes the native ones.
//
// Determinism: NCCL's sums are reproducible run to run for the same world size, topology, tensor
// sizes and NCCL version, and every rank gets the same bits. But NCCL associates the sum its own
// way (rings, trees, chunks), not in the MPI communicator's rank order, so multi-rank runs on
// GPUs and on CPUs agree to rounding, not bitwise.
//
// Faults: NCCL operations have no timeout. A rank that dies takes the job down through the
// launcher (mpirun kills the other ranks; a rank that fails calls abort_other_ranks), which is
// what keeps the others from waiting forever in a collective. Errors NCCL detects itself come
// back as CudaError (library "NCCL"); after one, the communicator is aborted rather than
// destroyed, since an orderly ncclCommDestroy may wait for peers that will never arrive.
#if defined(PTRAIN_HAVE_MPI) && defined(PTRAIN_HAVE_NCCL)

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_error.h"
#include "core/error.h"
#include "dist/mpi_communicator.h"

namespace ptrain {
namespace {

std::string nccl_status_name(ncclResult_t status) {
  switch (status) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t " + std::to_string(static_cast<int>(status));
  }
}

[[noreturn]] void throw_nccl_error(ncclResult_t status, ncclComm_t comm, const char* expression, const char* file,
                                   int line) {
  const char* text = ncclGetErrorString(status);
  std::string description = text && *text ? text : "unknown status";
  switch (status) {
    case ncclSystemError: description += " (network, sockets or /dev/shm; NCCL_DEBUG=WARN says which)"; break;
    case ncclRemoteError: description += " (another rank or the network failed)"; break;
    case ncclInvalidUsage: description += " (two ranks on one GPU? each rank takes its local rank's GPU)"; break;
    default: break;
  }
  // The library's last error message (comm may be null: NCCL keeps one per process).
  if (const char* last = ncclGetLastError(comm); last && *last) description += ": " + std::string(last);
  throw CudaError("NCCL", static_cast<long long>(status), nccl_status_name(status), description, expression, file,
                  line);
}

// NCCL_VERSION_CODE: major*1000 + minor*100 + patch up to 2.8, major*10000 + minor*100 + patch after.
std::string version_text(int code) {
  const bool wide = code >= 10000;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

#define PTRAIN_NCCL_CHECK(expr) check((expr), #expr, __FILE__, __LINE__)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator() : mpi_(make_mpi_communicator()) {
    try {
      // The CUDA backend has already taken this rank's GPU (cudaSetDevice); NCCL binds to it.
      PTRAIN_CUDA_CHECK(cudaGetDevice(&device_));
      PTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
      PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
      PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&gathered_, cudaEventDisableTiming));
      int code = 0;
      PTRAIN_NCCL_CHECK(ncclGetVersion(&code));
      version_ = version_text(code);
      ncclUniqueId id{};
      if (mpi_->rank() == 0) PTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
      mpi_->broadcast(&id, sizeof(id), 0);
      ncclComm_t comm = nullptr;
      PTRAIN_NCCL_CHECK(ncclCommInitRank(&comm, mpi_->world_size(), id, mpi_->rank()));
      comm_ = comm;
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclCommunicator() override { release(); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // e.g. "NCCL 2.28.9 over MPI (Open MPI v4.1.4), 8 ranks on 1 node, GPU 3"
  std::string description() const override {
    return "NCCL " + version_ + " over " + mpi_->description() + ", GPU " + std::to_string(device_);
  }
  int rank() const override { return mpi_->rank(); }
  int world_size() const override { return mpi_->world_size(); }

  void barrier() override { mpi_->barrier(); }
  void all_reduce_sum(double* values, size_t n) override { mpi_->all_reduce_sum(values, n); }
  void all_reduce_max(float* values, size_t n) override { mpi_->all_reduce_max(values, n); }
  std::vector<double> all_gather(double value) override { return mpi_->all_gather(value); }
  void broadcast(void* bytes, size_t n, int root) override { mpi_->broadcast(bytes, n, root); }
  void gather_shards(float* full, const float* shard, int64_t n) override { mpi_->gather_shards(full, shard, n); }

  void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }

  void wait() override { before_compute(); }
  bool overlaps_compute() const override { return true; }

 protected:
  void sum_tensor(Tensor t) override {
    const ncclDataType_t type = sum_type(t, "all_reduce_sum");
    if (t.numel() == 0) return;
    after_compute();
    PTRAIN_NCCL_CHECK(ncclAllReduce(t.data, t.data, count(t.numel()), type, ncclSum, comm_, stream_));
    before_compute();
  }

  // Even parts go to NCCL's reduce-scatter and all-gather; other parts (a length the ranks do
  // not share evenly, ZeRO-2's buckets) to one reduce or broadcast per rank, grouped.
  void reduce_scatter_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    start_reduce_scatter(out, in, parts);
    before_compute();
  }
  // On the communication stream after the compute work queued so far; wait() joins it.
  void start_reduce_scatter(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    const ncclDataType_t type = sum_type(in, "reduce_scatter_sum");
    sum_type(out, "reduce_scatter_sum");
    const int64_t n = in.numel();
    const int me = rank();
    PTRAIN_CHECK(out.dtype == in.dtype && out.numel() == parts.at(static_cast<size_t>(me)).count,
                 "NCCL reduce_scatter_sum: out must be this rank's part of in, of the same dtype");
    if (n == 0) return;
    after_compute();
    if (is_even(parts, n)) {
      PTRAIN_NCCL_CHECK(ncclReduceScatter(in.data, out.data, count(n / world_size()), type, ncclSum, comm_, stream_));
    } else {
      PTRAIN_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < world_size(); ++r) {
        const Shard s = parts[static_cast<size_t>(r)];
        if (s.count == 0) continue;  // every rank skips the same parts
        // recvbuff is only read on the root; NCCL allows null elsewhere.
        PTRAIN_NCCL_CHECK(ncclReduce(in.range(s.begin, s.count).data, r == me ? out.data : nullptr, count(s.count),
                                     type, ncclSum, r, comm_, stream_));
      }
      PTRAIN_NCCL_CHECK(ncclGroupEnd());
    }
  }
  void gather_tensor(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    start_gather(out, in, parts);
    before_compute();
  }
  // On the communication stream after the compute work queued so far; wait_gathers() joins the
  // streams at the event recorded after it.
  void start_gather(Tensor out, Tensor in, const std::vector<Shard>& parts) override {
    const ncclDataType_t type = device_type(out, "all_gather");
    device_type(in, "all_gather");
    const int64_t n = out.numel();
    const int me = rank();
    PTRAIN_CHECK(out.dtype == in.dtype && in.numel() == parts.at(static_cast<size_t>(me)).count,
                 "NCCL all_gather: in must be this rank's part of out, of the same dtype");
    if (n == 0) return;
    after_compute();
    if (is_even(parts, n)) {
      PTRAIN_NCCL_CHECK(ncclAllGather(in.data, out.data, count(n / world_size()), type, comm_, stream_));
    } else {
      PTRAIN_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < world_size(); ++r) {
        const Shard s = parts[static_cast<size_t>(r)];
        if (s.count == 0) continue;
        void* dst = out.range(s.begin, s.count).data;
        // sendbuff is only read on the root; elsewhere pass the destination (never null).
        PTRAIN_NCCL_CHECK(ncclBroadcast(r == me ? in.data : dst, dst, count(s.count), type, r, comm_, stream_));
      }
      PTRAIN_NCCL_CHECK(ncclGroupEnd());
    }
    PTRAIN_CUDA_CHECK(cudaEventRecord(gathered_, stream_));
  }
  void wait_gathers() override {
    PTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_, 0));
    check_async_error();
  }
  void start_sums(const std::vector<Tensor>& bucket) override {
    for (const Tensor& t : bucket) sum_type(t, "all_reduce_sum_async");  // check all before the group opens
    after_compute();
    PTRAIN_NCCL_CHECK(ncclGroupStart());
    for (const Tensor& t : bucket)
      if (t.numel() > 0)
        PTRAIN_NCCL_CHECK(ncclAllReduce(t.data, t.data, count(t.numel()), sum_type(t, "all_reduce_sum_async"),
                                        ncclSum, comm_, stream_));
    PTRAIN_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  void check(ncclResult_t status, const char* expression, const char* file, int line) {
    if (status == ncclSuccess) return;
    failed_ = true;
    throw_nccl_error(status, comm_, expression, file, line);
  }

  static size_t count(int64_t n) { return static_cast<size_t>(n); }
  // Whether rank r's part is the r-th of world equal lengths covering n.
  bool is_even(const std::vector<Shard>& parts, int64_t n) const {
    const int world = world_size();
    PTRAIN_CHECK(static_cast<int>(parts.size()) == world, "NCCL: one part of the tensor per rank");
    if (n % world != 0) return false;
    for (int r = 0; r < world; ++r)
      if (parts[static_cast<size_t>(r)].begin != r * (n / world) || parts[static_cast<size_t>(r)].count != n / world)
        return false;
    return true;
  }

  static ncclDataType_t device_type(const Tensor& t, const char* op) {
    PTRAIN_CHECK(t.device == Device::cuda,
                 std::string("NCCL ") + op + ": device tensors only (host values go through the MPI calls)");
    switch (t.dtype) {
      case DType::f32: return ncclFloat32;
      case DType::bf16: return ncclBfloat16;
      case DType::f16: return ncclFloat16;
      case DType::u8: return ncclUint8;  // FP8 codes: gathered, never summed (sum_type)
      default: break;
    }
    PTRAIN_CHECK(false, std::string("NCCL ") + op + ": f32, bf16, f16 or u8 tensors only, not " + dtype_name(t.dtype));
    return ncclFloat32;
  }

  // NCCL sums in the tensor's own type, so a bf16/f16 sum lands on its format's grid (rounded at
  // each step of NCCL's reduction, not once). The CPU backend's f32 emulation storage of bf16/fp16
  // values, which would need a rounding pass, never reaches this communicator: the GPU backend
  // stores those formats as bf16/f16 (Backend::storage_for). The check keeps it that way.
  static ncclDataType_t sum_type(const Tensor& t, const char* op) {
    const ncclDataType_t type = device_type(t, op);
    PTRAIN_CHECK(t.dtype != DType::u8, std::string("NCCL ") + op + ": FP8 codes are gathered, not summed");
    PTRAIN_CHECK(t.dtype != DType::f32 || t.format == Format::fp32,
                 std::string("NCCL ") + op + ": an f32 tensor on a narrower format's grid would need its sum rounded; "
                 "store bf16/fp16 values as bf16/f16 on the GPU");
    return type;
  }

  // The communication stream starts after the work queued on the compute stream so far.
  void after_compute() {
    PTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
    PTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  // Work queued on the compute stream from now on starts after all communication queued so far.
  // Also reports an error NCCL found since (ncclCommGetAsyncError only reads a flag: no sync).
  void before_compute() {
    PTRAIN_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));
    PTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_, 0));
    check_async_error();
  }
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    PTRAIN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    check(async, "an earlier collective (ncclCommGetAsyncError)", __FILE__, __LINE__);
  }

  // No throwing here. Destroy after an orderly finish (ncclCommDestroy may synchronise with the
  // node's other ranks, which are finishing too); abort after an NCCL error, while an exception is
  // unwinding, or when the stream cannot drain, since the peers may never arrive.
  void release() noexcept {
    if (comm_) {
      const bool abandon = failed_ || std::uncaught_exceptions() > 0 || cudaStreamSynchronize(stream_) != cudaSuccess;
      (void)(abandon ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
      comm_ = nullptr;
    }
    if (gathered_) (void)cudaEventDestroy(gathered_);
    if (comm_done_) (void)cudaEventDestroy(comm_done_);
    if (compute_ready_) (void)cudaEventDestroy(compute_ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    gathered_ = comm_done_ = compute_ready_ = nullptr;
    stream_ = nullptr;
  }

  std::unique_ptr<Communicator> mpi_;  // outlives comm_: declared first, destroyed last
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;   // NCCL's stream (non-blocking: no implicit sync with stream 0)
  cudaStream_t compute_ = nullptr;  // the backend's; null is the legacy default stream
  cudaEvent_t compute_ready_ = nullptr, comm_done_ = nullptr;
  cudaEvent_t gathered_ = nullptr;  // recorded after each gather start_gather queued
  int device_ = 0;
  std::string version_;
  bool failed_ = false;  // an NCCL call failed: abort, do not destroy
};

#undef PTRAIN_NCCL_CHECK

}  // namespace

std::unique_ptr<Communicator> make_gpu_communicator() { return std::make_unique<NcclCommunicator>(); }

}  // namespace ptrain

#endif  // PTRAIN_HAVE_MPI && PTRAIN_HAVE_NCCL

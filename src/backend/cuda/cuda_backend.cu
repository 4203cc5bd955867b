// Starting the CUDA backend on one device: the device checked (sm_90 or newer), its stream and
// arena made, the backend's fixed blocks taken first (so that later memory is the model's and
// the memory plan of `--dry-run` counts it exactly); the arena's blocks and the ops' kept
// scratch buffers; what the backend says about itself. The class is in cuda_backend_impl.h.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_impl.h"

#include <cudnn.h>

#include <string>
#include <vector>

#include "backend/cuda/arena_sizing.h"
#include "core/error.h"
#include "reduce.cuh"

namespace ptrain::cuda_impl {

// What --dry-run counts for the backend's own blocks (arena_sizing.h) is what it takes.
static_assert(sizeof(DeviceScalars) <= kDeviceScalarsBytes);
static_assert(kReduceScratchBytes == kernels::kReducePartials * sizeof(double));
static_assert(kCublasLtWorkspaceBytes == Matmul::kRecommendedWorkspaceBytes);

// The arena's size is a whole number of these (a large cudaMalloc's own granularity).
constexpr size_t kArenaGranularity = size_t(2) << 20;
// Less free memory than the margin and this is refused: too little for any model.
constexpr size_t kMinimumArenaBytes = size_t(1) << 30;

CudaBackend::CudaBackend(int device_index, size_t arena_bytes, bool tf32) : device_(device_index), tf32_(tf32) {
  int count = 0;
  PTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device_index < 0 || device_index >= count)
    throw EnvironmentError("CUDA device " + std::to_string(device_index) + " does not exist: this machine has " +
                           std::to_string(count) + " CUDA device(s)");
  PTRAIN_CUDA_CHECK(cudaSetDevice(device_index));
  PTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_index));
  if (prop_.major < 9)
    throw EnvironmentError("CUDA device " + std::to_string(device_index) + " (" + std::string(prop_.name) + ") is sm_" +
                           std::to_string(prop_.major) + std::to_string(prop_.minor) +
                           ": ptrain's kernels are built for sm_90 (Hopper) and newer; use run.device: cpu");
  try {
    // Non-blocking: work a library queues on the legacy default stream would otherwise wait for
    // this stream, and while a micro-batch is being captured as a CUDA graph that dependency
    // invalidates the capture.
    PTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    size_t free_bytes = 0, total_bytes = 0;
    PTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    free_at_start_ = free_bytes;
    total_bytes_ = total_bytes;
    size_t want = arena_bytes;
    if (want == 0) {
      const size_t margin = arena_margin_bytes(total_bytes);
      if (free_bytes < margin + kMinimumArenaBytes)
        throw EnvironmentError("CUDA device " + std::to_string(device_index) + " has only " + gib_text(free_bytes) +
                               " free of " + gib_text(total_bytes) +
                               ": too little for ptrain's arena (other processes?)");
      want = free_bytes - margin;
    }
    want = (want + kArenaGranularity - 1) / kArenaGranularity * kArenaGranularity;
    arena_ = std::make_unique<DeviceArena>(want, free_bytes, total_bytes, stream_);
    scalars_ = static_cast<DeviceScalars*>(allocate(sizeof(DeviceScalars)));
    workspace_ = allocate(Matmul::kRecommendedWorkspaceBytes);
    // Fixed-size, so made now: the first sum (the trainer's loss, between micro-batches) then
    // hands out no memory, which would make the next micro-batch's recording start afresh.
    scratch(kReduce, kernels::kReducePartials * sizeof(double));
    matmul_ = std::make_unique<Matmul>(workspace_, Matmul::kRecommendedWorkspaceBytes);

    versions_ = cuda_library_versions();
    sync();
  } catch (...) {
    destroy();
    throw;
  }
}

std::string CudaBackend::description() const {
  return "cuda:" + std::to_string(device_) + " " + std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) +
         std::to_string(prop_.minor) + ", " + std::to_string(prop_.multiProcessorCount) + " SMs, " +
         gib_text(prop_.totalGlobalMem) + "; " + versions_ + "; arena " + gib_text(arena_->capacity()) + ")";
}

std::vector<std::string> CudaBackend::performance_warnings() const {
  std::vector<std::string> warnings;
  if (prop_.major != 9 || prop_.minor != 0)
    warnings.push_back("ptrain's kernels are compiled and tuned for sm_90 (H100/H200); this " +
                       std::string(prop_.name) + " is sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) +
                       " and runs them from PTX compiled by the driver");
  if (free_at_start_ < total_bytes_ - total_bytes_ / 20)
    warnings.push_back("only " + gib_text(free_at_start_) + " of the " + gib_text(total_bytes_) + " of " +
                       std::string(prop_.name) + " were free when ptrain started: other processes share this GPU");
  return warnings;
}

DType CudaBackend::storage_for(Format format, DType compute) const {
  // f64 serves the CPU reference's gradient checks only: asking for it here is a bug.
  if (compute == DType::f64) fail("storage_for", "no f64 storage (f64 serves the CPU reference's gradient checks)");
  return cuda_storage_dtype(format);
}

void* CudaBackend::allocate(size_t bytes) { return arena_->allocate(bytes); }

// Accepts any pointer allocate() returned, in any order.
void CudaBackend::release(void* ptr) {
  if (!ptr) return;
  const size_t bytes = arena_->block_bytes(ptr);
  PTRAIN_CHECK(bytes > 0, "cuda backend release: the pointer was not returned by allocate()");
  forget_buckets_within(ptr, bytes);  // token buckets of tensors inside the block
  arena_->release(ptr);
}

// A scratch buffer of at least `bytes`, kept for later calls; a larger request replaces it.
// Work still queued on the stream may use the old buffer: everything that uses the new one
// is queued after it on the same stream.
void* CudaBackend::scratch(Slot slot, size_t bytes) {
  ScratchBuffer& b = scratch_[static_cast<size_t>(slot)];
  if (bytes > b.bytes || !b.ptr) {
    if (b.ptr) arena_->release(b.ptr);
    b = ScratchBuffer{};
    const size_t want = arena_block_bytes(bytes);
    b.ptr = allocate(want);
    b.bytes = want;
  }
  return b.ptr;
}

// Never throws: used by the destructor and by a constructor that failed half way.
void CudaBackend::destroy() noexcept {
  if (stream_) (void)cudaStreamSynchronize(stream_);
  cudnn_.reset();
  matmul_.reset();
  arena_.reset();
  if (stream_) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

}  // namespace ptrain::cuda_impl

namespace ptrain {

// "12.6" from the runtime's 12060.
static std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
// "12.6.3" from major * unit + minor * 100 + patch.
static std::string library_version(size_t v, size_t unit) {
  return std::to_string(v / unit) + "." + std::to_string((v % unit) / 100) + "." + std::to_string(v % 100);
}

std::string cuda_library_versions() {
  int runtime = 0, driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  // 0 without a driver (the call itself succeeds).
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const size_t cudnn = cudnnGetVersion();
  std::string cublaslt;  // loaded here, on demand (cublaslt_on_demand.cpp): its absence is a fact to print
  try {
    cublaslt = library_version(cublasLtGetVersion(), 10000);
  } catch (const EnvironmentError& e) {
    cublaslt = std::string("none (") + e.what() + ")";
  }
  return "CUDA runtime " + (have_runtime ? cuda_version(runtime) : std::string("?")) + ", driver " +
         (have_driver ? cuda_version(driver) : std::string("none")) + ", cuBLASLt " + cublaslt + ", cuDNN " +
         library_version(cudnn, cudnn >= 90000 ? 10000 : 1000);
}

std::string cuda_header_versions() {
  return "CUDA " + cuda_version(CUDART_VERSION) + ", cuBLASLt " +
         library_version(static_cast<size_t>(CUBLAS_VER_MAJOR) * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH,
                         10000) +
         ", cuDNN " + std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR) + "." +
         std::to_string(CUDNN_PATCHLEVEL);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index, size_t arena_bytes, bool tf32) {
  return std::make_unique<cuda_impl::CudaBackend>(device_index, arena_bytes, tf32);
}

}  // namespace ptrain

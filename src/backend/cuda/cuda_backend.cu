// The CUDA backend: every Backend op on one GPU. The ops check dtypes and shapes, stage operands
// of other dtypes, and call the kernel launchers of kernels/*.cuh (dtype conversion, the tail of
// a GEMM written through FP32 scratch and FP8 dequantisation in kernels/convert.cuh, the
// double-precision sums in kernels/reduce.cuh) and cuBLASLt (backend/cuda/matmul.h). This file
// defines no kernels: every one is tested under the SIMT emulator (tests/kernels/).
//
// Why this shape:
//  - Mixed dtypes. The model hands the backend f32 FP8 buffers (dequantised values) next to bf16
//    activations, f32 master weights next to bf16 gradients. Each op computes in one storage
//    type (the kernels are templates over one T); an operand of another dtype is converted into
//    a staging buffer first, and an output of another dtype is written to a staging buffer and
//    converted back (Staged). The common, uniform case stages nothing.
//  - Rounding to Tensor::format. bf16 / f16 storage rounds once as the kernels write. A tensor
//    stored wider than its format (f32 storage of bf16 values, the CPU backend's emulation) is
//    rounded in place after the op, with the same NVIDIA conversions, so the bits are the CPU's.
//    The FP8 casts are the exception the interface defines: their output holds dequantised
//    values, never rounded to the FP8 grid.
//  - GEMMs. cuBLASLt has no f32 x f32 -> bf16 (or bf16 x bf16 -> f16) GEMM, so such a product is
//    computed into FP32 scratch and kernels::gemm_finish adds it (and the bias) into the output,
//    rounding once: the CPU's arithmetic (FP32 accumulation, one rounding of old + product).
//  - Determinism. Every reduction runs in an order fixed by the sizes alone (kernels/ explains
//    theirs; sum and sum_squares use reduce.cuh's fixed grid of double partial sums), so results are
//    bit-identical run to run.
//  - Memory. One arena reserved at construction (see cuda_backend.h); scratch buffers are
//    sized on first use, grown when a larger call needs more, and kept.
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/arena_annotations.h"
#include "backend/cuda/arena_sizing.h"
#include "backend/cuda/cuda_error.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/kernel_formats.h"
#include "backend/cuda/matmul.h"
#include "core/error.h"
#include "core/rng.h"
#include "precision/formats.h"

// The kernels (kernels/ is on the include path).
#include "attention.cuh"
#include "classifier.cuh"
#include "convert.cuh"
#include "elementwise.cuh"
#include "encoder.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"
#include "optimizer.cuh"
#include "reduce.cuh"

namespace ptrain {
namespace {

using kernels::bf16;
using kernels::fp16;
using kernels::fp8;

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kGiB = size_t(1) << 30;

size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// ================================================================================ device scalars

// The device scalars the host reads back: FP8 cast telemetry, amax, the cast's scale, a sum.
struct DeviceScalars {
  kernels::Fp8Counts counts;
  float amax;
  float scale;
  double result;
};
// What --dry-run counts for the backend's own blocks (arena_sizing.h) is what it takes.
static_assert(sizeof(DeviceScalars) <= kDeviceScalarsBytes);
static_assert(kReduceScratchBytes == kernels::kReducePartials * sizeof(double));
static_assert(kCublasLtWorkspaceBytes == Matmul::kRecommendedWorkspaceBytes);

// ================================================================================ host helpers

Fp8CastStats to_stats(const DeviceScalars& d) {
  Fp8CastStats stats;
  stats.amax = d.amax;
  stats.nonzero = static_cast<int64_t>(d.counts.nonzero);
  stats.underflow = static_cast<int64_t>(d.counts.underflow);
  stats.saturated = static_cast<int64_t>(d.counts.saturated);
  return stats;
}

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::logic_error(std::string("cuda backend ") + op + ": " + what);
}
// Checks `cond`; the message (any string expression) is built only when it fails.
#define PTRAIN_EXPECT(cond, op, what) \
  do {                                \
    if (!(cond)) fail((op), (what));  \
  } while (0)

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// The format a storage dtype rounds to by itself.
Format natural_format(DType t) {
  switch (t) {
    case DType::bf16: return Format::bf16;
    case DType::f16: return Format::fp16;
    default: return Format::fp32;
  }
}

// A tensor stored wider than its format (f32 storage of bf16 values, anything of an FP8 format)
// is rounded to the format after an op writes it.
bool needs_rounding(const Tensor& t) {
  return !t.empty() && t.format != Format::fp32 && t.format != natural_format(t.dtype);
}

cudaDataType_t cuda_type(DType t) {
  if (t == DType::bf16) return CUDA_R_16BF;
  if (t == DType::f16) return CUDA_R_16F;
  if (t != DType::f32) fail("gemm", std::string("no cuBLASLt type for dtype ") + dtype_name(t));
  return CUDA_R_32F;
}

// Calls fn(Tag<T>{}) with T the storage type of dtype t (float, bf16 or fp16).
template <typename T>
struct Tag {
  using type = T;
};
template <typename Fn>
void with_float_type(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(Tag<float>{}); return;
    case DType::bf16: fn(Tag<bf16>{}); return;
    case DType::f16: fn(Tag<fp16>{}); return;
    default:
      fail(op, std::string("dtype ") + dtype_name(t) + " is not a float dtype of the CUDA backend (f32, bf16, f16)");
  }
}

// Names the element type of a with_float_type callback (and marks its tag as used).
#define PTRAIN_ELEMENT_TYPE(T, tag)       \
  using T = typename decltype(tag)::type; \
  (void)(tag)

// A float operand in device memory; empty tensors (optional operands) pass.
void expect_float(const char* op, const char* name, const Tensor& t) {
  if (t.empty()) return;
  PTRAIN_EXPECT(t.device == Device::cuda, op, std::string(name) + " is not in device memory");
  if (t.dtype == DType::f64)
    fail(op, std::string(name) + " is f64: the CUDA backend stores floats as f32, bf16 or f16 (f64 serves the CPU " +
                 "reference's gradient checks only)");
  PTRAIN_EXPECT(is_float(t.dtype), op,
                std::string(name) + " has dtype " + dtype_name(t.dtype) + ", not f32, bf16 or f16");
}

void expect_tokens(const char* op, const char* name, const Tensor& t) {
  PTRAIN_EXPECT(!t.empty() && t.device == Device::cuda && t.dtype == DType::i32, op,
                std::string(name) + " must be an i32 tensor in device memory");
}

// A named operand, for checking several alike.
struct Operand {
  const char* name;
  const Tensor* tensor;
};

// An elementwise op's operands: non-empty float tensors with the first one's element count,
// which is returned.
int64_t elementwise_size(const char* op, std::initializer_list<Operand> operands) {
  const Tensor& first = *operands.begin()->tensor;
  for (const Operand& o : operands) {
    PTRAIN_EXPECT(!o.tensor->empty(), op, std::string(o.name) + " must not be empty");
    expect_float(op, o.name, *o.tensor);
    PTRAIN_EXPECT(o.tensor->numel() == first.numel(), op,
                  "shape mismatch: " + std::string(operands.begin()->name) + " " + first.shape_string() + ", " +
                      o.name + " " + o.tensor->shape_string());
  }
  return first.numel();
}

// The kernels index with int: sizes must fit.
int to_int(int64_t v, const char* op, const char* what) {
  PTRAIN_EXPECT(v >= 0 && v <= INT32_MAX, op,
                std::string(what) + " = " + std::to_string(v) + " does not fit the kernels' 32-bit sizes");
  return static_cast<int>(v);
}

int64_t last_dim(const Tensor& t) { return t.ndim > 0 ? t.dim(-1) : 1; }

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / static_cast<double>(kGiB));
  return text;
}


// ================================================================================ the backend

// Scratch buffers, one per purpose. The staging slots hold converted operands of one op.
enum Slot : int {
  kStageFirst = 0,
  kStageSlots = 12,
  kGemmAccumulator = kStageSlots,  // FP32 result of a GEMM whose output type cuBLASLt cannot write
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnY,     // forward: att v; backward: dy
  kAttnDatt,  // backward: datt, then dpreatt in place
  kAttnDq,
  kAttnDk,
  kAttnDv,
  kAttnDqkv,        // fused backward: dq, dk, dv before they are added into dqkv
  kCudnnWorkspace,  // cuDNN's execution-plan workspace
  kPartials,  // layernorm / bias gradient partial sums
  kReduce,    // double partial sums of sum / sum_squares
  kFp8Codes,
  kFp8ScaleInv,
  kSlotCount
};

// An instantiated CUDA graph, launched on the backend's stream.
class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph() override { (void)cudaGraphExecDestroy(exec_); }
  void replay() override { PTRAIN_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// Page-locked host memory for copies that do not wait: the copy is queued and the host goes
// on; an event tells when the copy is done, so that the memory may be written again (an
// upload's source) or read (a download's destination).
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() {
    if (copied_) {
      (void)cudaEventSynchronize(copied_);  // a queued copy may still read the memory
      (void)cudaEventDestroy(copied_);
    }
    if (host_) (void)cudaFreeHost(host_);
  }

  // At least `bytes`, once the copy queued last with this memory is done.
  void* acquire(size_t bytes) {
    if (copied_)
      PTRAIN_CUDA_CHECK(cudaEventSynchronize(copied_));
    else
      PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    if (bytes > bytes_) {
      if (host_) PTRAIN_CUDA_CHECK(cudaFreeHost(host_));
      host_ = nullptr;
      bytes_ = 0;
      PTRAIN_CUDA_CHECK(cudaMallocHost(&host_, bytes));
      bytes_ = bytes;
    }
    return host_;
  }
  // After the copies that use the memory are queued on `stream`.
  void queued(cudaStream_t stream) { PTRAIN_CUDA_CHECK(cudaEventRecord(copied_, stream)); }

 private:
  void* host_ = nullptr;
  size_t bytes_ = 0;
  cudaEvent_t copied_ = nullptr;
};

// The deterministic encoder backward's buckets of one tokens tensor, packed as
// kernels::pack_buckets lays them out in one arena block whose layout depends on the token
// count only: a CUDA graph recorded with this block reads every later batch uploaded into it.
struct DeviceBuckets {
  int* packed = nullptr;  // kernels::packed_bucket_ints(tokens) ints
  int64_t tokens = 0;     // positions bucketed: the tokens tensor's numel when built
  int max_id = -1;
  // Two, used in turn: the host fills one while the other's copy may still be queued.
  std::array<PinnedStaging, 2> staging;
  int next_staging = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device_index, size_t arena_bytes, bool tf32) : device_(device_index), tf32_(tf32) {
    int count = 0;
    PTRAIN_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device_index < 0 || device_index >= count)
      throw EnvironmentError("CUDA device " + std::to_string(device_index) + " does not exist: this machine has " +
                             std::to_string(count) + " CUDA device(s)");
    PTRAIN_CUDA_CHECK(cudaSetDevice(device_index));
    PTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_index));
    if (prop_.major < 9)
      throw EnvironmentError("CUDA device " + std::to_string(device_index) + " (" + std::string(prop_.name) +
                             ") is sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) +
                             ": ptrain's kernels are built for sm_90 (Hopper) and newer; use run.device: cpu");
    try {
      PTRAIN_CUDA_CHECK(cudaStreamCreate(&stream_));
      size_t free_bytes = 0, total_bytes = 0;
      PTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      free_at_start_ = free_bytes;
      total_bytes_ = total_bytes;
      size_t want = arena_bytes;
      if (want == 0) {
        const size_t margin = arena_margin_bytes(total_bytes);
        if (free_bytes < margin + kGiB)
          throw EnvironmentError("CUDA device " + std::to_string(device_index) + " has only " + gib(free_bytes) +
                                 " free of " + gib(total_bytes) + ": too little for ptrain's arena (other processes?)");
        want = free_bytes - margin;
      }
      want = round_up(want, 2 * kMiB);
      void* base = nullptr;
      try {
        PTRAIN_CUDA_CHECK(cudaMalloc(&base, want));
      } catch (const CudaError& e) {
        throw EnvironmentError("could not reserve ptrain's CUDA arena of " + std::to_string(want) + " bytes (" +
                               gib(want) + "; " + gib(free_bytes) + " free of " + gib(total_bytes) + "): " + e.what());
      }
      arena_ = static_cast<char*>(base);
      arena_bytes_ = want;
      annotations_ = std::make_unique<ArenaAnnotations>(arena_, arena_bytes_);
      free_.emplace(size_t(0), want);
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

  ~CudaBackend() override { destroy(); }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  MemoryUse memory_use() const override { return MemoryUse{arena_bytes_, in_use_, peak_}; }
  void* stream() const override { return stream_; }

  // ------------------------------------------------------------------------ CUDA graphs

  std::string cannot_record() const override { return ""; }
  uint64_t memory_epoch() const override { return memory_epoch_; }

  // Stream capture in thread-local mode: a synchronisation or a copy between the device and
  // pageable memory inside `body` fails the capture (a CudaError with a capture status), and a
  // library call that cannot be captured fails with its library's error; either ends the
  // recording as a refusal. Arena allocations are no CUDA calls: they do not fail it.
  std::unique_ptr<RecordedWork> record(const std::function<void()>& body, std::string* why) override {
    PTRAIN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    std::string failure;
    try {
      body();
    } catch (const CudaError& e) {
      if (!refuses_capture(e)) {  // e.g. a fault of earlier work: not about recording
        end_failed_capture();
        throw;
      }
      failure = e.what();
    } catch (...) {
      end_failed_capture();
      throw;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (failure.empty() && ended != cudaSuccess) failure = "cudaStreamEndCapture: " + cuda_status_name(ended);
    cudaGraphExec_t exec = nullptr;
    if (failure.empty()) {
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      if (made != cudaSuccess) failure = "cudaGraphInstantiate: " + cuda_status_name(made);
    }
    if (graph) (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    (void)cudaGetLastError();                   // a failed capture is not an error of later calls
    if (!failure.empty()) {
      *why = failure;
      return nullptr;
    }
    return std::make_unique<CudaGraph>(exec, stream_);
  }

  // Whether `e`, thrown inside a capture, says the work cannot be captured.
  static bool refuses_capture(const CudaError& e) {
    if (e.library() != "CUDA") return true;  // cuBLASLt or cuDNN declined to run inside a capture
    switch (static_cast<cudaError_t>(e.status())) {
      case cudaErrorStreamCaptureUnsupported:
      case cudaErrorStreamCaptureInvalidated:
      case cudaErrorStreamCaptureMerge:
      case cudaErrorStreamCaptureUnmatched:
      case cudaErrorStreamCaptureUnjoined:
      case cudaErrorStreamCaptureIsolation:
      case cudaErrorStreamCaptureImplicit:
      case cudaErrorStreamCaptureWrongThread:
      case cudaErrorCapturedEvent:
      case cudaErrorNotPermitted:
        return true;
      default:
        return false;
    }
  }

  void end_failed_capture() noexcept {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  }

  // ------------------------------------------------------------------------ identity

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }

  std::string description() const override {
    return "cuda:" + std::to_string(device_) + " " + std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) +
           std::to_string(prop_.minor) + ", " + std::to_string(prop_.multiProcessorCount) + " SMs, " +
           gib(prop_.totalGlobalMem) + "; " + versions_ + "; arena " + gib(arena_bytes_) + ")";
  }

  std::vector<std::string> performance_warnings() const override {
    std::vector<std::string> warnings;
    if (prop_.major != 9 || prop_.minor != 0)
      warnings.push_back("ptrain's kernels are compiled and tuned for sm_90 (H100/H200); this " +
                         std::string(prop_.name) + " is sm_" + std::to_string(prop_.major) +
                         std::to_string(prop_.minor) + " and runs them from PTX compiled by the driver");
    if (free_at_start_ < total_bytes_ - total_bytes_ / 20)
      warnings.push_back("only " + gib(free_at_start_) + " of the " + gib(total_bytes_) + " of " +
                         std::string(prop_.name) + " were free when ptrain started: other processes share this GPU");
    return warnings;
  }

  DType storage_for(Format format, DType compute) const override {
    if (compute == DType::f64)
      throw UserError(
          "the CUDA backend has no f64 storage (f64 serves the CPU reference's gradient checks); run "
          "those with run.device: cpu");
    return cuda_storage_dtype(format);
  }

  // ------------------------------------------------------------------------ memory

  // First fit in address order over the arena's free blocks; the block is zeroed on the stream.
  void* allocate(size_t bytes) override {
    const size_t need = round_up(std::max<size_t>(bytes, 1), kArenaAlignment);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const size_t offset = it->first, size = it->second;
      free_.erase(it);
      if (size > need) free_.emplace(offset + need, size - need);
      void* p = arena_ + offset;
      allocations_.emplace(p, need);
      annotations_->allocated(p, need);
      ++memory_epoch_;
      in_use_ += need;
      peak_ = std::max(peak_, in_use_);
      PTRAIN_CUDA_CHECK(cudaMemsetAsync(p, 0, need, stream_));
      annotations_->shrink(p, std::max<size_t>(bytes, 1));
      return p;
    }
    size_t largest = 0;
    for (const auto& block : free_) largest = std::max(largest, block.second);
    throw EnvironmentError("out of GPU memory in ptrain's CUDA arena: asked for " + std::to_string(bytes) +
                           " bytes, but only " + std::to_string(arena_bytes_ - in_use_) + " bytes of the " +
                           std::to_string(arena_bytes_) + "-byte (" + gib(arena_bytes_) +
                           ") arena are free (the largest free block has " + std::to_string(largest) +
                           " bytes); lower training.micro_batch or free the GPU of other processes");
  }

  // Accepts any pointer allocate() returned, in any order; neighbouring free blocks merge.
  void release(void* ptr) override {
    if (!ptr) return;
    const auto it = allocations_.find(ptr);
    PTRAIN_CHECK(it != allocations_.end(), "cuda backend release: the pointer was not returned by allocate()");
    forget_buckets_within(ptr, it->second);
    free_block(ptr);
  }

  void zero(Tensor t) override {
    if (t.empty() || t.numel() == 0) return;
    PTRAIN_EXPECT(t.device == Device::cuda, "zero", "the tensor is not in device memory");
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
  }

  void upload(Tensor dst, const float* src) override {
    const char* op = "upload";
    PTRAIN_EXPECT(!dst.empty(), op, "the destination is empty");
    expect_float(op, "dst", dst);
    const size_t n = static_cast<size_t>(dst.numel());
    if (n == 0) return;
    with_float_type(dst.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      if constexpr (std::is_same<T, float>::value) {
        PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        sync();
      } else {
        std::vector<T> host(n);
        for (size_t i = 0; i < n; ++i) host[i] = kernels::from_float<T>(src[i]);
        PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream_));
        sync();  // before `host` goes away
      }
    });
  }

  void download(float* dst, Tensor src) override {
    const char* op = "download";
    PTRAIN_EXPECT(!src.empty(), op, "the source is empty");
    expect_float(op, "src", src);
    const size_t n = static_cast<size_t>(src.numel());
    if (n == 0) return;
    with_float_type(src.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      if constexpr (std::is_same<T, float>::value) {
        PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        sync();
      } else {
        std::vector<T> host(n);
        PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), src.data, n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
        sync();
        for (size_t i = 0; i < n; ++i) dst[i] = kernels::to_float(host[i]);
      }
    });
  }

  // Also builds the deterministic encoder backward's buckets of these tokens (kept per tokens
  // tensor, keyed by its data pointer, until the memory holding it is released). Both go up
  // through pinned staging: the call does not wait for the device.
  void upload_tokens(Tensor dst, const int32_t* src) override {
    const char* op = "upload_tokens";
    expect_tokens(op, "dst", dst);
    const int64_t n = dst.numel();
    if (n == 0) return;
    to_int(n, op, "tokens");
    build_buckets(dst.data, src, n, dst.data);
  }

  void copy(Tensor dst, Tensor src) override {
    const char* op = "copy";
    PTRAIN_EXPECT(!dst.empty() && !src.empty(), op, "empty tensor");
    expect_float(op, "dst", dst);
    expect_float(op, "src", src);
    PTRAIN_EXPECT(dst.numel() == src.numel(), op,
                  "shape mismatch: dst " + dst.shape_string() + " src " + src.shape_string());
    if (dst.numel() == 0) return;
    if (dst.dtype == src.dtype && !needs_rounding(dst)) {
      if (dst.data != src.data)
        PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    convert(dst, src, dst.format);
  }

  // ------------------------------------------------------------------------ embedding

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    const char* op = "embedding_forward";
    expect_float(op, "out", out);
    expect_float(op, "wte", wte);
    expect_float(op, "wpe", wpe);
    expect_tokens(op, "tokens", tokens);
    PTRAIN_EXPECT(out.ndim == 3 && wte.ndim == 2 && wpe.ndim == 2, op,
                  "expected out (B,T,C), wte (V,C) and wpe (maxT,C)");
    const int64_t B = out.dim(0), Tn = out.dim(1), C = out.dim(2);
    PTRAIN_EXPECT(tokens.numel() == B * Tn && wte.dim(1) == C && wpe.dim(1) == C && wpe.dim(0) >= Tn, op,
                  "shape mismatch: out " + out.shape_string() + " tokens " + tokens.shape_string() + " wte " +
                      wte.shape_string() + " wpe " + wpe.shape_string());
    if (out.numel() == 0) return;
    to_int(B * Tn, op, "B*T");
    check_token_range(op, tokens, wte.dim(0));
    Staged st(*this);
    const DType dt = wte.dtype;
    const Tensor o = st.out(out, dt, false), pe = st.in(wpe, dt);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::encoder_forward<T>(o.as<T>(), tokens.as<int>(), wte.as<T>(), pe.as<T>(), static_cast<int>(B),
                                  static_cast<int>(Tn), to_int(C, op, "C"), stream_);
    });
    st.finish();
  }

  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    const char* op = "embedding_backward";
    expect_float(op, "dwte", dwte);
    expect_float(op, "dwpe", dwpe);
    expect_float(op, "dout", dout);
    expect_tokens(op, "tokens", tokens);
    PTRAIN_EXPECT(dout.ndim == 3 && dwte.ndim == 2 && dwpe.ndim == 2, op,
                  "expected dout (B,T,C), dwte (V,C), dwpe (maxT,C)");
    const int64_t B = dout.dim(0), Tn = dout.dim(1), C = dout.dim(2);
    PTRAIN_EXPECT(tokens.numel() == B * Tn && dwte.dim(1) == C && dwpe.dim(1) == C && dwpe.dim(0) >= Tn, op,
                  "shape mismatch: dout " + dout.shape_string() + " tokens " + tokens.shape_string() + " dwte " +
                      dwte.shape_string() + " dwpe " + dwpe.shape_string());
    if (dout.numel() == 0) return;
    to_int(B * Tn, op, "B*T");
    const DeviceBuckets& buckets = buckets_for(tokens);
    if (buckets.max_id >= dwte.dim(0))
      throw UserError("token id " + std::to_string(buckets.max_id) + " is not below the " +
                      std::to_string(dwte.dim(0)) + " rows of the token embedding (vocabulary size)");
    Staged st(*this);
    const DType dt = dout.dtype;
    const Tensor te = st.out(dwte, dt, true), pe = st.out(dwpe, dt, true);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::encoder_backward<T>(te.as<T>(), pe.as<T>(), dout.as<T>(), buckets.packed, static_cast<int>(B),
                                   static_cast<int>(Tn), to_int(C, op, "C"), stream_);
    });
    st.finish();
  }

  // ------------------------------------------------------------------------ layernorm

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) override {
    const char* op = "layernorm_forward";
    for (const Operand& operand :
         {Operand{"out", &out}, Operand{"inp", &inp}, Operand{"weight", &weight}, Operand{"bias", &bias}}) {
      PTRAIN_EXPECT(!operand.tensor->empty(), op, std::string(operand.name) + " is empty");
      expect_float(op, operand.name, *operand.tensor);
    }
    expect_stats(op, mean, rstd);
    const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
    PTRAIN_EXPECT(C > 0 && out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
                      bias.numel() == C,
                  op, "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string());
    if (N == 0) return;
    Staged st(*this);
    const DType dt = inp.dtype;
    const Tensor o = st.out(out, dt, false), w = st.in(weight, dt), b = st.in(bias, dt);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::layernorm_forward<T>(o.as<T>(), mean.as<float>(), rstd.as<float>(), inp.as<T>(), w.as<T>(), b.as<T>(),
                                    to_int(N, op, "rows"), to_int(C, op, "C"), stream_);
    });
    st.finish();
  }

  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                          Tensor mean, Tensor rstd) override {
    const char* op = "layernorm_backward";
    for (const Operand& operand : {Operand{"dinp", &dinp}, Operand{"dweight", &dweight}, Operand{"dbias", &dbias},
                                   Operand{"dout", &dout}, Operand{"inp", &inp}, Operand{"weight", &weight}}) {
      PTRAIN_EXPECT(!operand.tensor->empty(), op, std::string(operand.name) + " is empty");
      expect_float(op, operand.name, *operand.tensor);
    }
    expect_stats(op, mean, rstd);
    const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
    PTRAIN_EXPECT(C > 0 && dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C &&
                      dbias.numel() == C && weight.numel() == C && mean.numel() == N && rstd.numel() == N,
                  op, "shape mismatch: inp " + inp.shape_string() + " dinp " + dinp.shape_string());
    PTRAIN_EXPECT(dinp.data != dout.data, op, "dinp must not alias dout");
    if (N == 0) return;
    const int n = to_int(N, op, "rows"), c = to_int(C, op, "C");
    Staged st(*this);
    const DType dt = inp.dtype;
    const Tensor di = st.out(dinp, dt, true), dw = st.out(dweight, dt, true), db = st.out(dbias, dt, true);
    const Tensor d = st.in(dout, dt), w = st.in(weight, dt);
    float* partial = scratch_floats(kPartials, kernels::layernorm_backward_scratch_floats(n, c));
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::layernorm_backward<T>(di.as<T>(), dw.as<T>(), db.as<T>(), partial, d.as<T>(), inp.as<T>(), w.as<T>(),
                                     mean.as<float>(), rstd.as<float>(), n, c, stream_);
    });
    st.finish();
  }

  // ------------------------------------------------------------------------ matmul

  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) override {
    const char* op = "matmul_forward";
    PTRAIN_EXPECT(!out.empty() && !inp.empty() && !weight.empty(), op, "out, inp and weight must not be empty");
    expect_float(op, "out", out);
    expect_float(op, "inp", inp);
    expect_float(op, "weight", weight);
    expect_float(op, "bias", bias);
    PTRAIN_EXPECT(weight.ndim == 2, op, "weight must be (OC, C), got " + weight.shape_string());
    const int64_t OC = weight.dim(0), C = weight.dim(1);
    const int64_t N = C > 0 ? inp.numel() / C : 0;
    PTRAIN_EXPECT(C > 0 && last_dim(inp) == C && out.numel() == N * OC && (bias.empty() || bias.numel() == OC), op,
                  "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string() + " out " +
                      out.shape_string());
    if (N == 0 || OC == 0) return;
    Staged st(*this);
    const DType ab = inp.dtype == weight.dtype ? inp.dtype : DType::f32;
    const Tensor x = st.in(inp, ab), w = st.in(weight, ab), o = st.out(out, out.dtype, false);
    const GemmSpec spec = linear_forward_gemm(N, C, OC, cuda_type(ab), cuda_type(ab), cuda_type(ab), compute_for(ab));
    gemm_into(st, spec, w.data, x.data, ab, o, false, bias);
    st.finish();
  }

  void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) override {
    const char* op = "matmul_backward";
    PTRAIN_EXPECT(!dout.empty() && !weight.empty(), op, "dout and weight must not be empty");
    for (const Operand& operand : {Operand{"dinp", &dinp}, Operand{"dweight", &dweight}, Operand{"dbias", &dbias},
                                   Operand{"dout", &dout}, Operand{"inp", &inp}, Operand{"weight", &weight}})
      expect_float(op, operand.name, *operand.tensor);
    PTRAIN_EXPECT(weight.ndim == 2, op, "weight must be (OC, C), got " + weight.shape_string());
    const int64_t OC = weight.dim(0), C = weight.dim(1);
    const int64_t N = OC > 0 ? dout.numel() / OC : 0;
    PTRAIN_EXPECT(C > 0 && OC > 0 && last_dim(dout) == OC && (inp.empty() || inp.numel() == N * C) &&
                      (dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == OC * C) &&
                      (dbias.empty() || dbias.numel() == OC) && (dweight.empty() || !inp.empty()),
                  op,
                  "shape mismatch: dout " + dout.shape_string() + " inp " + inp.shape_string() + " weight " +
                      weight.shape_string());
    if (N == 0) return;
    Staged st(*this);
    if (!dinp.empty()) {  // dinp(N,C) += dout(N,OC) W(OC,C)
      const DType ab = dout.dtype == weight.dtype ? dout.dtype : DType::f32;
      const Tensor d = st.in(dout, ab), w = st.in(weight, ab), o = st.out(dinp, dinp.dtype, true);
      const GemmSpec spec =
          linear_dgrad_gemm(N, C, OC, cuda_type(ab), cuda_type(ab), cuda_type(ab), false, compute_for(ab));
      gemm_into(st, spec, w.data, d.data, ab, o, true, Tensor());
    }
    if (!dweight.empty()) {  // dW(OC,C) += dout(N,OC)^T inp(N,C)
      const DType ab = dout.dtype == inp.dtype ? dout.dtype : DType::f32;
      const Tensor d = st.in(dout, ab), x = st.in(inp, ab), o = st.out(dweight, dweight.dtype, true);
      const GemmSpec spec =
          linear_wgrad_gemm(N, C, OC, cuda_type(ab), cuda_type(ab), cuda_type(ab), false, compute_for(ab));
      gemm_into(st, spec, x.data, d.data, ab, o, true, Tensor());
    }
    if (!dbias.empty()) bias_backward_into(st, dbias, dout, N, OC);
    st.finish();
  }

  void bias_backward(Tensor dbias, Tensor dout) override {
    const char* op = "bias_backward";
    PTRAIN_EXPECT(!dbias.empty() && !dout.empty(), op, "dbias and dout must not be empty");
    expect_float(op, "dbias", dbias);
    expect_float(op, "dout", dout);
    const int64_t OC = dbias.numel(), N = OC > 0 ? dout.numel() / OC : 0;
    PTRAIN_EXPECT(OC > 0 && last_dim(dout) == OC, op,
                  "shape mismatch: dbias " + dbias.shape_string() + " dout " + dout.shape_string());
    if (N == 0) return;
    Staged st(*this);
    bias_backward_into(st, dbias, dout, N, OC);
    st.finish();
  }

  // GELU in the GEMM's epilogue (llm.c fuses both directions on Hopper): forward GELU_AUX_BIAS
  // writes gelu(acc + bias) and keeps acc + bias as the aux matrix (pre); backward DGELU
  // multiplies the dgrad GEMM's result by gelu'(pre). Each value is rounded once, from FP32,
  // where the separate ops round the GEMM's output first: about an ulp apart in bf16. Operands
  // the GEMM cannot take as they are (mixed dtypes, a rounding format, an aux leading dimension
  // cuBLASLt refuses, a misaligned bias) take the separate ops.
  void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias) override {
    const int64_t OC = weight.ndim == 2 ? weight.dim(0) : 0, C = weight.ndim == 2 ? weight.dim(1) : 0;
    const int64_t N = C > 0 ? inp.numel() / C : 0;
    const bool shapes_fit = N > 0 && last_dim(inp) == C && out.numel() == N * OC && pre.numel() == N * OC &&
                            (bias.empty() || bias.numel() == OC);
    if (shapes_fit && gelu_epilogue_fits({&out, &pre, &inp, &weight}, bias)) {
      const cudaDataType_t t = cuda_type(inp.dtype);
      GemmSpec spec = linear_forward_gemm(N, C, OC, t, t, t, compute_for(inp.dtype));
      spec.epilogue = bias.empty() ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      spec.aux_ld = OC;  // aux and bias keep cuBLASLt's default type, D's (as llm.c leaves them)
      GemmArgs args;
      args.a = weight.data;
      args.b = inp.data;
      args.d = out.data;
      args.aux = pre.data;
      args.bias = bias.empty() ? nullptr : bias.data;
      if (matmul_->try_run(spec, args, stream_)) return;
    }
    Backend::matmul_gelu_forward(out, pre, inp, weight, bias);  // the separate ops (and their checks)
  }

  void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                            Tensor pre, Tensor dgelu) override {
    const int64_t OC = weight.ndim == 2 ? weight.dim(0) : 0, C = weight.ndim == 2 ? weight.dim(1) : 0;
    const int64_t N = OC > 0 ? dout.numel() / OC : 0;
    const bool shapes_fit = N > 0 && last_dim(dout) == OC && dpre.numel() == N * C && pre.numel() == N * C;
    if (shapes_fit && gelu_epilogue_fits({&dpre, &dout, &weight, &pre}, Tensor())) {
      const cudaDataType_t t = cuda_type(dout.dtype);
      GemmSpec spec = linear_dgrad_gemm(N, C, OC, t, t, t, false, compute_for(dout.dtype));
      spec.epilogue = CUBLASLT_EPILOGUE_DGELU;
      spec.aux_ld = C;
      GemmArgs args;  // dpre(N,C) = gelu'(pre) * (dout(N,OC) W(OC,C)), written (beta 0)
      args.a = weight.data;
      args.b = dout.data;
      args.d = dpre.data;
      args.aux = pre.data;
      if (matmul_->try_run(spec, args, stream_)) return matmul_backward(Tensor(), dweight, dbias, dout, inp, weight);
    }
    Backend::matmul_gelu_backward(dpre, dweight, dbias, dout, inp, weight, pre, dgelu);
  }

  // ------------------------------------------------------------------------ attention

  // The saved tensor's shape picks the path: (B,NH,T) FP32 log-sum-exps are the fused path's.
  void attention_forward(Tensor out, Tensor att, Tensor qkv, int n_head) override {
    const char* op = "attention_forward";
    PTRAIN_EXPECT(!out.empty() && !att.empty() && !qkv.empty(), op, "out, att and qkv must not be empty");
    expect_float(op, "out", out);
    expect_float(op, "att", att);
    expect_float(op, "qkv", qkv);
    PTRAIN_EXPECT(qkv.ndim == 3 && qkv.dim(2) % 3 == 0 && n_head > 0, op,
                  "qkv must be (B,T,3C) and n_head positive, got " + qkv.shape_string());
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = qkv.dim(2) / 3, NH = n_head;
    const bool fused = is_fused_saved(att, B, NH, Tn);
    PTRAIN_EXPECT(C % NH == 0 && out.numel() == B * Tn * C && (fused || att.numel() == B * NH * Tn * Tn), op,
                  "shape mismatch: qkv " + qkv.shape_string() + " out " + out.shape_string() + " saved " +
                      att.shape_string() + " (want (B,NH,T,T) probabilities or (B,NH,T) f32 log-sum-exps)");
    if (B * Tn * C == 0) return;
    if (fused) return fused_attention_forward(out, att, qkv, sdpa_shape(op, qkv, out, B, Tn, NH, C / NH));
    const int64_t HS = C / NH, BNH = B * NH;
    const int b = to_int(B, op, "B"), tn = to_int(Tn, op, "T"), hs = to_int(HS, op, "head size");
    to_int(BNH * Tn, op, "attention rows");
    Staged st(*this);
    const DType dt = qkv.dtype;
    const Tensor o = st.out(out, dt, false), a = st.out(att, dt, false);
    const size_t n = static_cast<size_t>(B * Tn * C) * dtype_size(dt);
    void* q = scratch(kAttnQ, n);
    void* k = scratch(kAttnK, n);
    void* v = scratch(kAttnV, n);
    void* y = scratch(kAttnY, n);
    const float scale = attention_scale(HS);  // the CPU's float expression
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::attention_permute<T>(static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), qkv.as<T>(), b, tn,
                                    n_head, hs, stream_);
    });
    batched_gemm(dt, BNH, Tn, Tn, HS, false, true, q, Tn * HS, k, Tn * HS, a.data, Tn * Tn);  // q k^T
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::softmax_causal_forward<T>(a.as<T>(), a.as<T>(), scale, static_cast<int>(BNH), tn, stream_);
    });
    batched_gemm(dt, BNH, Tn, HS, Tn, false, false, a.data, Tn * Tn, v, Tn * HS, y, Tn * HS);  // att v
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::attention_unpermute<T>(o.as<T>(), static_cast<const T*>(y), b, tn, n_head, hs, stream_);
    });
    st.finish();
  }

  // The same chain in reverse (tests/kernels/test_attention_kernels.cpp composes it the same
  // way): dy = unpermute_backward(dout); datt = dy v^T; dv = att^T dy; dpreatt =
  // softmax_causal_backward(datt) in place; dq = dpreatt k; dk = dpreatt^T q; dqkv += permute.
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor att, int n_head) override {
    const char* op = "attention_backward";
    PTRAIN_EXPECT(!dqkv.empty() && !dout.empty() && !qkv.empty() && !att.empty(), op, "empty operand");
    expect_float(op, "dqkv", dqkv);
    expect_float(op, "dout", dout);
    expect_float(op, "qkv", qkv);
    expect_float(op, "att", att);
    PTRAIN_EXPECT(qkv.ndim == 3 && qkv.dim(2) % 3 == 0 && n_head > 0, op,
                  "qkv must be (B,T,3C) and n_head positive, got " + qkv.shape_string());
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = qkv.dim(2) / 3, NH = n_head;
    const bool fused = is_fused_saved(att, B, NH, Tn);
    PTRAIN_EXPECT(C % NH == 0 && dqkv.numel() == qkv.numel() && dout.numel() == B * Tn * C &&
                      (fused || att.numel() == B * NH * Tn * Tn),
                  op,
                  "shape mismatch: qkv " + qkv.shape_string() + " dout " + dout.shape_string() + " saved " +
                      att.shape_string());
    if (B * Tn * C == 0) return;
    if (fused) {
      PTRAIN_EXPECT(!out.empty() && out.numel() == B * Tn * C, op,
                    "the fused path needs the forward's output (B,T,C), got " + out.shape_string());
      expect_float(op, "out", out);
      return fused_attention_backward(dqkv, dout, qkv, out, att, sdpa_shape(op, qkv, out, B, Tn, NH, C / NH));
    }
    const int64_t HS = C / NH, BNH = B * NH;
    const int b = to_int(B, op, "B"), tn = to_int(Tn, op, "T"), hs = to_int(HS, op, "head size");
    to_int(BNH * Tn, op, "attention rows");
    Staged st(*this);
    const DType dt = qkv.dtype;
    const Tensor dx = st.out(dqkv, dt, true), d = st.in(dout, dt), a = st.in(att, dt);
    const size_t es = dtype_size(dt);
    const size_t n = static_cast<size_t>(B * Tn * C) * es;
    void* q = scratch(kAttnQ, n);
    void* k = scratch(kAttnK, n);
    void* v = scratch(kAttnV, n);
    void* dy = scratch(kAttnY, n);
    void* datt = scratch(kAttnDatt, static_cast<size_t>(BNH * Tn * Tn) * es);
    void* dq = scratch(kAttnDq, n);
    void* dk = scratch(kAttnDk, n);
    void* dv = scratch(kAttnDv, n);
    const float scale = attention_scale(HS);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::attention_permute<T>(static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), qkv.as<T>(), b, tn,
                                    n_head, hs, stream_);
      kernels::attention_unpermute_backward<T>(static_cast<T*>(dy), d.as<T>(), b, tn, n_head, hs, stream_);
    });
    batched_gemm(dt, BNH, Tn, Tn, HS, false, true, dy, Tn * HS, v, Tn * HS, datt, Tn * Tn);     // dy v^T
    batched_gemm(dt, BNH, Tn, HS, Tn, true, false, a.data, Tn * Tn, dy, Tn * HS, dv, Tn * HS);  // att^T dy
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::softmax_causal_backward<T>(static_cast<T*>(datt), static_cast<const T*>(datt), a.as<T>(), scale,
                                          static_cast<int>(BNH), tn, stream_);
    });
    batched_gemm(dt, BNH, Tn, HS, Tn, false, false, datt, Tn * Tn, k, Tn * HS, dq, Tn * HS);  // dpreatt k
    batched_gemm(dt, BNH, Tn, HS, Tn, true, false, datt, Tn * Tn, q, Tn * HS, dk, Tn * HS);   // dpreatt^T q
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::attention_permute_backward<T>(dx.as<T>(), static_cast<const T*>(dq), static_cast<const T*>(dk),
                                             static_cast<const T*>(dv), b, tn, n_head, hs, stream_);
    });
    st.finish();
  }

  // The fused path: cuDNN's flash attention (backend/cuda/cudnn_attention.h) reads q, k and v in
  // place from qkv and saves one log-sum-exp per row; its backward writes dq, dk, dv into scratch,
  // which is then added into dqkv (backward ops accumulate).
  static bool is_fused_saved(const Tensor& saved, int64_t B, int64_t NH, int64_t Tn) {
    return saved.ndim == 3 && saved.dtype == DType::f32 && saved.dim(0) == B && saved.dim(1) == NH &&
           saved.dim(2) == Tn;
  }

  SdpaShape sdpa_shape(const char* op, const Tensor& qkv, const Tensor& out, int64_t B, int64_t Tn, int64_t NH,
                       int64_t HS) const {
    PTRAIN_EXPECT(cudnn_ != nullptr, op, "the fused attention path was not chosen (choose_attention)");
    PTRAIN_EXPECT((qkv.dtype == DType::bf16 || qkv.dtype == DType::f16) && out.dtype == qkv.dtype, op,
                  "the fused path takes bf16 or fp16 qkv and out of one dtype");
    return SdpaShape{B, Tn, NH, HS, cuda_type(qkv.dtype)};
  }

  static float attention_scale(int64_t HS) { return 1.0f / std::sqrt(static_cast<float>(HS)); }

  void fused_attention_forward(const Tensor& out, const Tensor& stats, const Tensor& qkv, const SdpaShape& s) {
    void* workspace = scratch(kCudnnWorkspace, cudnn_->workspace_bytes(s));
    cudnn_->forward(s, out.data, stats.as<float>(), qkv.data, attention_scale(s.HS), workspace);
    if (needs_rounding(out)) convert(out, out, out.format);
  }

  void fused_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& stats, const SdpaShape& s) {
    const char* op = "attention_backward";
    Staged st(*this);
    const DType dt = qkv.dtype;
    const Tensor d = st.in(dout, dt);
    const size_t n = static_cast<size_t>(qkv.numel());
    void* grads = scratch(kAttnDqkv, n * dtype_size(dt));
    void* workspace = scratch(kCudnnWorkspace, cudnn_->workspace_bytes(s));
    cudnn_->backward(s, grads, d.data, qkv.data, out.data, stats.as<float>(), attention_scale(s.HS), workspace);
    const Tensor dx = st.out(dqkv, dt, true);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::add<T>(dx.as<T>(), dx.as<T>(), static_cast<const T*>(grads), n, stream_);
    });
    st.finish();
  }

  AttentionChoice choose_attention(const std::string& want, DType dtype, int64_t B, int64_t Tn, int n_head,
                                   int64_t head_size) override {
    if (want == "fallback") return {AttentionPath::fallback, "fallback (model.attention: fallback)"};
    const bool required = want == "cudnn";
    const auto fallback = [&](const std::string& why) {
      if (required) throw UserError("model.attention: cudnn cannot run this model: " + why);
      return AttentionChoice{AttentionPath::fallback, "fallback (" + why + ")"};
    };
    if (dtype != DType::bf16 && dtype != DType::f16)
      return fallback("cuDNN's flash attention takes bf16 or fp16; this run's activations are " +
                      std::string(dtype_name(dtype)));
    try {
      if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(stream_, /*deterministic=*/true);
    } catch (const CudaError& e) {
      return fallback(std::string("cuDNN could not start: ") + e.what());
    }
    const SdpaShape s{B, Tn, n_head, head_size, cuda_type(dtype)};
    std::string why, mismatch;
    try {  // a cuDNN failure here (never seen on a GPU yet) must not end an `auto` run
      if (!cudnn_->supported(s, &why)) return fallback(why);
      mismatch = check_fused_attention(s);
    } catch (const EnvironmentError& e) {
      drop_attention_scratch();
      return fallback(std::string("cuDNN's attention failed: ") + e.what());
    }
    drop_attention_scratch();  // the check's fallback buffers: a fused run never needs them
    if (!mismatch.empty()) return fallback(mismatch);
    return {AttentionPath::fused,
            "cudnn (fused flash attention, checked against the fallback on this shape; " + cudnn_->plan_summary(s) + ")"};
  }

  void drop_attention_scratch() {
    for (const Slot slot : {kAttnQ, kAttnK, kAttnV, kAttnY, kAttnDatt, kAttnDq, kAttnDk, kAttnDv}) {
      ScratchBuffer& b = scratch_[static_cast<size_t>(slot)];
      if (b.ptr) free_block(b.ptr);
      b = ScratchBuffer{};
    }
  }

  // Runs both paths once on seeded inputs of shape s and compares out and dqkv; returns what
  // differs ("" when they agree). The composite cuDNN graph is only as right as its strides and
  // modes: checking it on the run's own shape costs one attention call and keeps a wrong graph
  // from training a model.
  std::string check_fused_attention(const SdpaShape& s) {
    const DType dt = s.type == CUDA_R_16F ? DType::f16 : DType::bf16;
    const Format f = dt == DType::f16 ? Format::fp16 : Format::bf16;
    const int64_t C = s.NH * s.HS, n_qkv = s.B * s.T * 3 * C, n_out = s.B * s.T * C;
    std::vector<float> host_qkv(static_cast<size_t>(n_qkv)), host_dout(static_cast<size_t>(n_out));
    Rng rng(/*seed=*/7);
    for (float& x : host_qkv) x = 2.0f * rng.uniform() - 1.0f;
    for (float& x : host_dout) x = 2.0f * rng.uniform() - 1.0f;
    std::vector<void*> blocks;
    const auto tensor = [&](std::vector<int64_t> shape, DType type, Format format) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      blocks.push_back(allocate(static_cast<size_t>(numel) * dtype_size(type)));
      return Tensor(blocks.back(), type, shape, Device::cuda).with_format(format);
    };
    std::string result;
    try {
      const Tensor qkv = tensor({s.B, s.T, 3 * C}, dt, f), dout = tensor({s.B, s.T, C}, dt, f);
      const Tensor out_f = tensor({s.B, s.T, C}, dt, f), out_r = tensor({s.B, s.T, C}, dt, f);
      const Tensor lse = tensor({s.B, s.NH, s.T}, DType::f32, Format::fp32);
      const Tensor probs = tensor({s.B, s.NH, s.T, s.T}, dt, f);
      const Tensor dqkv_f = tensor({s.B, s.T, 3 * C}, dt, f), dqkv_r = tensor({s.B, s.T, 3 * C}, dt, f);
      upload(qkv, host_qkv.data());
      upload(dout, host_dout.data());
      const int nh = static_cast<int>(s.NH);
      attention_forward(out_f, lse, qkv, nh);
      attention_backward(dqkv_f, dout, qkv, out_f, lse, nh);
      attention_forward(out_r, probs, qkv, nh);
      attention_backward(dqkv_r, dout, qkv, out_r, probs, nh);
      const auto relative_error = [&](const Tensor& got, const Tensor& want) {
        std::vector<float> g(static_cast<size_t>(got.numel())), w(g.size());
        download(g.data(), got);
        download(w.data(), want);
        double diff = 0, norm = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
          norm += double(w[i]) * w[i];
        }
        return std::sqrt(diff / std::max(norm, 1e-30));  // NaN stays NaN: it never passes
      };
      // Both paths round their bf16/fp16 operands alike; they differ in accumulation order.
      const double tolerance = 2e-2, e_out = relative_error(out_f, out_r), e_grad = relative_error(dqkv_f, dqkv_r);
      if (!(e_out <= tolerance && e_grad <= tolerance))
        result = "cuDNN's attention differs from the fallback on this shape (relative error " + std::to_string(e_out) +
                 " in the output, " + std::to_string(e_grad) + " in the gradients; tolerance " +
                 std::to_string(tolerance) + ")";
    } catch (...) {
      for (void* b : blocks) release(b);
      throw;
    }
    for (void* b : blocks) release(b);
    return result;
  }

  // ------------------------------------------------------------------------ elementwise

  void gelu_forward(Tensor out, Tensor inp) override {
    const char* op = "gelu_forward";
    const int64_t n = elementwise_size(op, {{"inp", &inp}, {"out", &out}});
    if (n == 0) return;
    Staged st(*this);
    const DType dt = inp.dtype;
    const Tensor o = st.out(out, dt, false);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::gelu_forward<T>(o.as<T>(), inp.as<T>(), static_cast<size_t>(n), stream_);
    });
    st.finish();
  }

  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    const char* op = "gelu_backward";
    const int64_t n = elementwise_size(op, {{"inp", &inp}, {"dinp", &dinp}, {"dout", &dout}});
    if (n == 0) return;
    Staged st(*this);
    const DType dt = inp.dtype;
    const Tensor di = st.out(dinp, dt, true), d = st.in(dout, dt);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::gelu_backward<T>(di.as<T>(), inp.as<T>(), d.as<T>(), static_cast<size_t>(n), stream_);
    });
    st.finish();
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    const char* op = "add";
    const int64_t n = elementwise_size(op, {{"a", &a}, {"b", &b}, {"out", &out}});
    if (n == 0) return;
    Staged st(*this);
    const DType dt = a.dtype;
    const Tensor o = st.out(out, dt, false), bb = st.in(b, dt);
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::add<T>(o.as<T>(), a.as<T>(), bb.as<T>(), static_cast<size_t>(n), stream_);
    });
    st.finish();
  }

  // ------------------------------------------------------------------------ classifier

  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override {
    const char* op = "classifier";
    PTRAIN_EXPECT(!logits.empty() && !losses.empty(), op, "empty operand");
    expect_float(op, "logits", logits);
    expect_float(op, "losses", losses);
    expect_tokens(op, "targets", targets);
    const int64_t Vp = last_dim(logits), N = Vp > 0 ? logits.numel() / Vp : 0;
    PTRAIN_EXPECT(Vp > 0 && losses.numel() == N && targets.numel() == N && vocab > 0 && vocab <= Vp, op,
                  "shape mismatch: logits " + logits.shape_string() + " losses " + losses.shape_string() + " vocab " +
                      std::to_string(vocab));
    if (N == 0) return;
    Staged st(*this);
    const Tensor lg = st.out(logits, logits.dtype, true), ls = st.out(losses, DType::f32, false);
    with_float_type(logits.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fused_classifier<T>(lg.as<T>(), ls.as<float>(), targets.as<int>(), to_int(N, op, "rows"), vocab,
                                   to_int(Vp, op, "padded vocabulary"), dloss, stream_);
    });
    st.finish();
  }

  // ------------------------------------------------------------------------ reductions

  double sum(Tensor t) override { return reduce("sum", t, false); }
  double sum_squares(Tensor t) override { return reduce("sum_squares", t, true); }

  void sum_into(Tensor out, Tensor t) override {
    PTRAIN_EXPECT(out.dtype == DType::f64 && out.numel() == 1 && out.device == Device::cuda, "sum_into",
                  "out must be one f64 element in device memory");
    queue_reduce("sum_into", t, false, out.as<double>());
  }

  void download_doubles(double* dst, Tensor src) override {
    PTRAIN_EXPECT(src.dtype == DType::f64 && src.device == Device::cuda, "download_doubles",
                  "src must be f64 in device memory");
    if (src.numel() == 0) return;
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    sync();
  }

  float amax(Tensor t) override {
    const char* op = "amax";
    expect_float(op, "t", t);
    const size_t n = t.empty() ? 0 : static_cast<size_t>(t.numel());
    if (n == 0) return 0.0f;
    float* device_amax = amax_ptr();
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(device_amax, 0, sizeof(float), stream_));
    with_float_type(t.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::amax<T>(device_amax, t.as<T>(), n, stream_);
    });
    float result = 0.0f;
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, device_amax, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    sync();
    return result;
  }

  // ------------------------------------------------------------------------ FP8 casts

  // kernels::fp8_cast writes the codes and the statistics; the dequantised output is
  // code value * (1.0f / scale), the CPU's expression, bit for bit. `out` is not rounded to
  // any format: it holds exactly the dequantised values.
  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format format, float scale) override {
    const char* op = "fp8_cast";
    PTRAIN_EXPECT(!out.empty() && !in.empty(), op, "empty operand");
    expect_float(op, "out", out);
    expect_float(op, "in", in);
    PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
    PTRAIN_EXPECT(out.numel() == in.numel(), op,
                  "in " + in.shape_string() + " and out " + out.shape_string() + " differ in size");
    const int64_t n = in.numel();
    if (n == 0) return Fp8CastStats{};
    const int64_t cols = last_dim(in);
    const int rows_i = to_int(n / cols, op, "rows"), cols_i = to_int(cols, op, "columns");
    fp8* codes = static_cast<fp8*>(scratch(kFp8Codes, static_cast<size_t>(n)));
    const __nv_fp8_interpretation_t fmt = fp8_interpretation(format);
    reset_scalars(scale);
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_cast<T>(codes, nullptr, amax_ptr(), counts_ptr(), in.as<T>(), rows_i, cols_i, scale_ptr(), fmt,
                           stream_);
    });
    const float inv_scale = 1.0f / scale;
    with_float_type(out.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_dequantize<T>(out.as<T>(), codes, static_cast<size_t>(n), inv_scale, fmt, stream_);
    });
    return read_fp8_stats();
  }

  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows, int block_cols) override {
    const char* op = "fp8_cast_blocks";
    PTRAIN_EXPECT(!out.empty() && !in.empty(), op, "empty operand");
    expect_float(op, "out", out);
    expect_float(op, "in", in);
    PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
    PTRAIN_EXPECT(block_rows >= 1 && block_cols >= 1, op, "block sizes must be positive");
    PTRAIN_EXPECT(out.numel() == in.numel(), op,
                  "in " + in.shape_string() + " and out " + out.shape_string() + " differ in size");
    const int64_t n = in.numel();
    if (n == 0) return Fp8CastStats{};
    const int64_t cols = last_dim(in), rows = n / cols;
    const int rows_i = to_int(rows, op, "rows"), cols_i = to_int(cols, op, "columns");
    const int64_t tile_rows = (rows + block_rows - 1) / block_rows, tile_cols = (cols + block_cols - 1) / block_cols;
    to_int(tile_rows * tile_cols, op, "blocks");
    fp8* codes = static_cast<fp8*>(scratch(kFp8Codes, static_cast<size_t>(n)));
    float* scale_inv = scratch_floats(kFp8ScaleInv, static_cast<size_t>(tile_rows * tile_cols));
    const __nv_fp8_interpretation_t fmt = fp8_interpretation(format);
    reset_scalars(1.0f);
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_quantize_blocks<T>(codes, scale_inv, amax_ptr(), counts_ptr(), in.as<T>(), rows_i, cols_i,
                                      block_rows, block_cols, fmt, stream_);
    });
    with_float_type(out.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_dequantize_blocks<T>(out.as<T>(), codes, scale_inv, rows_i, cols_i, block_rows, block_cols, fmt,
                                        stream_);
    });
    return read_fp8_stats();
  }

  // ------------------------------------------------------------------------ native FP8 GEMMs

  // One linear layer's FP8 operands in the arena: the codes of input (rows,C), weight (OC,C) and
  // grad (rows,OC), each with its transpose (cuBLASLt's FP8 GEMMs are TN only: dgrad reads W^T,
  // wgrad reads input^T and grad^T; matmul.h), and their dequantisation factors in device
  // memory for the scale pointers.
  //  - Per-tensor scaling: one cast-transpose pass per operand; one factor 1/scale each.
  //  - Block scaling (Hopper, cuBLASLt >= 12.9): the weight in 128x128 blocks (codes and
  //    transpose share the blocks, each with its factors in its GEMM's layout); input and grad
  //    twice, 1x128 tiles for the forward and dgrad GEMMs and 128x1 tiles, written transposed,
  //    for wgrad. Every GEMM has one 1x128 operand, as cuBLASLt requires.
  class CudaFp8Gemms final : public Fp8Gemms {
   public:
    CudaFp8Gemms(CudaBackend& be, int64_t rows, int64_t C, int64_t OC, Scaling scaling)
        : be_(be), rows_(rows), C_(C), OC_(OC), scaling_(scaling) {
      const std::array<int64_t, 3> sizes = {rows * C, OC * C, rows * OC};
      try {
        for (int i = 0; i < 3; ++i) {
          const Operand which = static_cast<Operand>(i);
          codes_[i] = static_cast<fp8*>(be_.allocate(static_cast<size_t>(sizes[i])));
          transposed_[i] = static_cast<fp8*>(be_.allocate(static_cast<size_t>(sizes[i])));
          factors_[i] = static_cast<float*>(be_.allocate(sizeof(float) * static_cast<size_t>(factor_count(which, false))));
          if (scaling_ == Scaling::blocks)  // per tensor, codes and transpose share their one factor
            factors_t_[i] = static_cast<float*>(
                be_.allocate(sizeof(float) * static_cast<size_t>(factor_count(which, true))));
        }
        stats_ = static_cast<DeviceScalars*>(be_.allocate(sizeof(DeviceScalars) * (kDiscard + 1)));
        current_amax_ = static_cast<float*>(be_.allocate(sizeof(float)));
      } catch (...) {
        release();
        throw;
      }
    }
    ~CudaFp8Gemms() override { release(); }
    CudaFp8Gemms(const CudaFp8Gemms&) = delete;
    CudaFp8Gemms& operator=(const CudaFp8Gemms&) = delete;

    // The three GEMMs' specs, for one combination of formats and output dtypes.
    static GemmSpec forward_spec(int64_t rows, int64_t C, int64_t OC, Format in, Format w, DType out, Scaling sc) {
      GemmSpec spec = linear_forward_gemm(rows, C, OC, cuda_data_type(in), cuda_data_type(w), cuda_type(out));
      scale_modes(spec, sc, GemmScale::block_128x128, GemmScale::block_1x128);
      spec.fast_accum = sc == Scaling::tensor;  // forward only, and never with block scaling (REFERENCE.md)
      return spec;
    }
    static GemmSpec dgrad_spec(int64_t rows, int64_t C, int64_t OC, Format grad, Format w, DType out, Scaling sc) {
      GemmSpec spec = linear_dgrad_gemm(rows, C, OC, cuda_data_type(grad), cuda_data_type(w), cuda_type(out), true);
      scale_modes(spec, sc, GemmScale::block_128x128, GemmScale::block_1x128);
      return spec;
    }
    static GemmSpec wgrad_spec(int64_t rows, int64_t C, int64_t OC, Format grad, Format in, DType out, Scaling sc) {
      GemmSpec spec = linear_wgrad_gemm(rows, C, OC, cuda_data_type(grad), cuda_data_type(in), cuda_type(out), true);
      scale_modes(spec, sc, GemmScale::block_1x128, GemmScale::block_1x128);
      return spec;
    }

    // Whether cuBLASLt on this GPU has algorithms for the three GEMMs with these formats (bf16
    // outputs, as the model's FP8 layers write) on this layer's buffers; if not, *why says which
    // it refused. The code buffers stand in for the outputs: only their alignment is read.
    bool runs_here(Format forward, Format backward, std::string* why) {
      const std::pair<const char*, std::pair<GemmSpec, GemmArgs>> gemms[] = {
          {"forward", {forward_spec(rows_, C_, OC_, forward, forward, DType::bf16, scaling_), forward_args(codes_[kInput])}},
          {"dgrad", {dgrad_spec(rows_, C_, OC_, backward, forward, DType::bf16, scaling_), dgrad_args(codes_[kInput])}},
          {"wgrad", {wgrad_spec(rows_, C_, OC_, backward, forward, DType::bf16, scaling_), wgrad_args(codes_[kWeight])}}};
      for (const auto& [name, gemm] : gemms)
        if (!be_.matmul_->can_run(gemm.first, gemm.second)) {
          *why = std::string("cuBLASLt on this GPU has no algorithm for the ") + name + " GEMM " +
                 describe_gemm(gemm.first);
          return false;
        }
      return true;
    }

    void cast(Operand which, Tensor in, Format format, float scale, bool record) override {
      const char* op = "fp8 cast";
      PTRAIN_CHECK(scaling_ == Scaling::tensor, "fp8 cast: these GEMMs take block-scaled operands (cast_blocks)");
      const std::pair<int, int> shape = expect_operand(op, which, in, format);
      formats_[which] = format;
      DeviceScalars* slot = stats_slot(which, record);
      kernels::set_scale(&slot->scale, factors_[which], scale, be_.stream_);  // the factor: 1/scale, as the CPU's
      cast_codes(op, which, in, format, shape, slot);
    }

    void cast_current(Operand which, Tensor in, Format format, bool record) override {
      const char* op = "fp8 cast (current scaling)";
      PTRAIN_CHECK(scaling_ == Scaling::tensor, "fp8 cast: these GEMMs take block-scaled operands (cast_blocks)");
      const std::pair<int, int> shape = expect_operand(op, which, in, format);
      formats_[which] = format;
      DeviceScalars* slot = stats_slot(which, record);
      PTRAIN_CUDA_CHECK(cudaMemsetAsync(current_amax_, 0, sizeof(float), be_.stream_));
      with_float_type(in.dtype, op, [&](auto tag) {
        PTRAIN_ELEMENT_TYPE(T, tag);
        kernels::amax<T>(current_amax_, in.as<T>(), static_cast<size_t>(in.numel()), be_.stream_);
      });
      kernels::current_scale_from_amax(&slot->scale, factors_[which], current_amax_, format_max(format), be_.stream_);
      cast_codes(op, which, in, format, shape, slot);
    }

    void cast_blocks(Operand which, Tensor in, Format format, int block_rows, int block_cols, bool record) override {
      const char* op = "fp8 block cast";
      PTRAIN_CHECK(scaling_ == Scaling::blocks, "fp8 block cast: these GEMMs take per-tensor scales (cast)");
      const std::pair<int, int> shape = expect_operand(op, which, in, format);
      const int r = shape.first, c = shape.second;  // named, not bound: lambdas capture them (C++17)
      constexpr int kB = 128;
      kernels::Fp8BlockCodes dst;
      if (which == kWeight && block_rows == kB && block_cols == kB) {  // codes and transpose, one pass
        dst.codes = codes_[which];
        dst.scale_inv = factors(which, false);
        dst.layout = factor_layout(which, false);
        dst.codes_t = transposed_[which];
        dst.scale_inv_t = factors(which, true);
        dst.layout_t = factor_layout(which, true);
      } else if (which != kWeight && block_rows == 1 && block_cols == kB) {
        dst.codes = codes_[which];
        dst.scale_inv = factors(which, false);
        dst.layout = factor_layout(which, false);
      } else if (which != kWeight && block_rows == kB && block_cols == 1) {
        dst.codes_t = transposed_[which];
        dst.scale_inv_t = factors(which, true);
        dst.layout_t = factor_layout(which, true);
      } else {
        PTRAIN_CHECK(false, "fp8 block cast: " + std::to_string(block_rows) + "x" + std::to_string(block_cols) +
                                " blocks are not this operand's tiling");
      }
      formats_[which] = format;
      DeviceScalars* slot = stats_slot(which, record);
      with_float_type(in.dtype, op, [&](auto tag) {
        PTRAIN_ELEMENT_TYPE(T, tag);
        kernels::fp8_quantize_blocks_into<T>(dst, &slot->amax, &slot->counts, in.as<T>(), r, c, block_rows, block_cols,
                                             fp8_interpretation(format), be_.stream_);
      });
    }

    void queue_stats_read() override {
      if (read_queued_) return;
      constexpr size_t kBytes = 3 * sizeof(DeviceScalars);
      void* host = stats_read_.acquire(kBytes);
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, stats_, kBytes, cudaMemcpyDeviceToHost, be_.stream_));
      PTRAIN_CUDA_CHECK(cudaMemsetAsync(stats_, 0, kBytes, be_.stream_));
      stats_read_.queued(be_.stream_);
      read_queued_ = true;
    }

    std::array<OperandStats, 3> take_stats() override {
      queue_stats_read();
      const auto* host = static_cast<const DeviceScalars*>(stats_read_.acquire(3 * sizeof(DeviceScalars)));
      read_queued_ = false;
      std::array<OperandStats, 3> out;
      for (int i = 0; i < 3; ++i) {
        out[i].stats = to_stats(host[i]);
        out[i].scale = scaling_ == Scaling::tensor ? host[i].scale : NAN;
      }
      return out;
    }

    void forward(Tensor out, Tensor bias) override {
      const char* op = "fp8 forward GEMM";
      expect_float(op, "out", out);
      expect_float(op, "bias", bias);
      PTRAIN_EXPECT(out.numel() == rows_ * OC_ && (bias.empty() || bias.numel() == OC_), op,
                    "shape mismatch: out " + out.shape_string() + " bias " + bias.shape_string());
      Staged st(be_);
      const Tensor o = st.out(out, out.dtype, false);
      GemmSpec spec = forward_spec(rows_, C_, OC_, formats_[kInput], formats_[kWeight], out.dtype, scaling_);
      GemmArgs args = forward_args(o.data);
      // cuBLASLt's FP8 GEMMs take a bf16/fp16 bias with an output of that type, never an f32 bias.
      bool fused_bias = !bias.empty() && bias.dtype == out.dtype && out.dtype != DType::f32 &&
                        reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
      if (fused_bias) {
        GemmSpec with_bias = spec;
        with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
        with_bias.bias_type = cuda_type(bias.dtype);
        GemmArgs bias_args = args;
        bias_args.bias = bias.data;
        fused_bias = be_.matmul_->try_run(with_bias, bias_args, be_.stream_);
      }
      if (!fused_bias) be_.matmul_->run(spec, args, be_.stream_);
      if (!bias.empty() && !fused_bias) {
        const Tensor bb = st.in(bias, out.dtype);
        with_float_type(out.dtype, op, [&](auto tag) {
          PTRAIN_ELEMENT_TYPE(T, tag);
          kernels::bias_add<T>(o.as<T>(), bb.as<T>(), to_int(rows_, op, "rows"), to_int(OC_, op, "columns"),
                               be_.stream_);
        });
      }
      st.finish();
    }

    void backward(Tensor dinp, Tensor dweight) override {
      const char* op = "fp8 backward GEMMs";
      expect_float(op, "dinp", dinp);
      expect_float(op, "dweight", dweight);
      PTRAIN_EXPECT((dinp.empty() || dinp.numel() == rows_ * C_) && (dweight.empty() || dweight.numel() == OC_ * C_),
                    op, "shape mismatch: dinp " + dinp.shape_string() + " dweight " + dweight.shape_string());
      Staged st(be_);
      if (!dinp.empty()) {  // dinp(rows,C) += grad(rows,OC) W(OC,C)
        const Tensor o = st.out(dinp, dinp.dtype, true);
        be_.matmul_->run(dgrad_spec(rows_, C_, OC_, formats_[kGrad], formats_[kWeight], dinp.dtype, scaling_),
                         dgrad_args(o.data), be_.stream_);
      }
      if (!dweight.empty()) {  // dW(OC,C) += grad^T input
        const Tensor o = st.out(dweight, dweight.dtype, true);
        be_.matmul_->run(wgrad_spec(rows_, C_, OC_, formats_[kGrad], formats_[kInput], dweight.dtype, scaling_),
                         wgrad_args(o.data), be_.stream_);
      }
      st.finish();
    }

   private:
    static void scale_modes(GemmSpec& spec, Scaling sc, GemmScale a_blocks, GemmScale b_blocks) {
      spec.a_scale = sc == Scaling::tensor ? GemmScale::tensor : a_blocks;
      spec.b_scale = sc == Scaling::tensor ? GemmScale::tensor : b_blocks;
    }
    // A GEMM reading operand a's codes (or their transpose) as A and b's as B, with their factors.
    GemmArgs operand_args(Operand a, bool a_transposed, Operand b, bool b_transposed, void* d, float beta) const {
      GemmArgs args;
      args.a = a_transposed ? transposed_[a] : codes_[a];
      args.b = b_transposed ? transposed_[b] : codes_[b];
      args.d = d;
      args.beta = beta;
      args.a_scale_inv = factors(a, a_transposed);
      args.b_scale_inv = factors(b, b_transposed);
      return args;
    }
    // out(rows,OC) = input W^T: A = W codes, B = input codes.
    GemmArgs forward_args(void* d) const { return operand_args(kWeight, false, kInput, false, d, 0.0f); }
    // dinp += grad W: A = W^T codes, B = grad codes.
    GemmArgs dgrad_args(void* d) const { return operand_args(kWeight, true, kGrad, false, d, 1.0f); }
    // dW += grad^T input: A = input^T codes, B = grad^T codes.
    GemmArgs wgrad_args(void* d) const { return operand_args(kInput, true, kGrad, true, d, 1.0f); }

    // Where an operand's casts gather their statistics; an evaluation's go to a slot never read.
    static constexpr int kDiscard = 3;
    // (A device address: never dereferenced here, only offset to its fields.)
    DeviceScalars* stats_slot(Operand which, bool record) const { return stats_ + (record ? which : kDiscard); }

    // The per-tensor cast with the scale in slot.scale: codes and transpose in one pass.
    void cast_codes(const char* op, Operand which, const Tensor& in, Format format, std::pair<int, int> shape,
                    DeviceScalars* slot) {
      const int r = shape.first, c = shape.second;
      with_float_type(in.dtype, op, [&](auto tag) {
        PTRAIN_ELEMENT_TYPE(T, tag);
        kernels::fp8_cast<T>(codes_[which], transposed_[which], &slot->amax, &slot->counts, in.as<T>(), r, c,
                             &slot->scale, fp8_interpretation(format), be_.stream_);
      });
    }

    std::pair<int, int> expect_operand(const char* op, Operand which, const Tensor& in, Format format) const {
      expect_float(op, "in", in);
      PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
      const auto [rows, cols] = shape_of(which);
      PTRAIN_EXPECT(in.numel() == rows * cols, op,
                    "expected " + std::to_string(rows) + " x " + std::to_string(cols) + " elements, got " +
                        in.shape_string());
      return {to_int(rows, op, "rows"), to_int(cols, op, "columns")};
    }
    std::pair<int64_t, int64_t> shape_of(Operand which) const {
      return which == kInput ? std::pair{rows_, C_} : which == kWeight ? std::pair{OC_, C_} : std::pair{rows_, OC_};
    }

    // The dequantisation factors of an operand's codes (transposed: of its transpose). As GEMM
    // operands (matmul.h, gemm_scale_floats): the weight is BLK128x128, the codes (outer OC, K
    // = C) and the transpose (outer C, K = OC); input and grad are VEC128, the codes (outer
    // rows, K = columns) and the transposes (outer columns, K = rows).
    float* factors(Operand which, bool transposed) const {
      return transposed && scaling_ == Scaling::blocks ? factors_t_[which] : factors_[which];
    }
    int64_t factor_count(Operand which, bool transposed) const {
      if (scaling_ == Scaling::tensor) return 1;
      const auto [rows, cols] = shape_of(which);
      const GemmScale mode = which == kWeight ? GemmScale::block_128x128 : GemmScale::block_1x128;
      return transposed ? gemm_scale_floats(mode, rows, cols) : gemm_scale_floats(mode, cols, rows);
    }
    // Where block (i, j) of the (rows, cols) operand puts its factor. VEC128 factors run along
    // the outer dimension (index outer + k_block * outer_length); BLK128x128 factors run along K
    // (index k_block + outer_block * ceil(K/128) rounded up to 4).
    kernels::BlockScaleLayout factor_layout(Operand which, bool transposed) const {
      const auto [rows, cols] = shape_of(which);
      const auto k_blocks_padded = [](int64_t k) { return static_cast<int>((k + 128 * 4 - 1) / (128 * 4) * 4); };
      if (which == kWeight)
        return transposed ? kernels::BlockScaleLayout{1, k_blocks_padded(rows)}
                          : kernels::BlockScaleLayout{k_blocks_padded(cols), 1};
      return transposed ? kernels::BlockScaleLayout{static_cast<int>(cols), 1}
                        : kernels::BlockScaleLayout{1, static_cast<int>(rows)};
    }

    void release() noexcept {
      for (fp8*& p : codes_) free_quietly(p);
      for (fp8*& p : transposed_) free_quietly(p);
      for (float*& p : factors_) free_quietly(p);
      for (float*& p : factors_t_) free_quietly(p);
      free_quietly(stats_);
      free_quietly(current_amax_);
    }
    template <typename P>
    void free_quietly(P*& p) noexcept {
      if (!p) return;
      try {
        be_.release(p);
      } catch (...) {  // a destructor must not throw; the arena goes with the backend anyway
      }
      p = nullptr;
    }

    CudaBackend& be_;
    int64_t rows_, C_, OC_;
    Scaling scaling_;
    std::array<fp8*, 3> codes_{}, transposed_{};
    std::array<float*, 3> factors_{}, factors_t_{};
    std::array<Format, 3> formats_{Format::e4m3, Format::e4m3, Format::e5m2};
    DeviceScalars* stats_ = nullptr;  // per operand, then the discard slot
    PinnedStaging stats_read_;        // where take_stats() reads the operands' slots to
    bool read_queued_ = false;        // a read into stats_read_ is queued and not taken yet
    float* current_amax_ = nullptr;   // current scaling: the tensor's amax, read by the scale kernel
  };

  // The model's FP8 operands are bf16 (or f32) in device memory and its outputs bf16, fp16 or
  // f32: cuBLASLt takes all of them. What can refuse is the shape (FP8 leading dimensions must
  // be multiples of 16 bytes; block scaling wants multiples of 128) and, for block scaling, the
  // GPU and cuBLASLt version (Hopper, cuBLASLt >= 12.9): each GEMM the layer will run is
  // validated here, then asked of cuBLASLt on the layer's own buffers, once.
  std::unique_ptr<Fp8Gemms> make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling,
                                           Format forward, Format backward, std::string* why) override {
    try {
      validate_gemm_spec(CudaFp8Gemms::forward_spec(rows, C, OC, forward, forward, DType::bf16, scaling));
      validate_gemm_spec(CudaFp8Gemms::dgrad_spec(rows, C, OC, backward, forward, DType::bf16, scaling));
      validate_gemm_spec(CudaFp8Gemms::wgrad_spec(rows, C, OC, backward, forward, DType::bf16, scaling));
    } catch (const UserError& e) {
      *why = std::string("this layer's shape does not suit cuBLASLt's FP8 GEMMs: ") + e.what();
      return nullptr;
    }
    auto gemms = std::make_unique<CudaFp8Gemms>(*this, rows, C, OC, scaling);
    if (!gemms->runs_here(forward, backward, why)) return nullptr;
    return gemms;
  }

  // ------------------------------------------------------------------------ optimizer

  // kernels::adamw_update repeats the CPU's expressions. The low-precision copy is written in
  // the same pass when it has the gradient's dtype and needs no further rounding; otherwise
  // copy() writes it afterwards, as the CPU backend does.
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor param_copy) override {
    const char* op = "adamw";
    PTRAIN_EXPECT(!param.empty() && !grad.empty() && !m.empty() && !v.empty(), op, "empty operand");
    for (const Operand& operand : {Operand{"param", &param}, Operand{"grad", &grad}, Operand{"m", &m}, Operand{"v", &v},
                                   Operand{"param_copy", &param_copy}})
      expect_float(op, operand.name, *operand.tensor);
    PTRAIN_EXPECT(param.dtype == DType::f32 && m.dtype == DType::f32 && v.dtype == DType::f32, op,
                  "param (the FP32 master weights), m and v must be f32");
    const int64_t n = param.numel();
    PTRAIN_EXPECT(
        grad.numel() == n && m.numel() == n && v.numel() == n && (param_copy.empty() || param_copy.numel() == n), op,
        "shape mismatch");
    if (n == 0) return;
    const float inv_bc1 = kernels::adamw_inv_bias_correction(p.beta1, p.step);
    const float inv_bc2 = kernels::adamw_inv_bias_correction(p.beta2, p.step);
    const bool fused_copy = !param_copy.empty() && param_copy.dtype == grad.dtype && !needs_rounding(param_copy);
    with_float_type(grad.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      T* copy_ptr = fused_copy ? param_copy.as<T>() : nullptr;
      kernels::adamw_update<T>(param.as<float>(), copy_ptr, grad.as<T>(), m.as<float>(), v.as<float>(),
                               static_cast<size_t>(n), p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale,
                               inv_bc1, inv_bc2, stream_);
    });
    if (!param_copy.empty() && !fused_copy) copy(param_copy, param);
  }

  // The GPU ops do not count gradient values that rounding flushed to zero yet: those counters
  // are the CPU backend's only. This returns zeros (elements = 0: nothing was counted).
  GradNumerics take_grad_numerics() override { return GradNumerics{}; }

 private:
  // ------------------------------------------------------------------------ staging

  // Operands of an op in the dtype it computes in (see the file comment). Outputs are written
  // back, rounded to their formats, by finish(); an op that throws before finish() leaves its
  // outputs unspecified, as any failed op does.
  class Staged {
   public:
    explicit Staged(CudaBackend& backend) : be_(backend) {}
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;

    // A read-only operand as dtype `want`: itself, or a converted copy.
    Tensor in(const Tensor& t, DType want) {
      if (t.empty() || t.dtype == want) return t;
      Tensor s = buffer(t, want);
      be_.convert(s, t, Format::fp32);
      return s;
    }

    // An output as dtype `want`: itself, or a buffer that finish() converts back. With
    // `accumulate` the op adds into it, so the buffer starts as a copy of the output.
    Tensor out(const Tensor& t, DType want, bool accumulate) {
      if (t.empty()) return t;
      if (t.dtype == want) {
        if (needs_rounding(t)) pending_.push_back(Pending{t, t});
        return t;
      }
      Tensor s = buffer(t, want);
      if (accumulate) be_.convert(s, t, Format::fp32);
      pending_.push_back(Pending{t, s});
      return s;
    }

    void finish() {
      for (const Pending& p : pending_) be_.convert(p.dst, p.staged, p.dst.format);
      pending_.clear();
    }

   private:
    struct Pending {
      Tensor dst, staged;
    };

    Tensor buffer(const Tensor& t, DType want) {
      PTRAIN_CHECK(next_ < kStageSlots, "cuda backend: an op staged more operands than there are staging slots");
      Tensor s = t;
      s.dtype = want;
      s.data = be_.scratch(static_cast<Slot>(kStageFirst + next_), static_cast<size_t>(t.numel()) * dtype_size(want));
      ++next_;
      return s;
    }

    CudaBackend& be_;
    std::vector<Pending> pending_;
    int next_ = 0;
  };

  // dst = src converted to dst's dtype and rounded to `round` (Format::fp32: only the dtype's
  // own rounding). dst may be src itself (rounding in place).
  void convert(const Tensor& dst, const Tensor& src, Format round) {
    const size_t n = static_cast<size_t>(dst.numel());
    if (n == 0) return;
    if (dst.data == src.data && dst.dtype == src.dtype && (round == Format::fp32 || round == natural_format(dst.dtype)))
      return;
    with_float_type(dst.dtype, "convert", [&](auto dst_tag) {
      PTRAIN_ELEMENT_TYPE(D, dst_tag);
      with_float_type(src.dtype, "convert", [&](auto src_tag) {
        PTRAIN_ELEMENT_TYPE(S, src_tag);
        kernels::convert<D, S>(dst.as<D>(), src.as<S>(), n, round_format(round), stream_);
      });
    });
  }

  // ------------------------------------------------------------------------ GEMMs

  cublasComputeType_t compute_for(DType ab) const { return gemm_compute_type(cuda_type(ab), tf32_); }

  // out (spec.n rows, spec.m columns, row-major) = A/B product [+ bias(columns)], or += it with
  // `accumulate`. A and B have dtype ab. cuBLASLt writes out directly where it has the type
  // pair (ab -> ab, bf16/f16 -> f32), with the bias through the BIAS epilogue when every type
  // agrees; otherwise the product goes to FP32 scratch and kernels::gemm_finish adds it in.
  void gemm_into(Staged& st, GemmSpec spec, const void* a, const void* b, DType ab, const Tensor& out, bool accumulate,
                 const Tensor& bias) {
    const int64_t rows = spec.n, cols = spec.m;
    GemmArgs args;
    args.a = a;
    args.b = b;
    const bool direct = out.dtype == ab || (out.dtype == DType::f32 && ab != DType::f32);
    if (direct) {
      spec.d_type = spec.c_type = cuda_type(out.dtype);
      args.d = out.data;
      args.beta = accumulate ? 1.0f : 0.0f;  // C = D: in place
      // A bias that is not 16-byte aligned would make cuBLASLt pick slower kernels for the whole
      // GEMM (Matmul's alignment class covers every pointer): it is added afterwards instead.
      const bool fused_bias = !bias.empty() && !accumulate && bias.dtype == out.dtype && out.dtype == ab &&
                              reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
      if (fused_bias) {
        spec.epilogue = CUBLASLT_EPILOGUE_BIAS;
        args.bias = bias.data;
      }
      matmul_->run(spec, args, stream_);
      if (!bias.empty() && !fused_bias) {
        const Tensor bb = st.in(bias, out.dtype);
        with_float_type(out.dtype, "matmul_forward", [&](auto tag) {
          PTRAIN_ELEMENT_TYPE(T, tag);
          kernels::bias_add<T>(out.as<T>(), bb.as<T>(), to_int(rows, "matmul_forward", "rows"),
                               to_int(cols, "matmul_forward", "columns"), stream_);
        });
      }
      return;
    }
    float* acc = scratch_floats(kGemmAccumulator, static_cast<size_t>(rows * cols));
    spec.d_type = spec.c_type = CUDA_R_32F;
    args.d = acc;
    args.beta = 0.0f;
    matmul_->run(spec, args, stream_);
    const size_t r = static_cast<size_t>(rows), c = static_cast<size_t>(cols);
    with_float_type(out.dtype, "matmul", [&](auto out_tag) {
      PTRAIN_ELEMENT_TYPE(D, out_tag);
      if (bias.empty()) {
        kernels::gemm_finish<D, D>(out.as<D>(), acc, nullptr, r, c, accumulate, stream_);
        return;
      }
      with_float_type(bias.dtype, "matmul", [&](auto bias_tag) {
        PTRAIN_ELEMENT_TYPE(Bt, bias_tag);
        kernels::gemm_finish<D, Bt>(out.as<D>(), acc, bias.as<Bt>(), r, c, accumulate, stream_);
      });
    });
  }

  // `batch` row-major products out(rows, cols) = op(X)(rows, inner) op(Y)(inner, cols), all of
  // dtype dt, matrix i of each at base + i * stride elements (matmul.h: A = Y, B = X).
  void batched_gemm(DType dt, int64_t batch, int64_t rows, int64_t cols, int64_t inner, bool x_transposed,
                    bool y_transposed, const void* x, int64_t stride_x, const void* y, int64_t stride_y, void* out,
                    int64_t stride_out) {
    RowMajorGemm g;
    g.rows = rows;
    g.cols = cols;
    g.inner = inner;
    g.x_transposed = x_transposed;
    g.y_transposed = y_transposed;
    g.x_type = g.y_type = g.out_type = cuda_type(dt);
    g.compute = compute_for(dt);
    g.batch = to_int(batch, "attention", "batch");
    g.stride_x = stride_x;
    g.stride_y = stride_y;
    g.stride_out = stride_out;
    GemmArgs args;
    args.a = y;
    args.b = x;
    args.d = out;
    matmul_->run(row_major_gemm(g), args, stream_);
  }

  // Whether a GELU epilogue can read and write these operands as they are: one 16-bit GEMM dtype
  // for all (FP32 runs keep the separate ops: cuBLASLt's GELU need not be the CPU's to FP32
  // precision), none needing a rounding pass, a bias (if any) 16-byte aligned as gemm_into
  // wants it.
  static bool gelu_epilogue_fits(std::initializer_list<const Tensor*> operands, const Tensor& bias) {
    const DType dt = (*operands.begin())->dtype;
    if (dt != DType::bf16 && dt != DType::f16) return false;
    const auto fits = [dt](const Tensor& t) { return t.device == Device::cuda && t.dtype == dt && !needs_rounding(t); };
    for (const Tensor* t : operands)
      if (t->empty() || !fits(*t)) return false;
    return bias.empty() || (fits(bias) && reinterpret_cast<uintptr_t>(bias.data) % 16 == 0);
  }
  // dbias(OC) += column sums of dout(N, OC), in dout's dtype (kernels::bias_backward: partial
  // sums per 32 rows, then the slices in order).
  void bias_backward_into(Staged& st, const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC) {
    const char* op = "bias_backward";
    const int n = to_int(N, op, "rows"), oc = to_int(OC, op, "OC");
    const DType dt = dout.dtype;
    const Tensor db = st.out(dbias, dt, true);
    float* partial = scratch_floats(kPartials, kernels::bias_backward_scratch_floats(n, oc));
    with_float_type(dt, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::bias_backward<T>(db.as<T>(), partial, dout.as<T>(), n, oc, stream_);
    });
  }

  // ------------------------------------------------------------------------ reductions

  double reduce(const char* op, const Tensor& t, bool squares) {
    double* device_result = result_ptr();
    queue_reduce(op, t, squares, device_result);
    double result = 0.0;
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, device_result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    sync();
    return result;
  }

  // *device_out = the sum (of squares) of t, queued on the stream.
  void queue_reduce(const char* op, const Tensor& t, bool squares, double* device_out) {
    expect_float(op, "t", t);
    const size_t n = t.empty() ? 0 : static_cast<size_t>(t.numel());
    if (n == 0) {
      PTRAIN_CUDA_CHECK(cudaMemsetAsync(device_out, 0, sizeof(double), stream_));
      return;
    }
    double* partials = static_cast<double*>(scratch(kReduce, kernels::kReducePartials * sizeof(double)));
    with_float_type(t.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::double_sum<T>(device_out, partials, t.as<T>(), n, squares, stream_);
    });
  }

  // Before an FP8 cast: zeroes the device scalars (counts, amax, result) and sets the cast's
  // scale, in stream order. A copy from pageable host memory is staged before cudaMemcpyAsync
  // returns, so `scale` may go away at once.
  void reset_scalars(float scale) {
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(scalars_, 0, sizeof(DeviceScalars), stream_));
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(scale_ptr(), &scale, sizeof(float), cudaMemcpyHostToDevice, stream_));
  }

  Fp8CastStats read_fp8_stats() {
    DeviceScalars host{};
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&host, scalars_, sizeof(DeviceScalars), cudaMemcpyDeviceToHost, stream_));
    sync();
    return to_stats(host);
  }

  char* scalar_field(size_t offset) const { return reinterpret_cast<char*>(scalars_) + offset; }
  float* amax_ptr() const { return reinterpret_cast<float*>(scalar_field(offsetof(DeviceScalars, amax))); }
  float* scale_ptr() const { return reinterpret_cast<float*>(scalar_field(offsetof(DeviceScalars, scale))); }
  double* result_ptr() const { return reinterpret_cast<double*>(scalar_field(offsetof(DeviceScalars, result))); }
  kernels::Fp8Counts* counts_ptr() const {
    return reinterpret_cast<kernels::Fp8Counts*>(scalar_field(offsetof(DeviceScalars, counts)));
  }

  // ------------------------------------------------------------------------ checks

  void expect_stats(const char* op, const Tensor& mean, const Tensor& rstd) const {
    PTRAIN_EXPECT(!mean.empty() && !rstd.empty() && mean.device == Device::cuda && rstd.device == Device::cuda &&
                      mean.dtype == DType::f32 && rstd.dtype == DType::f32,
                  op, "mean and rstd must be f32 tensors in device memory");
  }

  // Tokens uploaded through upload_tokens have known buckets: their largest id is checked
  // against the vocabulary for free.
  void check_token_range(const char* op, const Tensor& tokens, int64_t vocab) const {
    const auto it = buckets_.find(tokens.data);
    if (it == buckets_.end() || it->second.tokens != tokens.numel()) return;
    if (it->second.max_id >= vocab)
      throw UserError(std::string(op) + ": token id " + std::to_string(it->second.max_id) + " is not below the " +
                      std::to_string(vocab) + " rows of the token embedding (vocabulary size)");
  }

  // ------------------------------------------------------------------------ token buckets

  // Buckets of `tokens` (host copy) for the tensor at `key`, built on the host and uploaded
  // through pinned staging, with the tokens themselves to `copy_tokens_to` unless null. Nothing
  // waits for the device, unless the staging's previous copy is still queued.
  const DeviceBuckets& build_buckets(const void* key, const int32_t* tokens, int64_t n, void* copy_tokens_to) {
    const int count = static_cast<int>(n);
    const kernels::TokenBuckets host = kernels::bucket_tokens(tokens, count);
    const size_t packed_ints = kernels::packed_bucket_ints(count);
    DeviceBuckets& entry = buckets_[key];
    if (!entry.packed || entry.tokens != n) {
      if (entry.packed) {
        free_block(entry.packed);
        entry.packed = nullptr;  // not left dangling if the allocation below throws
      }
      entry.packed = static_cast<int*>(allocate(packed_ints * sizeof(int)));
      entry.tokens = n;
    }
    PinnedStaging& staging = entry.staging[static_cast<size_t>(entry.next_staging)];
    entry.next_staging ^= 1;
    int* pinned = static_cast<int*>(staging.acquire((static_cast<size_t>(n) + packed_ints) * sizeof(int)));
    std::copy(tokens, tokens + n, pinned);
    kernels::pack_buckets(host, count, pinned + n);
    if (copy_tokens_to)
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(copy_tokens_to, pinned, static_cast<size_t>(n) * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream_));
    PTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(entry.packed, pinned + n, packed_ints * sizeof(int), cudaMemcpyHostToDevice, stream_));
    staging.queued(stream_);
    entry.max_id = host.ids.empty() ? -1 : host.ids.back();
    return entry;
  }

  // The buckets of a tokens tensor; tokens that did not come through upload_tokens (or a view
  // of part of an uploaded tensor) are read back and bucketed now.
  const DeviceBuckets& buckets_for(const Tensor& tokens) {
    const auto it = buckets_.find(tokens.data);
    if (it != buckets_.end() && it->second.tokens == tokens.numel()) return it->second;
    const int64_t n = tokens.numel();
    std::vector<int32_t> host(static_cast<size_t>(n));
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), tokens.data, static_cast<size_t>(n) * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream_));
    sync();
    return build_buckets(tokens.data, host.data(), n, nullptr);
  }

  // Drops the buckets of tokens tensors inside [ptr, ptr + bytes): that memory is being released.
  void forget_buckets_within(const void* ptr, size_t bytes) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const uintptr_t key = reinterpret_cast<uintptr_t>(it->first);
      if (key >= begin && key < end) {
        if (it->second.packed) free_block(it->second.packed);
        it = buckets_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // ------------------------------------------------------------------------ arena internals

  // Returns an allocation to the free list, merging it with free neighbours.
  void free_block(void* ptr) {
    const auto it = allocations_.find(ptr);
    PTRAIN_CHECK(it != allocations_.end(), "cuda backend: freeing a block the arena did not hand out");
    const size_t size = it->second;
    allocations_.erase(it);
    annotations_->released(ptr);
    ++memory_epoch_;
    in_use_ -= size;
    const size_t offset = static_cast<size_t>(static_cast<char*>(ptr) - arena_);
    auto pos = free_.emplace(offset, size).first;
    const auto next = std::next(pos);
    if (next != free_.end() && pos->first + pos->second == next->first) {
      pos->second += next->second;
      free_.erase(next);
    }
    if (pos != free_.begin()) {
      const auto prev = std::prev(pos);
      if (prev->first + prev->second == pos->first) {
        prev->second += pos->second;
        free_.erase(pos);
      }
    }
  }

  // A scratch buffer of at least `bytes`, kept for later calls; a larger request replaces it.
  // Work still queued on the stream may use the old buffer: everything that uses the new one
  // is queued after it on the same stream.
  void* scratch(Slot slot, size_t bytes) {
    ScratchBuffer& b = scratch_[static_cast<size_t>(slot)];
    if (bytes > b.bytes || !b.ptr) {
      if (b.ptr) free_block(b.ptr);
      b = ScratchBuffer{};
      const size_t want = round_up(std::max<size_t>(bytes, 1), kArenaAlignment);
      b.ptr = allocate(want);
      b.bytes = want;
    }
    return b.ptr;
  }
  float* scratch_floats(Slot slot, size_t count) { return static_cast<float*>(scratch(slot, count * sizeof(float))); }

  void sync() { PTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // Never throws: used by the destructor and by a constructor that failed half way.
  void destroy() noexcept {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    cudnn_.reset();
    matmul_.reset();
    annotations_.reset();
    if (arena_) (void)cudaFree(arena_);
    arena_ = nullptr;
    if (stream_) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  struct ScratchBuffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  int device_ = 0;
  cudaDeviceProp prop_{};
  std::string versions_;
  size_t free_at_start_ = 0, total_bytes_ = 0;
  bool tf32_ = false;  // precision.tf32: FP32 GEMMs on TF32 tensor cores instead of full FP32
  cudaStream_t stream_ = nullptr;

  char* arena_ = nullptr;
  std::unique_ptr<ArenaAnnotations> annotations_;  // the arena's blocks, as compute-sanitizer sees them
  size_t arena_bytes_ = 0, in_use_ = 0, peak_ = 0;
  std::map<size_t, size_t> free_;                  // offset -> size of each free block, by address
  std::unordered_map<void*, size_t> allocations_;  // pointer -> size of each block handed out
  uint64_t memory_epoch_ = 0;                      // counts allocations and releases

  DeviceScalars* scalars_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  std::unique_ptr<CudnnAttention> cudnn_;  // made by choose_attention when the fused path is considered
  std::array<ScratchBuffer, kSlotCount> scratch_{};
  std::unordered_map<const void*, DeviceBuckets> buckets_;
};

}  // namespace

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
  return "CUDA runtime " + (have_runtime ? cuda_version(runtime) : std::string("?")) + ", driver " +
         (have_driver ? cuda_version(driver) : std::string("none")) + ", cuBLASLt " +
         library_version(cublasLtGetVersion(), 10000) + ", cuDNN " +
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
  return std::make_unique<CudaBackend>(device_index, arena_bytes, tf32);
}

}  // namespace ptrain

// The CUDA backend's class, shared by the files that implement it (private to
// src/backend/cuda; the rest of ptrain sees only make_cuda_backend in cuda_backend.h). One class
// because the ops share one stream, one arena and its scratch buffers; its members are defined
// by concern:
//   cuda_backend.cu      starting the device, the arena's blocks and scratch, identity
//   recording.cu         CUDA graphs (stream capture, replay)
//   transfers.cu         uploads and downloads, the token buckets through pinned staging
//   staged_operands.cu   operands of other dtypes converted for an op, outputs rounded back
//   ops_layers.cu        embedding, layernorm, GELU, add, classifier, AdamW
//   ops_matmul.cu        GEMMs through cuBLASLt, bias gradients, GELU epilogues
//   ops_attention.cu     the fallback attention chain and cuDNN's fused attention
//   ops_llama.cu         RMSNorm, RoPE, SwiGLU
//   ops_reductions.cu    sums and amax
//   fp8_casts.cu         the FP8 casts and their statistics
//   fp8_gemms.cu         native FP8 GEMMs of one linear layer
// with helpers of their own, in namespace ptrain as they know nothing of this class:
//   device_arena.h       the arena (one cudaMalloc, first-fit blocks)
//   pinned_staging.h     page-locked buffers for copies that do not wait
//   op_common.h          operand checks, dtype dispatch, rounding rules
//
// Why this shape:
//  - Mixed dtypes. The model hands the backend f32 FP8 buffers (dequantised values) next to bf16
//    activations, and FP32 weight gradients next to bf16 activations. Each op computes in one
//    storage type T; an operand of another dtype is converted into a staging buffer first, and
//    an output of another dtype is written to a staging buffer and converted back (Staged). The
//    one exception is an FP32 weight gradient: the backward kernels take its type G apart from T
//    and add into it as it is (op_common.h, gradient_dtype). The common case stages nothing.
//  - Rounding to Tensor::format. bf16 / f16 storage rounds once as the kernels write. A tensor
//    stored wider than its format (f32 storage of bf16 values, the CPU backend's emulation) is
//    rounded in place after the op, with the same NVIDIA conversions, so the bits are the CPU's.
//    The FP8 casts are the exception the interface defines: their output holds dequantised
//    values, never rounded to the FP8 grid.
//  - Determinism. Every reduction runs in an order fixed by the sizes alone (kernels/ explains
//    theirs; sum and sum_squares use reduce.cuh's fixed grid of double partial sums), so results
//    are bit-identical run to run.
//  - Memory. One arena reserved at construction (device_arena.h); scratch buffers are sized on
//    first use, grown when a larger call needs more, and kept.
// No file here defines a kernel: every one is in kernels/ and tested under the SIMT emulator.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/attention_heads.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_error.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/op_common.h"
#include "backend/cuda/pinned_staging.h"
#include "fp8.cuh"

namespace ptrain::cuda_impl {

// The device scalars the host reads back: FP8 cast telemetry, amax, the cast's scale, a sum.
struct DeviceScalars {
  kernels::Fp8Counts counts;
  float amax;
  float scale;
  double result;
};

Fp8CastStats to_stats(const DeviceScalars& d);

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
  kPartials,        // layernorm / RMSNorm / bias gradient partial sums
  kReduce,          // double partial sums of sum / sum_squares
  kFp8Codes,
  kFp8ScaleInv,
  kSlotCount
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
  CudaBackend(int device_index, size_t arena_bytes, bool tf32);
  ~CudaBackend() override { destroy(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // cuda_backend.cu
  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  std::string description() const override;
  std::vector<std::string> performance_warnings() const override;
  DType storage_for(Format format, DType compute) const override;
  MemoryUse memory_use() const override { return MemoryUse{arena_->capacity(), arena_->in_use(), arena_->peak()}; }
  void* stream() const override { return stream_; }
  void* allocate(size_t bytes) override;
  void release(void* ptr) override;

  // recording.cu
  std::string cannot_record() const override { return ""; }
  uint64_t memory_epoch() const override { return arena_->epoch(); }
  std::unique_ptr<RecordedWork> record(const std::function<void()>& body, std::string* why) override;

  // transfers.cu
  void zero(Tensor t) override;
  void upload(Tensor dst, const float* src) override;
  void download(float* dst, Tensor src) override;
  void upload_tokens(Tensor dst, const int32_t* src) override;
  void copy(Tensor dst, Tensor src) override;
  void download_doubles(double* dst, Tensor src) override;

  // ops_layers.cu
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override;
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override;
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) override;
  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                          Tensor mean, Tensor rstd) override;
  void gelu_forward(Tensor out, Tensor inp) override;
  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override;
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor param_copy) override;
  // The GPU ops do not count gradient values that rounding flushed to zero yet: those counters
  // are the CPU backend's only. This returns zeros (elements = 0: nothing was counted).
  GradNumerics take_grad_numerics() override { return GradNumerics{}; }

  // ops_matmul.cu
  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) override;
  void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) override;
  void bias_backward(Tensor dbias, Tensor dout) override;
  void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias) override;
  void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                            Tensor pre, Tensor dgelu) override;

  // ops_attention.cu
  void attention_forward(Tensor out, Tensor att, Tensor qkv, int n_head) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor att, int n_head) override;
  void attention_decode(Tensor out, Tensor qkv, int n_head) override;
  // ops_llama.cu
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) override;
  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) override;
  void qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor q_weight, Tensor k_weight, int n_head,
                       float eps) override;
  void qk_norm_backward(Tensor dinp, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor inp, Tensor q_weight,
                        Tensor k_weight, Tensor rstd, int n_head) override;
  void rope_forward(Tensor x, Tensor table, int heads) override;
  void rope_backward(Tensor dx, Tensor table, int heads) override;
  void swiglu_forward(Tensor out, Tensor gate_up) override;
  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) override;
  AttentionChoice choose_attention(AttentionRequest want, DType dtype, int64_t B, int64_t Tn, int n_head,
                                   int n_kv_head, int64_t head_size) override;

  // ops_reductions.cu
  double sum(Tensor t) override { return reduce("sum", t, false); }
  double sum_squares(Tensor t) override { return reduce("sum_squares", t, true); }
  void sum_into(Tensor out, Tensor t) override;
  float amax(Tensor t) override;

  // fp8_casts.cu
  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format format, float scale) override;
  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows, int block_cols) override;
  void fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int block_rows,
                        int block_cols) override;
  Fp8CastStats fp8_encode(Tensor out, Tensor part, Format format, const std::vector<float>& scales, int64_t first,
                          int64_t cols, int block_rows, int block_cols) override;

  // fp8_gemms.cu
  std::unique_ptr<Fp8Gemms> make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling,
                                           Format forward, Format backward, int input_slot,
                                           Fp8Gemms::WeightCodes weight_codes, std::string* why) override;

  // fp8_activation_store.cu
  std::unique_ptr<Fp8ActivationStore> make_fp8_activation_store(int layers, int64_t rows, int64_t cols,
                                                                Format format) override;

 private:
  class CudaFp8Gemms;
  class CudaFp8ActivationStore;

  // ---------------------------------------------------------------------- staged operands

  // Operands of an op in the dtype it computes in (see the file comment). Outputs are written
  // back, rounded to their formats, by finish(); an op that throws before finish() leaves its
  // outputs unspecified, as any failed op does.
  class Staged {
   public:
    explicit Staged(CudaBackend& backend) : be_(backend) {}
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;

    // A read-only operand as dtype `want`: itself, or a converted copy.
    Tensor in(const Tensor& t, DType want);
    // An output as dtype `want`: itself, or a buffer that finish() converts back. With
    // `accumulate` the op adds into it, so the buffer starts as a copy of the output.
    Tensor out(const Tensor& t, DType want, bool accumulate);
    void finish();

   private:
    struct Pending {
      Tensor dst, staged;
    };
    Tensor buffer(const Tensor& t, DType want);

    CudaBackend& be_;
    std::vector<Pending> pending_;
    int next_ = 0;
  };

  // The prologue of the ops that run one kernel template: body(staged, tag) stages its operands
  // through `staged` and launches the kernel for tag's element type, that of dtype `dt` (the one
  // the op computes in; a dtype that is none fails with the op's name before anything is
  // staged); the outputs it staged are then converted back, rounded to their formats.
  template <typename Body>
  void run_staged(const char* op, DType dt, Body&& body) {
    Staged st(*this);
    with_float_type(dt, op, [&](auto tag) { body(st, tag); });
    st.finish();
  }

  // dst = src converted to dst's dtype and rounded to `round` (Format::fp32: only the dtype's
  // own rounding). dst may be src itself (rounding in place).
  void convert(const Tensor& dst, const Tensor& src, Format round);

  // ---------------------------------------------------------------------- GEMMs (ops_matmul.cu)

  cublasComputeType_t compute_for(DType ab) const { return gemm_compute_type(cuda_type(ab), tf32_); }
  void gemm_into(Staged& st, GemmSpec spec, const void* a, const void* b, DType ab, const Tensor& out, bool accumulate,
                 const Tensor& bias);
  void batched_gemm(DType dt, int64_t batch, int64_t rows, int64_t cols, int64_t inner, bool x_transposed,
                    bool y_transposed, const void* x, int64_t stride_x, const void* y, int64_t stride_y, void* out,
                    int64_t stride_out);
  static bool gelu_epilogue_fits(std::initializer_list<const Tensor*> operands, const Tensor& bias);
  void bias_backward_into(Staged& st, const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC);

  // ---------------------------------------------------------------------- Llama ops (ops_llama.cu)

  void rope(const char* op, const Tensor& x, const Tensor& table, int heads, bool inverse);

  // ---------------------------------------------------------------------- attention (ops_attention.cu)

  // The fused path's saved tensor: (B,NH,T) FP32 log-sum-exps.
  static bool is_fused_saved(const Tensor& saved, int64_t B, int64_t NH, int64_t Tn) {
    return saved.ndim == 3 && saved.dtype == DType::f32 && saved.dim(0) == B && saved.dim(1) == NH &&
           saved.dim(2) == Tn;
  }
  SdpaShape sdpa_shape(const char* op, const Tensor& qkv, const Tensor& out, int64_t B, int64_t Tn,
                       const AttentionHeads& heads) const;
  void fused_attention_forward(const Tensor& out, const Tensor& stats, const Tensor& qkv, const SdpaShape& s);
  void fused_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& stats, const SdpaShape& s);
  void drop_attention_scratch();
  std::string check_fused_attention(const SdpaShape& s);

  // ------------------------------------------------------ reductions, FP8 statistics (ops_reductions.cu, fp8_casts.cu)

  double reduce(const char* op, const Tensor& t, bool squares);
  void queue_reduce(const char* op, const Tensor& t, bool squares, double* device_out);
  // fp8_casts.cu
  void reset_scalars(float scale);
  Fp8CastStats read_fp8_stats();
  char* scalar_field(size_t offset) const { return reinterpret_cast<char*>(scalars_) + offset; }
  float* amax_ptr() const { return reinterpret_cast<float*>(scalar_field(offsetof(DeviceScalars, amax))); }
  float* scale_ptr() const { return reinterpret_cast<float*>(scalar_field(offsetof(DeviceScalars, scale))); }
  double* result_ptr() const { return reinterpret_cast<double*>(scalar_field(offsetof(DeviceScalars, result))); }
  kernels::Fp8Counts* counts_ptr() const {
    return reinterpret_cast<kernels::Fp8Counts*>(scalar_field(offsetof(DeviceScalars, counts)));
  }

  // ---------------------------------------------------------------------- checks (ops_layers.cu, transfers.cu)

  void expect_stats(const char* op, const Tensor& mean, const Tensor& rstd) const;
  void check_token_range(const char* op, const Tensor& tokens, int64_t vocab) const;

  // ---------------------------------------------------------------------- token buckets (transfers.cu)

  const DeviceBuckets& build_buckets(const void* key, const int32_t* tokens, int64_t n, void* copy_tokens_to);
  const DeviceBuckets& buckets_for(const Tensor& tokens);
  void forget_buckets_within(const void* ptr, size_t bytes);

  // ---------------------------------------------------------------------- scratch (cuda_backend.cu)

  void* scratch(Slot slot, size_t bytes);
  float* scratch_floats(Slot slot, size_t count) { return static_cast<float*>(scratch(slot, count * sizeof(float))); }
  void sync() { PTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void destroy() noexcept;

  // ---------------------------------------------------------------------- recording (recording.cu)

  static bool refuses_capture(const CudaError& e);
  void end_failed_capture() noexcept;

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

  std::unique_ptr<DeviceArena> arena_;
  DeviceScalars* scalars_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  std::unique_ptr<CudnnAttention> cudnn_;  // made by choose_attention when the fused path is considered
  std::array<ScratchBuffer, kSlotCount> scratch_{};
  std::unordered_map<const void*, DeviceBuckets> buckets_;
  // FP8 operand blocks shared by layers (fp8_gemms.cu, CudaFp8Gemms::shared_parts): every
  // layer's output gradient, one set per shape (a layer casts it and runs its two backward GEMMs
  // on it at once); the inputs of the layers in one input slot (cast again right before their
  // backward pass: fp8_input_slot); the other inputs' codes, which only the forward GEMM reads,
  // one per shape; and the weight's transpose, one per shape (made from the layer's codes for
  // its dgrad GEMM). The fields a set does not share are null.
  struct SharedFp8Operand {
    void* codes = nullptr;
    void* transposed = nullptr;
    void* factors = nullptr;
    void* factors_t = nullptr;
    int users = 0;
  };
  std::map<std::array<int64_t, 5>, SharedFp8Operand> shared_fp8_operands_;  // by operand, slot, rows, cols, scaling
};

}  // namespace ptrain::cuda_impl

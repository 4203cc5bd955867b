// cuBLASLt GEMMs for the CUDA backend: every matmul of the model (FP32/TF32, BF16, FP16, FP8
// with per-tensor scale pointers or Hopper block scaling) and attention's batched GEMMs.
//
// A GEMM is described by a GemmSpec, in cuBLASLt's column-major terms:
//
//     D(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C(m,n)     [then the epilogue]
//
// Matmul keeps, per GemmSpec (and pointer-alignment class), a plan: the matmul descriptor, the
// four matrix layouts and the algorithm cublasLtMatmulAlgoGetHeuristic chose, so descriptors and
// heuristics are built once per shape. run() only sets the per-call pointers (bias, aux, scale
// factors, amax) on the cached descriptor and calls cublasLtMatmul.
//
// ptrain's row-major convention and its column-major mapping
// -----------------------------------------------------------
// ptrain stores every matrix row-major; a row-major (R, C) matrix is, byte for byte, a
// column-major (C, R) matrix with leading dimension C (its row stride). So a row-major product
//
//     out(rows, cols) = X(rows, inner) * Y(inner, cols)
//
// is the column-major product out^T(cols, rows) = Y^T(cols, inner) * X^T(inner, rows): cuBLASLt's
// A is Y, its B is X, and m = cols, n = rows, k = inner, ldd = cols. An operand that ptrain
// stores the other way round (X as (inner, rows), Y as (cols, inner)) gets op = T instead.
// row_major_gemm() implements this; for a linear layer with weight W(OC, C), N = B*T tokens:
//
//   forward  out(N,OC)  = inp(N,C) W(OC,C)^T
//            A = W   (col-major (C,OC), ld C),   op T       m = OC, n = N, k = C    TN
//            B = inp (col-major (C,N),  ld C),   op N       D = out, ld OC
//            BIAS / GELU_AUX_BIAS: bias(OC) has D's m rows; aux (pre-GELU) (N,OC), ld OC.
//   dgrad    dinp(N,C)  = dout(N,OC) W(OC,C)
//            A = W   (col-major (C,OC), ld C),   op N       m = C, n = N, k = OC    NN
//            B = dout(col-major (OC,N), ld OC),  op N       D = dinp, ld C
//            FP8 (TN only): A = W^T stored row-major (C,OC) (the cast-transposed weight),
//            col-major (OC,C), ld OC, op T.
//            DGELU(_BGRAD): aux = the pre-GELU input (N,C), ld C; bias gradient has C entries.
//   wgrad    dW(OC,C)  += dout(N,OC)^T inp(N,C)
//            A = inp (col-major (C,N),  ld C),   op N       m = C, n = OC, k = N    NT
//            B = dout(col-major (OC,N), ld OC),  op T       D = C = dW, ld C, beta = 1
//            FP8 (TN only): A = inp^T stored row-major (C,N), ld N, op T; B = dout^T stored
//            row-major (OC,N), ld N, op N (both from cast-transpose kernels).
//            BGRADB: dbias(OC) = column sums of dout, reduced over k = N (written, not added).
//   attention: preatt(T,T) = q(T,hs) k(T,hs)^T per (batch, head) is the forward form with
//            N = T, C = hs, OC = T, batch = B*NH and strides T*hs (q, k) and T*T (preatt).
//
// FP8 on Hopper (the cuBLAS documentation, cublasLtMatmul(), "FP8"): TN only; leading dimensions and batch strides multiples of 16
// bytes; pointers 16-byte aligned; E4M3 x E4M3 and E4M3 x E5M2 (either order), never
// E5M2 x E5M2; compute CUBLAS_COMPUTE_32F with scale type CUDA_R_32F; the scale pointers hold
// the DEQUANTISATION factors (scale_inv) in device memory. Block scaling (cuBLASLt >= 12.9):
// 1x128 tiles (VEC128_32F) or 128x128 blocks (BLK128x128_32F) per operand along K, not both
// operands 128x128; ptrain requires m, n, k multiples of 128, a non-FP8 output, no fast
// accumulation and the epilogues DEFAULT, BIAS or DGELU (what TransformerEngine uses).
//
// Not thread-safe: a Matmul (its cached descriptors) belongs to one host thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_error.h"
#include "precision/formats.h"

namespace ptrain {

// ptrain's formats as CUDA data types: fp32 -> CUDA_R_32F, bf16 -> CUDA_R_16BF, fp16 ->
// CUDA_R_16F, e4m3 -> CUDA_R_8F_E4M3, e5m2 -> CUDA_R_8F_E5M2.
cudaDataType_t cuda_data_type(Format f);
// "fp32", "bf16", "fp16", "e4m3", "e5m2", or "cudaDataType N".
std::string cuda_data_type_name(cudaDataType_t t);
bool is_fp8_type(cudaDataType_t t);
size_t cuda_data_type_size(cudaDataType_t t);  // bytes per element; 0 if not one of the five
// CUBLAS_COMPUTE_32F_FAST_TF32 for fp32 operands when tf32 is on, else CUBLAS_COMPUTE_32F.
cublasComputeType_t gemm_compute_type(cudaDataType_t operand_type, bool tf32);

// How an FP8 operand's scale factors are given (non-FP8 operands: none).
enum class GemmScale {
  none,           // no scale pointer: factor 1
  tensor,         // one float scale_inv for the whole tensor (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
  block_1x128,    // one float per 128 elements along K (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
  block_128x128,  // one float per 128x128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
};
const char* gemm_scale_name(GemmScale s);
// The CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE value for s (SCALAR_32F for none and tensor).
int32_t cublaslt_scale_mode(GemmScale s);
// Floats in the scale tensor of an operand with contraction length k and outer length `outer`
// (m for A, n for B), in cuBLASLt's layouts (cuBLAS documentation, "1D and 128x128 2D block
// scaling for FP8"; TransformerEngine's GEMM-ready block quantisers write the same): tensor 1;
// 1x128 (VEC128): outer-major, the factor of element (o, kk) at o + (kk / 128) * outer, outer a
// multiple of 4 (there is no leading-dimension attribute), ceil(k/128) * outer floats; 128x128
// (BLK128x128): K-major, the factor of block (o / 128, kk / 128) at kk / 128 + (o / 128) * L
// with L = ceil(k/128) rounded up to a multiple of 4. Scale pointers 16-byte aligned.
int64_t gemm_scale_floats(GemmScale s, int64_t k, int64_t outer);

bool epilogue_uses_bias(cublasLtEpilogue_t e);  // BIAS, GELU_BIAS, GELU_AUX_BIAS, DGELU_BGRAD, BGRADA, BGRADB
bool epilogue_uses_aux(cublasLtEpilogue_t e);   // GELU_AUX, GELU_AUX_BIAS, DGELU, DGELU_BGRAD
std::string epilogue_name(cublasLtEpilogue_t e);

// One GEMM shape and configuration: the key of Matmul's plan cache.
struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;  // elements; 0 = packed (the layout's row count)
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F;
  cudaDataType_t c_type = CUDA_R_32F;  // == d_type, except BF16/FP16 when D is FP8
  cudaDataType_t d_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // or CUBLAS_COMPUTE_32F_FAST_TF32 (fp32 only)
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t bias_type = -1;  // cudaDataType_t of the bias (gradient); -1: cuBLASLt's default
  int32_t aux_type = -1;   // cudaDataType_t of the GELU aux matrix; -1: cuBLASLt's default (D's)
  int64_t aux_ld = 0;      // GELU aux leading dimension; 0 = m
  GemmScale a_scale = GemmScale::none, b_scale = GemmScale::none;
  bool fast_accum = false;  // FP8, per-tensor scaling, forward GEMMs only (CUBLASLT_MATMUL_DESC_FAST_ACCUM)
  bool amax_d = false;      // run() receives a device float that gets max|D| (FP8 inputs only)
  int32_t batch = 1;        // strided batch: batch GEMMs, matrix i at base + i * stride (elements)
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;

  int64_t a_rows() const { return trans_a ? k : m; }
  int64_t a_cols() const { return trans_a ? m : k; }
  int64_t b_rows() const { return trans_b ? n : k; }
  int64_t b_cols() const { return trans_b ? k : n; }
  int64_t ld_a() const { return lda ? lda : a_rows(); }
  int64_t ld_b() const { return ldb ? ldb : b_rows(); }
  int64_t ld_c() const { return ldc ? ldc : m; }
  int64_t ld_d() const { return ldd ? ldd : m; }
  int64_t ld_aux() const { return aux_ld ? aux_ld : m; }
  bool fp8() const { return is_fp8_type(a_type) || is_fp8_type(b_type); }

  bool operator==(const GemmSpec& o) const;
  bool operator!=(const GemmSpec& o) const { return !(*this == o); }
};

struct GemmSpecHash {
  size_t operator()(const GemmSpec& s) const;
};

// e.g. "TN m=768 n=4096 k=3072, A e4m3 (tensor) x B e4m3 (tensor) -> D bf16, compute 32F, epilogue BIAS"
std::string describe_gemm(const GemmSpec& spec);

// The first problem cuBLASLt would have with the spec as ptrain knows its rules (FP8 layout,
// alignment of leading dimensions, unsupported type pairs, block-scaling shape, epilogue
// restrictions, ...), as "GEMM <spec>: <problem>"; "" if none. A question, not a check: FP8
// layers ask it to decide whether to run natively.
std::string gemm_spec_problem(const GemmSpec& spec);

// out(rows, cols) = op(X)(rows, inner) * op(Y)(inner, cols), every matrix row-major; see the
// mapping above. A = Y, B = X.
struct RowMajorGemm {
  int64_t rows = 0, cols = 0, inner = 0;
  bool x_transposed = false;  // X stored as (inner, rows) instead of (rows, inner)
  bool y_transposed = false;  // Y stored as (cols, inner) instead of (inner, cols)
  cudaDataType_t x_type = CUDA_R_32F, y_type = CUDA_R_32F, out_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  int32_t batch = 1;
  int64_t stride_x = 0, stride_y = 0, stride_out = 0;  // elements between batch entries
};
GemmSpec row_major_gemm(const RowMajorGemm& g);

// The three GEMMs of a linear layer (weight W(OC, C), N tokens); set epilogue, scaling and
// fast_accum on the result as needed.
//   forward: A = W (OC,C), B = inp (N,C), D = out (N,OC). TN.
GemmSpec linear_forward_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t input_type,
                             cudaDataType_t weight_type, cudaDataType_t out_type,
                             cublasComputeType_t compute = CUBLAS_COMPUTE_32F);
//   dgrad: B = dout (N,OC), D = dinp (N,C); A = W (OC,C) (NN) or, with weight_transposed, the
//   stored transpose W^T (C,OC) (TN, what FP8 needs).
GemmSpec linear_dgrad_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t grad_type,
                           cudaDataType_t weight_type, cudaDataType_t out_type, bool weight_transposed,
                           cublasComputeType_t compute = CUBLAS_COMPUTE_32F);
//   wgrad: D = dW (OC,C); A = inp (N,C) and B = dout (N,OC) (NT) or, with operands_transposed,
//   the stored transposes inp^T (C,N) and dout^T (OC,N) (TN, what FP8 needs).
GemmSpec linear_wgrad_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t grad_type,
                           cudaDataType_t input_type, cudaDataType_t out_type, bool operands_transposed,
                           cublasComputeType_t compute = CUBLAS_COMPUTE_32F);

// RAII owners of cuBLASLt descriptors.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const noexcept;
};
struct MatrixLayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const noexcept;
};
using MatmulDescHandle = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using MatrixLayoutHandle = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, MatrixLayoutDeleter>;

struct GemmDescriptors {
  MatmulDescHandle matmul;
  MatrixLayoutHandle a, b, c, d;
};

// Builds the matmul descriptor of a valid spec (compute and scale type, transposes,
// epilogue, aux leading dimension and types, FP8 scale modes and fast accumulation) and its
// four layouts (type, rows, cols, ld, batch count and stride). Needs no handle and no GPU.
// Pointer attributes (bias, aux, scales, amax) are left unset. A spec gemm_spec_problem refuses
// is a bug here (std::logic_error).
GemmDescriptors make_gemm_descriptors(const GemmSpec& spec);

// The per-call operands of a GEMM. All pointers are device pointers.
struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // nullptr: C = D (in place; beta != 0 accumulates into D)
  void* d = nullptr;
  float alpha = 1;
  float beta = 0;
  void* bias = nullptr;               // bias (read) or bias gradient (written), per the epilogue
  void* aux = nullptr;                // GELU aux: pre-GELU output (GELU_AUX*) or input (DGELU*)
  const float* a_scale_inv = nullptr;  // dequantisation factors of A (FP8 with a_scale != none)
  const float* b_scale_inv = nullptr;
  const float* d_scale = nullptr;     // quantisation scale of an FP8 D (nullptr: 1)
  float* amax_d = nullptr;            // receives max|D| (spec.amax_d)
};

// The first way the arguments do not fit the spec (a missing or unexpected pointer, an FP8 operand
// not 16-byte aligned, accumulation into an FP8 output, ...), as "GEMM <spec>: <problem>"; "" if none.
std::string gemm_args_problem(const GemmSpec& spec, const GemmArgs& args);
// The largest power of two, at most 16, dividing every pointer the GEMM reads or writes as a
// matrix (A, B, C, D, bias, aux): the alignment class a plan's heuristic was chosen for.
int gemm_pointer_alignment(const GemmArgs& args);

class Matmul {
 public:
  // cuBLAS recommends 32 MiB of workspace on Hopper.
  static constexpr size_t kRecommendedWorkspaceBytes = size_t(32) << 20;

  // Creates the cuBLASLt handle (a CudaError without a GPU). The workspace (device memory,
  // 256-byte aligned, e.g. from the run's arena) stays the caller's and must outlive this.
  Matmul(void* workspace, size_t workspace_bytes);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // D = alpha op(A) op(B) + beta C (+ epilogue) on `stream`. The first call for a spec (and
  // pointer alignment class) builds and caches its plan.
  void run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);

  // For optional paths (epilogues, block scaling) that have a fallback: whether the GEMM can run
  // (a spec ptrain's rules or cuBLASLt refuse, or no algorithm, is a refusal), asked once per
  // spec and alignment class; a plan found is kept, a refusal remembered. try_run() runs it if
  // it can, in the same lookup.
  bool can_run(const GemmSpec& spec, const GemmArgs& args);
  bool try_run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);
  // Whether the GEMM runs here, asked of the heuristic and then by one launch on `stream` (a
  // launch can be refused after the heuristic offered the algorithm): "" if it ran, else why not.
  std::string probe(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);

  size_t cached_plans() const { return plans_.size(); }
  cublasLtHandle_t handle() const { return handle_; }

 private:
  struct PlanKey {
    GemmSpec spec;
    int alignment = 16;
    bool operator==(const PlanKey& o) const { return alignment == o.alignment && spec == o.spec; }
  };
  struct PlanKeyHash {
    size_t operator()(const PlanKey& k) const { return GemmSpecHash()(k.spec) * 31 + size_t(k.alignment); }
  };
  struct Plan {
    GemmDescriptors desc;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;
  };

  // The plan for a valid spec: null (and *why, and the heuristic's *status) when cuBLASLt has none.
  Plan* find_plan(const GemmSpec& spec, int alignment, std::string* why, cublasStatus_t* status);
  Plan& plan_for(const GemmSpec& spec, int alignment);  // EnvironmentError when there is none
  Plan* plan_or_refusal(const GemmSpec& spec, const GemmArgs& args, std::string* why);  // null: refused, why
  cublasStatus_t launch_status(Plan& plan, const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);
  void launch(Plan& plan, const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream);
  // PTRAIN_LIBRARY_LOG records (backend/cuda/library_log.h).
  static void log_heuristic(const GemmSpec& spec, int alignment, size_t max_workspace, cublasStatus_t status,
                            int returned, const cublasLtMatmulHeuristicResult_t& result);
  static void log_refusal(const GemmSpec& spec, int alignment, const std::string& why);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
  std::unordered_map<PlanKey, std::string, PlanKeyHash> refused_;  // and why
};

}  // namespace ptrain

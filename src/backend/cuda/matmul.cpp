// Compiled only into CUDA builds (PTRAIN_HAVE_CUDA): links cudart and cublasLt.
#ifdef PTRAIN_HAVE_CUDA

#include "backend/cuda/matmul.h"

#include "backend/cuda/library_log.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <tuple>
#include <utility>

namespace ptrain {

// ---------------------------------------------------------------------------------------------
// Types, scale modes, epilogues
// ---------------------------------------------------------------------------------------------

cudaDataType_t cuda_data_type(Format f) {
  switch (f) {
    case Format::fp32: return CUDA_R_32F;
    case Format::bf16: return CUDA_R_16BF;
    case Format::fp16: return CUDA_R_16F;
    case Format::e4m3: return CUDA_R_8F_E4M3;
    case Format::e5m2: return CUDA_R_8F_E5M2;
  }
  PTRAIN_CHECK(false, "unknown Format");
  return CUDA_R_32F;
}

std::string cuda_data_type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "fp32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "fp16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "cudaDataType " + std::to_string(static_cast<int>(t));
  }
}

bool is_fp8_type(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

size_t cuda_data_type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: return 0;
  }
}

cublasComputeType_t gemm_compute_type(cudaDataType_t operand_type, bool tf32) {
  return operand_type == CUDA_R_32F && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

const char* gemm_scale_name(GemmScale s) {
  switch (s) {
    case GemmScale::none: return "unscaled";
    case GemmScale::tensor: return "tensor";
    case GemmScale::block_1x128: return "1x128 blocks";
    case GemmScale::block_128x128: return "128x128 blocks";
  }
  return "?";
}

int32_t cublaslt_scale_mode(GemmScale s) {
  switch (s) {
    case GemmScale::block_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case GemmScale::block_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case GemmScale::none:
    case GemmScale::tensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int64_t gemm_scale_floats(GemmScale s, int64_t k, int64_t outer) {
  switch (s) {
    case GemmScale::none: return 0;
    case GemmScale::tensor: return 1;
    case GemmScale::block_1x128: return ceil_div(k, 128) * round_up(outer, 4);
    case GemmScale::block_128x128: return ceil_div(outer, 128) * round_up(ceil_div(k, 128), 4);
  }
  return 0;
}

bool epilogue_uses_bias(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: return true;
    default: return false;
  }
}

bool epilogue_uses_aux(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return true;
    default: return false;
  }
}

// The epilogues ptrain uses; the others (ReLU, ...) are rejected by validation.
static bool epilogue_supported(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU:
    case CUBLASLT_EPILOGUE_GELU_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB: return true;
    default: return false;
  }
}

std::string epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "cublasLtEpilogue_t " + std::to_string(static_cast<int>(e));
  }
}

static std::string compute_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_32F: return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
    default: return "compute type " + std::to_string(static_cast<int>(c));
  }
}

// ---------------------------------------------------------------------------------------------
// GemmSpec
// ---------------------------------------------------------------------------------------------

static auto spec_tie(const GemmSpec& s) {
  return std::tie(s.m, s.n, s.k, s.trans_a, s.trans_b, s.lda, s.ldb, s.ldc, s.ldd, s.a_type, s.b_type, s.c_type,
                  s.d_type, s.compute, s.epilogue, s.bias_type, s.aux_type, s.aux_ld, s.a_scale, s.b_scale,
                  s.fast_accum, s.amax_d, s.batch, s.stride_a, s.stride_b, s.stride_c, s.stride_d);
}

bool GemmSpec::operator==(const GemmSpec& o) const { return spec_tie(*this) == spec_tie(o); }

size_t GemmSpecHash::operator()(const GemmSpec& s) const {
  const long long fields[] = {s.m,
                              s.n,
                              s.k,
                              s.trans_a,
                              s.trans_b,
                              s.lda,
                              s.ldb,
                              s.ldc,
                              s.ldd,
                              static_cast<long long>(s.a_type),
                              static_cast<long long>(s.b_type),
                              static_cast<long long>(s.c_type),
                              static_cast<long long>(s.d_type),
                              static_cast<long long>(s.compute),
                              static_cast<long long>(s.epilogue),
                              s.bias_type,
                              s.aux_type,
                              s.aux_ld,
                              static_cast<long long>(s.a_scale),
                              static_cast<long long>(s.b_scale),
                              s.fast_accum,
                              s.amax_d,
                              s.batch,
                              s.stride_a,
                              s.stride_b,
                              s.stride_c,
                              s.stride_d};
  size_t h = 1469598103934665603ull;
  for (long long f : fields) h = (h ^ std::hash<long long>()(f)) * 1099511628211ull;
  return h;
}

std::string describe_gemm(const GemmSpec& s) {
  std::string text = std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N");
  text += " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
  text += ", A " + cuda_data_type_name(s.a_type);
  if (s.a_scale != GemmScale::none) text += std::string(" (") + gemm_scale_name(s.a_scale) + ")";
  text += " x B " + cuda_data_type_name(s.b_type);
  if (s.b_scale != GemmScale::none) text += std::string(" (") + gemm_scale_name(s.b_scale) + ")";
  text += " -> D " + cuda_data_type_name(s.d_type);
  if (s.c_type != s.d_type) text += " (C " + cuda_data_type_name(s.c_type) + ")";
  text += ", compute " + compute_name(s.compute);
  if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT) text += ", epilogue " + epilogue_name(s.epilogue);
  if (s.fast_accum) text += ", fast accumulation";
  if (s.batch != 1) text += ", batch " + std::to_string(s.batch);
  return text;
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

namespace {

bool is_block(GemmScale s) { return s == GemmScale::block_1x128 || s == GemmScale::block_128x128; }

bool supported_operand(cudaDataType_t t) { return cuda_data_type_size(t) != 0; }

// A leading dimension or batch stride of an FP8 GEMM must be a multiple of 16 bytes; "" if it is.
std::string fp8_multiple_problem(const char* what, const char* matrix, int64_t elements, cudaDataType_t type) {
  const int64_t bytes = elements * static_cast<int64_t>(cuda_data_type_size(type));
  if (bytes % 16 == 0) return "";
  std::string text = std::string("FP8 GEMMs on Hopper need every leading dimension and batch stride to be a "
                                 "multiple of 16 bytes, but the ") +
                     what + " of " + matrix + " is " + std::to_string(elements) + " elements of " +
                     cuda_data_type_name(type);
  if (cuda_data_type_size(type) == 1)
    text += " (not a multiple of 16)";
  else
    text += " (" + std::to_string(bytes) + " bytes)";
  text += "; in ptrain's terms the contraction and output widths of an FP8 layer (n_embd, 4*n_embd, the "
          "tokens per micro-batch) must be multiples of 16";
  return text;
}

// The first problem of the spec, without the "GEMM ..." prefix; "" if none.
std::string spec_problem(const GemmSpec& s) {
  // Shape.
  if (s.m <= 0 || s.n <= 0 || s.k <= 0) return "m, n and k must be positive";
  if (s.m > INT32_MAX || s.n > INT32_MAX || s.k > INT32_MAX) return "m, n and k must fit in 32 bits";
  if (s.batch < 1) return "batch must be at least 1, got " + std::to_string(s.batch);
  if (s.stride_a < 0 || s.stride_b < 0 || s.stride_c < 0 || s.stride_d < 0)
    return "batch strides must not be negative";
  if (s.ld_a() < s.a_rows())
    return "lda = " + std::to_string(s.ld_a()) + " is smaller than A's " + std::to_string(s.a_rows()) + " rows";
  if (s.ld_b() < s.b_rows())
    return "ldb = " + std::to_string(s.ld_b()) + " is smaller than B's " + std::to_string(s.b_rows()) + " rows";
  if (s.ld_c() < s.m)
    return "ldc = " + std::to_string(s.ld_c()) + " is smaller than C's " + std::to_string(s.m) + " rows";
  if (s.ld_d() < s.m)
    return "ldd = " + std::to_string(s.ld_d()) + " is smaller than D's " + std::to_string(s.m) + " rows";

  // Types.
  const std::pair<cudaDataType_t, const char*> operands[] = {
      {s.a_type, "A"}, {s.b_type, "B"}, {s.c_type, "C"}, {s.d_type, "D"}};
  for (const auto& [t, name] : operands)
    if (!supported_operand(t))
      return std::string("the type of ") + name + " (" + cuda_data_type_name(t) +
                    ") is not one of fp32, bf16, fp16, e4m3, e5m2";
  const bool fp8 = s.fp8();
  if (fp8) {
    if (!is_fp8_type(s.a_type) || !is_fp8_type(s.b_type))
      return "an FP8 GEMM needs both A and B in FP8, got A " + cuda_data_type_name(s.a_type) + " and B " +
                    cuda_data_type_name(s.b_type);
    if (s.a_type == CUDA_R_8F_E5M2 && s.b_type == CUDA_R_8F_E5M2)
      return "E5M2 x E5M2 is not supported by cuBLASLt (A and B are both e5m2); one operand must be E4M3 "
             "(the hybrid recipe keeps activations and weights in E4M3 and only gradients in E5M2)";
    if (is_fp8_type(s.d_type)) {
      if (s.c_type != CUDA_R_16BF && s.c_type != CUDA_R_16F)
        return "with an FP8 output D, C must be bf16 or fp16, got " + cuda_data_type_name(s.c_type);
    } else if (s.c_type != s.d_type) {
      return "C and D must have the same type, got C " + cuda_data_type_name(s.c_type) + " and D " +
                    cuda_data_type_name(s.d_type);
    }
  } else {
    if (s.a_type != s.b_type)
      return "A and B must have the same type, got A " + cuda_data_type_name(s.a_type) + " and B " +
                    cuda_data_type_name(s.b_type);
    if (is_fp8_type(s.c_type) || is_fp8_type(s.d_type)) return "an FP8 output needs FP8 inputs";
    if (s.a_type == CUDA_R_32F && s.d_type != CUDA_R_32F)
      return "fp32 inputs need an fp32 output, got D " + cuda_data_type_name(s.d_type);
    if (s.d_type != s.a_type && s.d_type != CUDA_R_32F)
      return cuda_data_type_name(s.a_type) + " inputs need a " + cuda_data_type_name(s.a_type) +
                    " or fp32 output, got D " + cuda_data_type_name(s.d_type);
    if (s.c_type != s.d_type)
      return "C and D must have the same type, got C " + cuda_data_type_name(s.c_type) + " and D " +
                    cuda_data_type_name(s.d_type);
  }

  // Compute type.
  if (s.compute != CUBLAS_COMPUTE_32F && s.compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return "the compute type must be CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32";
  if (s.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && s.a_type != CUDA_R_32F)
    return "TF32 compute applies to fp32 operands only; " + cuda_data_type_name(s.a_type) +
                  " GEMMs use CUBLAS_COMPUTE_32F";

  // Scaling, fast accumulation, amax.
  if (!is_fp8_type(s.a_type) && s.a_scale != GemmScale::none)
    return "scale factors apply to FP8 operands only, but A is " + cuda_data_type_name(s.a_type);
  if (!is_fp8_type(s.b_type) && s.b_scale != GemmScale::none)
    return "scale factors apply to FP8 operands only, but B is " + cuda_data_type_name(s.b_type);
  if (s.fast_accum && !fp8) return "fast accumulation applies to FP8 GEMMs only";
  if (s.amax_d && !fp8) return "the amax of D is computed by FP8 GEMMs only";

  // Epilogue.
  if (!epilogue_supported(s.epilogue)) return "epilogue " + epilogue_name(s.epilogue) + " is not used by ptrain";
  if (s.batch > 1 && s.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    return "epilogues are not supported on batched GEMMs";
  if (epilogue_uses_aux(s.epilogue)) {
    if (s.ld_aux() < s.m)
      return "the GELU aux leading dimension " + std::to_string(s.ld_aux()) + " is smaller than D's " +
                    std::to_string(s.m) + " rows";
    if (s.ld_aux() % 8 != 0)
      return "the GELU aux leading dimension " + std::to_string(s.ld_aux()) +
             " must be a multiple of 8 (cuBLASLt); the layer's output width must be a multiple of 8";
    if (s.aux_type != -1 && is_fp8_type(static_cast<cudaDataType_t>(s.aux_type)))
      return "an FP8 GELU aux matrix is not supported";
  }

  if (!fp8) return "";

  // FP8 on Hopper.
  if (!(s.trans_a && !s.trans_b))
    return std::string("FP8 GEMMs on Hopper need the TN layout (A transposed, B not, in cuBLASLt's "
                          "column-major terms: both operands stored with the contraction dimension "
                          "contiguous), got ") +
                  (s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N") +
                  "; pass the cast-transposed copy of the operand instead";
  const std::string multiples[] = {
      fp8_multiple_problem("leading dimension", "A (lda)", s.ld_a(), s.a_type),
      fp8_multiple_problem("leading dimension", "B (ldb)", s.ld_b(), s.b_type),
      fp8_multiple_problem("leading dimension", "C (ldc)", s.ld_c(), s.c_type),
      fp8_multiple_problem("leading dimension", "D (ldd)", s.ld_d(), s.d_type),
      s.batch > 1 ? fp8_multiple_problem("batch stride", "A", s.stride_a, s.a_type) : "",
      s.batch > 1 ? fp8_multiple_problem("batch stride", "B", s.stride_b, s.b_type) : "",
      s.batch > 1 ? fp8_multiple_problem("batch stride", "C", s.stride_c, s.c_type) : "",
      s.batch > 1 ? fp8_multiple_problem("batch stride", "D", s.stride_d, s.d_type) : ""};
  for (const std::string& problem : multiples)
    if (!problem.empty()) return problem;

  if (is_block(s.a_scale) || is_block(s.b_scale)) {
    if (!is_block(s.a_scale) || !is_block(s.b_scale))
      return "block scaling must be used on both operands (1x128 or 128x128 each), got A " +
                    std::string(gemm_scale_name(s.a_scale)) + " and B " + gemm_scale_name(s.b_scale);
    if (s.a_scale == GemmScale::block_128x128 && s.b_scale == GemmScale::block_128x128)
      return "128x128 block scaling on both A and B is not supported by cuBLASLt; one operand (the "
                "activation or gradient) must use 1x128 tiles";
    if (s.m % 128 != 0 || s.n % 128 != 0 || s.k % 128 != 0)
      return "block-scaled FP8 GEMMs need m, n and k to be multiples of 128, got m=" + std::to_string(s.m) +
                    " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                    " (n_embd, 4*n_embd and the tokens per micro-batch must be multiples of 128)";
    if (is_fp8_type(s.d_type)) return "block-scaled FP8 GEMMs must write a bf16, fp16 or fp32 output";
    if (s.fast_accum) return "fast accumulation is not supported with block scaling";
    if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT && s.epilogue != CUBLASLT_EPILOGUE_BIAS &&
        s.epilogue != CUBLASLT_EPILOGUE_DGELU)
      return "block-scaled FP8 GEMMs support the epilogues DEFAULT, BIAS and DGELU only, got " +
                    epilogue_name(s.epilogue);
  }
  return "";
}

}  // namespace

std::string gemm_spec_problem(const GemmSpec& spec) {
  const std::string problem = spec_problem(spec);
  return problem.empty() ? problem : "GEMM " + describe_gemm(spec) + ": " + problem;
}

// ---------------------------------------------------------------------------------------------
// Row-major helpers
// ---------------------------------------------------------------------------------------------

GemmSpec row_major_gemm(const RowMajorGemm& g) {
  GemmSpec s;
  s.m = g.cols;
  s.n = g.rows;
  s.k = g.inner;
  s.trans_a = g.y_transposed;  // A = Y: (inner, cols) row-major is (cols, inner) column-major
  s.trans_b = g.x_transposed;  // B = X: (rows, inner) row-major is (inner, rows) column-major
  s.lda = g.y_transposed ? g.inner : g.cols;
  s.ldb = g.x_transposed ? g.rows : g.inner;
  s.ldd = g.cols;
  s.ldc = s.ldd;
  s.a_type = g.y_type;
  s.b_type = g.x_type;
  s.d_type = g.out_type;
  s.c_type = is_fp8_type(g.out_type) ? CUDA_R_16BF : g.out_type;
  s.compute = g.compute;
  s.batch = g.batch;
  s.stride_a = g.stride_y;
  s.stride_b = g.stride_x;
  s.stride_c = g.stride_out;
  s.stride_d = g.stride_out;
  return s;
}

GemmSpec linear_forward_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t input_type,
                             cudaDataType_t weight_type, cudaDataType_t out_type, cublasComputeType_t compute) {
  RowMajorGemm g;
  g.rows = N;
  g.cols = OC;
  g.inner = C;
  g.x_transposed = false;  // inp (N, C)
  g.y_transposed = true;   // W (OC, C) = (cols, inner)
  g.x_type = input_type;
  g.y_type = weight_type;
  g.out_type = out_type;
  g.compute = compute;
  return row_major_gemm(g);
}

GemmSpec linear_dgrad_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t grad_type, cudaDataType_t weight_type,
                           cudaDataType_t out_type, bool weight_transposed, cublasComputeType_t compute) {
  RowMajorGemm g;
  g.rows = N;
  g.cols = C;
  g.inner = OC;
  g.x_transposed = false;               // dout (N, OC)
  g.y_transposed = weight_transposed;   // W (OC, C) = (inner, cols), or W^T (C, OC) = (cols, inner)
  g.x_type = grad_type;
  g.y_type = weight_type;
  g.out_type = out_type;
  g.compute = compute;
  return row_major_gemm(g);
}

GemmSpec linear_wgrad_gemm(int64_t N, int64_t C, int64_t OC, cudaDataType_t grad_type, cudaDataType_t input_type,
                           cudaDataType_t out_type, bool operands_transposed, cublasComputeType_t compute) {
  RowMajorGemm g;
  g.rows = OC;
  g.cols = C;
  g.inner = N;
  g.x_transposed = !operands_transposed;  // dout (N, OC) = (inner, rows), or dout^T (OC, N) = (rows, inner)
  g.y_transposed = operands_transposed;   // inp (N, C) = (inner, cols), or inp^T (C, N) = (cols, inner)
  g.x_type = grad_type;
  g.y_type = input_type;
  g.out_type = out_type;
  g.compute = compute;
  return row_major_gemm(g);
}

// ---------------------------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------------------------

void MatmulDescDeleter::operator()(cublasLtMatmulDescOpaque_t* p) const noexcept {
  if (p) (void)cublasLtMatmulDescDestroy(p);
}

void MatrixLayoutDeleter::operator()(cublasLtMatrixLayoutOpaque_t* p) const noexcept {
  if (p) (void)cublasLtMatrixLayoutDestroy(p);
}

namespace {

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value, const char* name,
              int line) {
  const cublasStatus_t status = cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cublas_error(status, (std::string("cublasLtMatmulDescSetAttribute(") + name + ")").c_str(), __FILE__,
                       line);
}

template <typename T>
void set_layout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const T& value,
                const char* name, int line) {
  const cublasStatus_t status = cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof(value));
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cublas_error(status, (std::string("cublasLtMatrixLayoutSetAttribute(") + name + ")").c_str(), __FILE__,
                       line);
}

#define PTRAIN_SET_DESC(desc, attr, value) set_desc(desc, attr, value, #attr, __LINE__)
#define PTRAIN_SET_LAYOUT(layout, attr, value) set_layout(layout, attr, value, #attr, __LINE__)

MatrixLayoutHandle make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int32_t batch,
                               int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  PTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  MatrixLayoutHandle owned(layout);
  if (batch > 1) {
    PTRAIN_SET_LAYOUT(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch);
    PTRAIN_SET_LAYOUT(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return owned;
}

}  // namespace

GemmDescriptors make_gemm_descriptors(const GemmSpec& spec) {
  // Callers ask gemm_spec_problem first (Matmul does): a spec that breaks the rules here is a bug.
  if (const std::string problem = gemm_spec_problem(spec); !problem.empty()) throw std::logic_error(problem);
  GemmDescriptors out;

  cublasLtMatmulDesc_t desc = nullptr;
  PTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, spec.compute, CUDA_R_32F));
  out.matmul.reset(desc);

  const int32_t trans_a = spec.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = spec.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_TRANSA, trans_a);
  PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_TRANSB, trans_b);
  const uint32_t epilogue = static_cast<uint32_t>(spec.epilogue);
  PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (epilogue_uses_bias(spec.epilogue) && spec.bias_type != -1)
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, spec.bias_type);
  if (epilogue_uses_aux(spec.epilogue)) {
    const int64_t aux_ld = spec.ld_aux();
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    if (spec.aux_type != -1) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, spec.aux_type);
  }
  if (spec.fp8()) {
    const int8_t fast_accum = spec.fast_accum ? 1 : 0;
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
    const int32_t a_mode = cublaslt_scale_mode(spec.a_scale);
    const int32_t b_mode = cublaslt_scale_mode(spec.b_scale);
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);
  }

  out.a = make_layout(spec.a_type, spec.a_rows(), spec.a_cols(), spec.ld_a(), spec.batch, spec.stride_a);
  out.b = make_layout(spec.b_type, spec.b_rows(), spec.b_cols(), spec.ld_b(), spec.batch, spec.stride_b);
  out.c = make_layout(spec.c_type, spec.m, spec.n, spec.ld_c(), spec.batch, spec.stride_c);
  out.d = make_layout(spec.d_type, spec.m, spec.n, spec.ld_d(), spec.batch, spec.stride_d);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

namespace {

// The largest power of two up to kMaxGemmAlignment that divides the address. cuBLASLt's
// alignment preferences take up to 256 bytes, and arena blocks are 256-byte aligned: telling
// the heuristic the true alignment lets it pick kernels that load whole 256-byte lines.
constexpr int kMaxGemmAlignment = 256;
int alignment_of(const void* p) {
  if (!p) return kMaxGemmAlignment;
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < kMaxGemmAlignment && address % static_cast<uintptr_t>(2 * a) == 0) a *= 2;
  return a;
}

std::string pointer_text(const void* p) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%p", p);
  return buffer;
}

// The first problem of the arguments, without the "GEMM ..." prefix; "" if none.
std::string args_problem(const GemmSpec& s, const GemmArgs& g) {
  if (!g.a || !g.b || !g.d) return "the A, B and D pointers must not be null";

  if (is_fp8_type(s.d_type) && g.beta != 0) return "an FP8 output cannot be accumulated into (beta must be 0)";
  const bool c_is_d = g.c == nullptr;
  if (g.beta != 0 && c_is_d && (s.c_type != s.d_type || s.ld_c() != s.ld_d() || s.stride_c != s.stride_d))
    return "beta != 0 with no C accumulates into D, which needs C and D to have the same type, leading "
         "dimension and batch stride";

  // Scale pointers: present exactly when the spec scales that operand.
  if (s.a_scale != GemmScale::none && !g.a_scale_inv)
    return std::string("A is scaled (") + gemm_scale_name(s.a_scale) + ") but a_scale_inv is null";
  if (s.a_scale == GemmScale::none && g.a_scale_inv) return "a_scale_inv is given but the spec does not scale A";
  if (s.b_scale != GemmScale::none && !g.b_scale_inv)
    return std::string("B is scaled (") + gemm_scale_name(s.b_scale) + ") but b_scale_inv is null";
  if (s.b_scale == GemmScale::none && g.b_scale_inv) return "b_scale_inv is given but the spec does not scale B";
  if (g.d_scale && !is_fp8_type(s.d_type)) return "d_scale is given but D is not FP8";
  if (s.amax_d && !g.amax_d) return "the spec asks for the amax of D but amax_d is null";
  if (!s.amax_d && g.amax_d) return "amax_d is given but the spec does not ask for the amax of D";

  const bool bias = epilogue_uses_bias(s.epilogue), aux = epilogue_uses_aux(s.epilogue);
  if (bias && !g.bias) return "epilogue " + epilogue_name(s.epilogue) + " needs a bias pointer";
  if (!bias && g.bias) return "a bias pointer is given but epilogue " + epilogue_name(s.epilogue) + " uses none";
  if (aux && !g.aux) return "epilogue " + epilogue_name(s.epilogue) + " needs an aux pointer";
  if (!aux && g.aux) return "an aux pointer is given but epilogue " + epilogue_name(s.epilogue) + " uses none";

  // Every matrix pointer aligned to its element; FP8 GEMMs: everything to 16 bytes.
  struct Matrix {
    const char* name;
    const void* p;
    cudaDataType_t type;
  };
  const Matrix matrices[] = {{"A", g.a, s.a_type}, {"B", g.b, s.b_type}, {"C", g.c, s.c_type}, {"D", g.d, s.d_type}};
  for (const Matrix& m : matrices) {
    if (!m.p) continue;
    const int need = s.fp8() ? 16 : static_cast<int>(cuda_data_type_size(m.type));
    if (alignment_of(m.p) < need)
      return std::string("pointer ") + m.name + " (" + pointer_text(m.p) + ") is not " + std::to_string(need) +
           "-byte aligned" + (s.fp8() ? " (FP8 GEMMs on Hopper need 16-byte aligned pointers)" : "");
  }
  if (s.fp8()) {
    if (g.bias && alignment_of(g.bias) < 16)
      return "the bias pointer (" + pointer_text(g.bias) + ") is not 16-byte aligned (FP8 GEMM)";
    if (g.aux && alignment_of(g.aux) < 16)
      return "the aux pointer (" + pointer_text(g.aux) + ") is not 16-byte aligned (FP8 GEMM)";
  } else {
    if (g.bias && alignment_of(g.bias) < 2) return "the bias pointer (" + pointer_text(g.bias) + ") is misaligned";
    if (g.aux && alignment_of(g.aux) < 2) return "the aux pointer (" + pointer_text(g.aux) + ") is misaligned";
  }
  const struct {
    const char* name;
    const void* p;
    bool block;
  } scales[] = {{"a_scale_inv", g.a_scale_inv, is_block(s.a_scale)},
                {"b_scale_inv", g.b_scale_inv, is_block(s.b_scale)},
                {"d_scale", g.d_scale, false},
                {"amax_d", g.amax_d, false}};
  for (const auto& sc : scales) {
    if (!sc.p) continue;
    const int need = sc.block ? 16 : 4;
    if (alignment_of(sc.p) < need)
      return std::string("the ") + sc.name + " pointer (" + pointer_text(sc.p) + ") is not " + std::to_string(need) +
           "-byte aligned";
  }
  return "";
}

}  // namespace

std::string gemm_args_problem(const GemmSpec& spec, const GemmArgs& args) {
  const std::string problem = args_problem(spec, args);
  return problem.empty() ? problem : "GEMM " + describe_gemm(spec) + ": " + problem;
}

int gemm_pointer_alignment(const GemmArgs& args) {
  int a = kMaxGemmAlignment;
  for (const void* p : {args.a, args.b, args.c, static_cast<const void*>(args.d), static_cast<const void*>(args.bias),
                        static_cast<const void*>(args.aux)})
    a = std::min(a, alignment_of(p));
  return a;
}

// ---------------------------------------------------------------------------------------------
// The library log (PTRAIN_LIBRARY_LOG): what cuBLASLt's heuristic answered for each GEMM
// ---------------------------------------------------------------------------------------------

namespace {

nlohmann::json gemm_spec_json(const GemmSpec& s) {
  return {{"gemm", describe_gemm(s)},
          {"m", s.m},
          {"n", s.n},
          {"k", s.k},
          {"op", std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N")},
          {"ld", {s.ld_a(), s.ld_b(), s.ld_c(), s.ld_d()}},
          {"types", {cuda_data_type_name(s.a_type), cuda_data_type_name(s.b_type), cuda_data_type_name(s.c_type),
                     cuda_data_type_name(s.d_type)}},
          {"compute", compute_name(s.compute)},
          {"epilogue", epilogue_name(s.epilogue)},
          {"bias_type", s.bias_type},
          {"aux_type", s.aux_type},
          {"aux_ld", s.ld_aux()},
          {"scales", {gemm_scale_name(s.a_scale), gemm_scale_name(s.b_scale)}},
          {"fast_accum", s.fast_accum},
          {"amax_d", s.amax_d},
          {"batch", s.batch},
          {"strides", {s.stride_a, s.stride_b, s.stride_c, s.stride_d}}};
}

template <typename T>
int64_t algo_attribute(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS)
    return -1;
  return static_cast<int64_t>(value);
}

}  // namespace

void Matmul::log_heuristic(const GemmSpec& spec, int alignment, size_t max_workspace, cublasStatus_t status,
                           int returned, const cublasLtMatmulHeuristicResult_t& result) {
  nlohmann::json record = {{"library", "cuBLASLt"},
                           {"version", static_cast<int64_t>(cublasLtGetVersion())},
                           {"spec", gemm_spec_json(spec)},
                           {"alignment", alignment},
                           {"max_workspace", max_workspace},
                           {"status", cublasLtGetStatusName(status)},
                           {"returned", returned}};
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
    record["state"] = cublasLtGetStatusName(result.state);
    // The types are the header's (cublasLtMatmulAlgoConfigAttributes_t).
    record["algo"] = {{"id", algo_attribute<int32_t>(result.algo, CUBLASLT_ALGO_CONFIG_ID)},
                      {"tile", algo_attribute<uint32_t>(result.algo, CUBLASLT_ALGO_CONFIG_TILE_ID)},
                      {"stages", algo_attribute<uint32_t>(result.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)},
                      {"splitk", algo_attribute<int32_t>(result.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)},
                      {"reduction", algo_attribute<uint32_t>(result.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)},
                      {"swizzle", algo_attribute<uint32_t>(result.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)},
                      {"custom", algo_attribute<uint32_t>(result.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)},
                      {"inner_shape", algo_attribute<uint16_t>(result.algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)},
                      {"cluster_shape", algo_attribute<uint16_t>(result.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)}};
    record["workspace"] = result.workspaceSize;
    record["waves"] = result.wavesCount;
  }
  log_library_choice(record);
}

void Matmul::log_refusal(const GemmSpec& spec, int alignment, const std::string& why) {
  log_library_choice({{"library", "cuBLASLt"},
                      {"spec", gemm_spec_json(spec)},
                      {"alignment", alignment},
                      {"status", "not asked"},
                      {"why", why}});
}

// ---------------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------------

Matmul::Matmul(void* workspace, size_t workspace_bytes) : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  if (workspace_bytes_ > 0 && !workspace_) throw std::invalid_argument("Matmul: workspace_bytes > 0 with a null workspace");
  PTRAIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

Matmul::~Matmul() {
  plans_.clear();  // descriptors first, then the handle
  if (handle_) (void)cublasLtDestroy(handle_);
}

Matmul::Plan* Matmul::find_plan(const GemmSpec& spec, int alignment, std::string* why, cublasStatus_t* status) {
  PlanKey key{spec, alignment};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();

  auto plan = std::make_unique<Plan>();
  plan->desc = make_gemm_descriptors(spec);
  cublasLtMatmulDesc_t desc = plan->desc.matmul.get();

  // The heuristic reads (never dereferences) the pointer attributes to learn their alignment
  // and which optional outputs are wanted: give it placeholders of the alignment class; run()
  // sets the real pointers on every call.
  void* matrix_placeholder = reinterpret_cast<void*>(static_cast<uintptr_t>(alignment));
  void* scalar_placeholder = reinterpret_cast<void*>(static_cast<uintptr_t>(16));
  if (epilogue_uses_bias(spec.epilogue)) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, matrix_placeholder);
  if (epilogue_uses_aux(spec.epilogue))
    PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, matrix_placeholder);
  if (spec.a_scale != GemmScale::none) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scalar_placeholder);
  if (spec.b_scale != GemmScale::none) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scalar_placeholder);
  if (is_fp8_type(spec.d_type)) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, scalar_placeholder);
  if (spec.amax_d) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, scalar_placeholder);

  cublasLtMatmulPreference_t preference = nullptr;
  PTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  struct PreferenceOwner {
    cublasLtMatmulPreference_t p;
    ~PreferenceOwner() { (void)cublasLtMatmulPreferenceDestroy(p); }
  } owner{preference};
  const uint64_t max_workspace = workspace_bytes_;
  PTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &max_workspace, sizeof(max_workspace)));
  const uint32_t min_alignment = static_cast<uint32_t>(alignment);
  for (cublasLtMatmulPreferenceAttributes_t attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    PTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attr, &min_alignment, sizeof(min_alignment)));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle_, desc, plan->desc.a.get(), plan->desc.b.get(), plan->desc.c.get(),
                                           plan->desc.d.get(), preference, 1, &result, &returned);
  if (library_log_enabled()) log_heuristic(spec, alignment, workspace_bytes_, *status, returned, result);
  // cuBLASLt refuses with a status (PyTorch has seen INVALID_VALUE for a bias epilogue on a one-row
  // operand) or by returning no algorithm: either way there is no plan.
  if (*status != CUBLAS_STATUS_SUCCESS || returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    *why = "cuBLASLt has no algorithm for GEMM " + describe_gemm(spec) + " with " + std::to_string(alignment) +
           "-byte aligned pointers and " + std::to_string(workspace_bytes_) + " bytes of workspace on this GPU (" +
           cublas_status_name(*status != CUBLAS_STATUS_SUCCESS ? *status : result.state) + ")";
    return nullptr;
  }
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  return plans_.emplace(std::move(key), std::move(plan)).first->second.get();
}

Matmul::Plan& Matmul::plan_for(const GemmSpec& spec, int alignment) {
  std::string why;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  Plan* plan = find_plan(spec, alignment, &why, &status);
  if (plan) return *plan;
  PTRAIN_CUBLAS_CHECK(status);  // a library status, as any call's (inside a capture: a refusal to record)
  throw EnvironmentError(why);  // the heuristic answered, with no algorithm
}

Matmul::Plan* Matmul::plan_or_refusal(const GemmSpec& spec, const GemmArgs& args, std::string* why) {
  const PlanKey key{spec, gemm_pointer_alignment(args)};
  if (const auto refused = refused_.find(key); refused != refused_.end()) {
    *why = refused->second;
    return nullptr;
  }
  *why = gemm_spec_problem(spec);
  if (why->empty()) *why = gemm_args_problem(spec, args);
  if (!why->empty()) {  // ptrain's rules for cuBLASLt refuse it: the heuristic is never asked
    if (library_log_enabled()) log_refusal(spec, key.alignment, *why);
  } else if (cublasStatus_t status; Plan* plan = find_plan(spec, key.alignment, why, &status)) {
    return plan;
  }
  refused_.emplace(key, *why);
  return nullptr;
}

bool Matmul::can_run(const GemmSpec& spec, const GemmArgs& args) {
  std::string why;
  return plan_or_refusal(spec, args, &why) != nullptr;
}

void Matmul::run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  // ptrain builds its GEMMs to ptrain's rules: arguments that break them are a bug.
  if (const std::string problem = gemm_args_problem(spec, args); !problem.empty()) throw std::logic_error(problem);
  launch(plan_for(spec, gemm_pointer_alignment(args)), spec, args, stream);
}

std::string Matmul::probe(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  std::string why;
  Plan* plan = plan_or_refusal(spec, args, &why);
  if (!plan) return why;
  const cublasStatus_t status = launch_status(*plan, spec, args, stream);
  if (status == CUBLAS_STATUS_SUCCESS) return "";
  return "cuBLASLt refused to launch GEMM " + describe_gemm(spec) + ", which its heuristic had offered (" +
         cublas_status_name(status) + ")";
}

bool Matmul::try_run(const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  std::string why;
  Plan* plan = plan_or_refusal(spec, args, &why);
  if (plan) launch(*plan, spec, args, stream);
  return plan != nullptr;
}

cublasStatus_t Matmul::launch_status(Plan& plan, const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  cublasLtMatmulDesc_t desc = plan.desc.matmul.get();

  if (epilogue_uses_bias(spec.epilogue)) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, args.bias);
  if (epilogue_uses_aux(spec.epilogue)) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, args.aux);
  if (spec.a_scale != GemmScale::none) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, args.a_scale_inv);
  if (spec.b_scale != GemmScale::none) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, args.b_scale_inv);
  if (is_fp8_type(spec.d_type)) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, args.d_scale);
  if (spec.amax_d) PTRAIN_SET_DESC(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, args.amax_d);

  // C = nullptr means in place (C = D); an FP8 D has a C of another type, never read (beta = 0).
  const void* c = args.c ? args.c : (is_fp8_type(spec.d_type) ? nullptr : args.d);
  return cublasLtMatmul(handle_, desc, &args.alpha, args.a, plan.desc.a.get(), args.b, plan.desc.b.get(), &args.beta,
                        c, plan.desc.c.get(), args.d, plan.desc.d.get(), &plan.algo, workspace_, workspace_bytes_,
                        stream);
}

void Matmul::launch(Plan& plan, const GemmSpec& spec, const GemmArgs& args, cudaStream_t stream) {
  PTRAIN_CUBLAS_CHECK(launch_status(plan, spec, args, stream));
}

#undef PTRAIN_SET_DESC
#undef PTRAIN_SET_LAYOUT

}  // namespace ptrain

#endif  // PTRAIN_HAVE_CUDA

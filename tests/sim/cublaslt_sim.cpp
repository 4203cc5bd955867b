// The simulated cuBLASLt (see sim.h): the descriptor, layout and preference objects ptrain
// builds, with every attribute's size checked against the type cublasLt.h gives it; a heuristic
// that refuses what the real library refuses on Hopper; and cublasLtMatmul as a reference over
// decoded values, queued on the stream like any other work.
//
// What cublasLtMatmul computes (cuBLAS documentation, "cublasLtMatmul()", "FP8 support" and
// "1D and 128x128 2D block scaling for FP8"), column-major, per batch:
//     T = alpha * sA * sB * op(A) op(B) + beta * C        (sA, sB: the dequantisation factors)
//     T = epilogue(T)                                     (bias, GELU, DGELU; bias gradients)
//     amax_D = max |T|;  D = round_to_D_type(sD * T)      (sD only for an FP8 D)
// Products accumulate in double and round once into D's type, FP8 saturating to the largest
// finite value; the tensor cores' own accumulation (and FP8 fast accumulation) is not modelled.
// GELU is the tanh approximation, as cuBLASLt's epilogue (and llm.c, which relies on it) uses.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "sim.h"

namespace {

constexpr uint64_t kAlgoMagic = 0x70747261696e4c74ull;  // "ptrainLt"

struct Layout {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = -1;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* d_scale = nullptr;
  void* amax_d = nullptr;
  int8_t fast_accum = 0;
  int32_t a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct Preference {
  uint64_t max_workspace = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cublasLt.h's defaults
};

// What the sim's algorithm records (inside cublasLtMatmulAlgo_t's opaque words): the alignment
// the heuristic was promised, which every later call's pointers must keep.
struct AlgoWords {
  uint64_t magic;
  uint32_t min_alignment[4];
  int32_t id;
};
static_assert(sizeof(AlgoWords) <= sizeof(cublasLtMatmulAlgo_t), "the algorithm's words must fit");

// Attribute writes: `size` must be the size of the type the header documents.
template <typename T>
cublasStatus_t set(T* field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: return 0;
  }
}
bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

float load(const void* base, int64_t i, cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(base)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_8F_E4M3: return float(static_cast<const __nv_fp8_e4m3*>(base)[i]);
    case CUDA_R_8F_E5M2: return float(static_cast<const __nv_fp8_e5m2*>(base)[i]);
    default: return NAN;
  }
}

void store(void* base, int64_t i, cudaDataType_t t, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(base)[i] = v; break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    case CUDA_R_16F: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case CUDA_R_8F_E4M3:
      static_cast<__nv_fp8_storage_t*>(base)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      break;
    case CUDA_R_8F_E5M2:
      static_cast<__nv_fp8_storage_t*>(base)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
      break;
    default: break;
  }
}

// TF32 (CUBLAS_COMPUTE_32F_FAST_TF32): inputs keep 10 mantissa bits, rounded to nearest even.
float to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
  std::memcpy(&x, &u, 4);
  return x;
}

double gelu(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  const double u = c * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x);
}

bool has_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool has_aux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool known_epilogue(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_GELU || has_bias(e) || has_aux(e);
}

// The dequantisation factor of element (o, kk) of an operand whose outer length is `outer`
// (m for A, n for B) and contraction length k (matmul.h, gemm_scale_floats, states the layouts).
float scale_factor(const float* s, int32_t mode, int64_t o, int64_t kk, int64_t k, int64_t outer) {
  if (!s) return 1.0f;
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return s[o + (kk / 128) * outer];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: {
      const int64_t l = ((k + 127) / 128 + 3) / 4 * 4;
      return s[kk / 128 + (o / 128) * l];
    }
    default: return s[0];
  }
}

int pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 1;
  while (align < 256 && a % (2 * align) == 0) align *= 2;
  return align;
}

// Why the heuristic finds no algorithm on Hopper for this problem, or empty (cuBLAS
// documentation, "cublasLtMatmul() ... Regular FP8", "block scaling").
const char* refusal(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd,
                    const Preference& p) {
  const bool fp8 = is_fp8(a.type) || is_fp8(b.type);
  if (!known_epilogue(d.epilogue)) return "epilogue";
  if (type_size(a.type) == 0 || type_size(b.type) == 0 || type_size(c.type) == 0 || type_size(dd.type) == 0)
    return "type";
  if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_FAST_TF32) return "compute type";
  if (d.scale_type != CUDA_R_32F) return "scale type";
  if (fp8) {
    if (!is_fp8(a.type) || !is_fp8(b.type)) return "FP8 with a non-FP8 operand";
    if (a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2) return "E5M2 x E5M2";
    if (d.trans_a != CUBLAS_OP_T || d.trans_b != CUBLAS_OP_N) return "FP8 outside TN";
    if (d.compute != CUBLAS_COMPUTE_32F) return "FP8 compute type";
    const Layout* all[] = {&a, &b, &c, &dd};
    for (const Layout* l : all)
      if ((l->ld * int64_t(type_size(l->type))) % 16 != 0 || (l->stride * int64_t(type_size(l->type))) % 16 != 0)
        return "FP8 leading dimension or batch stride not a multiple of 16 bytes";
    for (uint32_t align : p.min_alignment)
      if (align < 16) return "FP8 with pointers aligned below 16 bytes";
    const bool block_a = d.a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const bool block_b = d.b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if (block_a || block_b) {
      if (d.a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
          d.b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
        return "both operands 128x128 block-scaled";
      if (is_fp8(dd.type)) return "block scaling with an FP8 output";
      if (d.fast_accum) return "block scaling with fast accumulation";
      if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_BIAS &&
          d.epilogue != CUBLASLT_EPILOGUE_DGELU)
        return "block scaling with this epilogue";
    }
    if (is_fp8(dd.type) && c.type != CUDA_R_16BF && c.type != CUDA_R_16F) return "FP8 D with a C of this type";
  } else {
    if (a.type != b.type) return "A and B of different types";
    if (a.type == CUDA_R_32F && dd.type != CUDA_R_32F) return "fp32 inputs with a narrower output";
    if (dd.type != a.type && dd.type != CUDA_R_32F) return "this output type";
    if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && a.type != CUDA_R_32F) return "TF32 on non-fp32 inputs";
  }
  if (!is_fp8(dd.type) && c.type != dd.type) return "C and D of different types";
  if (has_aux(d.epilogue) && (d.aux_ld < int64_t(dd.rows) || d.aux_ld % 8 != 0)) return "aux leading dimension";
  if ((has_bias(d.epilogue) || has_aux(d.epilogue)) && a.batch > 1) return "an epilogue on a batched GEMM";
  return "";
}

// One cublasLtMatmul, with everything it reads taken by value at the call.
struct MatmulCall {
  Desc d;
  Layout a, b, c, dd;
  float alpha = 1, beta = 0;
  const void *pa, *pb, *pc;
  void* pd;
  void run() const;
};

void MatmulCall::run() const {
  const int64_t m = int64_t(dd.rows), n = int64_t(dd.cols);
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  const int64_t k = ta ? int64_t(a.rows) : int64_t(a.cols);
  const bool tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const float* sa = static_cast<const float*>(d.a_scale);
  const float* sb = static_cast<const float*>(d.b_scale);
  const float sd = d.d_scale && is_fp8(dd.type) ? *static_cast<const float*>(d.d_scale) : 1.0f;
  const cudaDataType_t aux_type = d.aux_type == -1 ? dd.type : static_cast<cudaDataType_t>(d.aux_type);
  // The bias (gradient) defaults to D's type, or C's when D is FP8.
  const cudaDataType_t bias_type =
      d.bias_type != -1 ? static_cast<cudaDataType_t>(d.bias_type) : (is_fp8(dd.type) ? c.type : dd.type);
  float amax = 0.0f;
  std::vector<double> bias_grad;
  if (d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || d.epilogue == CUBLASLT_EPILOGUE_BGRADA)
    bias_grad.assign(size_t(m), 0.0);
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB) bias_grad.assign(size_t(n), 0.0);

  std::vector<float> opa(size_t(m * k)), opb(size_t(n * k));  // op(A) row i, op(B)^T row j: contiguous in k
  for (int32_t batch = 0; batch < dd.batch; ++batch) {
    const char* base_a = static_cast<const char*>(pa) + batch * a.stride * int64_t(type_size(a.type));
    const char* base_b = static_cast<const char*>(pb) + batch * b.stride * int64_t(type_size(b.type));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) {
        float v = load(base_a, ta ? p + i * a.ld : i + p * a.ld, a.type) *
                  scale_factor(sa, d.a_scale_mode, i, p, k, m);
        opa[size_t(i * k + p)] = tf32 ? to_tf32(v) : v;
      }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) {
        float v = load(base_b, tb ? j + p * b.ld : p + j * b.ld, b.type) *
                  scale_factor(sb, d.b_scale_mode, j, p, k, n);
        opb[size_t(j * k + p)] = tf32 ? to_tf32(v) : v;
      }
    char* base_d = static_cast<char*>(pd) + batch * dd.stride * int64_t(type_size(dd.type));
    const char* base_c = pc ? static_cast<const char*>(pc) + batch * c.stride * int64_t(type_size(c.type)) : nullptr;
    // Columns in parallel (each element independent), then the reductions in a fixed order:
    // the result does not depend on the thread count.
    std::vector<double> result(size_t(m * n));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const float* x = &opa[size_t(i * k)];
        const float* y = &opb[size_t(j * k)];
        double t = double(alpha) * ptrain::sim::dot(x, y, k);
        if (beta != 0.0f && base_c) t += double(beta) * load(base_c, i + j * c.ld, c.type);
        const uint32_t e = d.epilogue;
        if (e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
          t += load(d.bias, i, bias_type);
        if (e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) store(d.aux, i + j * d.aux_ld, aux_type, float(t));
        if (e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
            e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
          t = gelu(t);
        if (e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD)
          t *= gelu_grad(load(d.aux, i + j * d.aux_ld, aux_type));
        result[size_t(j * m + i)] = t;
      }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const double t = result[size_t(j * m + i)];
        if (d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) bias_grad[size_t(i)] += t;
        amax = std::max(amax, float(std::fabs(t)));
        store(base_d, i + j * dd.ld, dd.type, float(t * sd));
      }
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) bias_grad[size_t(i)] += opa[size_t(i * k + p)];
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) bias_grad[size_t(j)] += opb[size_t(j * k + p)];
  }
  for (size_t i = 0; i < bias_grad.size(); ++i) store(const_cast<void*>(d.bias), int64_t(i), bias_type, float(bias_grad[i]));
  if (d.amax_d) *static_cast<float*>(d.amax_d) = amax;
}

template <typename T>
T* object(void* handle) {
  return static_cast<T*>(handle);
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (const int injected = ptrain::sim::injected_failure(__func__)) return static_cast<cublasStatus_t>(injected);
  static int token;
  *handle = reinterpret_cast<cublasLtHandle_t>(&token);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
size_t cublasLtGetVersion(void) { return CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH; }

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  Desc* d = new Desc;
  d->compute = compute;
  d->scale_type = scale_type;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete object<Desc>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

// The types are cublasLt.h's, attribute by attribute (cublasLtMatmulDescAttributes_t).
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Desc* d = object<Desc>(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set<int32_t>(&d->trans_a, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set<int32_t>(&d->trans_b, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set<uint32_t>(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set<const void*>(&d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set<int32_t>(&d->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set<void*>(&d->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set<int64_t>(&d->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set<int32_t>(&d->aux_type, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set<const void*>(&d->a_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set<const void*>(&d->b_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return set<const void*>(&d->d_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return set<void*>(&d->amax_d, buf, size);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return set<int8_t>(&d->fast_accum, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return set<int32_t>(&d->a_scale_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return set<int32_t>(&d->b_scale_mode, buf, size);
    default: return CUBLAS_STATUS_INVALID_VALUE;  // an attribute the simulation does not model
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < int64_t(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  Layout* l = new Layout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete object<Layout>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Layout* l = object<Layout>(layout);
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set<int32_t>(&l->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set<int64_t>(&l->stride, buf, size);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete object<Preference>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  Preference* p = object<Preference>(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set<uint64_t>(&p->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set<uint32_t>(&p->min_alignment[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set<uint32_t>(&p->min_alignment[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set<uint32_t>(&p->min_alignment[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set<uint32_t>(&p->min_alignment[3], buf, size);
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (const int injected = ptrain::sim::injected_failure(__func__)) return static_cast<cublasStatus_t>(injected);
  const Preference& p = *object<Preference>(pref);
  // A bias epilogue on an operand of one row or one column: PyTorch keeps cuBLASLt's bias path off
  // such shapes because "if mat2 has only 1 row or column, we get CUBLAS_STATUS_INVALID_VALUE error
  // from cublasLtMatmulAlgoGetHeuristic" (aten/src/ATen/native/cuda/Blas.cpp,
  // isInputCompliesAddmmCudaLt, which extends it to mat1).
  const Layout& la = *object<Layout>(a);
  const Layout& lb = *object<Layout>(b);
  if (has_bias(object<Desc>(desc)->epilogue) && (la.rows == 1 || la.cols == 1 || lb.rows == 1 || lb.cols == 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  const char* why = refusal(*object<Desc>(desc), *object<Layout>(a), *object<Layout>(b), *object<Layout>(c),
                            *object<Layout>(d), p);
  if (*why) return CUBLAS_STATUS_NOT_SUPPORTED;  // "no algorithm": the real library's status
  cublasLtMatmulHeuristicResult_t r{};
  AlgoWords words{kAlgoMagic, {p.min_alignment[0], p.min_alignment[1], p.min_alignment[2], p.min_alignment[3]}, 1};
  std::memcpy(&r.algo, &words, sizeof(words));
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
  AlgoWords words;
  std::memcpy(&words, algo, sizeof(words));
  if (words.magic != kAlgoMagic || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  // Every attribute of the simulated algorithm is 0 but its id; sizes as cublasLt.h gives them.
  size_t need = 4;
  if (attr == CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID || attr == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) need = 2;
  if (size != need) return CUBLAS_STATUS_INVALID_VALUE;
  std::memset(buf, 0, size);
  if (attr == CUBLASLT_ALGO_CONFIG_ID) std::memcpy(buf, &words.id, 4);
  if (written) *written = need;
  return CUBLAS_STATUS_SUCCESS;
}

// The matmul's name in the simulated device's report: its input types and how they are scaled,
// e.g. "cublasLtMatmul e4m3 x e4m3, block scales" (which GEMM path a run took).
std::string report_name(const MatmulCall& call) {
  auto name = [](cudaDataType_t t) {
    switch (t) {
      case CUDA_R_32F: return "f32";
      case CUDA_R_16BF: return "bf16";
      case CUDA_R_16F: return "f16";
      case CUDA_R_8F_E4M3: return "e4m3";
      case CUDA_R_8F_E5M2: return "e5m2";
      default: return "other";
    }
  };
  const bool blocks = call.d.a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
                      call.d.b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  return std::string("cublasLtMatmul ") + name(call.a.type) + " x " + name(call.b.type) +
         (blocks ? ", block scales" : is_fp8(call.a.type) ? ", tensor scales" : "");
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* c, cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!algo || !alpha || !beta || !a || !b || !d) return CUBLAS_STATUS_INVALID_VALUE;
  AlgoWords words;
  std::memcpy(&words, algo, sizeof(words));
  if (words.magic != kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
  // A launch refused after the heuristic offered the algorithm (PTRAIN_SIM_FAIL=cublasLtMatmul:...).
  if (const int injected = ptrain::sim::injected_failure(__func__)) return static_cast<cublasStatus_t>(injected);
  auto call = std::make_shared<MatmulCall>();
  call->d = *object<Desc>(desc);
  call->a = *object<Layout>(la);
  call->b = *object<Layout>(lb);
  call->c = *object<Layout>(lc);
  call->dd = *object<Layout>(ld);
  std::memcpy(&call->alpha, alpha, sizeof(float));  // host scalars (the default pointer mode)
  std::memcpy(&call->beta, beta, sizeof(float));
  call->pa = a;
  call->pb = b;
  call->pc = c;
  call->pd = d;
  // The pointers must keep the alignment the heuristic was promised (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*).
  const void* pointers[] = {a, b, c ? c : d, d};
  for (int i = 0; i < 4; ++i)
    if (pointer_alignment(pointers[i]) < int(words.min_alignment[i])) return CUBLAS_STATUS_INVALID_VALUE;
  if (call->beta != 0.0f && !c) return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace_bytes > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_bias(call->d.epilogue) && !call->d.bias) return CUBLAS_STATUS_INVALID_VALUE;
  if (has_aux(call->d.epilogue) && !call->d.aux) return CUBLAS_STATUS_INVALID_VALUE;
  if (ptrain::sim::enqueue(stream, report_name(*call).c_str(), [call]() { call->run(); }) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

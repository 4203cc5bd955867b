// The cuBLASLt GEMM layer without a GPU: the descriptors and layouts built for each precision
// and for the forward, dgrad and wgrad GEMMs of a linear layer, read back through cuBLASLt's own
// getters; the row-major -> column-major mapping checked numerically by a column-major reference
// GEMM on the CPU; the FP8 rules (TN, leading dimensions, E5M2 x E5M2, block scaling) rejected
// with messages naming the problem; and CudaError's text. Compiled only in CUDA builds.
#ifdef PTRAIN_HAVE_CUDA

#include <catch2/catch.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_error.h"
#include "backend/cuda/matmul.h"
#include "core/error.h"

using namespace ptrain;
using Catch::Contains;

namespace {

template <typename T>
T desc_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr) {
  T value{};
  size_t written = 0;
  REQUIRE(cublasLtMatmulDescGetAttribute(desc, attr, &value, sizeof(value), &written) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(written == sizeof(value));
  return value;
}

template <typename T>
T layout_attr(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr) {
  T value{};
  size_t written = 0;
  REQUIRE(cublasLtMatrixLayoutGetAttribute(layout, attr, &value, sizeof(value), &written) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(written == sizeof(value));
  return value;
}

struct Expected {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

void check_layout(cublasLtMatrixLayout_t layout, const Expected& e) {
  CHECK(layout_attr<uint32_t>(layout, CUBLASLT_MATRIX_LAYOUT_TYPE) == static_cast<uint32_t>(e.type));
  CHECK(layout_attr<int32_t>(layout, CUBLASLT_MATRIX_LAYOUT_ORDER) == CUBLASLT_ORDER_COL);
  CHECK(layout_attr<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_ROWS) == e.rows);
  CHECK(layout_attr<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_COLS) == e.cols);
  CHECK(layout_attr<int64_t>(layout, CUBLASLT_MATRIX_LAYOUT_LD) == e.ld);
  CHECK(layout_attr<int32_t>(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) == e.batch);
  CHECK(layout_attr<int64_t>(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) == e.stride);
}

struct ExpectedDesc {
  cublasOperation_t trans_a, trans_b;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

void check_desc(cublasLtMatmulDesc_t desc, const ExpectedDesc& e) {
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSA) == e.trans_a);
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_TRANSB) == e.trans_b);
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) == e.compute);
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE) == CUDA_R_32F);
  CHECK(desc_attr<uint32_t>(desc, CUBLASLT_MATMUL_DESC_EPILOGUE) == static_cast<uint32_t>(e.epilogue));
}

void check_fp8_desc(cublasLtMatmulDesc_t desc, int8_t fast_accum, int32_t a_mode, int32_t b_mode) {
  CHECK(desc_attr<int8_t>(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM) == fast_accum);
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE) == a_mode);
  CHECK(desc_attr<int32_t>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE) == b_mode);
  // The scale pointers are per call: the built descriptor leaves them unset.
  CHECK(desc_attr<const void*>(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER) == nullptr);
  CHECK(desc_attr<const void*>(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) == nullptr);
}

std::string rejection(const GemmSpec& spec) {
  const std::string problem = gemm_spec_problem(spec);
  if (problem.empty()) FAIL("the spec was accepted: " + describe_gemm(spec));
  // Building its descriptors anyway is a bug in the caller, not bad input.
  CHECK_THROWS_AS(make_gemm_descriptors(spec), std::logic_error);
  return problem;
}

std::string args_rejection(const GemmSpec& spec, const GemmArgs& args) {
  const std::string problem = gemm_args_problem(spec, args);
  if (problem.empty()) FAIL("the arguments were accepted: " + describe_gemm(spec));
  return problem;
}

// cuBLASLt's definition, executed on the CPU: D = alpha op(A) op(B) + beta C, column-major with
// the spec's leading dimensions and batch strides. Data types are ignored (all float here).
void reference_gemm(const GemmSpec& s, const float* A, const float* B, float* D, float beta) {
  for (int32_t b = 0; b < s.batch; ++b) {
    const float* a = A + b * s.stride_a;
    const float* bb = B + b * s.stride_b;
    float* d = D + b * s.stride_d;
    for (int64_t j = 0; j < s.n; ++j)
      for (int64_t i = 0; i < s.m; ++i) {
        double acc = 0;
        for (int64_t l = 0; l < s.k; ++l) {
          const float x = s.trans_a ? a[l + i * s.ld_a()] : a[i + l * s.ld_a()];
          const float y = s.trans_b ? bb[j + l * s.ld_b()] : bb[l + j * s.ld_b()];
          acc += double(x) * double(y);
        }
        float& out = d[i + j * s.ld_d()];
        out = static_cast<float>(acc + beta * out);
      }
  }
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// (rows, cols) row-major -> its transpose (cols, rows) row-major.
std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])));
}

bool have_gpu() {
  int count = 0;  // cudaGetDeviceCount leaves it unwritten when it fails
  const cudaError_t status = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  return status == cudaSuccess && count > 0;
}

constexpr int64_t N = 64, C = 48, OC = 96;  // tokens, in features, out features

}  // namespace

// ---------------------------------------------------------------------------------------------
// The row-major -> column-major mapping, checked numerically
// ---------------------------------------------------------------------------------------------

TEST_CASE("the forward dgrad and wgrad specs compute ptrain's row-major products", "[cuda][matmul]") {
  const int64_t n = 5, c = 7, oc = 3;  // odd sizes: a swapped dimension cannot hide
  const std::vector<float> inp = random_vector(n * c, 1), w = random_vector(oc * c, 2),
                           dout = random_vector(n * oc, 3);

  SECTION("forward out(N OC) = inp W^T") {
    const GemmSpec s = linear_forward_gemm(n, c, oc, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    std::vector<float> out(n * oc, 0.f);
    reference_gemm(s, w.data(), inp.data(), out.data(), 0);  // A = W, B = inp
    std::vector<double> want(n * oc, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < oc; ++o)
        for (int64_t j = 0; j < c; ++j) want[i * oc + o] += double(inp[i * c + j]) * w[o * c + j];
    check_close(out, want);
  }

  std::vector<double> dinp_want(n * c, 0.0), dw_want(oc * c, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j)
      for (int64_t o = 0; o < oc; ++o) {
        dinp_want[i * c + j] += double(dout[i * oc + o]) * w[o * c + j];
        dw_want[o * c + j] += double(dout[i * oc + o]) * inp[i * c + j];
      }

  SECTION("dgrad dinp(N C) = dout W with W or its stored transpose") {
    for (bool transposed : {false, true}) {
      const GemmSpec s = linear_dgrad_gemm(n, c, oc, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, transposed);
      const std::vector<float> a = transposed ? transpose(w, oc, c) : w;
      std::vector<float> dinp(n * c, 0.f);
      reference_gemm(s, a.data(), dout.data(), dinp.data(), 0);
      check_close(dinp, dinp_want);
    }
  }

  SECTION("wgrad dW(OC C) += dout^T inp with the operands or their stored transposes") {
    for (bool transposed : {false, true}) {
      const GemmSpec s = linear_wgrad_gemm(n, c, oc, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, transposed);
      const std::vector<float> a = transposed ? transpose(inp, n, c) : inp;
      const std::vector<float> b = transposed ? transpose(dout, n, oc) : dout;
      std::vector<float> dw(oc * c, 0.5f);  // accumulates: beta = 1
      reference_gemm(s, a.data(), b.data(), dw.data(), 1);
      std::vector<double> want = dw_want;
      for (double& x : want) x += 0.5;
      check_close(dw, want);
    }
  }

  SECTION("batched attention scores preatt = q k^T per head") {
    const int64_t heads = 3, T = 4, hs = 5;
    const std::vector<float> q = random_vector(heads * T * hs, 4), k = random_vector(heads * T * hs, 5);
    RowMajorGemm g;
    g.rows = T;
    g.cols = T;
    g.inner = hs;
    g.y_transposed = true;  // k (T, hs) = (cols, inner)
    g.batch = static_cast<int32_t>(heads);
    g.stride_x = g.stride_y = T * hs;
    g.stride_out = T * T;
    const GemmSpec s = row_major_gemm(g);
    std::vector<float> att(heads * T * T, 0.f);
    reference_gemm(s, k.data(), q.data(), att.data(), 0);
    std::vector<double> want(heads * T * T, 0.0);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t u = 0; u < T; ++u)
          for (int64_t d = 0; d < hs; ++d)
            want[h * T * T + t * T + u] += double(q[h * T * hs + t * hs + d]) * k[h * T * hs + u * hs + d];
    check_close(att, want);
  }
}

// ---------------------------------------------------------------------------------------------
// Descriptors per precision, read back from cuBLASLt
// ---------------------------------------------------------------------------------------------

TEST_CASE("fp32 descriptors for the forward dgrad and wgrad GEMMs", "[cuda][matmul]") {
  SECTION("forward is TN: A = W (C x OC) and B = inp (C x N)") {
    const GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N});
    check_layout(d.a.get(), {CUDA_R_32F, C, OC, C});
    check_layout(d.b.get(), {CUDA_R_32F, C, N, C});
    check_layout(d.c.get(), {CUDA_R_32F, OC, N, OC});
    check_layout(d.d.get(), {CUDA_R_32F, OC, N, OC});
  }
  SECTION("dgrad is NN: A = W (C x OC) and B = dout (OC x N)") {
    const GemmSpec s = linear_dgrad_gemm(N, C, OC, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false);
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_N, CUBLAS_OP_N});
    check_layout(d.a.get(), {CUDA_R_32F, C, OC, C});
    check_layout(d.b.get(), {CUDA_R_32F, OC, N, OC});
    check_layout(d.d.get(), {CUDA_R_32F, C, N, C});
  }
  SECTION("wgrad is NT: A = inp (C x N) and B = dout (OC x N) transposed") {
    const GemmSpec s = linear_wgrad_gemm(N, C, OC, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false);
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_N, CUBLAS_OP_T});
    check_layout(d.a.get(), {CUDA_R_32F, C, N, C});
    check_layout(d.b.get(), {CUDA_R_32F, OC, N, OC});
    check_layout(d.c.get(), {CUDA_R_32F, C, OC, C});
    check_layout(d.d.get(), {CUDA_R_32F, C, OC, C});
  }
}

TEST_CASE("tf32 applies to fp32 operands only", "[cuda][matmul]") {
  CHECK(gemm_compute_type(CUDA_R_32F, true) == CUBLAS_COMPUTE_32F_FAST_TF32);
  CHECK(gemm_compute_type(CUDA_R_32F, false) == CUBLAS_COMPUTE_32F);
  CHECK(gemm_compute_type(CUDA_R_16BF, true) == CUBLAS_COMPUTE_32F);

  const GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32);
  const GemmDescriptors d = make_gemm_descriptors(s);
  check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F_FAST_TF32});

  const GemmSpec bf16 =
      linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F_FAST_TF32);
  CHECK_THAT(rejection(bf16), Contains("TF32 compute applies to fp32 operands only"));
}

TEST_CASE("bf16 descriptors carry the fused bias and GELU epilogues", "[cuda][matmul]") {
  SECTION("forward with GELU_AUX_BIAS keeps the pre-GELU output at ld OC") {
    GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
    s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_GELU_AUX_BIAS});
    CHECK(desc_attr<int64_t>(d.matmul.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) == OC);
    CHECK(desc_attr<const void*>(d.matmul.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER) == nullptr);
    check_layout(d.a.get(), {CUDA_R_16BF, C, OC, C});
    check_layout(d.b.get(), {CUDA_R_16BF, C, N, C});
    check_layout(d.d.get(), {CUDA_R_16BF, OC, N, OC});
    CHECK(epilogue_uses_bias(s.epilogue));
    CHECK(epilogue_uses_aux(s.epilogue));
  }
  SECTION("dgrad with DGELU_BGRAD reads the pre-GELU input at ld C") {
    GemmSpec s = linear_dgrad_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false);
    s.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_DGELU_BGRAD});
    CHECK(desc_attr<int64_t>(d.matmul.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) == C);
    check_layout(d.d.get(), {CUDA_R_16BF, C, N, C});
  }
  SECTION("wgrad with BGRADB reduces dout over the tokens and accumulates into an fp32 dW") {
    GemmSpec s = linear_wgrad_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, false);
    s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BGRADB});
    check_layout(d.a.get(), {CUDA_R_16BF, C, N, C});
    check_layout(d.b.get(), {CUDA_R_16BF, OC, N, OC});
    check_layout(d.c.get(), {CUDA_R_32F, C, OC, C});
    check_layout(d.d.get(), {CUDA_R_32F, C, OC, C});
  }
}

TEST_CASE("fp16 descriptors with a bias epilogue", "[cuda][matmul]") {
  GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_16F, CUDA_R_16F, CUDA_R_16F);
  s.epilogue = CUBLASLT_EPILOGUE_BIAS;
  const GemmDescriptors d = make_gemm_descriptors(s);
  check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS});
  check_layout(d.a.get(), {CUDA_R_16F, C, OC, C});
  check_layout(d.c.get(), {CUDA_R_16F, OC, N, OC});
  check_layout(d.d.get(), {CUDA_R_16F, OC, N, OC});

  GemmSpec mixed = s;
  mixed.b_type = CUDA_R_16BF;
  CHECK_THAT(rejection(mixed), Contains("A and B must have the same type"));
}

TEST_CASE("fp8 per-tensor descriptors for e4m3 x e4m3 forward and e4m3 x e5m2 gradients", "[cuda][matmul]") {
  const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;

  SECTION("forward e4m3 x e4m3 is TN with fast accumulation") {
    GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
    s.a_scale = s.b_scale = GemmScale::tensor;
    s.fast_accum = true;
    s.epilogue = CUBLASLT_EPILOGUE_BIAS;
    s.bias_type = CUDA_R_16BF;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS});
    check_fp8_desc(d.matmul.get(), 1, scalar, scalar);
    CHECK(desc_attr<int32_t>(d.matmul.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) == CUDA_R_16BF);
    check_layout(d.a.get(), {CUDA_R_8F_E4M3, C, OC, C});
    check_layout(d.b.get(), {CUDA_R_8F_E4M3, C, N, C});
    check_layout(d.c.get(), {CUDA_R_16BF, OC, N, OC});
    check_layout(d.d.get(), {CUDA_R_16BF, OC, N, OC});
  }
  SECTION("dgrad e4m3 W^T x e5m2 dout is TN over the stored transpose") {
    GemmSpec s = linear_dgrad_gemm(N, C, OC, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, true);
    s.a_scale = s.b_scale = GemmScale::tensor;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N});
    check_fp8_desc(d.matmul.get(), 0, scalar, scalar);
    check_layout(d.a.get(), {CUDA_R_8F_E4M3, OC, C, OC});
    check_layout(d.b.get(), {CUDA_R_8F_E5M2, OC, N, OC});
    check_layout(d.d.get(), {CUDA_R_16BF, C, N, C});
  }
  SECTION("wgrad e4m3 inp^T x e5m2 dout^T is TN and contracts over the tokens") {
    GemmSpec s = linear_wgrad_gemm(N, C, OC, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, true);
    s.a_scale = s.b_scale = GemmScale::tensor;
    s.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BGRADB});
    check_fp8_desc(d.matmul.get(), 0, scalar, scalar);
    check_layout(d.a.get(), {CUDA_R_8F_E4M3, N, C, N});
    check_layout(d.b.get(), {CUDA_R_8F_E5M2, N, OC, N});
    check_layout(d.d.get(), {CUDA_R_16BF, C, OC, C});
  }
  SECTION("an fp8 output takes a bf16 C and may report its amax") {
    GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3);
    s.a_scale = s.b_scale = GemmScale::tensor;
    s.amax_d = true;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_layout(d.c.get(), {CUDA_R_16BF, OC, N, OC});
    check_layout(d.d.get(), {CUDA_R_8F_E4M3, OC, N, OC});
    CHECK(desc_attr<void*>(d.matmul.get(), CUBLASLT_MATMUL_DESC_AMAX_D_POINTER) == nullptr);  // per call
  }
}

TEST_CASE("block-scaled fp8 descriptors use Hopper's 1x128 and 128x128 scale modes", "[cuda][matmul]") {
  const int64_t n = 256, c = 128, oc = 384;
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  CHECK(cublaslt_scale_mode(GemmScale::block_1x128) == vec);
  CHECK(cublaslt_scale_mode(GemmScale::block_128x128) == blk);
  CHECK(cublaslt_scale_mode(GemmScale::tensor) == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);

  SECTION("forward: 128x128 weight blocks and 1x128 input tiles") {
    GemmSpec s = linear_forward_gemm(n, c, oc, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
    s.a_scale = GemmScale::block_128x128;
    s.b_scale = GemmScale::block_1x128;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N});
    check_fp8_desc(d.matmul.get(), 0, blk, vec);
    check_layout(d.a.get(), {CUDA_R_8F_E4M3, c, oc, c});
    // Scale tensors: 3 weight blocks along OC, K padded to 4; one row of 256 input factors.
    CHECK(gemm_scale_floats(s.a_scale, s.k, s.m) == 3 * 4);
    CHECK(gemm_scale_floats(s.b_scale, s.k, s.n) == 256);
  }
  SECTION("wgrad: 1x128 tiles along the tokens for both operands") {
    GemmSpec s = linear_wgrad_gemm(n, c, oc, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_32F, true);
    s.a_scale = s.b_scale = GemmScale::block_1x128;
    const GemmDescriptors d = make_gemm_descriptors(s);
    check_fp8_desc(d.matmul.get(), 0, vec, vec);
    check_layout(d.a.get(), {CUDA_R_8F_E4M3, n, c, n});
    check_layout(d.b.get(), {CUDA_R_8F_E5M2, n, oc, n});
    check_layout(d.d.get(), {CUDA_R_32F, c, oc, c});
  }
  SECTION("what block scaling does not support is rejected by name") {
    GemmSpec s = linear_forward_gemm(n, c, oc, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
    s.a_scale = s.b_scale = GemmScale::block_128x128;
    CHECK_THAT(rejection(s), Contains("128x128 block scaling on both A and B"));

    s.b_scale = GemmScale::block_1x128;
    GemmSpec odd = s;
    odd.k = 144;  // a multiple of 16, not of 128
    odd.lda = odd.ldb = 144;
    CHECK_THAT(rejection(odd), Contains("multiples of 128") && Contains("k=144"));

    GemmSpec fast = s;
    fast.fast_accum = true;
    CHECK_THAT(rejection(fast), Contains("fast accumulation is not supported with block scaling"));

    GemmSpec gelu = s;
    gelu.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    CHECK_THAT(rejection(gelu), Contains("DEFAULT, BIAS and DGELU"));

    GemmSpec half = s;
    half.b_scale = GemmScale::tensor;
    CHECK_THAT(rejection(half), Contains("block scaling must be used on both operands"));
  }
}

TEST_CASE("batched descriptors carry the batch count and strides of every matrix", "[cuda][matmul]") {
  const int64_t heads = 24, T = 64, hs = 64;
  RowMajorGemm g;
  g.rows = T;
  g.cols = T;
  g.inner = hs;
  g.y_transposed = true;
  g.x_type = g.y_type = g.out_type = CUDA_R_16BF;
  g.batch = static_cast<int32_t>(heads);
  g.stride_x = g.stride_y = T * hs;
  g.stride_out = T * T;
  const GemmSpec s = row_major_gemm(g);
  const GemmDescriptors d = make_gemm_descriptors(s);
  check_desc(d.matmul.get(), {CUBLAS_OP_T, CUBLAS_OP_N});
  check_layout(d.a.get(), {CUDA_R_16BF, hs, T, hs, static_cast<int32_t>(heads), T * hs});
  check_layout(d.b.get(), {CUDA_R_16BF, hs, T, hs, static_cast<int32_t>(heads), T * hs});
  check_layout(d.c.get(), {CUDA_R_16BF, T, T, T, static_cast<int32_t>(heads), T * T});
  check_layout(d.d.get(), {CUDA_R_16BF, T, T, T, static_cast<int32_t>(heads), T * T});
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

TEST_CASE("fp8 validation names E5M2 x E5M2 and non-TN layouts and misaligned leading dimensions",
          "[cuda][matmul]") {
  SECTION("E5M2 x E5M2") {
    const GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, CUDA_R_16BF);
    CHECK_THAT(rejection(s), Contains("E5M2 x E5M2 is not supported"));
  }
  SECTION("an NN dgrad over the untransposed weight") {
    const GemmSpec s = linear_dgrad_gemm(N, C, OC, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, false);
    CHECK_THAT(rejection(s), Contains("TN layout") && Contains("got NN"));
  }
  SECTION("an NT wgrad over the untransposed operands") {
    const GemmSpec s = linear_wgrad_gemm(N, C, OC, CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUDA_R_16BF, false);
    CHECK_THAT(rejection(s), Contains("TN layout") && Contains("got NT"));
  }
  SECTION("a contraction of 40 gives lda = 40") {
    const GemmSpec s = linear_forward_gemm(N, 40, OC, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
    CHECK_THAT(rejection(s), Contains("A (lda) is 40 elements of e4m3") && Contains("multiple of 16"));
  }
  SECTION("100 output features give bf16 C and D columns of 200 bytes") {
    const GemmSpec s = linear_forward_gemm(N, C, 100, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
    CHECK_THAT(rejection(s), Contains("C (ldc) is 100 elements of bf16 (200 bytes)"));
    GemmSpec d_only = s;
    d_only.ldc = 128;  // a separate, aligned C: D is the one left
    CHECK_THAT(rejection(d_only), Contains("D (ldd) is 100 elements of bf16 (200 bytes)"));
  }
  SECTION("fp8 with a non-fp8 operand and scales on non-fp8 operands") {
    const GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_8F_E4M3, CUDA_R_16BF);
    CHECK_THAT(rejection(s), Contains("needs both A and B in FP8"));
    GemmSpec t = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
    t.a_scale = GemmScale::tensor;
    CHECK_THAT(rejection(t), Contains("scale factors apply to FP8 operands only"));
    GemmSpec f = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
    f.fast_accum = true;
    CHECK_THAT(rejection(f), Contains("fast accumulation applies to FP8 GEMMs only"));
  }
  SECTION("non-fp8 GEMMs accept odd sizes") {
    CHECK(gemm_spec_problem(linear_forward_gemm(7, 19, 3, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F)).empty());
    CHECK(gemm_spec_problem(linear_dgrad_gemm(7, 19, 3, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false)).empty());
  }
}

TEST_CASE("other spec problems are named", "[cuda][matmul]") {
  GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
  GemmSpec bad = s;
  bad.lda = 10;
  CHECK_THAT(rejection(bad), Contains("lda = 10 is smaller than A's 48 rows"));
  bad = s;
  bad.epilogue = CUBLASLT_EPILOGUE_RELU;
  CHECK_THAT(rejection(bad), Contains("is not used by ptrain"));
  bad = s;
  bad.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  bad.aux_ld = 100;
  CHECK_THAT(rejection(bad), Contains("multiple of 8"));
  bad = s;
  bad.d_type = CUDA_R_16F;
  bad.c_type = CUDA_R_16F;
  CHECK_THAT(rejection(bad), Contains("bf16 inputs need a bf16 or fp32 output"));
  bad = s;
  bad.amax_d = true;
  CHECK_THAT(rejection(bad), Contains("amax of D is computed by FP8 GEMMs only"));
  bad = s;
  bad.batch = 2;
  bad.epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK_THAT(rejection(bad), Contains("epilogues are not supported on batched GEMMs"));
}

TEST_CASE("call arguments are checked against the spec", "[cuda][matmul]") {
  auto at = [](uintptr_t address) { return reinterpret_cast<void*>(address); };
  GemmSpec s = linear_forward_gemm(N, C, OC, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF);
  s.a_scale = s.b_scale = GemmScale::tensor;
  GemmArgs args;
  args.a = at(0x10000);
  args.b = at(0x20000);
  args.d = at(0x30000);
  const float* scale = static_cast<const float*>(at(0x40000));
  args.a_scale_inv = scale;
  args.b_scale_inv = scale;
  CHECK(gemm_args_problem(s, args).empty());
  // The alignment cuBLASLt's heuristic is promised: the pointers' own, up to its 256-byte maximum.
  CHECK(gemm_pointer_alignment(args) == 256);
  GemmArgs sixteen = args;
  sixteen.b = at(0x20010);
  CHECK(gemm_pointer_alignment(sixteen) == 16);

  GemmArgs misaligned = args;
  misaligned.a = at(0x10008);
  CHECK_THAT(args_rejection(s, misaligned), Contains("pointer A") && Contains("not 16-byte aligned"));

  GemmArgs unscaled = args;
  unscaled.b_scale_inv = nullptr;
  CHECK_THAT(args_rejection(s, unscaled), Contains("b_scale_inv is null"));

  GemmArgs no_bias = args;
  GemmSpec with_bias = s;
  with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK_THAT(args_rejection(with_bias, no_bias), Contains("needs a bias pointer"));

  GemmSpec fp8_out = linear_forward_gemm(N, C, OC, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3);
  fp8_out.a_scale = fp8_out.b_scale = GemmScale::tensor;
  GemmArgs accumulate = args;
  accumulate.beta = 1;
  CHECK_THAT(args_rejection(fp8_out, accumulate), Contains("FP8 output cannot be accumulated into"));

  GemmArgs amax = args;
  amax.amax_d = static_cast<float*>(at(0x50000));
  CHECK_THAT(args_rejection(s, amax), Contains("does not ask for the amax of D"));

  // Non-FP8 GEMMs only need element alignment; the plan cache keys on the alignment class.
  const GemmSpec f32 = linear_forward_gemm(7, 19, 3, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
  GemmArgs odd;
  odd.a = at(0x10004);
  odd.b = at(0x20000);
  odd.d = at(0x30008);
  CHECK(gemm_args_problem(f32, odd).empty());
  CHECK(gemm_pointer_alignment(odd) == 4);
  odd.a = at(0x10002);
  CHECK_THAT(args_rejection(f32, odd), Contains("pointer A") && Contains("not 4-byte aligned"));
}

TEST_CASE("specs compare and hash by every field", "[cuda][matmul]") {
  const GemmSpec a = linear_forward_gemm(N, C, OC, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF);
  GemmSpec b = a;
  CHECK(a == b);
  CHECK(GemmSpecHash()(a) == GemmSpecHash()(b));
  b.epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK(a != b);
  b = a;
  b.stride_d = 1;
  CHECK(a != b);
  CHECK_THAT(describe_gemm(a), Contains("TN m=96 n=64 k=48") && Contains("bf16"));
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

TEST_CASE("a CudaError from cudaErrorInsufficientDriver names the status and file:line", "[cuda][errors]") {
  const CudaError direct("CUDA", 35, "cudaErrorInsufficientDriver", "driver too old", "cudaGetDeviceCount(&n)",
                         "src/backend/device.cpp", 41);
  CHECK_THAT(std::string(direct.what()), Contains("CUDA error cudaErrorInsufficientDriver (35): driver too old") &&
                                             Contains("cudaGetDeviceCount(&n)") &&
                                             Contains("src/backend/device.cpp:41"));

  int line = 0;
  try {
    line = __LINE__ + 1;
    PTRAIN_CUDA_CHECK(static_cast<cudaError_t>(35));
    FAIL("PTRAIN_CUDA_CHECK did not throw");
  } catch (const CudaError& e) {
    CHECK(e.library() == "CUDA");
    CHECK(e.status() == 35);
    CHECK(e.status_name() == "cudaErrorInsufficientDriver");
    CHECK(e.line() == line);
    CHECK_THAT(e.file(), Contains("test_cuda_matmul.cpp"));
    CHECK_THAT(std::string(e.what()), Contains("cudaErrorInsufficientDriver (35)") &&
                                          Contains("test_cuda_matmul.cpp:" + std::to_string(line)) &&
                                          Contains("static_cast<cudaError_t>(35)"));
  }
  CHECK_THROWS_AS([] { PTRAIN_CUDA_CHECK(cudaErrorInsufficientDriver); }(), EnvironmentError);
}

TEST_CASE("an out-of-memory CudaError says so plainly", "[cuda][errors]") {
  CHECK_THROWS_WITH([] { PTRAIN_CUDA_CHECK(cudaErrorMemoryAllocation); }(),
                    Contains("cudaErrorMemoryAllocation (2): out of GPU memory"));
}

TEST_CASE("cuBLASLt and cuDNN statuses become CudaErrors with their names", "[cuda][errors]") {
  try {
    PTRAIN_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL("PTRAIN_CUBLAS_CHECK did not throw");
  } catch (const CudaError& e) {
    CHECK(e.library() == "cuBLASLt");
    CHECK(e.status() == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(e.status_name() == "CUBLAS_STATUS_NOT_SUPPORTED");
    CHECK_THAT(std::string(e.what()), Contains("cuBLASLt error CUBLAS_STATUS_NOT_SUPPORTED (15)"));
  }
  try {
    PTRAIN_CUDNN_CHECK(CUDNN_STATUS_NOT_INITIALIZED);
    FAIL("PTRAIN_CUDNN_CHECK did not throw");
  } catch (const CudaError& e) {
    CHECK(e.library() == "cuDNN");
    CHECK(e.status() == 1001);
    CHECK_THAT(e.status_name(), Contains("CUDNN_STATUS_NOT_INITIALIZED"));
  }
  CHECK_NOTHROW([] { PTRAIN_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }());
  CHECK_NOTHROW([] { PTRAIN_CUDNN_CHECK(CUDNN_STATUS_SUCCESS); }());
  CHECK_NOTHROW([] { PTRAIN_CUDA_CHECK(cudaSuccess); }());
}

TEST_CASE("Matmul reports a missing GPU as a CudaError from cublasLtCreate", "[cuda][matmul]") {
  if (have_gpu()) {
    Matmul matmul(nullptr, 0);
    CHECK(matmul.cached_plans() == 0);
    CHECK(matmul.handle() != nullptr);
  } else {
    CHECK_THROWS_AS(Matmul(nullptr, 0), CudaError);
    CHECK_THROWS_WITH(Matmul(nullptr, 0), Contains("cublasLtCreate") && Contains("CUBLAS_STATUS_NOT_INITIALIZED"));
  }
}

#endif  // PTRAIN_HAVE_CUDA

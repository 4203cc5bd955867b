// The linear layers' GEMMs through cuBLASLt (matmul.h). cuBLASLt has no f32 x f32 -> bf16 (or
// bf16 x bf16 -> f16) GEMM, so such a product is computed into FP32 scratch and
// kernels::gemm_finish adds it (and the bias) into the output, rounding once: the CPU's
// arithmetic (FP32 accumulation, one rounding of old + product). Bias gradients are a kernel of
// their own, in a fixed order (deterministic, unlike cuBLASLt's BGRAD epilogues).
#include "backend/cuda/cuda_backend_impl.h"

#include "convert.cuh"
#include "elementwise.cuh"

namespace ptrain::cuda_impl {

void CudaBackend::matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const char* op = "matmul_forward";
  expect_floats(op, {{"out", &out}, {"inp", &inp}, {"weight", &weight}}, {{"bias", &bias}});
  PTRAIN_EXPECT(weight.ndim == 2, op, "weight must be (OC, C), got " + weight.shape_string());
  const int64_t OC = weight.dim(0), C = weight.dim(1);
  const int64_t N = C > 0 ? inp.numel() / C : 0;
  PTRAIN_EXPECT(
      C > 0 && last_dim(inp) == C && out.numel() == N * OC && (bias.empty() || bias.numel() == OC), op,
      "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string() + " out " + out.shape_string());
  if (N == 0 || OC == 0) return;
  Staged st(*this);
  const DType ab = inp.dtype == weight.dtype ? inp.dtype : DType::f32;
  const Tensor x = st.in(inp, ab), w = st.in(weight, ab), o = st.out(out, out.dtype, false);
  const GemmSpec spec = linear_forward_gemm(N, C, OC, cuda_type(ab), cuda_type(ab), cuda_type(ab), compute_for(ab));
  gemm_into(st, spec, w.data, x.data, ab, o, false, bias);
  st.finish();
}

void CudaBackend::matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  const char* op = "matmul_backward";
  expect_floats(op, {{"dout", &dout}, {"weight", &weight}},
                {{"dinp", &dinp}, {"dweight", &dweight}, {"dbias", &dbias}, {"inp", &inp}});
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

void CudaBackend::bias_backward(Tensor dbias, Tensor dout) {
  const char* op = "bias_backward";
  expect_floats(op, {{"dbias", &dbias}, {"dout", &dout}});
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
void CudaBackend::matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias) {
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

void CudaBackend::matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                                       Tensor weight, Tensor pre, Tensor dgelu) {
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

// out (spec.n rows, spec.m columns, row-major) = A/B product [+ bias(columns)], or += it with
// `accumulate`. A and B have dtype ab. cuBLASLt writes out directly where it has the type
// pair (ab -> ab, bf16/f16 -> f32), with the bias through the BIAS epilogue when every type
// agrees; otherwise the product goes to FP32 scratch and kernels::gemm_finish adds it in.
void CudaBackend::gemm_into(Staged& st, GemmSpec spec, const void* a, const void* b, DType ab, const Tensor& out,
                            bool accumulate, const Tensor& bias) {
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
    // GEMM (Matmul's alignment class covers every pointer): it is added afterwards instead. So is
    // one cuBLASLt refuses with the BIAS epilogue (it refuses operands of one row or column,
    // decoding's single position among them): the plain GEMM runs, then the bias kernel.
    bool fused_bias = !bias.empty() && !accumulate && bias.dtype == out.dtype && out.dtype == ab &&
                      reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
    if (fused_bias) {
      GemmSpec with_bias = spec;
      with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
      GemmArgs bias_args = args;
      bias_args.bias = bias.data;
      fused_bias = matmul_->try_run(with_bias, bias_args, stream_);
    }
    if (!fused_bias) matmul_->run(spec, args, stream_);
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
void CudaBackend::batched_gemm(DType dt, int64_t batch, int64_t rows, int64_t cols, int64_t inner, bool x_transposed,
                               bool y_transposed, const void* x, int64_t stride_x, const void* y, int64_t stride_y,
                               void* out, int64_t stride_out) {
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
bool CudaBackend::gelu_epilogue_fits(std::initializer_list<const Tensor*> operands, const Tensor& bias) {
  const DType dt = (*operands.begin())->dtype;
  if (dt != DType::bf16 && dt != DType::f16) return false;
  const auto fits = [dt](const Tensor& t) { return t.device == Device::cuda && t.dtype == dt && !needs_rounding(t); };
  for (const Tensor* t : operands)
    if (t->empty() || !fits(*t)) return false;
  return bias.empty() || (fits(bias) && reinterpret_cast<uintptr_t>(bias.data) % 16 == 0);
}

// dbias(OC) += column sums of dout(N, OC), read in dout's dtype (kernels::bias_backward: partial
// sums per 32 rows, then the slices in order) and added into FP32 gradients as they are.
void CudaBackend::bias_backward_into(Staged& st, const Tensor& dbias, const Tensor& dout, int64_t N, int64_t OC) {
  const char* op = "bias_backward";
  const int n = to_int(N, op, "rows"), oc = to_int(OC, op, "OC");
  const DType dt = dout.dtype, gt = gradient_dtype(dbias, dt);
  const Tensor db = st.out(dbias, gt, true);
  float* partial = scratch_floats(kPartials, kernels::bias_backward_scratch_floats(n, oc));
  with_float_type(dt, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    with_gradient_type<T>(gt, [&](auto grad_tag) {
      PTRAIN_ELEMENT_TYPE(G, grad_tag);
      kernels::bias_backward<T, G>(db.as<G>(), partial, dout.as<T>(), n, oc, stream_);
    });
  });
}

}  // namespace ptrain::cuda_impl

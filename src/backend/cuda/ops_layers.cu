// The ops that run one kernel template of kernels/ each (embedding, layernorm, GELU, add, the
// fused classifier, AdamW): checks, then staging and dispatch through run_staged and the launch
// (AdamW, whose operands are never staged, dispatches directly).
#include "backend/cuda/cuda_backend_impl.h"

#include "core/error.h"
#include "classifier.cuh"
#include "elementwise.cuh"
#include "encoder.cuh"
#include "layernorm.cuh"
#include "optimizer.cuh"

namespace ptrain::cuda_impl {

void CudaBackend::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) {
  const char* op = "embedding_forward";
  expect_floats(op, {{"out", &out}, {"wte", &wte}}, {{"wpe", &wpe}});
  expect_tokens(op, "tokens", tokens);
  PTRAIN_EXPECT(out.ndim == 3 && wte.ndim == 2 && (wpe.empty() || wpe.ndim == 2), op,
                "expected out (B,T,C), wte (V,C) and wpe (maxT,C) or none");
  const int64_t B = out.dim(0), Tn = out.dim(1), C = out.dim(2);
  PTRAIN_EXPECT(tokens.numel() == B * Tn && wte.dim(1) == C && (wpe.empty() || (wpe.dim(1) == C && wpe.dim(0) >= Tn)),
                op,
                "shape mismatch: out " + out.shape_string() + " tokens " + tokens.shape_string() + " wte " +
                    wte.shape_string() + " wpe " + wpe.shape_string());
  if (out.numel() == 0) return;
  to_int(B * Tn, op, "B*T");
  check_token_range(op, tokens, wte.dim(0));
  const DType dt = wte.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, dt, false), pe = wpe.empty() ? Tensor() : st.in(wpe, dt);
    kernels::encoder_forward<T>(o.as<T>(), tokens.as<int>(), wte.as<T>(), pe.empty() ? nullptr : pe.as<T>(),
                                static_cast<int>(B),
                                static_cast<int>(Tn), to_int(C, op, "C"), stream_);
  });
}

void CudaBackend::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) {
  const char* op = "embedding_backward";
  expect_floats(op, {{"dwte", &dwte}, {"dout", &dout}}, {{"dwpe", &dwpe}});
  expect_tokens(op, "tokens", tokens);
  PTRAIN_EXPECT(dout.ndim == 3 && dwte.ndim == 2 && (dwpe.empty() || dwpe.ndim == 2), op,
                "expected dout (B,T,C), dwte (V,C), dwpe (maxT,C) or none");
  const int64_t B = dout.dim(0), Tn = dout.dim(1), C = dout.dim(2);
  PTRAIN_EXPECT(tokens.numel() == B * Tn && dwte.dim(1) == C &&
                    (dwpe.empty() || (dwpe.dim(1) == C && dwpe.dim(0) >= Tn)),
                op,
                "shape mismatch: dout " + dout.shape_string() + " tokens " + tokens.shape_string() + " dwte " +
                    dwte.shape_string() + " dwpe " + dwpe.shape_string());
  if (dout.numel() == 0) return;
  to_int(B * Tn, op, "B*T");
  const DeviceBuckets& buckets = buckets_for(tokens);
  // The model checks the tokens on the host (Transformer::check_tokens): one out of range here is a bug.
  PTRAIN_EXPECT(buckets.max_id < dwte.dim(0), op,
                "token id " + std::to_string(buckets.max_id) + " is not below the " + std::to_string(dwte.dim(0)) +
                    " rows of the token embedding (vocabulary size)");
  const DType dt = dout.dtype, gt = gradient_dtype(dwte, dt);
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor te = st.out(dwte, gt, true), pe = dwpe.empty() ? Tensor() : st.out(dwpe, gt, true);
    with_gradient_type<T>(gt, [&](auto grad_tag) {
      PTRAIN_ELEMENT_TYPE(G, grad_tag);
      kernels::encoder_backward<T, G>(te.as<G>(), pe.empty() ? nullptr : pe.as<G>(), dout.as<T>(), buckets.packed,
                                      static_cast<int>(B), static_cast<int>(Tn), to_int(C, op, "C"), stream_);
    });
  });
}

void CudaBackend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias) {
  const char* op = "layernorm_forward";
  expect_floats(op, {{"out", &out}, {"inp", &inp}, {"weight", &weight}, {"bias", &bias}});
  expect_stats(op, mean, rstd);
  const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
  PTRAIN_EXPECT(C > 0 && out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
                    bias.numel() == C,
                op, "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string());
  if (N == 0) return;
  const DType dt = inp.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, dt, false), w = st.in(weight, dt), b = st.in(bias, dt);
    kernels::layernorm_forward<T>(o.as<T>(), mean.as<float>(), rstd.as<float>(), inp.as<T>(), w.as<T>(), b.as<T>(),
                                  to_int(N, op, "rows"), to_int(C, op, "C"), stream_);
  });
}

void CudaBackend::layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                                     Tensor mean, Tensor rstd) {
  const char* op = "layernorm_backward";
  expect_floats(
      op,
      {{"dinp", &dinp}, {"dweight", &dweight}, {"dbias", &dbias}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}});
  expect_stats(op, mean, rstd);
  const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
  PTRAIN_EXPECT(C > 0 && dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C && dbias.numel() == C &&
                    weight.numel() == C && mean.numel() == N && rstd.numel() == N,
                op, "shape mismatch: inp " + inp.shape_string() + " dinp " + dinp.shape_string());
  PTRAIN_EXPECT(dinp.data != dout.data, op, "dinp must not alias dout");
  if (N == 0) return;
  const int n = to_int(N, op, "rows"), c = to_int(C, op, "C");
  const DType dt = inp.dtype, gt = gradient_dtype(dweight, dt);
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor di = st.out(dinp, dt, true), dw = st.out(dweight, gt, true), db = st.out(dbias, gt, true);
    const Tensor d = st.in(dout, dt), w = st.in(weight, dt);
    float* partial = scratch_floats(kPartials, kernels::layernorm_backward_scratch_floats(n, c));
    with_gradient_type<T>(gt, [&](auto grad_tag) {
      PTRAIN_ELEMENT_TYPE(G, grad_tag);
      kernels::layernorm_backward<T, G>(di.as<T>(), dw.as<G>(), db.as<G>(), partial, d.as<T>(), inp.as<T>(),
                                        w.as<T>(), mean.as<float>(), rstd.as<float>(), n, c, stream_);
    });
  });
}

void CudaBackend::expect_stats(const char* op, const Tensor& mean, const Tensor& rstd) const {
  PTRAIN_EXPECT(!mean.empty() && !rstd.empty() && mean.device == Device::cuda && rstd.device == Device::cuda &&
                    mean.dtype == DType::f32 && rstd.dtype == DType::f32,
                op, "mean and rstd must be f32 tensors in device memory");
}

void CudaBackend::gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  const int64_t n = elementwise_size(op, {{"inp", &inp}, {"out", &out}});
  if (n == 0) return;
  run_staged(op, inp.dtype, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, inp.dtype, false);
    kernels::gelu_forward<T>(o.as<T>(), inp.as<T>(), static_cast<size_t>(n), stream_);
  });
}

void CudaBackend::gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "gelu_backward";
  const int64_t n = elementwise_size(op, {{"inp", &inp}, {"dinp", &dinp}, {"dout", &dout}});
  if (n == 0) return;
  run_staged(op, inp.dtype, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor di = st.out(dinp, inp.dtype, true), d = st.in(dout, inp.dtype);
    kernels::gelu_backward<T>(di.as<T>(), inp.as<T>(), d.as<T>(), static_cast<size_t>(n), stream_);
  });
}

void CudaBackend::add(Tensor out, Tensor a, Tensor b) {
  const char* op = "add";
  const int64_t n = elementwise_size(op, {{"a", &a}, {"b", &b}, {"out", &out}});
  if (n == 0) return;
  run_staged(op, a.dtype, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, a.dtype, false), bb = st.in(b, a.dtype);
    kernels::add<T>(o.as<T>(), a.as<T>(), bb.as<T>(), static_cast<size_t>(n), stream_);
  });
}

void CudaBackend::classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) {
  const char* op = "classifier";
  expect_floats(op, {{"logits", &logits}, {"losses", &losses}});
  expect_tokens(op, "targets", targets);
  const int64_t Vp = last_dim(logits), N = Vp > 0 ? logits.numel() / Vp : 0;
  PTRAIN_EXPECT(Vp > 0 && losses.numel() == N && targets.numel() == N && vocab > 0 && vocab <= Vp, op,
                "shape mismatch: logits " + logits.shape_string() + " losses " + losses.shape_string() + " vocab " +
                    std::to_string(vocab));
  if (N == 0) return;
  run_staged(op, logits.dtype, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor lg = st.out(logits, logits.dtype, true), ls = st.out(losses, DType::f32, false);
    kernels::fused_classifier<T>(lg.as<T>(), ls.as<float>(), targets.as<int>(), to_int(N, op, "rows"), vocab,
                                 to_int(Vp, op, "padded vocabulary"), dloss, stream_);
  });
}

// kernels::adamw_update repeats the CPU's expressions. The low-precision copy is written in
// the same pass when it has the gradient's dtype and needs no further rounding; otherwise
// copy() writes it afterwards, as the CPU backend does.
void CudaBackend::adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor param_copy) {
  const char* op = "adamw";
  expect_floats(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}}, {{"param_copy", &param_copy}});
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

}  // namespace ptrain::cuda_impl

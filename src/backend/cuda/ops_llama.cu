// The ops of a Llama-style block (kernels/llama.cuh): RMSNorm, QK-norm, RoPE in place, SwiGLU. Checks,
// then staging and dispatch through run_staged, as for the GPT-2 block's ops (ops_layers.cu).
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/attention_heads.h"
#include "core/error.h"
#include "llama.cuh"

namespace ptrain::cuda_impl {

namespace {

void expect_rstd(const char* op, const Tensor& rstd, int64_t N) {
  PTRAIN_EXPECT(!rstd.empty() && rstd.device == Device::cuda && rstd.dtype == DType::f32 && rstd.numel() == N, op,
                "rstd must be an f32 tensor of " + std::to_string(N) + " elements in device memory, got " +
                    rstd.shape_string());
}

}  // namespace

void CudaBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  const char* op = "rmsnorm_forward";
  expect_floats(op, {{"out", &out}, {"inp", &inp}, {"weight", &weight}});
  const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
  PTRAIN_EXPECT(C > 0 && out.numel() == N * C && weight.numel() == C && eps >= 0, op,
                "shape mismatch: inp " + inp.shape_string() + " out " + out.shape_string() + " weight " +
                    weight.shape_string());
  expect_rstd(op, rstd, N);
  if (N == 0) return;
  const DType dt = inp.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, dt, false), w = st.in(weight, dt);
    kernels::rmsnorm_forward<T>(o.as<T>(), rstd.as<float>(), inp.as<T>(), w.as<T>(), to_int(N, op, "rows"),
                                to_int(C, op, "C"), eps, stream_);
  });
}

void CudaBackend::rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  const char* op = "rmsnorm_backward";
  expect_floats(op, {{"dinp", &dinp}, {"dweight", &dweight}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}});
  const int64_t C = last_dim(inp), N = C > 0 ? inp.numel() / C : 0;
  PTRAIN_EXPECT(C > 0 && dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C && weight.numel() == C,
                op, "shape mismatch: inp " + inp.shape_string() + " dinp " + dinp.shape_string());
  expect_rstd(op, rstd, N);
  PTRAIN_EXPECT(dinp.data != dout.data, op, "dinp must not alias dout");
  if (N == 0) return;
  const int n = to_int(N, op, "rows"), c = to_int(C, op, "C");
  const DType dt = inp.dtype, gt = gradient_dtype(dweight, dt);
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor di = st.out(dinp, dt, true), dw = st.out(dweight, gt, true);
    const Tensor d = st.in(dout, dt), w = st.in(weight, dt);
    float* partial = scratch_floats(kPartials, kernels::rmsnorm_backward_scratch_floats(n, c));
    with_gradient_type<T>(gt, [&](auto grad_tag) {
      PTRAIN_ELEMENT_TYPE(G, grad_tag);
      kernels::rmsnorm_backward<T, G>(di.as<T>(), dw.as<G>(), partial, d.as<T>(), inp.as<T>(), w.as<T>(),
                                      rstd.as<float>(), n, c, stream_);
    });
  });
}

void CudaBackend::qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor q_weight, Tensor k_weight, int n_head,
                                  float eps) {
  const char* op = "qk_norm_forward";
  expect_floats(op, {{"out", &out}, {"inp", &inp}, {"q_weight", &q_weight}, {"k_weight", &k_weight}});
  const AttentionHeads h = qk_norm_heads(op, inp, q_weight, k_weight, rstd, n_head);
  PTRAIN_EXPECT(out.numel() == inp.numel() && eps >= 0, op,
                "shape mismatch: inp " + inp.shape_string() + " out " + out.shape_string());
  const int64_t N = inp.numel() / h.row_width();
  expect_rstd(op, rstd, N * (h.n_head + h.n_kv_head));
  if (N == 0) return;
  const DType dt = inp.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, dt, false), qw = st.in(q_weight, dt), kw = st.in(k_weight, dt);
    kernels::qk_norm_forward<T>(o.as<T>(), rstd.as<float>(), inp.as<T>(), qw.as<T>(), kw.as<T>(), to_int(N, op, "rows"), to_int(h.n_head, op, "n_head"),
                                to_int(h.n_kv_head, op, "n_kv_head"), to_int(h.head_size, op, "head size"), eps,
                                stream_);
  });
}

void CudaBackend::qk_norm_backward(Tensor dinp, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor inp,
                                   Tensor q_weight, Tensor k_weight, Tensor rstd, int n_head) {
  const char* op = "qk_norm_backward";
  expect_floats(op, {{"dinp", &dinp}, {"dq_weight", &dq_weight}, {"dk_weight", &dk_weight}, {"dout", &dout},
                     {"inp", &inp}, {"q_weight", &q_weight}, {"k_weight", &k_weight}});
  const AttentionHeads h = qk_norm_heads(op, inp, q_weight, k_weight, rstd, n_head);
  PTRAIN_EXPECT(dinp.numel() == inp.numel() && dout.numel() == inp.numel() && dq_weight.numel() == h.head_size &&
                    dk_weight.numel() == h.head_size,
                op, "shape mismatch: inp " + inp.shape_string() + " dinp " + dinp.shape_string());
  const int64_t N = inp.numel() / h.row_width();
  expect_rstd(op, rstd, N * (h.n_head + h.n_kv_head));
  PTRAIN_EXPECT(dinp.data != dout.data, op, "dinp must not alias dout");
  if (N == 0) return;
  const int n = to_int(N, op, "rows"), nh = to_int(h.n_head, op, "n_head"), kv = to_int(h.n_kv_head, op, "n_kv_head"),
            hs = to_int(h.head_size, op, "head size");
  const DType dt = inp.dtype, gt = gradient_dtype(dq_weight, dt);
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor di = st.out(dinp, dt, true), dqw = st.out(dq_weight, gt, true), dkw = st.out(dk_weight, gt, true);
    const Tensor d = st.in(dout, dt), qw = st.in(q_weight, dt), kw = st.in(k_weight, dt);
    float* partial = scratch_floats(kPartials, kernels::qk_norm_backward_scratch_floats(n, nh, hs));
    with_gradient_type<T>(gt, [&](auto grad_tag) {
      PTRAIN_ELEMENT_TYPE(G, grad_tag);
      kernels::qk_norm_backward<T, G>(di.as<T>(), dqw.as<G>(), dkw.as<G>(), partial, d.as<T>(), inp.as<T>(),
                                      qw.as<T>(), kw.as<T>(), rstd.as<float>(), n, nh, kv, hs, stream_);
    });
  });
}

void CudaBackend::rope_forward(Tensor x, Tensor table, int heads) { rope("rope_forward", x, table, heads, false); }
void CudaBackend::rope_backward(Tensor dx, Tensor table, int heads) { rope("rope_backward", dx, table, heads, true); }

void CudaBackend::rope(const char* op, const Tensor& x, const Tensor& table, int heads, bool inverse) {
  expect_floats(op, {{"x", &x}});
  const int64_t half = table.ndim == 3 ? table.dim(1) : 0;
  PTRAIN_EXPECT(x.ndim == 3 && table.dtype == DType::f32 && table.device == Device::cuda && half > 0 &&
                    table.dim(2) == 2 && table.dim(0) >= x.dim(1) && heads > 0 && heads * 2 * half <= x.dim(2),
                op,
                "shape mismatch: x " + x.shape_string() + " (want (B,T,width)) table " + table.shape_string() +
                    " (want f32 (T,hs/2,2) in device memory) for " + std::to_string(heads) + " heads");
  const int64_t rows = x.dim(0) * x.dim(1);
  if (rows == 0) return;
  const DType dt = x.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor v = st.out(x, dt, true);  // read and written in place
    kernels::rope<T>(v.as<T>(), table.as<float>(), to_int(rows, op, "rows"), to_int(x.dim(1), op, "T"),
                     to_int(x.dim(2), op, "width"), heads, to_int(half, op, "head size"), inverse, stream_);
  });
}

void CudaBackend::swiglu_forward(Tensor out, Tensor gate_up) {
  const char* op = "swiglu_forward";
  expect_floats(op, {{"out", &out}, {"gate_up", &gate_up}});
  const int64_t H = last_dim(gate_up) / 2, N = H > 0 ? gate_up.numel() / (2 * H) : 0;
  PTRAIN_EXPECT(H > 0 && last_dim(gate_up) == 2 * H && out.numel() == N * H, op,
                "shape mismatch: gate_up " + gate_up.shape_string() + " (want (N,2H)) out " + out.shape_string() +
                    " (want (N,H))");
  if (N == 0) return;
  const DType dt = gate_up.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, dt, false);
    kernels::swiglu_forward<T>(o.as<T>(), gate_up.as<T>(), to_int(N, op, "rows"), to_int(H, op, "H"), stream_);
  });
}

void CudaBackend::swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) {
  const char* op = "swiglu_backward";
  expect_floats(op, {{"dgate_up", &dgate_up}, {"dout", &dout}, {"gate_up", &gate_up}});
  const int64_t H = last_dim(gate_up) / 2, N = H > 0 ? gate_up.numel() / (2 * H) : 0;
  PTRAIN_EXPECT(H > 0 && last_dim(gate_up) == 2 * H && dgate_up.numel() == gate_up.numel() && dout.numel() == N * H,
                op, "shape mismatch: gate_up " + gate_up.shape_string() + " dgate_up " + dgate_up.shape_string() +
                        " dout " + dout.shape_string());
  if (N == 0) return;
  const DType dt = gate_up.dtype;
  run_staged(op, dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor dg = st.out(dgate_up, dt, true), d = st.in(dout, dt);
    kernels::swiglu_backward<T>(dg.as<T>(), d.as<T>(), gate_up.as<T>(), to_int(N, op, "rows"), to_int(H, op, "H"),
                                stream_);
  });
}

}  // namespace ptrain::cuda_impl

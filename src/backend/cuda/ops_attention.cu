// Causal self-attention two ways. The fallback is ptrain's own chain of kernels and batched
// GEMMs (permute, q k^T, causal softmax, att v, unpermute) that saves the (B,NH,T,T)
// probabilities; the fused path is cuDNN's flash attention (cudnn_attention.h), saving one
// log-sum-exp per row. choose_attention takes the fused path only after checking it against
// the fallback on the run's own shape.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "attention.cuh"
#include "core/tensor.h"
#include "elementwise.cuh"

namespace ptrain::cuda_impl {

static float attention_scale(int64_t HS) { return 1.0f / std::sqrt(static_cast<float>(HS)); }  // the CPU's expression

// The saved tensor's shape picks the path: (B,NH,T) FP32 log-sum-exps are the fused path's.
void CudaBackend::attention_forward(Tensor out, Tensor att, Tensor qkv, int n_head) {
  const char* op = "attention_forward";
  expect_floats(op, {{"out", &out}, {"att", &att}, {"qkv", &qkv}});
  PTRAIN_EXPECT(qkv.ndim == 3, op, "qkv must be (B,T,W), got " + qkv.shape_string());
  const AttentionHeads heads = attention_heads(op, qkv, out, n_head);
  const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = heads.q_width(), NH = n_head;
  const bool fused = is_fused_saved(att, B, NH, Tn);
  PTRAIN_EXPECT(out.numel() == B * Tn * C && (fused || att.numel() == B * NH * Tn * Tn), op,
                "shape mismatch: qkv " + qkv.shape_string() + " out " + out.shape_string() + " saved " +
                    att.shape_string() + " (want (B,NH,T,T) probabilities or (B,NH,T) f32 log-sum-exps)");
  if (B * Tn * C == 0) return;
  if (fused) return fused_attention_forward(out, att, qkv, sdpa_shape(op, qkv, out, B, Tn, heads));
  const int64_t HS = heads.head_size, BNH = B * NH;
  const int b = to_int(B, op, "B"), tn = to_int(Tn, op, "T"), hs = to_int(HS, op, "head size");
  const int kv = static_cast<int>(heads.n_kv_head);
  to_int(BNH * Tn, op, "attention rows");
  Staged st(*this);
  const DType dt = qkv.dtype;
  const Tensor o = st.out(out, dt, false), a = st.out(att, dt, false);
  const size_t n = static_cast<size_t>(B * Tn * C) * dtype_size(dt);
  void* q = scratch(kAttnQ, n);
  void* k = scratch(kAttnK, n);
  void* v = scratch(kAttnV, n);
  void* y = scratch(kAttnY, n);
  const float scale = attention_scale(HS);
  with_float_type(dt, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::attention_permute<T>(static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), qkv.as<T>(), b, tn,
                                  n_head, kv, hs, stream_);
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
void CudaBackend::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor att, int n_head) {
  const char* op = "attention_backward";
  expect_floats(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"att", &att}});
  PTRAIN_EXPECT(qkv.ndim == 3, op, "qkv must be (B,T,W), got " + qkv.shape_string());
  const AttentionHeads heads = attention_heads(op, qkv, dout, n_head);
  const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = heads.q_width(), NH = n_head;
  const bool fused = is_fused_saved(att, B, NH, Tn);
  PTRAIN_EXPECT(
      dqkv.numel() == qkv.numel() && dout.numel() == B * Tn * C &&
          (fused || att.numel() == B * NH * Tn * Tn),
      op,
      "shape mismatch: qkv " + qkv.shape_string() + " dout " + dout.shape_string() + " saved " + att.shape_string());
  if (B * Tn * C == 0) return;
  if (fused) {
    PTRAIN_EXPECT(!out.empty() && out.numel() == B * Tn * C, op,
                  "the fused path needs the forward's output (B,T,C), got " + out.shape_string());
    expect_float(op, "out", out);
    return fused_attention_backward(dqkv, dout, qkv, out, att, sdpa_shape(op, qkv, out, B, Tn, heads));
  }
  const int64_t HS = heads.head_size, BNH = B * NH;
  const int b = to_int(B, op, "B"), tn = to_int(Tn, op, "T"), hs = to_int(HS, op, "head size");
  const int kv = static_cast<int>(heads.n_kv_head);
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
                                  n_head, kv, hs, stream_);
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
                                           static_cast<const T*>(dv), b, tn, n_head, kv, hs, stream_);
  });
  st.finish();
}

// Decoding's one query row runs ptrain's own kernel whichever path the training forward takes.
void CudaBackend::attention_decode(Tensor out, Tensor qkv, int n_head) {
  const char* op = "attention_decode";
  expect_floats(op, {{"out", &out}, {"qkv", &qkv}});
  PTRAIN_EXPECT(qkv.ndim == 2 && qkv.dim(0) > 0, op, "qkv must be (T,W) with T >= 1, got " + qkv.shape_string());
  const AttentionHeads heads = attention_heads(op, qkv, out, n_head);
  const int64_t n = qkv.dim(0), C = heads.q_width(), HS = heads.head_size;
  PTRAIN_EXPECT(out.numel() == C && HS <= kernels::kAttentionDecodeMaxThreads, op,
                "shape mismatch: qkv " + qkv.shape_string() + " out " + out.shape_string() + " with " +
                    std::to_string(n_head) + " heads (want C elements, head size at most " +
                    std::to_string(kernels::kAttentionDecodeMaxThreads) + ")");
  run_staged(op, qkv.dtype, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor o = st.out(out, qkv.dtype, false);
    kernels::attention_decode<T>(o.as<T>(), qkv.as<T>(), to_int(n, op, "T"), n_head, static_cast<int>(heads.n_kv_head),
                                 to_int(HS, op, "head size"), attention_scale(HS), stream_);
  });
}

SdpaShape CudaBackend::sdpa_shape(const char* op, const Tensor& qkv, const Tensor& out, int64_t B, int64_t Tn,
                                  const AttentionHeads& heads) const {
  PTRAIN_EXPECT(cudnn_ != nullptr, op, "the fused attention path was not chosen (choose_attention)");
  PTRAIN_EXPECT((qkv.dtype == DType::bf16 || qkv.dtype == DType::f16) && out.dtype == qkv.dtype, op,
                "the fused path takes bf16 or fp16 qkv and out of one dtype");
  return SdpaShape{B, Tn, heads.n_head, heads.n_kv_head, heads.head_size, cuda_type(qkv.dtype)};
}

void CudaBackend::fused_attention_forward(const Tensor& out, const Tensor& stats, const Tensor& qkv,
                                          const SdpaShape& s) {
  void* workspace = scratch(kCudnnWorkspace, cudnn_->workspace_bytes(s));
  cudnn_->forward(s, out.data, stats.as<float>(), qkv.data, attention_scale(s.HS), workspace);
  if (needs_rounding(out)) convert(out, out, out.format);
}

// cuDNN reads q, k and v in place from qkv; its backward writes dq, dk and dv into scratch, which
// is then added into dqkv (backward ops accumulate).
void CudaBackend::fused_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                           const Tensor& stats, const SdpaShape& s) {
  const DType dt = qkv.dtype;
  run_staged("attention_backward", dt, [&](Staged& st, auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    const Tensor d = st.in(dout, dt);
    const size_t n = static_cast<size_t>(qkv.numel());
    void* grads = scratch(kAttnDqkv, n * dtype_size(dt));
    void* workspace = scratch(kCudnnWorkspace, cudnn_->workspace_bytes(s));
    cudnn_->backward(s, grads, d.data, qkv.data, out.data, stats.as<float>(), attention_scale(s.HS), workspace);
    const Tensor dx = st.out(dqkv, dt, true);
    kernels::add<T>(dx.as<T>(), dx.as<T>(), static_cast<const T*>(grads), n, stream_);
  });
}

AttentionChoice CudaBackend::choose_attention(AttentionRequest want, DType dtype, int64_t B, int64_t Tn, int n_head,
                                              int n_kv_head, int64_t head_size) {
  if (want == AttentionRequest::fallback) return {AttentionPath::fallback, "fallback (model.attention: fallback)"};
  const bool required = want == AttentionRequest::cudnn;
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
  const SdpaShape s{B, Tn, n_head, n_kv_head, head_size, cuda_type(dtype)};
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

void CudaBackend::drop_attention_scratch() {
  for (const Slot slot : {kAttnQ, kAttnK, kAttnV, kAttnY, kAttnDatt, kAttnDq, kAttnDk, kAttnDv}) {
    ScratchBuffer& b = scratch_[static_cast<size_t>(slot)];
    if (b.ptr) arena_->release(b.ptr);
    b = ScratchBuffer{};
  }
}

// Runs both paths once on seeded inputs of shape s and compares out and each of dq, dk and dv
// (a wrong grouped K/V gradient must not hide behind a right dq); returns what differs ("" when
// they agree). The composite cuDNN graph is only as right as its strides and
// modes: checking it on the run's own shape costs one attention call and keeps a wrong graph
// from training a model.
std::string CudaBackend::check_fused_attention(const SdpaShape& s) {
  const DType dt = s.type == CUDA_R_16F ? DType::f16 : DType::bf16;
  const Format f = dt == DType::f16 ? Format::fp16 : Format::bf16;
  const int64_t C = s.NH * s.HS, KVC = s.KV * s.HS, W = C + 2 * KVC;
  const int64_t n_qkv = s.B * s.T * W, n_out = s.B * s.T * C;
  std::vector<float> host_qkv(static_cast<size_t>(n_qkv)), host_dout(static_cast<size_t>(n_out));
  Rng rng(/*seed=*/7);
  for (float& x : host_qkv) x = 2.0f * rng.uniform() - 1.0f;
  for (float& x : host_dout) x = 2.0f * rng.uniform() - 1.0f;
  std::vector<void*> blocks;
  const auto tensor = [&](std::vector<int64_t> shape, DType type, Format format) {
    blocks.push_back(allocate(static_cast<size_t>(shape_numel(shape)) * dtype_size(type)));
    return Tensor(blocks.back(), type, shape, Device::cuda).with_format(format);
  };
  std::string result;
  try {
    const Tensor qkv = tensor({s.B, s.T, W}, dt, f), dout = tensor({s.B, s.T, C}, dt, f);
    const Tensor out_f = tensor({s.B, s.T, C}, dt, f), out_r = tensor({s.B, s.T, C}, dt, f);
    const Tensor lse = tensor({s.B, s.NH, s.T}, DType::f32, Format::fp32);
    const Tensor probs = tensor({s.B, s.NH, s.T, s.T}, dt, f);
    const Tensor dqkv_f = tensor({s.B, s.T, W}, dt, f), dqkv_r = tensor({s.B, s.T, W}, dt, f);
    upload(qkv, host_qkv.data());
    upload(dout, host_dout.data());
    const int nh = static_cast<int>(s.NH);
    attention_forward(out_f, lse, qkv, nh);
    attention_backward(dqkv_f, dout, qkv, out_f, lse, nh);
    attention_forward(out_r, probs, qkv, nh);
    attention_backward(dqkv_r, dout, qkv, out_r, probs, nh);
    // Relative L2 error of columns [begin, end) of every row of `width` elements.
    const auto relative_error = [&](const Tensor& got, const Tensor& want, int64_t width, int64_t begin,
                                    int64_t end) {
      std::vector<float> g(static_cast<size_t>(got.numel())), w(g.size());
      download(g.data(), got);
      download(w.data(), want);
      double diff = 0, norm = 0;
      for (size_t row = 0; row < g.size() / static_cast<size_t>(width); ++row)
        for (int64_t c = begin; c < end; ++c) {
          const size_t i = row * static_cast<size_t>(width) + static_cast<size_t>(c);
          diff += (double(g[i]) - w[i]) * (double(g[i]) - w[i]);
          norm += double(w[i]) * w[i];
        }
      return std::sqrt(diff / std::max(norm, 1e-30));  // NaN stays NaN: it never passes
    };
    // Both paths round their bf16/fp16 operands alike; they differ in accumulation order.
    const double tolerance = 2e-2, e_out = relative_error(out_f, out_r, C, 0, C);
    const double e_dq = relative_error(dqkv_f, dqkv_r, W, 0, C), e_dk = relative_error(dqkv_f, dqkv_r, W, C, C + KVC),
                 e_dv = relative_error(dqkv_f, dqkv_r, W, C + KVC, W);
    if (!(e_out <= tolerance && e_dq <= tolerance && e_dk <= tolerance && e_dv <= tolerance))
      result = "cuDNN's attention differs from the fallback on this shape (relative error " + std::to_string(e_out) +
               " in the output, " + std::to_string(e_dq) + " / " + std::to_string(e_dk) + " / " +
               std::to_string(e_dv) + " in the q / k / v gradients; tolerance " + std::to_string(tolerance) + ")";
  } catch (...) {
    for (void* b : blocks) release(b);
    throw;
  }
  for (void* b : blocks) release(b);
  return result;
}

}  // namespace ptrain::cuda_impl

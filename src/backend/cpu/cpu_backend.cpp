// The CPU reference backend: the ops of layer_ops.h, attention_ops.h, classifier_ops.h and
// format_ops.h, each a template over the element type so the same code runs in float (training)
// and double (gradient checks by finite differences), GEMMs through OpenBLAS in a decomposition
// fixed by their shape (gemm.h). Every op gives each output element to one thread and sums in a
// fixed order, so results do not depend on the thread count. This file checks operands, picks
// the element type, rounds outputs to their formats and charges each op to the profile.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/attention_heads.h"
#include "backend/cpu/attention_ops.h"
#include "backend/cpu/classifier_ops.h"
#include "backend/cpu/format_ops.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/layer_ops.h"
#include "backend/cpu/llama_ops.h"
#include "precision/fp8_scaling.h"
#include "precision/formats.h"

namespace ptrain {
namespace {

using cpu::worth_threads;
using cpu::kReduceChunk;

// Rounds an op's output to its format's grid. With `counters`, also counts gradient values that
// the rounding flushed to zero. Only float storage can hold reduced-precision values.
void round_output(OpProfile* profile, const Tensor& t, GradNumerics* counters = nullptr) {
  if (t.format == Format::fp32 || t.empty()) return;
  const OpScope scope(profile, OpFamily::rounding);
  PTRAIN_CHECK(t.dtype == DType::f32, "reduced-precision values need f32 storage on the CPU");
  int64_t nonzero = 0, underflow = 0;
  cpu::round_in_place(t.as<float>(), t.numel(), t.format, &nonzero, &underflow);
  if (counters) {
    counters->elements += t.numel();
    counters->nonzero += nonzero;
    counters->underflow += underflow;
  }
}

void expect(bool ok, const char* op, const std::string& what) {
  PTRAIN_CHECK(ok, std::string(op) + ": " + what);
}

void expect_same_float_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  DType first = (*ts.begin())->dtype;
  for (const Tensor* t : ts) {
    if (t->empty()) continue;
    expect(t->dtype == first && (first == DType::f32 || first == DType::f64), op,
           "operands must share dtype f32 or f64");
    expect(t->device == Device::cpu, op, "operand is not in host memory");
  }
}

// ---------------------------------------------------------------------------- matmul

// A GEMM charged to the profile's GEMM family, with its shape and FLOPs.
template <typename T>
void profiled_gemm(OpProfile* profile, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                   const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (!profile) return gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
  const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " " +
                            (ta ? "T" : "N") + (tb ? "T" : "N");
  double seconds;
  {
    const OpScope scope(profile, OpFamily::gemm);  // the GEMM alone, as its shape's time below
    const auto t0 = profile->now();
    gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
    seconds = std::chrono::duration<double>(profile->now() - t0).count();
  }
  profile->add_gemm(shape, 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K), seconds);
}

template <typename T>
void matmul_forward_impl(OpProfile* profile, T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C,
                         int64_t OC) {
  profiled_gemm(profile, false, true, N, OC, C, inp, C, w, C, T(0), out, OC);
  if (!bias) return;
  const OpScope scope(profile, OpFamily::bias);
  cpu::bias_forward(out, bias, N, OC);
}

template <typename T>
void matmul_backward_impl(OpProfile* profile, T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w,
                          int64_t N, int64_t C, int64_t OC) {
  if (dinp) profiled_gemm(profile, false, false, N, C, OC, dout, OC, w, C, T(1), dinp, C);  // dinp += dout w
  if (dw) profiled_gemm(profile, true, false, OC, C, N, dout, OC, inp, C, T(1), dw, C);     // dw += dout^T inp
  if (!dbias) return;
  const OpScope scope(profile, OpFamily::bias);
  cpu::bias_backward(dbias, dout, N, OC);
}

// ---------------------------------------------------------------------------- the backend

// Calls fn with the element type of `t` (float or double).
template <typename Fn>
void dispatch(const Tensor& t, Fn&& fn) {
  if (t.dtype == DType::f64)
    fn(double{});
  else
    fn(float{});
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    if (threads > 0) omp_set_num_threads(threads);
    // OpenBLAS keeps its own pool: give it the same thread count as OpenMP.
    openblas_set_num_threads(omp_get_max_threads());
  }

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  std::string description() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads, OpenBLAS " + openblas_get_corename() +
           " kernels)";
  }

  std::vector<std::string> performance_warnings() const override {
    // OpenBLAS falls back to SSE3-era kernels on CPUs newer than its release: GEMMs then run
    // several times slower than the CPU allows. Only the user can choose to override that.
    const std::string core = openblas_get_corename();
    const bool generic = core == "Prescott" || core == "Core2" || core == "Nehalem" || core == "Sandybridge";
    if (!generic || !__builtin_cpu_supports("avx2")) return {};
    const char* suggestion = __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
    return {"OpenBLAS does not recognise this CPU and runs its generic " + core +
            " kernels although the CPU has AVX2" + (__builtin_cpu_supports("avx512f") ? "/AVX-512" : "") +
            "; GEMMs may run several times faster with OPENBLAS_CORETYPE=" + suggestion +
            " in the environment (check the results with ./scripts/test.sh first)"};
  }

  DType storage_for(Format, DType compute) const override { return compute; }

  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* ptr) override { std::free(ptr); }
  void zero(Tensor t) override {
    const OpScope scope(profile_, OpFamily::memory);
    // In 1 MiB pieces shared among threads: one thread alone does not saturate memory.
    constexpr size_t kPiece = size_t{1} << 20;
    char* bytes = static_cast<char*>(t.data);
    const size_t n = t.bytes(), pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (size_t p = 0; p < pieces; ++p) std::memset(bytes + p * kPiece, 0, std::min(kPiece, n - p * kPiece));
  }

  void upload(Tensor dst, const float* src) override {
    const OpScope scope(profile_, OpFamily::memory);
    if (dst.dtype == DType::f64)
      std::copy(src, src + dst.numel(), dst.as<double>());
    else
      std::copy(src, src + dst.numel(), dst.as<float>());
  }
  void download(float* dst, Tensor src) override {
    const OpScope scope(profile_, OpFamily::memory);
    if (src.dtype == DType::f64)
      std::transform(src.as<double>(), src.as<double>() + src.numel(), dst,
                     [](double x) { return static_cast<float>(x); });
    else
      std::copy(src.as<float>(), src.as<float>() + src.numel(), dst);
  }
  void upload_tokens(Tensor dst, const int32_t* src) override {
    const OpScope scope(profile_, OpFamily::memory);
    expect(dst.dtype == DType::i32, "upload_tokens", "destination must be i32");
    std::copy(src, src + dst.numel(), dst.as<int32_t>());
  }

  void copy(Tensor dst, Tensor src) override {
    const OpScope scope(profile_, OpFamily::memory);
    expect_same_float_dtype("copy", {&dst, &src});
    expect(dst.numel() == src.numel(), "copy", "shape mismatch");
    std::memcpy(dst.data, src.data, dst.bytes());
    round_output(profile_, dst);
  }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    const OpScope scope(profile_, OpFamily::embedding);
    expect_same_float_dtype("embedding_forward", {&out, &wte, &wpe});
    const int64_t B = out.dim(0), Tn = out.dim(1), C = out.dim(2);
    expect(tokens.dtype == DType::i32 && tokens.numel() == B * Tn && wte.dim(1) == C &&
               (wpe.empty() || (wpe.dim(1) == C && wpe.dim(0) >= Tn)),
           "embedding_forward", "shape mismatch");
    dispatch(out, [&](auto z) {
      using T = decltype(z);
      cpu::embedding_forward<T>(out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), wpe.empty() ? nullptr : wpe.as<T>(), B,
                                Tn, C);
    });
    round_output(profile_, out);
  }

  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    const OpScope scope(profile_, OpFamily::embedding);
    expect_same_float_dtype("embedding_backward", {&dout, &dwte, &dwpe});
    const int64_t B = dout.dim(0), Tn = dout.dim(1), C = dout.dim(2);
    expect(tokens.numel() == B * Tn && dwte.dim(1) == C && (dwpe.empty() || dwpe.dim(1) == C), "embedding_backward",
           "shape mismatch");
    dispatch(dout, [&](auto z) {
      using T = decltype(z);
      cpu::embedding_backward<T>(dwte.as<T>(), dwpe.empty() ? nullptr : dwpe.as<T>(), dout.as<T>(),
                                 tokens.as<int32_t>(), B, Tn, C);
    });
    round_output(profile_, dwte, &grad_numerics_);
    if (!dwpe.empty()) round_output(profile_, dwpe, &grad_numerics_);
  }

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight,
                         Tensor bias) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("layernorm_forward", {&out, &mean, &rstd, &inp, &weight, &bias});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
               bias.numel() == C,
           "layernorm_forward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::layernorm_forward<T>(out.as<T>(), mean.as<T>(), rstd.as<T>(), inp.as<T>(), weight.as<T>(),
                                bias.as<T>(), N, C);
    });
    round_output(profile_, out);
  }

  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("layernorm_backward", {&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C &&
               dbias.numel() == C && mean.numel() == N && rstd.numel() == N,
           "layernorm_backward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::layernorm_backward<T>(dinp.as<T>(), dweight.as<T>(), dbias.as<T>(), dout.as<T>(), inp.as<T>(),
                                 weight.as<T>(), mean.as<T>(), rstd.as<T>(), N, C);
    });
    round_output(profile_, dinp, &grad_numerics_);
    round_output(profile_, dweight, &grad_numerics_);
    round_output(profile_, dbias, &grad_numerics_);
  }

  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) override {
    expect_same_float_dtype("matmul_forward", {&out, &inp, &weight, &bias});
    const int64_t OC = weight.dim(0), C = weight.dim(1), N = inp.numel() / C;
    expect(inp.dim(-1) == C && out.numel() == N * OC && (bias.empty() || bias.numel() == OC),
           "matmul_forward", "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string());
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      matmul_forward_impl<T>(profile_, out.as<T>(), inp.as<T>(), weight.as<T>(), bias.empty() ? nullptr : bias.as<T>(), N, C, OC);
    });
    round_output(profile_, out);
  }

  void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                       Tensor weight) override {
    expect_same_float_dtype("matmul_backward", {&dinp, &dweight, &dbias, &dout, &inp, &weight});
    const int64_t OC = weight.dim(0), C = weight.dim(1), N = inp.numel() / C;
    expect((dinp.empty() || dinp.numel() == N * C) && dout.numel() == N * OC &&
               (dweight.empty() || dweight.numel() == OC * C) && (dbias.empty() || dbias.numel() == OC),
           "matmul_backward", "shape mismatch");
    auto ptr = [](const Tensor& t, auto z) { return t.empty() ? nullptr : t.as<decltype(z)>(); };
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      matmul_backward_impl<T>(profile_, ptr(dinp, z), ptr(dweight, z), ptr(dbias, z), dout.as<T>(), inp.as<T>(),
                              weight.as<T>(), N, C, OC);
    });
    round_output(profile_, dinp, &grad_numerics_);
    round_output(profile_, dweight, &grad_numerics_);
    round_output(profile_, dbias, &grad_numerics_);
  }

  void bias_backward(Tensor dbias, Tensor dout) override {
    const OpScope scope(profile_, OpFamily::bias);
    expect_same_float_dtype("bias_backward", {&dbias, &dout});
    const int64_t OC = dbias.numel(), N = dout.numel() / OC;
    expect(dout.dim(-1) == OC, "bias_backward", "shape mismatch");
    dispatch(dout, [&](auto z) {
      using T = decltype(z);
      cpu::bias_backward<T>(dbias.as<T>(), dout.as<T>(), N, OC);
    });
    round_output(profile_, dbias, &grad_numerics_);
  }

  void attention_forward(Tensor out, Tensor att, Tensor qkv, int n_head) override {
    const OpScope scope(profile_, OpFamily::attention);
    expect_same_float_dtype("attention_forward", {&out, &att, &qkv});
    expect(qkv.ndim == 3, "attention_forward", "qkv must be (B,T,W), got " + qkv.shape_string());
    const AttentionHeads heads = attention_heads("attention_forward", qkv, out, n_head);
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1);
    expect(out.numel() == B * Tn * heads.q_width() && att.numel() == B * n_head * Tn * Tn,
           "attention_forward", "shape mismatch");
    dispatch(qkv, [&](auto z) {
      using T = decltype(z);
      cpu::attention_forward<T>(out.as<T>(), att.as<T>(), qkv.as<T>(), B, Tn, heads);
    });
    round_output(profile_, out);
    round_output(profile_, att);
  }

  void attention_decode(Tensor out, Tensor qkv, int n_head) override {
    const OpScope scope(profile_, OpFamily::attention);
    expect_same_float_dtype("attention_decode", {&out, &qkv});
    expect(qkv.ndim == 2 && qkv.dim(0) > 0, "attention_decode",
           "shape mismatch: qkv " + qkv.shape_string() + " (want (T,W), T >= 1)");
    const AttentionHeads heads = attention_heads("attention_decode", qkv, out, n_head);
    expect(out.numel() == heads.q_width(), "attention_decode",
           "out " + out.shape_string() + " is not one row of n_head * head_size elements");
    dispatch(qkv, [&](auto z) {
      using T = decltype(z);
      cpu::attention_decode<T>(out.as<T>(), qkv.as<T>(), qkv.dim(0), heads);
    });
    round_output(profile_, out);
  }

  // `out` serves the fused path only: the probabilities saved in `att` make it unnecessary here.
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor /*out*/, Tensor att, int n_head) override {
    const OpScope scope(profile_, OpFamily::attention);
    expect_same_float_dtype("attention_backward", {&dqkv, &dout, &qkv, &att});
    expect(qkv.ndim == 3, "attention_backward", "qkv must be (B,T,W), got " + qkv.shape_string());
    const AttentionHeads heads = attention_heads("attention_backward", qkv, dout, n_head);
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1);
    expect(dqkv.numel() == qkv.numel() && dout.numel() == B * Tn * heads.q_width() &&
               att.numel() == B * n_head * Tn * Tn,
           "attention_backward", "shape mismatch");
    dispatch(qkv, [&](auto z) {
      using T = decltype(z);
      cpu::attention_backward<T>(dqkv.as<T>(), dout.as<T>(), qkv.as<T>(), att.as<T>(), B, Tn, heads);
    });
    round_output(profile_, dqkv, &grad_numerics_);
  }

  AttentionChoice choose_attention(AttentionRequest want, DType, int64_t, int64_t, int, int, int64_t) override {
    if (want == AttentionRequest::cudnn)
      throw UserError("model.attention: cudnn runs on the CUDA backend only; this run uses the CPU backend "
                      "(use model.attention: auto or fallback, or run.device: cuda)");
    return {AttentionPath::fallback, "fallback (the CPU backend's reference attention)"};
  }

  void gelu_forward(Tensor out, Tensor inp) override {
    const OpScope scope(profile_, OpFamily::activations);
    expect_same_float_dtype("gelu_forward", {&out, &inp});
    expect(out.numel() == inp.numel(), "gelu_forward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::gelu_forward<T>(out.as<T>(), inp.as<T>(), inp.numel());
    });
    round_output(profile_, out);
  }

  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    const OpScope scope(profile_, OpFamily::activations);
    expect_same_float_dtype("gelu_backward", {&dinp, &inp, &dout});
    expect(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "gelu_backward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::gelu_backward<T>(dinp.as<T>(), inp.as<T>(), dout.as<T>(), inp.numel());
    });
    round_output(profile_, dinp, &grad_numerics_);
  }

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("rmsnorm_forward", {&out, &rstd, &inp, &weight});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(out.numel() == N * C && rstd.numel() == N && weight.numel() == C && eps >= 0, "rmsnorm_forward",
           "shape mismatch: inp " + inp.shape_string() + " out " + out.shape_string() + " rstd " + rstd.shape_string() +
               " weight " + weight.shape_string());
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::rmsnorm_forward<T>(out.as<T>(), rstd.as<T>(), inp.as<T>(), weight.as<T>(), N, C, static_cast<T>(eps));
    });
    round_output(profile_, out);
  }

  void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("rmsnorm_backward", {&dinp, &dweight, &dout, &inp, &weight, &rstd});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C && weight.numel() == C &&
               rstd.numel() == N,
           "rmsnorm_backward", "shape mismatch");
    expect(dinp.data != dout.data, "rmsnorm_backward", "dinp must not alias dout (dinp is added to row by row)");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::rmsnorm_backward<T>(dinp.as<T>(), dweight.as<T>(), dout.as<T>(), inp.as<T>(), weight.as<T>(), rstd.as<T>(),
                               N, C);
    });
    round_output(profile_, dinp, &grad_numerics_);
    round_output(profile_, dweight, &grad_numerics_);
  }

  void qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor q_weight, Tensor k_weight, int n_head,
                       float eps) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("qk_norm_forward", {&out, &rstd, &inp, &q_weight, &k_weight});
    const AttentionHeads h = qk_norm_heads("qk_norm_forward", inp, q_weight, k_weight, rstd, n_head);
    expect(out.numel() == inp.numel() && eps >= 0, "qk_norm_forward",
           "shape mismatch: inp " + inp.shape_string() + " out " + out.shape_string());
    const int64_t N = inp.numel() / h.row_width();
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::qk_norm_forward<T>(out.as<T>(), rstd.as<T>(), inp.as<T>(), q_weight.as<T>(), k_weight.as<T>(), N,
                              h.n_head, h.n_kv_head, h.head_size, static_cast<T>(eps));
    });
    round_output(profile_, out);
  }

  void qk_norm_backward(Tensor dinp, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor inp, Tensor q_weight,
                        Tensor k_weight, Tensor rstd, int n_head) override {
    const OpScope scope(profile_, OpFamily::norms);
    expect_same_float_dtype("qk_norm_backward", {&dinp, &dq_weight, &dk_weight, &dout, &inp, &q_weight, &k_weight, &rstd});
    const AttentionHeads h = qk_norm_heads("qk_norm_backward", inp, q_weight, k_weight, rstd, n_head);
    expect(dinp.numel() == inp.numel() && dout.numel() == inp.numel() && dq_weight.numel() == h.head_size &&
               dk_weight.numel() == h.head_size,
           "qk_norm_backward", "shape mismatch");
    expect(dinp.data != dout.data, "qk_norm_backward", "dinp must not alias dout (dinp is added to row by row)");
    const int64_t N = inp.numel() / h.row_width();
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      cpu::qk_norm_backward<T>(dinp.as<T>(), dq_weight.as<T>(), dk_weight.as<T>(), dout.as<T>(), inp.as<T>(),
                               q_weight.as<T>(), k_weight.as<T>(), rstd.as<T>(), N, h.n_head, h.n_kv_head,
                               h.head_size);
    });
    round_output(profile_, dinp, &grad_numerics_);
    round_output(profile_, dq_weight, &grad_numerics_);
    round_output(profile_, dk_weight, &grad_numerics_);
  }

  void rope_forward(Tensor x, Tensor table, int heads) override { rope("rope_forward", x, table, heads, 1); }
  void rope_backward(Tensor dx, Tensor table, int heads) override { rope("rope_backward", dx, table, heads, -1); }

  void swiglu_forward(Tensor out, Tensor gate_up) override {
    const OpScope scope(profile_, OpFamily::activations);
    expect_same_float_dtype("swiglu_forward", {&out, &gate_up});
    const int64_t H = gate_up.dim(-1) / 2, N = gate_up.numel() / std::max<int64_t>(1, 2 * H);
    expect(gate_up.dim(-1) == 2 * H && H > 0 && out.numel() == N * H, "swiglu_forward",
           "shape mismatch: gate_up " + gate_up.shape_string() + " (want (N,2H)) out " + out.shape_string() +
               " (want (N,H))");
    dispatch(gate_up, [&](auto z) {
      using T = decltype(z);
      cpu::swiglu_forward<T>(out.as<T>(), gate_up.as<T>(), N, H);
    });
    round_output(profile_, out);
  }

  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) override {
    const OpScope scope(profile_, OpFamily::activations);
    expect_same_float_dtype("swiglu_backward", {&dgate_up, &dout, &gate_up});
    const int64_t H = gate_up.dim(-1) / 2, N = gate_up.numel() / std::max<int64_t>(1, 2 * H);
    expect(gate_up.dim(-1) == 2 * H && H > 0 && dgate_up.numel() == gate_up.numel() && dout.numel() == N * H,
           "swiglu_backward", "shape mismatch");
    dispatch(gate_up, [&](auto z) {
      using T = decltype(z);
      cpu::swiglu_backward<T>(dgate_up.as<T>(), dout.as<T>(), gate_up.as<T>(), N, H);
    });
    round_output(profile_, dgate_up, &grad_numerics_);
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    const OpScope scope(profile_, OpFamily::residual);
    expect_same_float_dtype("add", {&out, &a, &b});
    expect(out.numel() == a.numel() && a.numel() == b.numel(), "add", "shape mismatch");
    dispatch(out, [&](auto z) {
      using T = decltype(z);
      cpu::add<T>(out.as<T>(), a.as<T>(), b.as<T>(), out.numel());
    });
    round_output(profile_, out);
  }

  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override {
    const OpScope scope(profile_, OpFamily::classifier);
    expect_same_float_dtype("classifier", {&logits, &losses});
    const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
    expect(losses.numel() == N && targets.numel() == N && targets.dtype == DType::i32 && vocab <= Vp,
           "classifier", "shape mismatch");
    dispatch(logits, [&](auto z) {
      using T = decltype(z);
      cpu::classifier<T>(logits.as<T>(), losses.as<T>(), targets.as<int32_t>(), N, Vp, vocab, static_cast<T>(dloss));
    });
    if (dloss != 0) round_output(profile_, logits, &grad_numerics_);
  }

  double sum(Tensor t) override {
    const OpScope scope(profile_, OpFamily::reductions);
    double result = 0;
    dispatch(t, [&](auto z) {
      using T = decltype(z);
      result = cpu::reduce(t.as<T>(), t.numel(), [](double x) { return x; });
    });
    return result;
  }

  void sum_into(Tensor out, Tensor t) override {
    expect(out.dtype == DType::f64 && out.numel() == 1, "sum_into", "out must be one f64 element");
    *out.as<double>() = sum(t);
  }

  void download_doubles(double* dst, Tensor src) override {
    const OpScope scope(profile_, OpFamily::memory);
    expect(src.dtype == DType::f64, "download_doubles", "src must be f64");
    std::copy(src.as<double>(), src.as<double>() + src.numel(), dst);
  }

  double sum_squares(Tensor t) override {
    const OpScope scope(profile_, OpFamily::reductions);
    double result = 0;
    dispatch(t, [&](auto z) {
      using T = decltype(z);
      result = cpu::reduce(t.as<T>(), t.numel(), [](double x) { return x * x; });
    });
    return result;
  }


  float amax(Tensor t) override {
    const OpScope scope(profile_, OpFamily::fp8_casts);
    expect(t.dtype == DType::f32, "amax", "f32 storage expected");
    return cpu::amax(t.as<float>(), t.numel());
  }

  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format format, float scale) override {
    const OpScope scope(profile_, OpFamily::fp8_casts);
    expect(in.dtype == DType::f32 && out.dtype == DType::f32 && out.numel() == in.numel() && is_fp8(format),
           "fp8_cast", "f32 storage of equal size and an fp8 format expected");
    const int64_t n = in.numel();
    const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
    std::vector<Fp8CastStats> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kReduceChunk, count = std::min(n, begin + kReduceChunk) - begin;
      cpu::fp8_cast_run(out.as<float>() + begin, in.as<float>() + begin, count, format, scale, partial[c]);
    }
    Fp8CastStats stats;
    for (const auto& p : partial) stats.merge(p);  // counts; the amax is the tensor's, below
    stats.amax = cpu::amax(in.as<float>(), n);
    return stats;
  }

  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows, int block_cols) override {
    const OpScope scope(profile_, OpFamily::fp8_casts);
    expect(in.dtype == DType::f32 && out.dtype == DType::f32 && out.numel() == in.numel() && is_fp8(format),
           "fp8_cast_blocks", "f32 storage of equal size and an fp8 format expected");
    const int64_t cols = in.dim(-1), rows = in.numel() / cols;
    const int64_t bands = (rows + block_rows - 1) / block_rows, bcols = (cols + block_cols - 1) / block_cols;
    const float max = format_max(format);
    std::vector<Fp8CastStats> partial(bands);
    const float* x = in.as<float>();
    float* y = out.as<float>();
    // One band of block_rows rows at a time, read row by row (contiguous) whatever the block
    // shape: first each block's amax, then the cast with each element's block scale.
#pragma omp parallel for schedule(static) if (worth_threads(rows * cols))
    for (int64_t band = 0; band < bands; ++band) {
      const int64_t r0 = band * block_rows, r1 = std::min(rows, r0 + block_rows);
      std::vector<float> block_amax(bcols, 0.0f);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          float& a = block_amax[c / block_cols];
          a = std::max(a, std::fabs(x[r * cols + c]));
        }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = 0; b < bcols; ++b) {
          const int64_t c0 = b * block_cols, n = std::min(cols, c0 + block_cols) - c0;
          cpu::fp8_cast_run(y + r * cols + c0, x + r * cols + c0, n, format, current_scale(block_amax[b], max),
                       partial[band]);
        }
    }
    Fp8CastStats stats;
    for (const auto& p : partial) stats.merge(p);  // counts; the amax is the tensor's, below
    stats.amax = cpu::amax(x, in.numel());
    return stats;
  }

  void fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int block_rows,
                        int block_cols) override {
    const OpScope scope(profile_, OpFamily::fp8_casts);
    expect(part.dtype == DType::f32 && first >= 0 && cols > 0 && block_rows > 0 && block_cols > 0, "fp8_block_amaxes",
           "f32 storage, a place in the tensor and positive block sizes expected");
    const int64_t bcols = (cols + block_cols - 1) / block_cols;
    const float* x = part.as<float>();
    for (int64_t i = 0; i < part.numel(); ++i) {
      const int64_t at = first + i;
      float& a = amaxes[at / cols / block_rows * bcols + at % cols / block_cols];
      a = std::max(a, std::fabs(x[i]));  // skips NaN, as fp8_cast_blocks does
    }
  }

  Fp8CastStats fp8_encode(Tensor out, Tensor part, Format format, const std::vector<float>& scales, int64_t first,
                          int64_t cols, int block_rows, int block_cols) override {
    const OpScope scope(profile_, OpFamily::fp8_casts);
    expect(part.dtype == DType::f32 && out.dtype == DType::f32 && out.numel() == part.numel() && is_fp8(format) &&
               !scales.empty() && first >= 0 && cols > 0 && block_rows > 0 && block_cols > 0,
           "fp8_encode", "f32 storage of equal size, an fp8 format, scales and positive block sizes expected");
    const int64_t n = part.numel(), bcols = (cols + block_cols - 1) / block_cols;
    const float* x = part.as<float>();
    float* y = out.as<float>();
    Fp8CastStats stats;
    // Runs of elements that share a scale: a whole part per tensor, a row's stretch of a block.
    for (int64_t i = 0; i < n;) {
      const int64_t at = first + i, col = at % cols;
      const int64_t len =
          scales.size() == 1 ? n : std::min({n - i, block_cols - col % block_cols, cols - col});
      const float scale = scales.size() == 1 ? scales[0] : scales.at(at / cols / block_rows * bcols + col / block_cols);
      cpu::fp8_cast_run(y + i, x + i, len, format, scale, stats);
      i += len;
    }
    stats.amax = cpu::amax(x, n);
    return stats;
  }

  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor param_copy) override {
    const OpScope scope(profile_, OpFamily::adamw);
    expect_same_float_dtype("adamw", {&param, &grad, &m, &v, &param_copy});
    expect(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel() &&
               (param_copy.empty() || param_copy.numel() == param.numel()),
           "adamw", "shape mismatch");
    dispatch(param, [&](auto z) {
      using T = decltype(z);
      cpu::adamw<T>(param.as<T>(), grad.as<T>(), m.as<T>(), v.as<T>(), param.numel(), p);
    });
    if (!param_copy.empty()) copy(param_copy, param);
  }

  bool set_profile(OpProfile* profile) override {
    profile_ = profile;
    return true;
  }

  GradNumerics take_grad_numerics() override {
    GradNumerics taken = grad_numerics_;
    grad_numerics_ = GradNumerics{};
    return taken;
  }

 private:
  // Both directions of RoPE: direction -1 turns each pair back.
  void rope(const char* op, Tensor x, Tensor table, int heads, int direction) {
    const OpScope scope(profile_, OpFamily::attention);
    expect_same_float_dtype(op, {&x});
    const int64_t half = table.ndim == 3 ? table.dim(1) : 0, hs = 2 * half;
    expect(x.ndim == 3 && table.dtype == DType::f32 && half > 0 && table.dim(2) == 2 && table.dim(0) >= x.dim(1) &&
               heads > 0 && heads * hs <= x.dim(2),
           op, "shape mismatch: x " + x.shape_string() + " (want (B,T,width)) table " + table.shape_string() +
                   " (want f32 (T,hs/2,2)) for " + std::to_string(heads) + " heads");
    dispatch(x, [&](auto z) {
      using T = decltype(z);
      cpu::rope_rotate<T>(x.as<T>(), table.as<float>(), x.dim(0), x.dim(1), x.dim(2), heads, hs, direction);
    });
    if (direction > 0)
      round_output(profile_, x);
    else
      round_output(profile_, x, &grad_numerics_);
  }

  GradNumerics grad_numerics_;
  OpProfile* profile_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace ptrain

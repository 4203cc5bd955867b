// The CPU reference backend. Readable loops with OpenMP, GEMMs through OpenBLAS. Every op is a
// template over the element type so the same code runs in float (training) and double
// (gradient checks by finite differences). Each parallel loop gives every output element to
// exactly one thread and sums in a fixed order, and GEMMs run in a decomposition fixed by their
// shape (gemm.h), so results do not depend on the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "precision/fp8_scaling.h"
#include "precision/formats.h"

namespace ptrain {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int64_t kReduceChunk = 1 << 14;  // fixed chunking: deterministic partial sums

// Below this many elements of work a parallel region costs more than it saves. Whether a loop
// runs threaded never changes its result: every output element has one owner either way.
inline bool worth_threads(int64_t work) { return work >= (1 << 15); }

// Rounds an op's output to its format's grid. With `counters`, also counts gradient values that
// the rounding flushed to zero. Only float storage can hold reduced-precision values.
void round_output(const Tensor& t, GradNumerics* counters = nullptr) {
  if (t.format == Format::fp32 || t.empty()) return;
  PTRAIN_CHECK(t.dtype == DType::f32, "reduced-precision values need f32 storage on the CPU");
  float* x = t.as<float>();
  const int64_t n = t.numel();
  const Format f = t.format;
  int64_t nonzero = 0, underflow = 0;
#pragma omp parallel for schedule(static) reduction(+ : nonzero, underflow) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const float r = round_to_format(x[i], f, /*saturate=*/false);
    // Values already on the grid (untouched rows of an accumulating gradient) are not counted.
    nonzero += x[i] != 0.0f && r != x[i];
    underflow += x[i] != 0.0f && r == 0.0f;
    x[i] = r;
  }
  if (counters) {
    counters->elements += n;
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

// ---------------------------------------------------------------------------- embedding

template <typename T>
void embedding_forward_impl(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                            int64_t Tn, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const T* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    const T* p = wpe + (bt % Tn) * C;
    T* o = out + bt * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <typename T>
void embedding_backward_impl(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                             int64_t Tn, int64_t C) {
  // Several positions can share a token: give each thread a range of channels and walk all
  // positions in order, so no two threads write the same element.
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t bt = 0; bt < B * Tn; ++bt) dwte[static_cast<int64_t>(tokens[bt]) * C + c] += dout[bt * C + c];
  }
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t t = 0; t < Tn; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const T* d = dout + (b * Tn + t) * C;
      for (int64_t c = 0; c < C; ++c) dwpe[t * C + c] += d[c];
    }
  }
}

// ---------------------------------------------------------------------------- layernorm

template <typename T>
void layernorm_forward_impl(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b,
                            int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T var = 0;
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= static_cast<T>(C);
    T s = 1 / std::sqrt(var + static_cast<T>(kLayerNormEps));
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void layernorm_backward_impl(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                             const T* mean, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dout + n * C;
    const T* x = inp + n * C;
    T m = mean[n], s = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      T norm = (x[c] - m) * s;
      T dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<T>(C);
    dnorm_norm_mean /= static_cast<T>(C);
    T* di = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      T norm = (x[c] - m) * s;
      T dnorm = w[c] * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  // Parameter gradients sum over rows: one thread per channel, rows in order.
#pragma omp parallel for schedule(static) if (worth_threads(N * C))
  for (int64_t c = 0; c < C; ++c) {
    T sw = 0, sb = 0;
    for (int64_t n = 0; n < N; ++n) {
      T d = dout[n * C + c];
      sw += d * (inp[n * C + c] - mean[n]) * rstd[n];
      sb += d;
    }
    dw[c] += sw;
    db[c] += sb;
  }
}

// ---------------------------------------------------------------------------- matmul

template <typename T>
void matmul_forward_impl(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C,
                         int64_t OC) {
  gemm(false, true, N, OC, C, T(1), inp, C, w, C, T(0), out, OC);
  if (!bias) return;
#pragma omp parallel for schedule(static) if (worth_threads(N * OC))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) out[n * OC + o] += bias[o];
}

template <typename T>
void bias_backward_impl(T* dbias, const T* dout, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (worth_threads(N * OC))
  for (int64_t o = 0; o < OC; ++o) {
    T s = 0;
    for (int64_t n = 0; n < N; ++n) s += dout[n * OC + o];
    dbias[o] += s;
  }
}

template <typename T>
void matmul_backward_impl(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w,
                          int64_t N, int64_t C, int64_t OC) {
  if (dinp) gemm(false, false, N, C, OC, T(1), dout, OC, w, C, T(1), dinp, C);  // dinp += dout w
  if (dw) gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dw, C);     // dw += dout^T inp
  if (dbias) bias_backward_impl(dbias, dout, N, OC);
}

// ---------------------------------------------------------------------------- attention

template <typename T>
void attention_forward_impl(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C,
                            int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = 1 / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for collapse(3) schedule(static) if (worth_threads(B * Tn * Tn * C))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        const T* q = qkv + (b * Tn + t) * 3 * C + h * hs;
        T* p = att + ((b * NH + h) * Tn + t) * Tn;
        T maxv = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const T* k = qkv + (b * Tn + t2) * 3 * C + C + h * hs;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          p[t2] = dot * scale;
          maxv = std::max(maxv, p[t2]);
        }
        T sum = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          p[t2] = std::exp(p[t2] - maxv);
          sum += p[t2];
        }
        T inv = 1 / sum;
        for (int64_t t2 = 0; t2 <= t; ++t2) p[t2] *= inv;
        for (int64_t t2 = t + 1; t2 < Tn; ++t2) p[t2] = 0;
        T* o = out + (b * Tn + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const T* v = qkv + (b * Tn + t2) * 3 * C + 2 * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] += p[t2] * v[i];
        }
      }
}

template <typename T>
void attention_backward_impl(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B,
                             int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = 1 / std::sqrt(static_cast<T>(hs));
  // dk and dv of a position collect from every later query: one thread owns a whole (b, h).
#pragma omp parallel for collapse(2) schedule(static) if (worth_threads(B * Tn * Tn * C))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      std::vector<T> dpre(Tn);
      for (int64_t t = 0; t < Tn; ++t) {
        const T* p = att + ((b * NH + h) * Tn + t) * Tn;
        const T* d = dout + (b * Tn + t) * C + h * hs;
        // d(probs) = dout . v, then through the softmax: dpre = p * (dp - sum(p * dp)).
        T pdp = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const T* v = qkv + (b * Tn + t2) * 3 * C + 2 * C + h * hs;
          T* dv = dqkv + (b * Tn + t2) * 3 * C + 2 * C + h * hs;
          T dp = 0;
#pragma omp simd reduction(+ : dp)
          for (int64_t i = 0; i < hs; ++i) {
            dp += d[i] * v[i];
            dv[i] += p[t2] * d[i];
          }
          dpre[t2] = dp;
          pdp += p[t2] * dp;
        }
        const T* q = qkv + (b * Tn + t) * 3 * C + h * hs;
        T* dq = dqkv + (b * Tn + t) * 3 * C + h * hs;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          T g = p[t2] * (dpre[t2] - pdp) * scale;
          const T* k = qkv + (b * Tn + t2) * 3 * C + C + h * hs;
          T* dk = dqkv + (b * Tn + t2) * 3 * C + C + h * hs;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += g * k[i];
            dk[i] += g * q[i];
          }
        }
      }
    }
}

// ---------------------------------------------------------------------------- gelu, add

template <typename T>
inline T gelu_inner(T x) {
  const T kBeta = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
  return kBeta * (x + static_cast<T>(0.044715) * x * x * x);
}

template <typename T>
void gelu_forward_impl(T* out, const T* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(0.5) * inp[i] * (1 + std::tanh(gelu_inner(inp[i])));
}

template <typename T>
void gelu_backward_impl(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T kBeta = static_cast<T>(0.7978845608028654);
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T th = std::tanh(gelu_inner(x));
    T sech2 = 1 - th * th;
    T dinner = kBeta * (1 + 3 * static_cast<T>(0.044715) * x * x);
    dinp[i] += dout[i] * (static_cast<T>(0.5) * (1 + th) + static_cast<T>(0.5) * x * sech2 * dinner);
  }
}

template <typename T>
void add_impl(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------------------- classifier

template <typename T>
void classifier_impl(T* logits, T* losses, const int32_t* targets, int64_t N, int64_t Vp, int64_t V,
                     T dloss) {
#pragma omp parallel for schedule(static) if (worth_threads(N * Vp))
  for (int64_t n = 0; n < N; ++n) {
    T* row = logits + n * Vp;
    T maxv = -INFINITY;
    for (int64_t i = 0; i < V; ++i) maxv = std::max(maxv, row[i]);
    const int64_t target = targets[n];
    const T target_logit = row[target];
    // One exp per element, kept in place: the row becomes the softmax numerators.
    T sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += (row[i] = std::exp(row[i] - maxv));
    losses[n] = std::log(sum) - (target_logit - maxv);
    const T scale = dloss / sum;
    for (int64_t i = 0; i < V; ++i) row[i] *= scale;
    row[target] -= dloss;
    for (int64_t i = V; i < Vp; ++i) row[i] = 0;
  }
}

// ---------------------------------------------------------------------------- reductions

// Sum of f(x[i]) in double: fixed chunks summed in parallel, then the chunks in order.
template <typename T, typename F>
double reduce_impl(const T* x, int64_t n, F f) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kReduceChunk; i < std::min(n, (c + 1) * kReduceChunk); ++i) s += f(static_cast<double>(x[i]));
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template <typename T>
void adamw_impl(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const T b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay;
  const T inv_bc1 = static_cast<T>(1.0 / bc1), inv_bc2 = static_cast<T>(1.0 / bc2);
  const T gs = p.grad_scale;
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] * gs;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    T mhat = m[i] * inv_bc1;
    T vhat = v[i] * inv_bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
  }
}

// ---------------------------------------------------------------------------- fp8 casts

float amax_impl(const float* x, int64_t n) {
  float m = 0;
  bool nan = false;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(|| : nan) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = std::max(m, std::fabs(x[i]));
  }
  return nan ? NAN : m;
}

// Casts one run of elements with one scale; adds to `stats` (amax is the caller's).
void fp8_cast_run(float* out, const float* in, int64_t n, Format f, float scale, Fp8CastStats& stats) {
  const float inv = 1.0f / scale;
  const float max = format_max(f);
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float q = round_to_format(x * scale, f, /*saturate=*/true);
    stats.nonzero += x != 0.0f;
    stats.underflow += x != 0.0f && q == 0.0f;
    // Clipped: beyond max, and beyond what round-to-nearest would still bring back to max.
    stats.saturated += std::fabs(x * scale) > max && !std::isfinite(round_to_format(x * scale, f, false));
    out[i] = q * inv;
  }
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
  void zero(Tensor t) override { std::memset(t.data, 0, t.bytes()); }

  void upload(Tensor dst, const float* src) override {
    if (dst.dtype == DType::f64)
      std::copy(src, src + dst.numel(), dst.as<double>());
    else
      std::copy(src, src + dst.numel(), dst.as<float>());
  }
  void download(float* dst, Tensor src) override {
    if (src.dtype == DType::f64)
      std::transform(src.as<double>(), src.as<double>() + src.numel(), dst,
                     [](double x) { return static_cast<float>(x); });
    else
      std::copy(src.as<float>(), src.as<float>() + src.numel(), dst);
  }
  void upload_tokens(Tensor dst, const int32_t* src) override {
    expect(dst.dtype == DType::i32, "upload_tokens", "destination must be i32");
    std::copy(src, src + dst.numel(), dst.as<int32_t>());
  }

  void copy(Tensor dst, Tensor src) override {
    expect_same_float_dtype("copy", {&dst, &src});
    expect(dst.numel() == src.numel(), "copy", "shape mismatch");
    std::memcpy(dst.data, src.data, dst.bytes());
    round_output(dst);
  }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) override {
    expect_same_float_dtype("embedding_forward", {&out, &wte, &wpe});
    const int64_t B = out.dim(0), Tn = out.dim(1), C = out.dim(2);
    expect(tokens.dtype == DType::i32 && tokens.numel() == B * Tn && wte.dim(1) == C &&
               wpe.dim(1) == C && wpe.dim(0) >= Tn,
           "embedding_forward", "shape mismatch");
    dispatch(out, [&](auto z) {
      using T = decltype(z);
      embedding_forward_impl<T>(out.as<T>(), tokens.as<int32_t>(), wte.as<T>(), wpe.as<T>(), B, Tn, C);
    });
    round_output(out);
  }

  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) override {
    expect_same_float_dtype("embedding_backward", {&dout, &dwte, &dwpe});
    const int64_t B = dout.dim(0), Tn = dout.dim(1), C = dout.dim(2);
    expect(tokens.numel() == B * Tn && dwte.dim(1) == C && dwpe.dim(1) == C, "embedding_backward",
           "shape mismatch");
    dispatch(dout, [&](auto z) {
      using T = decltype(z);
      embedding_backward_impl<T>(dwte.as<T>(), dwpe.as<T>(), dout.as<T>(), tokens.as<int32_t>(), B, Tn, C);
    });
    round_output(dwte, &grad_numerics_);
    round_output(dwpe, &grad_numerics_);
  }

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight,
                         Tensor bias) override {
    expect_same_float_dtype("layernorm_forward", {&out, &mean, &rstd, &inp, &weight, &bias});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(out.numel() == N * C && mean.numel() == N && rstd.numel() == N && weight.numel() == C &&
               bias.numel() == C,
           "layernorm_forward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      layernorm_forward_impl<T>(out.as<T>(), mean.as<T>(), rstd.as<T>(), inp.as<T>(), weight.as<T>(),
                                bias.as<T>(), N, C);
    });
    round_output(out);
  }

  void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    expect_same_float_dtype("layernorm_backward", {&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd});
    const int64_t C = inp.dim(-1), N = inp.numel() / C;
    expect(dinp.numel() == N * C && dout.numel() == N * C && dweight.numel() == C &&
               dbias.numel() == C && mean.numel() == N && rstd.numel() == N,
           "layernorm_backward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      layernorm_backward_impl<T>(dinp.as<T>(), dweight.as<T>(), dbias.as<T>(), dout.as<T>(), inp.as<T>(),
                                 weight.as<T>(), mean.as<T>(), rstd.as<T>(), N, C);
    });
    round_output(dinp, &grad_numerics_);
    round_output(dweight, &grad_numerics_);
    round_output(dbias, &grad_numerics_);
  }

  void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) override {
    expect_same_float_dtype("matmul_forward", {&out, &inp, &weight, &bias});
    const int64_t OC = weight.dim(0), C = weight.dim(1), N = inp.numel() / C;
    expect(inp.dim(-1) == C && out.numel() == N * OC && (bias.empty() || bias.numel() == OC),
           "matmul_forward", "shape mismatch: inp " + inp.shape_string() + " weight " + weight.shape_string());
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      matmul_forward_impl<T>(out.as<T>(), inp.as<T>(), weight.as<T>(), bias.empty() ? nullptr : bias.as<T>(), N, C, OC);
    });
    round_output(out);
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
      matmul_backward_impl<T>(ptr(dinp, z), ptr(dweight, z), ptr(dbias, z), dout.as<T>(), inp.as<T>(),
                              weight.as<T>(), N, C, OC);
    });
    round_output(dinp, &grad_numerics_);
    round_output(dweight, &grad_numerics_);
    round_output(dbias, &grad_numerics_);
  }

  void bias_backward(Tensor dbias, Tensor dout) override {
    expect_same_float_dtype("bias_backward", {&dbias, &dout});
    const int64_t OC = dbias.numel(), N = dout.numel() / OC;
    expect(dout.dim(-1) == OC, "bias_backward", "shape mismatch");
    dispatch(dout, [&](auto z) {
      using T = decltype(z);
      bias_backward_impl<T>(dbias.as<T>(), dout.as<T>(), N, OC);
    });
    round_output(dbias, &grad_numerics_);
  }

  void attention_forward(Tensor out, Tensor att, Tensor qkv, int n_head) override {
    expect_same_float_dtype("attention_forward", {&out, &att, &qkv});
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = qkv.dim(2) / 3;
    expect(qkv.dim(2) == 3 * C && C % n_head == 0 && out.numel() == B * Tn * C &&
               att.numel() == B * n_head * Tn * Tn,
           "attention_forward", "shape mismatch");
    dispatch(qkv, [&](auto z) {
      using T = decltype(z);
      attention_forward_impl<T>(out.as<T>(), att.as<T>(), qkv.as<T>(), B, Tn, C, n_head);
    });
    round_output(out);
    round_output(att);
  }

  // `out` serves the fused path only: the probabilities saved in `att` make it unnecessary here.
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor /*out*/, Tensor att, int n_head) override {
    expect_same_float_dtype("attention_backward", {&dqkv, &dout, &qkv, &att});
    const int64_t B = qkv.dim(0), Tn = qkv.dim(1), C = qkv.dim(2) / 3;
    expect(dqkv.numel() == qkv.numel() && dout.numel() == B * Tn * C &&
               att.numel() == B * n_head * Tn * Tn,
           "attention_backward", "shape mismatch");
    dispatch(qkv, [&](auto z) {
      using T = decltype(z);
      attention_backward_impl<T>(dqkv.as<T>(), dout.as<T>(), qkv.as<T>(), att.as<T>(), B, Tn, C, n_head);
    });
    round_output(dqkv, &grad_numerics_);
  }

  AttentionChoice choose_attention(const std::string& want, DType, int64_t, int64_t, int, int64_t) override {
    if (want == "cudnn")
      throw UserError("model.attention: cudnn runs on the CUDA backend only; this run uses the CPU backend "
                      "(use model.attention: auto or fallback, or run.device: cuda)");
    return {AttentionPath::fallback, "fallback (the CPU backend's reference attention)"};
  }

  void gelu_forward(Tensor out, Tensor inp) override {
    expect_same_float_dtype("gelu_forward", {&out, &inp});
    expect(out.numel() == inp.numel(), "gelu_forward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      gelu_forward_impl<T>(out.as<T>(), inp.as<T>(), inp.numel());
    });
    round_output(out);
  }

  void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) override {
    expect_same_float_dtype("gelu_backward", {&dinp, &inp, &dout});
    expect(dinp.numel() == inp.numel() && dout.numel() == inp.numel(), "gelu_backward", "shape mismatch");
    dispatch(inp, [&](auto z) {
      using T = decltype(z);
      gelu_backward_impl<T>(dinp.as<T>(), inp.as<T>(), dout.as<T>(), inp.numel());
    });
    round_output(dinp, &grad_numerics_);
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    expect_same_float_dtype("add", {&out, &a, &b});
    expect(out.numel() == a.numel() && a.numel() == b.numel(), "add", "shape mismatch");
    dispatch(out, [&](auto z) {
      using T = decltype(z);
      add_impl<T>(out.as<T>(), a.as<T>(), b.as<T>(), out.numel());
    });
    round_output(out);
  }

  void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) override {
    expect_same_float_dtype("classifier", {&logits, &losses});
    const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
    expect(losses.numel() == N && targets.numel() == N && targets.dtype == DType::i32 && vocab <= Vp,
           "classifier", "shape mismatch");
    dispatch(logits, [&](auto z) {
      using T = decltype(z);
      classifier_impl<T>(logits.as<T>(), losses.as<T>(), targets.as<int32_t>(), N, Vp, vocab, static_cast<T>(dloss));
    });
    if (dloss != 0) round_output(logits, &grad_numerics_);
  }

  double sum(Tensor t) override {
    double result = 0;
    dispatch(t, [&](auto z) {
      using T = decltype(z);
      result = reduce_impl(t.as<T>(), t.numel(), [](double x) { return x; });
    });
    return result;
  }

  void sum_into(Tensor out, Tensor t) override {
    expect(out.dtype == DType::f64 && out.numel() == 1, "sum_into", "out must be one f64 element");
    *out.as<double>() = sum(t);
  }

  void download_doubles(double* dst, Tensor src) override {
    expect(src.dtype == DType::f64, "download_doubles", "src must be f64");
    std::copy(src.as<double>(), src.as<double>() + src.numel(), dst);
  }

  double sum_squares(Tensor t) override {
    double result = 0;
    dispatch(t, [&](auto z) {
      using T = decltype(z);
      result = reduce_impl(t.as<T>(), t.numel(), [](double x) { return x * x; });
    });
    return result;
  }


  float amax(Tensor t) override {
    expect(t.dtype == DType::f32, "amax", "f32 storage expected");
    return amax_impl(t.as<float>(), t.numel());
  }

  Fp8CastStats fp8_cast(Tensor out, Tensor in, Format format, float scale) override {
    expect(in.dtype == DType::f32 && out.dtype == DType::f32 && out.numel() == in.numel() && is_fp8(format),
           "fp8_cast", "f32 storage of equal size and an fp8 format expected");
    const int64_t n = in.numel();
    const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
    std::vector<Fp8CastStats> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kReduceChunk, count = std::min(n, begin + kReduceChunk) - begin;
      fp8_cast_run(out.as<float>() + begin, in.as<float>() + begin, count, format, scale, partial[c]);
    }
    Fp8CastStats stats;
    for (const auto& p : partial) stats.merge(p);  // counts; the amax is the tensor's, below
    stats.amax = amax_impl(in.as<float>(), n);
    return stats;
  }

  Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows, int block_cols) override {
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
          fp8_cast_run(y + r * cols + c0, x + r * cols + c0, n, format, current_scale(block_amax[b], max),
                       partial[band]);
        }
    }
    Fp8CastStats stats;
    for (const auto& p : partial) stats.merge(p);  // counts; the amax is the tensor's, below
    stats.amax = amax_impl(x, in.numel());
    return stats;
  }

  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p, Tensor param_copy) override {
    expect_same_float_dtype("adamw", {&param, &grad, &m, &v, &param_copy});
    expect(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel() &&
               (param_copy.empty() || param_copy.numel() == param.numel()),
           "adamw", "shape mismatch");
    dispatch(param, [&](auto z) {
      using T = decltype(z);
      adamw_impl<T>(param.as<T>(), grad.as<T>(), m.as<T>(), v.as<T>(), param.numel(), p);
    });
    if (!param_copy.empty()) copy(param_copy, param);
  }

  GradNumerics take_grad_numerics() override {
    GradNumerics taken = grad_numerics_;
    grad_numerics_ = GradNumerics{};
    return taken;
  }

 private:
  GradNumerics grad_numerics_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace ptrain

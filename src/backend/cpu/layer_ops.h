// The CPU backend's per-layer ops on raw arrays (embedding, layernorm, bias, GELU, residual add,
// AdamW, reductions), templated over float (training) and double (gradient checks). Each parallel
// loop gives every output element to one thread and sums in an order fixed by the shape, so the
// thread count never changes a result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vector_math.h"

namespace ptrain {
namespace cpu {

constexpr float kLayerNormEps = 1e-5f;
constexpr int64_t kReduceChunk = 1 << 14;  // fixed chunking: deterministic partial sums
// Column sums (bias and layernorm gradients) run over blocks of this many columns, each walked
// row by row: contiguous reads, and per column the same additions in the same order.
constexpr int64_t kColumnBlock = 64;

// Below this many elements of work a parallel region costs more than it saves. Whether a loop
// runs threaded never changes its result: every output element has one owner either way.
inline bool worth_threads(int64_t work) { return work >= (1 << 15); }

// ---------------------------------------------------------------------------- embedding

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B, int64_t Tn, int64_t C) {
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const T* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    T* o = out + bt * C;
    if (!wpe) {  // no position embedding
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
      continue;
    }
    const T* p = wpe + (bt % Tn) * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B, int64_t Tn, int64_t C) {
  // Several positions can share a token: give each thread a range of channels and walk all
  // positions in order, so no two threads write the same element.
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t bt = 0; bt < B * Tn; ++bt) dwte[static_cast<int64_t>(tokens[bt]) * C + c] += dout[bt * C + c];
  }
  if (!dwpe) return;
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * C))
  for (int64_t t = 0; t < Tn; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const T* d = dout + (b * Tn + t) * C;
      for (int64_t c = 0; c < C; ++c) dwpe[t * C + c] += d[c];
    }
  }
}

// ---------------------------------------------------------------------------- column sums

// For each column c of an N x cols array: sums[c] += sum over rows n, in order, of f(n, c).
template <typename T, typename F>
void add_column_sums(T* sums, int64_t N, int64_t cols, F f) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (worth_threads(N * cols))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, width = std::min(cols, c0 + kColumnBlock) - c0;
    T s[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < width; ++j) s[j] += f(n, c0 + j);
    for (int64_t j = 0; j < width; ++j) sums[c0 + j] += s[j];
  }
}

// ---------------------------------------------------------------------------- layernorm

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C) {
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
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C) {
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
  add_column_sums(dw, N, C, [&](int64_t n, int64_t c) { return dout[n * C + c] * (inp[n * C + c] - mean[n]) * rstd[n]; });
  add_column_sums(db, N, C, [&](int64_t n, int64_t c) { return dout[n * C + c]; });
}

// ---------------------------------------------------------------------------- bias

template <typename T>
void bias_forward(T* out, const T* bias, int64_t N, int64_t OC) {
#pragma omp parallel for schedule(static) if (worth_threads(N * OC))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) out[n * OC + o] += bias[o];
}

template <typename T>
void bias_backward(T* dbias, const T* dout, int64_t N, int64_t OC) {
  add_column_sums(dbias, N, OC, [&](int64_t n, int64_t o) { return dout[n * OC + o]; });
}

// ---------------------------------------------------------------------------- gelu, add

// GELU's tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), in the
// equivalent form x * logistic(2u): no tanh call, and no cancellation where 1 + tanh(u) -> 0.
template <typename T>
inline T gelu_inner(T x) {
  const T kBeta = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
  return kBeta * (x + static_cast<T>(0.044715) * x * x * x);
}

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) out[i] = inp[i] * vmath::logistic(2 * gelu_inner(inp[i]));
}

// d/dx [x s] with s = logistic(2u): s + x * 2 s (1 - s) * du/dx.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T kBeta = static_cast<T>(0.7978845608028654);
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T s = vmath::logistic(2 * gelu_inner(x));
    const T du = kBeta * (1 + 3 * static_cast<T>(0.044715) * x * x);
    dinp[i] += dout[i] * (s + 2 * x * s * (1 - s) * du);
  }
}

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------------------- reductions, AdamW

// Sum of f(x[i]) in double: fixed chunks summed in parallel, each in fixed lanes (vector_math.h),
// then the chunks in order.
template <typename T, typename F>
double reduce(const T* x, int64_t n, F f) {
  const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const T* chunk = x + c * kReduceChunk;
    const int64_t count = std::min(n - c * kReduceChunk, kReduceChunk);
    vmath::LaneSum<double> s;
    int64_t i = 0;
    for (; i + vmath::kLanes <= count; i += vmath::kLanes)
      for (int j = 0; j < vmath::kLanes; ++j) s.lane[j] += f(static_cast<double>(chunk[i + j]));
    for (int j = 0; i + j < count; ++j) s.lane[j] += f(static_cast<double>(chunk[i + j]));
    partial[c] = s.total();
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template <typename T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWParams& p) {
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

}  // namespace cpu
}  // namespace ptrain

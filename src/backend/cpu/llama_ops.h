// The CPU backend's ops of a Llama-style block: RMSNorm (and QK-norm, an RMSNorm per q and k
// head), rotary position embeddings (RoPE) and the SwiGLU activation, templated over float (training) and double (gradient checks) like
// layer_ops.h, with every output element owned by one thread and sums in an order fixed by the
// shape, so the thread count never changes a result.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/layer_ops.h"
#include "backend/cpu/vector_math.h"

namespace ptrain {
namespace cpu {

// ---------------------------------------------------------------------------- RMSNorm

// Where row n of C elements starts: rows come in groups of `group` adjacent rows, the groups
// `stride` elements apart (QK-norm's q or k heads inside each token's qkv row); the default is
// a plain (N, C) matrix.
struct NormRows {
  int64_t group = 1, stride = 0;  // stride 0: C
  int64_t at(int64_t n, int64_t C) const { return stride == 0 ? n * C : (n / group) * stride + (n % group) * C; }
};

// out(n, c) = x(n, c) * rstd(n) * w(c), rstd(n) = 1 / sqrt(mean_c x(n, c)^2 + eps).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int64_t N, int64_t C, T eps, NormRows rows = {}) {
#pragma omp parallel for schedule(static) if (worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + rows.at(n, C);
    T squares = 0;
    for (int64_t c = 0; c < C; ++c) squares += x[c] * x[c];
    const T s = 1 / std::sqrt(squares / static_cast<T>(C) + eps);
    T* o = out + rows.at(n, C);
    for (int64_t c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
    rstd[n] = s;
  }
}

// With g = w * dout: dinp += s g - s^3 x mean_c(g x); dw += sum_n dout x s.
template <typename T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int64_t N, int64_t C,
                      NormRows rows = {}) {
#pragma omp parallel for schedule(static) if (worth_threads(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dout + rows.at(n, C);
    const T* x = inp + rows.at(n, C);
    const T s = rstd[n];
    T gx = 0;
    for (int64_t c = 0; c < C; ++c) gx += w[c] * d[c] * x[c];
    const T k = s * s * s * gx / static_cast<T>(C);
    T* di = dinp + rows.at(n, C);
    for (int64_t c = 0; c < C; ++c) di[c] += s * w[c] * d[c] - k * x[c];
  }
  add_column_sums(dw, N, C, [&](int64_t n, int64_t c) {
    const int64_t i = rows.at(n, C) + c;
    return dout[i] * inp[i] * rstd[n];
  });
}

// QK-norm over N qkv rows of width (NH + 2 KV) hs: q's heads by qw, k's by kw, v copied into out
// (out may be inp); rstd holds q's N NH rows, then k's N KV.
template <typename T>
void qk_norm_forward(T* out, T* rstd, const T* inp, const T* qw, const T* kw, int64_t N, int64_t NH, int64_t KV,
                     int64_t hs, T eps) {
  const int64_t W = (NH + 2 * KV) * hs, k_at = NH * hs, v_at = (NH + KV) * hs;
  rmsnorm_forward(out, rstd, inp, qw, N * NH, hs, eps, NormRows{NH, W});
  rmsnorm_forward(out + k_at, rstd + N * NH, inp + k_at, kw, N * KV, hs, eps, NormRows{KV, W});
  if (out == inp) return;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = v_at; c < W; ++c) out[n * W + c] = inp[n * W + c];
}

// dinp += QK-norm's input gradient (v's: dout); dqw, dkw += the norm weights' gradients.
template <typename T>
void qk_norm_backward(T* dinp, T* dqw, T* dkw, const T* dout, const T* inp, const T* qw, const T* kw, const T* rstd,
                      int64_t N, int64_t NH, int64_t KV, int64_t hs) {
  const int64_t W = (NH + 2 * KV) * hs, k_at = NH * hs, v_at = (NH + KV) * hs;
  rmsnorm_backward(dinp, dqw, dout, inp, qw, rstd, N * NH, hs, NormRows{NH, W});
  rmsnorm_backward(dinp + k_at, dkw, dout + k_at, inp + k_at, kw, rstd + N * NH, N * KV, hs, NormRows{KV, W});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = v_at; c < W; ++c) dinp[n * W + c] += dout[n * W + c];
}

// ---------------------------------------------------------------------------- SwiGLU

// Each row of gate_up (N, 2H) holds the gate projection's H values, then the up projection's:
// out(n, h) = silu(gate) * up, silu(g) = g * logistic(g).
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static) if (worth_threads(N * H))
  for (int64_t n = 0; n < N; ++n) {
    const T* g = gate_up + n * 2 * H;
    const T* u = g + H;
    T* o = out + n * H;
    for (int64_t h = 0; h < H; ++h) o[h] = g[h] * vmath::logistic(g[h]) * u[h];
  }
}

// d gate += dout * up * silu'(g), silu'(g) = s (1 + g (1 - s)) with s = logistic(g);
// d up += dout * silu(g).
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static) if (worth_threads(N * H))
  for (int64_t n = 0; n < N; ++n) {
    const T* g = gate_up + n * 2 * H;
    const T* u = g + H;
    const T* d = dout + n * H;
    T* dg = dgate_up + n * 2 * H;
    T* du = dg + H;
    for (int64_t h = 0; h < H; ++h) {
      const T s = vmath::logistic(g[h]);
      dg[h] += d[h] * u[h] * s * (1 + g[h] * (1 - s));
      du[h] += d[h] * g[h] * s;
    }
  }
}

// ---------------------------------------------------------------------------- RoPE

// Rotary position embeddings in the rotate-half layout (Llama, Hugging Face): in each head of
// size hs, element i < hs/2 pairs with i + hs/2, and the pair turns by angle(t, i), whose cosine
// and sine `table` (T, hs/2, 2) holds for position t. The first `heads` heads of each row of
// x (B, T, width) turn (q's and k's heads, v's stay); `direction` -1 turns back, which is the
// backward pass (a rotation's transpose is its inverse). In place.
template <typename T>
void rope_rotate(T* x, const float* table, int64_t B, int64_t Tn, int64_t width, int64_t heads, int64_t hs,
                 int direction) {
  const int64_t half = hs / 2;
#pragma omp parallel for schedule(static) if (worth_threads(B * Tn * heads * hs))
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    const float* angles = table + (bt % Tn) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + bt * width + h * hs;
      for (int64_t i = 0; i < half; ++i) {
        const T c = angles[2 * i], s = direction * static_cast<T>(angles[2 * i + 1]);
        const T a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace cpu
}  // namespace ptrain

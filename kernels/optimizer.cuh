// The optimizer step on the GPU: AdamW on FP32 master weights, writing the low-precision copy
// the next forward pass reads. (The gradient norm for clipping and the inf/NaN check are the
// deterministic double sums of reduce.cuh.)
//
// Why this shape: elementwise over the one flat gradient buffer, so bound by memory: it moves
// 16-byte vectors. AdamW repeats the CPU backend's expressions in the same order, so FP32 results
// agree to the last bit or nearly (only FMA contraction differs).
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kOptimizerThreads = 256;

// Elements [0, count) of a run of N floats (N a multiple of 4), as 16-byte vectors where whole
// and aligned; elements past count read as 0.
template <int N>
__device__ __forceinline__ void load_float_chunk(float (&out)[N], const float* p, int count) {
  static_assert(N % 4 == 0, "whole float vectors");
  for (int j = 0; j < N; j += 4) {
    float part[4];
    load_chunk(part, p, j, count);
    for (int k = 0; k < 4; ++k) out[j + k] = part[k];
  }
}

// Writes elements [0, count) of a run of N floats.
template <int N>
__device__ __forceinline__ void store_float_chunk(float* p, int count, const float (&in)[N]) {
  static_assert(N % 4 == 0, "whole float vectors");
  for (int j = 0; j < N; j += 4) {
    float part[4];
    for (int k = 0; k < 4; ++k) part[k] = in[j + k];
    store_chunk(p, j, count, part);
  }
}

// One chunk of V = 16 / sizeof(T) parameters per thread: the gradient chunk is one 16-byte load.
template <typename T>
__global__ void adamw_kernel(float* master, T* copy, const T* grad, float* m, float* v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                             float inv_bias_correction1, float inv_bias_correction2) {
  constexpr int V = Packed128<T>::size;
  const size_t base = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (base >= n) return;
  const int count = run_len(n, base, V);
  float g[V], p[V], mv[V], vv[V];
  load_chunk(g, grad + base, 0, count);
  load_float_chunk(p, master + base, count);
  load_float_chunk(mv, m + base, count);
  load_float_chunk(vv, v + base, count);
  for (int k = 0; k < V; ++k) {  // the CPU backend's adamw_impl, expression for expression
    const float gk = g[k] * grad_scale;
    mv[k] = beta1 * mv[k] + (1.0f - beta1) * gk;
    vv[k] = beta2 * vv[k] + (1.0f - beta2) * gk * gk;
    const float mhat = mv[k] * inv_bias_correction1;
    const float vhat = vv[k] * inv_bias_correction2;
    p[k] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p[k]);
  }
  store_float_chunk(master + base, count, p);
  store_float_chunk(m + base, count, mv);
  store_float_chunk(v + base, count, vv);
  if (copy) store_chunk(copy + base, 0, count, p);
}

// ---------------------------------------------------------------------------- launchers

// 1 / (1 - beta^step), in double and rounded once to float, exactly as the CPU backend's AdamW.
inline float adamw_inv_bias_correction(float beta, int64_t step) {
  return static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step))));
}

// AdamW on n FP32 master weights, first and second moments m and v, in place. The gradient is
// multiplied by grad_scale first (clipping). If `copy` is not null it receives the updated
// weights rounded to T (the copy the forward pass reads). inv_bias_correction1/2 come from
// adamw_inv_bias_correction(beta1/beta2, step).
template <typename T>
void adamw_update(float* master, T* copy, const T* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, float inv_bias_correction1,
                  float inv_bias_correction2, cudaStream_t stream) {
  if (n == 0) return;
  const size_t chunks = ceil_div(n, static_cast<size_t>(Packed128<T>::size));
  const auto blocks = static_cast<unsigned>(ceil_div(chunks, static_cast<size_t>(kOptimizerThreads)));
  PTRAIN_LAUNCH(adamw_kernel<T>, blocks, kOptimizerThreads, 0, stream, master, copy, grad, m, v, n, lr, beta1, beta2,
                eps, weight_decay, grad_scale, inv_bias_correction1, inv_bias_correction2);
}

}  // namespace ptrain::kernels

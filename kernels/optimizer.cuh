// The optimizer step on the GPU: AdamW on FP32 master weights (writing the low-precision copy
// the next forward pass reads), the global gradient norm for clipping, and loss-scale removal
// with the inf/NaN check that decides whether a step is skipped.
//
// Why this shape: all three are elementwise or reductions over the one flat gradient buffer, so
// they are bound by memory and move 16-byte vectors. AdamW repeats the CPU backend's expressions
// in the same order, so FP32 results agree to the last bit or nearly (only FMA contraction
// differs). The gradient norm must not depend on timing or on the device: a fixed number of
// blocks (not derived from the SM count) each sum a grid-stride slice, and a second kernel adds
// the per-block partials in a fixed order. The non-finite flag is a plain store of 1 from any
// thread that sees inf or NaN: every writer stores the same value, so no atomic is needed.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kOptimizerThreads = 256;
// At most this many blocks in the first gradient-norm stage (two per SM of an H100/H200), and so
// the number of floats of the `partials` buffer grad_norm_squared needs.
constexpr int kGradNormPartials = 264;

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

// partials[block] = sum of squares (FP32) of this block's grid-stride slice of the chunks.
template <typename T>
__global__ void grad_norm_partial_kernel(float* partials, const T* grad, size_t n) {
  PTRAIN_DYNAMIC_SHARED(float, scratch);  // 32 floats for block_sum
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  float sum = 0.0f;
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float x[V];
    load_chunk(x, grad + c * V, 0, run_len(n, c * V, V));
    for (int k = 0; k < V; ++k) sum += x[k] * x[k];  // missing elements read as 0
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *out = sum of `count` partials, by one warp: lane l adds partials l, l + 32, ... in order,
// then a fixed butterfly. A template only so that several translation units may include this
// header (see current_scale_kernel in fp8.cuh).
template <int = 0>
__global__ void sum_partials_kernel(float* out, const float* partials, int count) {
  float sum = 0.0f;
  for (int i = threadIdx.x; i < count; i += kWarpSize) sum += partials[i];
  sum = warp_sum(sum);
  if (threadIdx.x == 0) *out = sum;
}

template <typename T>
__global__ void grad_unscale_kernel(T* grad, size_t n, float inv_scale, int* found_nonfinite) {
  constexpr int V = Packed128<T>::size;
  const size_t base = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (base >= n) return;
  const int count = run_len(n, base, V);
  float x[V];
  load_chunk(x, grad + base, 0, count);
  bool nonfinite = false;
  for (int k = 0; k < V; ++k) {  // missing elements read as 0: finite
    nonfinite = nonfinite || !is_finite(x[k]);
    x[k] *= inv_scale;
  }
  store_chunk(grad + base, 0, count, x);
  if (nonfinite) *found_nonfinite = 1;
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

// *out = sum of grad[i]^2, accumulated in FP32 in an order fixed by n alone (the same bits on
// every run and every device): min(kGradNormPartials, what n needs) blocks of partial sums, then
// one warp adding them in order. `partials` is scratch of kGradNormPartials floats.
template <typename T>
void grad_norm_squared(float* out, float* partials, const T* grad, size_t n, cudaStream_t stream) {
  const size_t chunks = ceil_div(n, static_cast<size_t>(Packed128<T>::size));
  const size_t needed = ceil_div(chunks, static_cast<size_t>(kOptimizerThreads));
  const int blocks = needed < 1 ? 1 : (needed < kGradNormPartials ? static_cast<int>(needed) : kGradNormPartials);
  PTRAIN_LAUNCH(grad_norm_partial_kernel<T>, blocks, kOptimizerThreads, kWarpSize * sizeof(float), stream, partials,
                grad, n);
  PTRAIN_LAUNCH(sum_partials_kernel<0>, 1, kWarpSize, 0, stream, out, partials, blocks);
}

// grad[i] = round_to_T(grad[i] * inv_scale), in place; *found_nonfinite = 1 if any grad[i] was inf
// or NaN before scaling. Never writes 0: the caller zeroes the flag once per step, so several
// buffers may share it.
template <typename T>
void grad_unscale(T* grad, size_t n, float inv_scale, int* found_nonfinite, cudaStream_t stream) {
  if (n == 0) return;
  const size_t chunks = ceil_div(n, static_cast<size_t>(Packed128<T>::size));
  const auto blocks = static_cast<unsigned>(ceil_div(chunks, static_cast<size_t>(kOptimizerThreads)));
  PTRAIN_LAUNCH(grad_unscale_kernel<T>, blocks, kOptimizerThreads, 0, stream, grad, n, inv_scale, found_nonfinite);
}

}  // namespace ptrain::kernels

// Layer normalisation: forward (saving FP32 mean and 1/std for the backward pass) and the
// backward pass.
//
// Why this shape: one warp per row. Each lane caches the elements it reads in shared memory as
// FP32 and always touches the same elements in every pass, so the row is read from global
// memory once and no lane waits for another's writes. The cache is lane-interleaved (element k
// of a lane's j-th chunk at word (j * V + k) * 32 + lane), so a warp's 32 accesses fall in 32
// different banks. The weight and bias gradients sum over
// rows; atomics would make them depend on timing, so a first kernel writes per-slice partial
// sums and a second adds the slices in a fixed order.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kLayerNormMaxRowsPerBlock = 4;
constexpr int kLayerNormGradRows = 32;  // rows per partial sum of the weight/bias gradients

// Floats of a row's cache: whole rounds of 32 lanes x one 16-byte chunk each.
template <typename T>
__host__ __device__ __forceinline__ int layernorm_cache_floats(int C) {
  constexpr int kRound = kWarpSize * Packed128<T>::size;
  return (C + kRound - 1) / kRound * kRound;
}

// Where element k of lane's j-th chunk lives in a row's cache.
template <typename T>
__device__ __forceinline__ int cache_slot(int j, int k, int lane) {
  return (j * Packed128<T>::size + k) * kWarpSize + lane;
}

// Rows per block that fit `caches` row caches per row in 48 KB of shared memory.
template <typename T>
int layernorm_rows_per_block(int C, int caches) {
  const size_t per_row = sizeof(float) * caches * static_cast<size_t>(layernorm_cache_floats<T>(C));
  const int rows = static_cast<int>(48 * 1024 / per_row);
  if (rows < 1) throw std::invalid_argument("layernorm: rows of " + std::to_string(C) + " channels do not fit in shared memory");
  return rows < kLayerNormMaxRowsPerBlock ? rows : kLayerNormMaxRowsPerBlock;
}

// Normalises the row cached in x (this lane's elements) and writes out, mean and rstd.
template <typename T>
__device__ __forceinline__ void layernorm_row(T* out_row, float* mean, float* rstd, const float* x, const T* weight,
                                              const T* bias, int row, int C, int lane) {
  constexpr int V = Packed128<T>::size;
  float sum = 0.0f;
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V)
    for (int k = 0; k < V && i + k < C; ++k) sum += x[cache_slot<T>(j, k, lane)];
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V)
    for (int k = 0; k < V && i + k < C; ++k) {
      const float d = x[cache_slot<T>(j, k, lane)] - m;
      var += d * d;
    }
  const float s = rsqrtf(warp_sum(var) / C + kLayerNormEps);
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V) {
    float w[V], b[V], o[V];
    load_chunk(w, weight, i, C);
    load_chunk(b, bias, i, C);
    for (int k = 0; k < V; ++k) o[k] = i + k < C ? (x[cache_slot<T>(j, k, lane)] - m) * s * w[k] + b[k] : 0.0f;
    store_chunk(out_row, i, C, o);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C) {
  PTRAIN_DYNAMIC_SHARED(float, cache);  // (rows per block, cache floats)
  constexpr int V = Packed128<T>::size;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= N) return;  // warps never meet at a barrier: a spare warp may leave
  float* x = cache + static_cast<size_t>(warp) * layernorm_cache_floats<T>(C);
  const T* in = inp + static_cast<size_t>(row) * C;
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V) {
    float v[V];
    load_chunk(v, in, i, C);
    for (int k = 0; k < V && i + k < C; ++k) x[cache_slot<T>(j, k, lane)] = v[k];
  }
  layernorm_row(out + static_cast<size_t>(row) * C, mean, rstd, x, weight, bias, row, C, lane);
}

// dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, with dnorm = weight * dout.
template <typename T>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  PTRAIN_DYNAMIC_SHARED(float, cache);  // (rows per block, 2, cache floats): norm, then dnorm
  constexpr int V = Packed128<T>::size;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= N) return;
  float* norm = cache + static_cast<size_t>(warp) * 2 * layernorm_cache_floats<T>(C);
  float* dnorm = norm + layernorm_cache_floats<T>(C);
  const size_t offset = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V) {
    float x[V], d[V], w[V];
    load_chunk(x, inp + offset, i, C);
    load_chunk(d, dout + offset, i, C);
    load_chunk(w, weight, i, C);
    for (int k = 0; k < V && i + k < C; ++k) {
      const int slot = cache_slot<T>(j, k, lane);
      norm[slot] = (x[k] - m) * s;
      dnorm[slot] = w[k] * d[k];
      dnorm_sum += dnorm[slot];
      dnorm_norm_sum += dnorm[slot] * norm[slot];
    }
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
  for (int j = 0, i = lane * V; i < C; ++j, i += kWarpSize * V) {
    float g[V];
    load_chunk(g, dinp + offset, i, C);
    for (int k = 0; k < V && i + k < C; ++k) {
      const int slot = cache_slot<T>(j, k, lane);
      g[k] += (dnorm[slot] - dnorm_mean - norm[slot] * dnorm_norm_mean) * s;
    }
    store_chunk(dinp + offset, i, C, g);
  }
}

// partial(slice, 2, C): over the slice's kLayerNormGradRows rows, sum of dout * norm (weight)
// and of dout (bias). One thread per channel, rows in order: reads of a row are coalesced.
template <typename T>
__global__ void layernorm_backward_partial_kernel(float* partial, const T* dout, const T* inp, const float* mean,
                                                  const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int slice = blockIdx.y;
  if (c >= C) return;
  const int r0 = slice * kLayerNormGradRows;
  const int r1 = r0 + kLayerNormGradRows < N ? r0 + kLayerNormGradRows : N;
  float sw = 0.0f, sb = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * C + c;
    const float d = to_float(dout[i]);
    sw += d * (to_float(inp[i]) - mean[r]) * rstd[r];
    sb += d;
  }
  partial[(static_cast<size_t>(slice) * 2) * C + c] = sw;
  partial[(static_cast<size_t>(slice) * 2 + 1) * C + c] = sb;
}

// dweight += sum of the slices' weight partials, dbias likewise, slices in order. G: the
// gradients' storage (FP32 main gradients, or the activations' type).
template <typename G>
__global__ void layernorm_backward_params_kernel(G* dweight, G* dbias, const float* partial, int slices, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = to_float(dweight[c]), sb = to_float(dbias[c]);
  for (int s = 0; s < slices; ++s) {
    sw += partial[(static_cast<size_t>(s) * 2) * C + c];
    sb += partial[(static_cast<size_t>(s) * 2 + 1) * C + c];
  }
  dweight[c] = from_float<G>(sw);
  dbias[c] = from_float<G>(sb);
}

// ---------------------------------------------------------------------------- launchers

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t stream) {
  const int rows = layernorm_rows_per_block<T>(C, 1);
  const size_t shared = sizeof(float) * rows * static_cast<size_t>(layernorm_cache_floats<T>(C));
  PTRAIN_LAUNCH(layernorm_forward_kernel<T>, ceil_div(N, rows), rows * kWarpSize, shared, stream, out, mean, rstd, inp,
                weight, bias, N, C);
}

// Floats of scratch memory layernorm_backward needs for N rows of C channels.
inline size_t layernorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(ceil_div(N, kLayerNormGradRows)) * 2 * static_cast<size_t>(C);
}

// Adds into dinp (N, C), dweight (C) and dbias (C), the last two stored as G. dinp must not
// alias dout: the weight and bias gradients read dout after dinp has been updated.
template <typename T, typename G = T>
void layernorm_backward(T* dinp, G* dweight, G* dbias, float* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
  const int rows = layernorm_rows_per_block<T>(C, 2);
  const size_t shared = sizeof(float) * 2 * rows * static_cast<size_t>(layernorm_cache_floats<T>(C));
  PTRAIN_LAUNCH(layernorm_backward_input_kernel<T>, ceil_div(N, rows), rows * kWarpSize, shared, stream, dinp, dout, inp,
                weight, mean, rstd, N, C);
  const int slices = ceil_div(N, kLayerNormGradRows);
  if (slices > 65535) throw std::invalid_argument("layernorm_backward: " + std::to_string(N) + " rows exceed the grid");
  constexpr int kThreads = 128;
  PTRAIN_LAUNCH(layernorm_backward_partial_kernel<T>, dim3(ceil_div(C, kThreads), slices), kThreads, 0, stream, scratch,
                dout, inp, mean, rstd, N, C);
  PTRAIN_LAUNCH(layernorm_backward_params_kernel<G>, ceil_div(C, kThreads), kThreads, 0, stream, dweight, dbias, scratch,
                slices, C);
}

}  // namespace ptrain::kernels

// Elementwise ops of the MLP and the residual stream: GELU (tanh approximation) forward and
// backward, addition, the bias add that a cuBLASLt GEMM without a bias epilogue leaves to us,
// and the bias gradient.
//
// Why this shape: all but the bias gradient are memory-bound streams, so each thread moves
// 16-byte vectors in a grid-stride loop, computes in FP32 and rounds once per output. A flat
// array is one row of n elements: load_chunk/store_chunk fall back to element access where a
// pointer into the middle of a buffer is unaligned or the array ends mid-vector. The bias
// gradient sums over rows; atomics would make it depend on timing, so a first kernel writes
// per-slice partial sums to scratch and a second adds the slices in a fixed order.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kElementwiseThreads = 256;
constexpr int kBiasGradRows = 32;  // rows per partial sum of the bias gradient
// The CPU backend's constants, rounded from double to float as it rounds them.
constexpr float kGeluBeta = static_cast<float>(0.7978845608028654);  // sqrt(2/pi)
constexpr float kGeluCubic = static_cast<float>(0.044715);

// Chunk `chunk` (elements [chunk * size, chunk * size + size)) of a flat array of n elements.
// Offsetting the pointer keeps the int indices of load_chunk/store_chunk small for any n.
template <typename T>
__device__ __forceinline__ void load_flat(float (&out)[Packed128<T>::size], const T* p, size_t chunk, size_t n) {
  constexpr size_t V = Packed128<T>::size;
  const size_t i = chunk * V;
  load_chunk(out, p + i, 0, n - i < V ? static_cast<int>(n - i) : static_cast<int>(V));
}
template <typename T>
__device__ __forceinline__ void store_flat(T* p, size_t chunk, size_t n, const float (&in)[Packed128<T>::size]) {
  constexpr size_t V = Packed128<T>::size;
  const size_t i = chunk * V;
  store_chunk(p + i, 0, n - i < V ? static_cast<int>(n - i) : static_cast<int>(V), in);
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written in the CPU backend's order.
__device__ __forceinline__ float gelu_value(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluBeta * (x + kGeluCubic * x * x * x)));
}
// d gelu / dx.
__device__ __forceinline__ float gelu_derivative(float x) {
  const float th = tanhf(kGeluBeta * (x + kGeluCubic * x * x * x));
  const float sech2 = 1.0f - th * th;
  const float dinner = kGeluBeta * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * dinner;
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float x[V], y[V];
    load_flat(x, inp, c, n);
    for (int k = 0; k < V; ++k) y[k] = gelu_value(x[k]);
    store_flat(out, c, n, y);
  }
}

// dinp += dout * gelu'(inp).
template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float x[V], d[V], g[V];
    load_flat(x, inp, c, n);
    load_flat(d, dout, c, n);
    load_flat(g, dinp, c, n);
    for (int k = 0; k < V; ++k) g[k] += d[k] * gelu_derivative(x[k]);
    store_flat(dinp, c, n, g);
  }
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, size_t n) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float va[V], vb[V], o[V];
    load_flat(va, a, c, n);
    load_flat(vb, b, c, n);
    for (int k = 0; k < V; ++k) o[k] = va[k] + vb[k];
    store_flat(out, c, n, o);
  }
}

// out(N, OC) += bias(OC) on every row, one thread per (row, chunk).
template <typename T>
__global__ void bias_add_kernel(T* out, const T* bias, int N, int OC) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = static_cast<size_t>(ceil_div(OC, V));
  const size_t total = static_cast<size_t>(N) * chunks;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % chunks) * V;
    T* row = out + (idx / chunks) * OC;
    float o[V], b[V];
    load_chunk(o, row, i, OC);
    load_chunk(b, bias, i, OC);
    for (int k = 0; k < V; ++k) o[k] += b[k];
    store_chunk(row, i, OC, o);
  }
}

// partial(slice, OC): column sums of dout over the slice's kBiasGradRows rows, rows in order.
// One thread per chunk of channels: the reads of a row are coalesced.
template <typename T>
__global__ void bias_backward_partial_kernel(float* partial, const T* dout, int N, int OC) {
  constexpr int V = Packed128<T>::size;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x) * V;
  const int slice = blockIdx.y;
  if (i >= OC) return;
  const int r0 = slice * kBiasGradRows;
  const int r1 = r0 + kBiasGradRows < N ? r0 + kBiasGradRows : N;
  float acc[V];
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  for (int r = r0; r < r1; ++r) {
    float d[V];
    load_chunk(d, dout + static_cast<size_t>(r) * OC, i, OC);
    for (int k = 0; k < V; ++k) acc[k] += d[k];
  }
  float* out = partial + static_cast<size_t>(slice) * OC;
  for (int k = 0; k < V && i + k < OC; ++k) out[i + k] = acc[k];
}

// dbias (stored as G) += the sum of the slices' partials, slices in order (as the CPU: old value
// + column sum).
template <typename G>
__global__ void bias_backward_sum_kernel(G* dbias, const float* partial, int slices, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float sum = 0.0f;
  for (int s = 0; s < slices; ++s) sum += partial[static_cast<size_t>(s) * OC + c];
  dbias[c] = from_float<G>(to_float(dbias[c]) + sum);
}

// ---------------------------------------------------------------------------- launchers

// Blocks for `work` threads; the grid-stride loops cover any excess.
inline int elementwise_blocks(size_t work) {
  constexpr size_t kMaxBlocks = 1 << 16;
  const size_t blocks = ceil_div(work, static_cast<size_t>(kElementwiseThreads));
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// 16-byte chunks of a flat array of n elements of T.
template <typename T>
size_t flat_chunks(size_t n) {
  return ceil_div(n, static_cast<size_t>(Packed128<T>::size));
}

// out = gelu(inp), n elements.
template <typename T>
void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  PTRAIN_LAUNCH(gelu_forward_kernel<T>, elementwise_blocks(flat_chunks<T>(n)), kElementwiseThreads, 0, stream, out, inp,
                n);
}

// dinp += dout * gelu'(inp), n elements.
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  PTRAIN_LAUNCH(gelu_backward_kernel<T>, elementwise_blocks(flat_chunks<T>(n)), kElementwiseThreads, 0, stream, dinp,
                inp, dout, n);
}

// out = a + b, n elements (out may alias a or b).
template <typename T>
void add(T* out, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  PTRAIN_LAUNCH(add_kernel<T>, elementwise_blocks(flat_chunks<T>(n)), kElementwiseThreads, 0, stream, out, a, b, n);
}

// out(N, OC) += bias(OC) per row.
template <typename T>
void bias_add(T* out, const T* bias, int N, int OC, cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  const size_t work = static_cast<size_t>(N) * ceil_div(OC, Packed128<T>::size);
  PTRAIN_LAUNCH(bias_add_kernel<T>, elementwise_blocks(work), kElementwiseThreads, 0, stream, out, bias, N, OC);
}

// Floats of scratch memory bias_backward needs for N rows of OC channels.
inline size_t bias_backward_scratch_floats(int N, int OC) {
  return static_cast<size_t>(ceil_div(N, kBiasGradRows)) * static_cast<size_t>(OC);
}

// dbias(OC, stored as G) += column sums of dout(N, OC).
template <typename T, typename G = T>
void bias_backward(G* dbias, float* scratch, const T* dout, int N, int OC, cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  const int slices = ceil_div(N, kBiasGradRows);
  constexpr int kMaxSlices = 65535;  // the grid's y dimension
  if (slices > kMaxSlices)
    throw std::invalid_argument("bias_backward: " + std::to_string(N) + " rows exceed the " +
                                std::to_string(kMaxSlices * kBiasGradRows) + " it supports");
  const int chunks = ceil_div(OC, Packed128<T>::size);
  PTRAIN_LAUNCH(bias_backward_partial_kernel<T>, dim3(ceil_div(chunks, kElementwiseThreads), slices),
                kElementwiseThreads, 0, stream, scratch, dout, N, OC);
  PTRAIN_LAUNCH(bias_backward_sum_kernel<G>, ceil_div(OC, kElementwiseThreads), kElementwiseThreads, 0, stream, dbias,
                scratch, slices, OC);
}

}  // namespace ptrain::kernels

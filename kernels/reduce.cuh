// Deterministic double-precision sums: the sum and the sum of squares of a tensor, each element
// widened to double, as the CPU backend's sum / sum_squares compute them (the global gradient
// norm, loss totals, checks).
//
// Why this shape: atomics would let timing choose the order of the additions, and so the last
// bits. Here the order depends on n and the storage type alone: a grid of min(kReducePartials,
// what n needs) blocks, in which each thread adds its 16-byte chunks (grid-stride, so in index
// order) in double, then each warp combines its lanes by a fixed butterfly and thread 0 adds the
// warps in order, writing one partial sum per block; a second launch has one thread add the
// partials in order. Every float is exact in double and so is the product of two floats, so
// whether the GPU contracts x * x + s into an FMA changes nothing; the result differs from the
// CPU's chunked sum only by the rounding of double additions. NaN and infinities propagate as
// in any sum.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kReduceThreads = 256;
// The largest grid of the first stage (two blocks per SM of an H100/H200), and so the number of
// doubles of the `partials` buffer double_sum needs. Fixed: the summation order is n's alone.
constexpr int kReducePartials = 264;

// partials[block] = sum over this block's share of x (kSquares: of x^2), in double.
template <typename T, bool kSquares>
__global__ void double_sum_partial_kernel(double* partials, const T* x, size_t n) {
  PTRAIN_DYNAMIC_SHARED(double, warp_sums);  // blockDim.x / 32
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  double s = 0.0;
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t base = c * V;
    const int count = run_len(n, base, V);
    float v[V];
    load_chunk(v, x + base, 0, count);
    for (int k = 0; k < V; ++k) {
      if (k < count) {
        const double d = static_cast<double>(v[k]);
        if constexpr (kSquares)
          s += d * d;
        else
          s += d;
      }
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    const int warps = static_cast<int>(blockDim.x) / kWarpSize;
    for (int w = 0; w < warps; ++w) total += warp_sums[w];
    partials[blockIdx.x] = total;
  }
}

// *out = partials[0] + partials[1] + ..., in order, by one thread. A template only so that
// several translation units may include this header (see fp8.cuh's current_scale_kernel).
template <int = 0>
__global__ void double_sum_final_kernel(double* out, const double* partials, int count) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int i = 0; i < count; ++i) s += partials[i];
  *out = s;
}

// ---------------------------------------------------------------------------- launchers

// Blocks of the first stage for n elements of T: min(max_partials, what n needs), at least 1.
template <typename T>
int double_sum_blocks(size_t n, int max_partials) {
  const size_t chunks = ceil_div(n, static_cast<size_t>(Packed128<T>::size));
  const size_t needed = ceil_div(chunks, static_cast<size_t>(kReduceThreads));
  if (needed < 1) return 1;
  return needed < static_cast<size_t>(max_partials) ? static_cast<int>(needed) : max_partials;
}

// *out (device memory) = the sum of x[0, n) in double, or with `squares` the sum of x[i]^2, in
// an order fixed by n (the same bits every run). `partials` is scratch of kReducePartials
// doubles. n = 0 gives 0. max_partials caps the first stage's grid (tests lower it to exercise
// the grid-stride loop; the backend keeps kReducePartials).
template <typename T>
void double_sum(double* out, double* partials, const T* x, size_t n, bool squares, cudaStream_t stream,
                int max_partials = kReducePartials) {
  if (max_partials < 1 || max_partials > kReducePartials)
    throw std::invalid_argument("double_sum: max_partials must be in [1, " + std::to_string(kReducePartials) + "]");
  const int blocks = double_sum_blocks<T>(n, max_partials);
  const size_t shared = (kReduceThreads / kWarpSize) * sizeof(double);
  if (squares) {
    // A name with a comma cannot be a macro argument.
    auto double_sum_partial_kernel_instance = double_sum_partial_kernel<T, true>;
    PTRAIN_LAUNCH(double_sum_partial_kernel_instance, blocks, kReduceThreads, shared, stream, partials, x, n);
  } else {
    auto double_sum_partial_kernel_instance = double_sum_partial_kernel<T, false>;
    PTRAIN_LAUNCH(double_sum_partial_kernel_instance, blocks, kReduceThreads, shared, stream, partials, x, n);
  }
  PTRAIN_LAUNCH(double_sum_final_kernel<0>, 1, kWarpSize, 0, stream, out, partials, blocks);
}

}  // namespace ptrain::kernels

// The fused classifier: softmax, cross-entropy loss and the logits' gradient in one kernel.
//
// Why this shape: the logits (N, Vp) are the largest activation of a GPT-2 step (50304 columns a
// row), so the kernel reads each row twice and writes it once, in place, and never keeps a
// second copy: the row's gradient dloss * (softmax - onehot(target)) replaces it, as in the CPU
// backend's classifier. One block per row. In the first pass each thread keeps a running max and
// a sum of exponentials rescaled to it (one read gives both statistics); two block reductions
// combine the threads' partials, and the second pass writes the gradient, zeros in the padded
// columns V..Vp. Losses and all arithmetic are FP32; the gradient is rounded once to the storage
// type.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kClassifierThreads = 512;

template <typename T>
__launch_bounds__(kClassifierThreads)  // lets ptxas fit the registers to the 512-thread blocks
__global__ void fused_classifier_kernel(T* logits, float* losses, const int* targets, int V, int Vp, float dloss) {
  PTRAIN_DYNAMIC_SHARED(float, scratch);  // 32 floats for the block reductions
  constexpr int W = Packed128<T>::size;
  const int n = blockIdx.x;
  const int first = static_cast<int>(threadIdx.x) * W, stride = static_cast<int>(blockDim.x) * W;
  T* row = logits + static_cast<size_t>(n) * Vp;
  const int target = targets[n];
  // Read before the reductions' barriers: after them the row is being overwritten.
  const float target_logit = threadIdx.x == 0 ? to_float(row[target]) : 0.0f;

  // This thread's running max m and sum s of exp(x - m) over its chunks, rescaled as m grows.
  float m = -INFINITY, s = 0.0f;
  for (int i = first; i < V; i += stride) {
    float x[W];
    load_chunk(x, row, i, V);
    float chunk_max = m;
    for (int k = 0; k < W && i + k < V; ++k) chunk_max = fmaxf(chunk_max, x[k]);
    s *= expf(m - chunk_max);
    for (int k = 0; k < W && i + k < V; ++k) s += expf(x[k] - chunk_max);
    m = chunk_max;
  }
  const float row_max = block_max(m, scratch);
  // A thread that saw no column has s = 0 and m = -inf: it adds 0 * exp(-inf) = 0.
  const float sum = block_sum(s * expf(m - row_max), scratch);
  if (threadIdx.x == 0) losses[n] = logf(sum) - (target_logit - row_max);

  // Each thread rewrites exactly the chunks it read, so no thread overwrites another's input.
  const float scale = dloss / sum;
  for (int i = first; i < Vp; i += stride) {
    float x[W], g[W];
    load_chunk(x, row, i, V);
    for (int k = 0; k < W; ++k) {
      const int col = i + k;
      g[k] = col < V ? expf(x[k] - row_max) * scale - (col == target ? dloss : 0.0f) : 0.0f;
    }
    store_chunk(row, i, Vp, g);
  }
}

// ---------------------------------------------------------------------------- launchers

// logits (N, Vp): losses[n] = logsumexp(row[0, V)) - row[target[n]] (FP32), and the row is
// overwritten by dloss * (softmax - onehot(target)) for columns < V and 0 for V..Vp (all zeros
// when dloss = 0).
template <typename T>
void fused_classifier(T* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      cudaStream_t stream) {
  PTRAIN_LAUNCH(fused_classifier_kernel<T>, N, kClassifierThreads, kWarpSize * sizeof(float), stream, logits, losses,
                targets, V, Vp, dloss);
}

}  // namespace ptrain::kernels

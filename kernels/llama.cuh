// The ops of a Llama-style block: RMSNorm (forward saving FP32 1/rms, backward; over a plain
// matrix, or over QK-norm's q or k heads inside qkv rows), rotary position embeddings in place
// (rotate-half layout) and the SwiGLU activation.
//
// Why this shape: RMSNorm gives one warp to each row, its lanes reading 16-byte chunks and
// reducing by a fixed butterfly; the weight gradient sums over rows, so as for layernorm a
// first kernel writes per-slice partial sums and a second adds the slices in order (atomics
// would let timing choose the last bits). RoPE and SwiGLU are elementwise: one thread per
// rotated pair or output element, grid-stride, FP32 arithmetic rounded once on the write.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kLlamaThreads = 256;
constexpr int kRmsNormGradRows = 32;  // rows per partial sum of the weight gradient

// ---------------------------------------------------------------------------- RMSNorm

// Where row r of C elements starts: rows in groups of `group` adjacent rows, the groups `stride`
// elements apart ({1, C}: a plain matrix; QK-norm: {heads, qkv width}).
struct NormRows {
  int group;
  size_t stride;
  __host__ __device__ size_t at(int r, int C) const {
    return static_cast<size_t>(r / group) * stride + static_cast<size_t>(r % group) * C;
  }
};

// out(row) = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); one warp per row.
template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                                       NormRows rows) {
  constexpr int V = Packed128<T>::size;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= N) return;  // no block barriers here: a spare warp may leave
  const T* x = inp + rows.at(row, C);
  float squares = 0.0f;
  for (int i = lane * V; i < C; i += kWarpSize * V) {
    float v[V];
    load_chunk(v, x, i, C);
    for (int k = 0; k < V; ++k) squares += v[k] * v[k];  // elements past C read as 0
  }
  const float s = 1.0f / sqrtf(warp_sum(squares) / C + eps);
  for (int i = lane * V; i < C; i += kWarpSize * V) {
    float v[V], w[V];
    load_chunk(v, x, i, C);
    load_chunk(w, weight, i, C);
    for (int k = 0; k < V; ++k) v[k] = v[k] * s * w[k];
    store_chunk(out + rows.at(row, C), i, C, v);
  }
  if (lane == 0) rstd[row] = s;
}

// dinp(row) += s g - s^3 x mean(g x) with g = weight * dout; one warp per row.
template <typename T>
__global__ void rmsnorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                                              int N, int C, NormRows rows) {
  constexpr int V = Packed128<T>::size;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= N) return;
  const size_t offset = rows.at(row, C);
  float gx = 0.0f;
  for (int i = lane * V; i < C; i += kWarpSize * V) {
    float d[V], x[V], w[V];
    load_chunk(d, dout + offset, i, C);
    load_chunk(x, inp + offset, i, C);
    load_chunk(w, weight, i, C);
    for (int k = 0; k < V; ++k) gx += w[k] * d[k] * x[k];
  }
  const float s = rstd[row];
  const float scale = s * s * s * warp_sum(gx) / C;
  for (int i = lane * V; i < C; i += kWarpSize * V) {
    float d[V], x[V], w[V], di[V];
    load_chunk(d, dout + offset, i, C);
    load_chunk(x, inp + offset, i, C);
    load_chunk(w, weight, i, C);
    load_chunk(di, dinp + offset, i, C);
    for (int k = 0; k < V; ++k) di[k] += s * w[k] * d[k] - scale * x[k];
    store_chunk(dinp + offset, i, C, di);
  }
}

// partial(slice, C): over the slice's kRmsNormGradRows rows, the sum of dout * x * rstd. One
// thread per channel, rows in order.
template <typename T>
__global__ void rmsnorm_backward_partial_kernel(float* partial, const T* dout, const T* inp, const float* rstd, int N,
                                                int C, NormRows rows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int slice = blockIdx.y;
  if (c >= C) return;
  const int r0 = slice * kRmsNormGradRows;
  const int r1 = r0 + kRmsNormGradRows < N ? r0 + kRmsNormGradRows : N;
  float sum = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = rows.at(r, C) + c;
    sum += to_float(dout[i]) * to_float(inp[i]) * rstd[r];
  }
  partial[static_cast<size_t>(slice) * C + c] = sum;
}

// dweight (stored as G) += the slices' partial sums, slices in order.
template <typename G>
__global__ void rmsnorm_backward_weight_kernel(G* dweight, const float* partial, int slices, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = to_float(dweight[c]);
  for (int s = 0; s < slices; ++s) sum += partial[static_cast<size_t>(s) * C + c];
  dweight[c] = from_float<G>(sum);
}

// QK-norm's v heads: columns [begin, width) of each of `rows` rows, copied (forward) or added
// (backward) from src into dst. One thread per element, grid-stride.
template <typename T>
__global__ void copy_tail_columns_kernel(T* dst, const T* src, int rows, int width, int begin, bool accumulate) {
  const int span = width - begin;
  const size_t n = static_cast<size_t>(rows) * span;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = e / span * width + begin + e % span;
    dst[i] = accumulate ? from_float<T>(to_float(dst[i]) + to_float(src[i])) : src[i];
  }
}

// ---------------------------------------------------------------------------- RoPE

// One thread per pair (row, head, i): elements i and i + hs/2 of the head turn by the angle
// whose cos and sin table holds at (position, i); direction -1 turns back. In place.
template <typename T>
__global__ void rope_kernel(T* x, const float* table, int rows, int Tn, int width, int heads, int half,
                            float direction) {
  const size_t pairs = static_cast<size_t>(rows) * heads * half;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const int h = static_cast<int>(p / half % heads);
    const int row = static_cast<int>(p / half / heads);
    const float* angle = table + (static_cast<size_t>(row % Tn) * half + i) * 2;
    const float c = angle[0], s = direction * angle[1];
    T* v = x + static_cast<size_t>(row) * width + static_cast<size_t>(h) * 2 * half;
    const float a = to_float(v[i]), b = to_float(v[i + half]);
    v[i] = from_float<T>(a * c - b * s);
    v[i + half] = from_float<T>(b * c + a * s);
  }
}

// ---------------------------------------------------------------------------- SwiGLU

__device__ __forceinline__ float logistic(float x) { return 1.0f / (1.0f + expf(-x)); }

// out(n, h) = silu(gate) * up, each row of gate_up holding H gate values, then H up values.
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int N, int H) {
  const size_t n_out = static_cast<size_t>(N) * H;
  for (size_t o = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < n_out;
       o += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t g = o / H * 2 * H + o % H;
    const float gate = to_float(gate_up[g]), up = to_float(gate_up[g + H]);
    out[o] = from_float<T>(gate * logistic(gate) * up);
  }
}

// d gate += dout * up * s (1 + gate (1 - s)), d up += dout * gate * s, with s = logistic(gate).
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int N, int H) {
  const size_t n_out = static_cast<size_t>(N) * H;
  for (size_t o = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < n_out;
       o += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t g = o / H * 2 * H + o % H;
    const float gate = to_float(gate_up[g]), up = to_float(gate_up[g + H]), d = to_float(dout[o]);
    const float s = logistic(gate);
    dgate_up[g] = from_float<T>(to_float(dgate_up[g]) + d * up * s * (1.0f + gate * (1.0f - s)));
    dgate_up[g + H] = from_float<T>(to_float(dgate_up[g + H]) + d * gate * s);
  }
}

// ---------------------------------------------------------------------------- launchers

inline int llama_blocks(size_t work) {
  constexpr size_t kMaxBlocks = 1 << 16;
  const size_t blocks = ceil_div(work, static_cast<size_t>(kLlamaThreads));
  return static_cast<int>(blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// out, inp (N, C), or N rows laid out as `rows` says; rstd (N) FP32 written.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps, cudaStream_t stream,
                     NormRows rows = {1, 0}) {
  if (N == 0) return;
  if (rows.stride == 0) rows.stride = static_cast<size_t>(C);
  const int rows_per_block = kLlamaThreads / kWarpSize;
  PTRAIN_LAUNCH(rmsnorm_forward_kernel<T>, ceil_div(N, rows_per_block), kLlamaThreads, 0, stream, out, rstd, inp,
                weight, N, C, eps, rows);
}

// Floats of scratch memory rmsnorm_backward needs for N rows of C channels.
inline size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return static_cast<size_t>(ceil_div(N, kRmsNormGradRows)) * static_cast<size_t>(C);
}

// Adds into dinp (N, C) and dweight (C, stored as G). dinp must not alias dout: the weight
// gradient reads dout after dinp has been updated.
template <typename T, typename G = T>
void rmsnorm_backward(T* dinp, G* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, cudaStream_t stream, NormRows rows = {1, 0}) {
  if (N == 0) return;
  if (rows.stride == 0) rows.stride = static_cast<size_t>(C);
  const int rows_per_block = kLlamaThreads / kWarpSize;
  PTRAIN_LAUNCH(rmsnorm_backward_input_kernel<T>, ceil_div(N, rows_per_block), kLlamaThreads, 0, stream, dinp, dout,
                inp, weight, rstd, N, C, rows);
  const int slices = ceil_div(N, kRmsNormGradRows);
  if (slices > 65535) throw std::invalid_argument("rmsnorm_backward: " + std::to_string(N) + " rows exceed the grid");
  constexpr int kThreads = 128;
  PTRAIN_LAUNCH(rmsnorm_backward_partial_kernel<T>, dim3(ceil_div(C, kThreads), slices), kThreads, 0, stream, scratch,
                dout, inp, rstd, N, C, rows);
  PTRAIN_LAUNCH(rmsnorm_backward_weight_kernel<G>, ceil_div(C, kThreads), kThreads, 0, stream, dweight, scratch, slices,
                C);
}

// QK-norm over `rows` qkv rows of (NH + 2 KV) hs: q's heads by q_weight, k's by k_weight, v's
// copied into out unless out is inp; rstd (rows NH + rows KV) FP32 written, q's rows first.
template <typename T>
void qk_norm_forward(T* out, float* rstd, const T* inp, const T* q_weight, const T* k_weight, int rows, int NH, int KV,
                     int hs, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  const int width = (NH + 2 * KV) * hs;
  const size_t k_at = static_cast<size_t>(NH) * hs;
  rmsnorm_forward(out, rstd, inp, q_weight, rows * NH, hs, eps, stream, NormRows{NH, static_cast<size_t>(width)});
  rmsnorm_forward(out + k_at, rstd + static_cast<size_t>(rows) * NH, inp + k_at, k_weight, rows * KV, hs, eps, stream,
                  NormRows{KV, static_cast<size_t>(width)});
  if (out == inp) return;
  PTRAIN_LAUNCH(copy_tail_columns_kernel<T>, llama_blocks(static_cast<size_t>(rows) * KV * hs), kLlamaThreads, 0,
                stream, out, inp, rows, width, (NH + KV) * hs, false);
}

// Floats of scratch memory qk_norm_backward needs (the larger of its two weight gradients).
inline size_t qk_norm_backward_scratch_floats(int rows, int NH, int hs) {
  return rmsnorm_backward_scratch_floats(rows * NH, hs);
}

// Adds into dinp (rows, W), dq_weight and dk_weight (hs, stored as G); v's gradient passes
// through. dinp must not alias dout.
template <typename T, typename G = T>
void qk_norm_backward(T* dinp, G* dq_weight, G* dk_weight, float* scratch, const T* dout, const T* inp,
                      const T* q_weight, const T* k_weight, const float* rstd, int rows, int NH, int KV, int hs,
                      cudaStream_t stream) {
  if (rows == 0) return;
  const int width = (NH + 2 * KV) * hs;
  const size_t k_at = static_cast<size_t>(NH) * hs;
  rmsnorm_backward(dinp, dq_weight, scratch, dout, inp, q_weight, rstd, rows * NH, hs, stream,
                   NormRows{NH, static_cast<size_t>(width)});
  rmsnorm_backward(dinp + k_at, dk_weight, scratch, dout + k_at, inp + k_at, k_weight,
                   rstd + static_cast<size_t>(rows) * NH, rows * KV, hs, stream, NormRows{KV, static_cast<size_t>(width)});
  PTRAIN_LAUNCH(copy_tail_columns_kernel<T>, llama_blocks(static_cast<size_t>(rows) * KV * hs), kLlamaThreads, 0,
                stream, dinp, dout, rows, width, (NH + KV) * hs, true);
}

// x (rows = B * T, width): the first `heads` heads of size 2 * half turn; table (T, half, 2).
template <typename T>
void rope(T* x, const float* table, int rows, int Tn, int width, int heads, int half, bool inverse,
          cudaStream_t stream) {
  const size_t pairs = static_cast<size_t>(rows) * heads * half;
  if (pairs == 0) return;
  PTRAIN_LAUNCH(rope_kernel<T>, llama_blocks(pairs), kLlamaThreads, 0, stream, x, table, rows, Tn, width, heads, half,
                inverse ? -1.0f : 1.0f);
}

// out (N, H) from gate_up (N, 2H).
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int H, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(N) * H;
  if (n == 0) return;
  PTRAIN_LAUNCH(swiglu_forward_kernel<T>, llama_blocks(n), kLlamaThreads, 0, stream, out, gate_up, N, H);
}

// Adds into dgate_up (N, 2H).
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int H, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(N) * H;
  if (n == 0) return;
  PTRAIN_LAUNCH(swiglu_backward_kernel<T>, llama_blocks(n), kLlamaThreads, 0, stream, dgate_up, dout, gate_up, N, H);
}

}  // namespace ptrain::kernels

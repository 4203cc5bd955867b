// Attention's fallback path, used where cuDNN SDPA is not: the kernels around its cuBLASLt
// batched GEMMs (the GEMMs themselves live with the cuBLASLt wrappers). Forward:
//   qkv -> attention_permute -> q, k, v;  preatt = q k^T;  att = softmax_causal_forward(preatt);
//   y = att v;  attention_unpermute(y) -> out.
// Backward runs the same chain in reverse; only attention_permute_backward adds (+=) into
// dqkv, like every backward op, because the other gradients here are scratch.
//
// Why this shape: a GEMM wants each head's rows contiguous, (B, NH, T, HS), while the model keeps
// tokens contiguous, (B, T, NH + 2 KV, HS) for qkv (q's NH heads, then k's and v's KV heads:
// backend/attention_heads.h) and (B, T, NH, HS) for out. With grouped-query attention
// (KV < NH) the permute copies each K/V head once for every query head of its group, so the
// GEMMs are those of multi-head attention, and the backward permute sums the group's
// gradients, in a fixed order, into the K/V head's. The permutes move
// 16-byte chunks of a head's HS elements, one chunk per thread, bit for bit. The causal softmax
// gives one warp to each row: a lane keeps a running max and a sum rescaled to it while it reads
// its chunks of the visible part (j <= t), so the row is read once for the statistics and once
// to write, and the masked part (j > t) is written as zeros that the next GEMM can read.
#pragma once

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kAttentionThreads = 256;  // 8 warps: 8 softmax rows, or 256 permute chunks, per block
// Decoding runs a block of at least HS threads per head, up to 512 (head sizes up to 512): at 1024
// threads a thread has 64 registers and the kernel spills; at 512, one block an SM, it needs ~120
// (decoding has one block per head: occupancy is not what limits it).
constexpr int kAttentionDecodeMaxThreads = 512;

// A thread's chunk of one head row: `head` is the row's offset in the per-head layout
// (B, NH, T, HS), `token` the same row's offset in a token layout (B, T, token_heads, HS), and
// `i` the chunk's first element within HS.
struct HeadChunk {
  bool valid;
  int i;
  int h;  // the head
  size_t head;
  size_t token;
};

template <typename T>
__device__ __forceinline__ HeadChunk head_chunk(int B, int Tn, int NH, int HS, int token_heads) {
  constexpr int V = Packed128<T>::size;
  const int chunks = ceil_div(HS, V);
  const int idx = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int row = idx / chunks;  // (b, h, t)
  const int t = row % Tn, h = (row / Tn) % NH, b = row / Tn / NH;
  return {idx < B * NH * Tn * chunks, (idx % chunks) * V, h, static_cast<size_t>(row) * HS,
          ((static_cast<size_t>(b) * Tn + t) * token_heads + h) * HS};
}

// Copies elements [i, min(i + size, n)) of a row without converting them: exact for any bits.
template <typename T>
__device__ __forceinline__ void copy_chunk(T* dst, const T* src, int i, int n) {
  constexpr int V = Packed128<T>::size;
  if (i + V <= n && aligned16(src + i) && aligned16(dst + i)) {
    store128(dst + i, load128(src + i));
  } else {
    for (int k = 0; k < V && i + k < n; ++k) dst[i + k] = src[i + k];
  }
}

// dst += src over elements [i, min(i + size, n)) of a row: one FP32 addition, rounded once.
template <typename T>
__device__ __forceinline__ void add_chunk(T* dst, const T* src, int i, int n) {
  constexpr int V = Packed128<T>::size;
  float acc[V], x[V];
  load_chunk(acc, dst, i, n);
  load_chunk(x, src, i, n);
  for (int k = 0; k < V; ++k) acc[k] += x[k];
  store_chunk(dst, i, n, acc);
}

// Where query head h's K head sits in a qkv row, relative to the row's q head h.
__device__ __forceinline__ size_t kv_head_shift(int h, int NH, int KV, int HS) {
  return static_cast<size_t>(NH - h + h / (NH / KV)) * HS;
}

// qkv (B, T, NH + 2 KV, HS) -> q, k, v, each (B, NH, T, HS).
template <typename T>
__global__ void attention_permute_kernel(T* q, T* k, T* v, const T* qkv, int B, int Tn, int NH, int KV, int HS) {
  const HeadChunk c = head_chunk<T>(B, Tn, NH, HS, NH + 2 * KV);
  if (!c.valid) return;
  const size_t key = c.token + kv_head_shift(c.h, NH, KV, HS), kv_width = static_cast<size_t>(KV) * HS;
  copy_chunk(q + c.head, qkv + c.token, c.i, HS);
  copy_chunk(k + c.head, qkv + key, c.i, HS);
  copy_chunk(v + c.head, qkv + key + kv_width, c.i, HS);
}

// dqkv (B, T, NH + 2 KV, HS) += dq, dk, dv, each (B, NH, T, HS): the thread of a group's first
// query head also adds the group's dk and dv, summed in FP32 in head order, into its K/V head.
template <typename T>
__global__ void attention_permute_backward_kernel(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int Tn, int NH,
                                                  int KV, int HS) {
  constexpr int V = Packed128<T>::size;
  const HeadChunk c = head_chunk<T>(B, Tn, NH, HS, NH + 2 * KV);
  if (!c.valid) return;
  add_chunk(dqkv + c.token, dq + c.head, c.i, HS);
  const int group = NH / KV;
  if (c.h % group != 0) return;
  const size_t key = c.token + kv_head_shift(c.h, NH, KV, HS), kv_width = static_cast<size_t>(KV) * HS;
  const size_t head_stride = static_cast<size_t>(Tn) * HS;  // from head h to h + 1 in (B, NH, T, HS)
  float acc_k[V], acc_v[V], x[V];
  load_chunk(acc_k, dqkv + key, c.i, HS);
  load_chunk(acc_v, dqkv + key + kv_width, c.i, HS);
  for (int g = 0; g < group; ++g) {
    load_chunk(x, dk + c.head + g * head_stride, c.i, HS);
    for (int e = 0; e < V; ++e) acc_k[e] += x[e];
    load_chunk(x, dv + c.head + g * head_stride, c.i, HS);
    for (int e = 0; e < V; ++e) acc_v[e] += x[e];
  }
  store_chunk(dqkv + key, c.i, HS, acc_k);
  store_chunk(dqkv + key + kv_width, c.i, HS, acc_v);
}

// y (B, NH, T, HS) -> out (B, T, NH, HS), i.e. (B, T, C).
template <typename T>
__global__ void attention_unpermute_kernel(T* out, const T* y, int B, int Tn, int NH, int HS) {
  const HeadChunk c = head_chunk<T>(B, Tn, NH, HS, NH);
  if (c.valid) copy_chunk(out + c.token, y + c.head, c.i, HS);
}

// dout (B, T, C) -> dy (B, NH, T, HS).
template <typename T>
__global__ void attention_unpermute_backward_kernel(T* dy, const T* dout, int B, int Tn, int NH, int HS) {
  const HeadChunk c = head_chunk<T>(B, Tn, NH, HS, NH);
  if (c.valid) copy_chunk(dy + c.head, dout + c.token, c.i, HS);
}

// One warp per row (b, h, t) of preatt (B*NH*T, T): att[t, j] = softmax over j <= t of
// scale * preatt[t, j], and 0 for j > t. att may alias preatt: a lane rewrites only what it read.
template <typename T>
__global__ void softmax_causal_forward_kernel(T* att, const T* preatt, float scale, int rows, int Tn) {
  constexpr int V = Packed128<T>::size;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // no block barriers here: a spare warp may leave
  const int n = row % Tn + 1;  // query t sees keys 0..t
  const T* in = preatt + static_cast<size_t>(row) * Tn;
  T* out = att + static_cast<size_t>(row) * Tn;
  // This lane's running max m and sum s of exp(x - m), rescaled whenever m grows.
  float m = -INFINITY, s = 0.0f;
  for (int i = lane * V; i < n; i += kWarpSize * V) {
    float x[V];
    load_chunk(x, in, i, n);
    float chunk_max = m;
    for (int k = 0; k < V && i + k < n; ++k) chunk_max = fmaxf(chunk_max, scale * x[k]);
    s *= expf(m - chunk_max);
    for (int k = 0; k < V && i + k < n; ++k) s += expf(scale * x[k] - chunk_max);
    m = chunk_max;
  }
  const float row_max = warp_max(m);
  // A lane that saw no element has s = 0 and m = -inf: it adds 0 * exp(-inf) = 0.
  const float inv_sum = 1.0f / warp_sum(s * expf(m - row_max));
  for (int i = lane * V; i < Tn; i += kWarpSize * V) {
    float x[V], p[V];
    load_chunk(x, in, i, n);
    for (int k = 0; k < V; ++k) p[k] = i + k < n ? expf(scale * x[k] - row_max) * inv_sum : 0.0f;
    store_chunk(out, i, Tn, p);
  }
}

// One warp per row: dpreatt[t, j] = scale * att[t, j] * (datt[t, j] - sum_{k<=t} att[t, k] datt[t, k])
// for j <= t, 0 above. Written, not added: dpreatt is scratch. It may alias datt.
template <typename T>
__global__ void softmax_causal_backward_kernel(T* dpreatt, const T* datt, const T* att, float scale, int rows, int Tn) {
  constexpr int V = Packed128<T>::size;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int n = row % Tn + 1;
  const size_t offset = static_cast<size_t>(row) * Tn;
  float dot = 0.0f;
  for (int i = lane * V; i < n; i += kWarpSize * V) {
    float a[V], d[V];
    load_chunk(a, att + offset, i, n);
    load_chunk(d, datt + offset, i, n);
    for (int k = 0; k < V; ++k) dot += a[k] * d[k];  // elements past n read as 0
  }
  const float total = warp_sum(dot);
  for (int i = lane * V; i < Tn; i += kWarpSize * V) {
    float a[V], d[V], g[V];
    load_chunk(a, att + offset, i, n);
    load_chunk(d, datt + offset, i, n);
    for (int k = 0; k < V; ++k) g[k] = i + k < n ? scale * a[k] * (d[k] - total) : 0.0f;
    store_chunk(dpreatt + offset, i, Tn, g);
  }
}

// One query over a sequence's cached keys and values (incremental decoding, the KV cache):
// qkv (n, 3, NH, HS) holds rows 0..n-1 of one sequence; out (NH, HS) = the softmax over j < n
// of scale q_{n-1} . k_j, times v_j, for head blockIdx.x. The keys go in tiles of blockDim.x: a
// warp scores one key at a time (lanes over HS, a butterfly sum) into shared memory; the block
// then moves its running max and sum on (online softmax) and thread d < HS its running sum of
// p_j v_j[d], both rescaled when the max grows, so any n takes one pass and fixed shared memory:
// blockDim.x scores, then 32 floats for the block reductions.
template <typename T>
__launch_bounds__(kAttentionDecodeMaxThreads, 1)  // one block of up to 512 threads per SM: up to 128 registers
__global__ void attention_decode_kernel(T* out, const T* qkv, int n, int NH, int KV, int HS, float scale) {
  PTRAIN_DYNAMIC_SHARED(float, shared);
  float* scores = shared;
  float* scratch = shared + blockDim.x;
  const int h = blockIdx.x, tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int warps = blockDim.x / kWarpSize, tile_size = blockDim.x;
  const size_t ld = static_cast<size_t>(NH + 2 * KV) * HS;
  const T* q = qkv + static_cast<size_t>(n - 1) * ld + static_cast<size_t>(h) * HS;
  const T* keys = qkv + static_cast<size_t>(NH + h / (NH / KV)) * HS;
  const T* values = keys + static_cast<size_t>(KV) * HS;
  float m = -INFINITY, sum = 0.0f, acc = 0.0f;
  for (int j0 = 0; j0 < n; j0 += tile_size) {
    const int tile = n - j0 < tile_size ? n - j0 : tile_size;
    for (int j = warp; j < tile; j += warps) {
      const T* k = keys + static_cast<size_t>(j0 + j) * ld;
      float dot = 0.0f;
      for (int d = lane; d < HS; d += kWarpSize) dot += to_float(q[d]) * to_float(k[d]);
      dot = warp_sum(dot);
      if (lane == 0) scores[j] = scale * dot;
    }
    __syncthreads();
    const float s = tid < tile ? scores[tid] : -INFINITY;
    const float m_new = fmaxf(m, block_max(s, scratch));
    const float p = tid < tile ? expf(s - m_new) : 0.0f;
    const float rescale = expf(m - m_new);  // 0 on the first tile (m = -inf)
    sum = sum * rescale + block_sum(p, scratch);
    scores[tid] = p;  // each thread rewrites only its own score
    __syncthreads();
    if (tid < HS) {
      float a = acc * rescale;
      for (int j = 0; j < tile; ++j) a += scores[j] * to_float(values[static_cast<size_t>(j0 + j) * ld + tid]);
      acc = a;
    }
    m = m_new;
    __syncthreads();  // the next tile overwrites the scores
  }
  if (tid < HS) out[static_cast<size_t>(h) * HS + tid] = from_float<T>(acc / sum);
}

// ---------------------------------------------------------------------------- launchers

template <typename T>
inline int attention_permute_blocks(int B, int Tn, int NH, int HS) {
  return ceil_div(B * NH * Tn * ceil_div(HS, Packed128<T>::size), kAttentionThreads);
}

// qkv (B, T, (NH + 2 KV) HS) -> q, k, v (B, NH, T, HS); KV divides NH.
template <typename T>
void attention_permute(T* q, T* k, T* v, const T* qkv, int B, int Tn, int NH, int KV, int HS, cudaStream_t stream) {
  PTRAIN_LAUNCH(attention_permute_kernel<T>, attention_permute_blocks<T>(B, Tn, NH, HS), kAttentionThreads, 0, stream, q,
                k, v, qkv, B, Tn, NH, KV, HS);
}

// y (B, NH, T, HS) -> out (B, T, C).
template <typename T>
void attention_unpermute(T* out, const T* y, int B, int Tn, int NH, int HS, cudaStream_t stream) {
  PTRAIN_LAUNCH(attention_unpermute_kernel<T>, attention_permute_blocks<T>(B, Tn, NH, HS), kAttentionThreads, 0, stream,
                out, y, B, Tn, NH, HS);
}

// Writes dy (B, NH, T, HS) from dout (B, T, C).
template <typename T>
void attention_unpermute_backward(T* dy, const T* dout, int B, int Tn, int NH, int HS, cudaStream_t stream) {
  PTRAIN_LAUNCH(attention_unpermute_backward_kernel<T>, attention_permute_blocks<T>(B, Tn, NH, HS), kAttentionThreads, 0,
                stream, dy, dout, B, Tn, NH, HS);
}

// Adds dq, dk, dv (B, NH, T, HS) into dqkv (B, T, (NH + 2 KV) HS).
template <typename T>
void attention_permute_backward(T* dqkv, const T* dq, const T* dk, const T* dv, int B, int Tn, int NH, int KV, int HS,
                                cudaStream_t stream) {
  PTRAIN_LAUNCH(attention_permute_backward_kernel<T>, attention_permute_blocks<T>(B, Tn, NH, HS), kAttentionThreads, 0,
                stream, dqkv, dq, dk, dv, B, Tn, NH, KV, HS);
}

// att, preatt (BNH, T, T) with BNH = B * NH.
template <typename T>
void softmax_causal_forward(T* att, const T* preatt, float scale, int BNH, int Tn, cudaStream_t stream) {
  const int rows = BNH * Tn, rows_per_block = kAttentionThreads / kWarpSize;
  PTRAIN_LAUNCH(softmax_causal_forward_kernel<T>, ceil_div(rows, rows_per_block), kAttentionThreads, 0, stream, att,
                preatt, scale, rows, Tn);
}

// dpreatt, datt, att (BNH, T, T); dpreatt is written, not added.
template <typename T>
void softmax_causal_backward(T* dpreatt, const T* datt, const T* att, float scale, int BNH, int Tn,
                             cudaStream_t stream) {
  const int rows = BNH * Tn, rows_per_block = kAttentionThreads / kWarpSize;
  PTRAIN_LAUNCH(softmax_causal_backward_kernel<T>, ceil_div(rows, rows_per_block), kAttentionThreads, 0, stream,
                dpreatt, datt, att, scale, rows, Tn);
}

// out (NH HS) = attention of row n-1 of qkv (n, (NH + 2 KV) HS) over rows 0..n-1 (n >= 1,
// HS <= kAttentionDecodeMaxThreads): one block per query head, of at least HS threads.
template <typename T>
void attention_decode(T* out, const T* qkv, int n, int NH, int KV, int HS, float scale, cudaStream_t stream) {
  const int threads = HS > kAttentionThreads ? ceil_div(HS, kWarpSize) * kWarpSize : kAttentionThreads;
  PTRAIN_LAUNCH(attention_decode_kernel<T>, NH, threads, (threads + kWarpSize) * sizeof(float), stream, out, qkv, n, NH,
                KV, HS, scale);
}

}  // namespace ptrain::kernels

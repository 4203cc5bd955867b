// Token + position embedding ("encoder"): forward and a deterministic backward.
//
// Why this shape: the forward gathers two rows per position and is memory-bound, so each thread
// moves one 16-byte chunk of a row. The backward scatters: many positions may share a token, and
// float atomics would make dwte depend on timing. So the host sorts positions by token (a stable
// counting sort, bucket_tokens) and one thread owns each (token, chunk of channels), adding its
// positions' gradient rows in ascending order into the old value and rounding once. That is the
// CPU backend's order, so results are bit-identical to it. dwpe sums over the batch in order,
// one thread per (position, chunk).
#pragma once

#include <algorithm>
#include <vector>

#include "common.cuh"

namespace ptrain::kernels {

constexpr int kEncoderThreads = 256;

// The buckets of n positions (TokenBuckets below) packed into 3n + 2 ints in a layout that
// depends on n only: [count | ids (n) | starts (n + 1) | positions (n)], unused slots left as
// they are. A kernel launched on one batch's buffer (a CUDA graph replays exactly that launch)
// then reads whatever batch was packed into it since.
struct PackedBucketsView {
  int count;
  const int* ids;
  const int* starts;
  const int* positions;
  __host__ __device__ static PackedBucketsView of(const int* packed, int n) {
    return {packed[0], packed + 1, packed + 1 + n, packed + 2 + 2 * static_cast<size_t>(n)};
  }
};
__host__ __device__ constexpr size_t packed_bucket_ints(int n) { return 3 * static_cast<size_t>(n) + 2; }

// out(N, C) = wte[tokens[bt]] + wpe[bt % Tn], one rounding per element; wte's row alone without wpe.
template <typename T>
__global__ void encoder_forward_kernel(T* out, const int* tokens, const T* wte, const T* wpe, int N, int Tn, int C) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = static_cast<size_t>(ceil_div(C, V));
  const size_t total = static_cast<size_t>(N) * chunks;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int bt = static_cast<int>(idx / chunks), i = static_cast<int>(idx % chunks) * V;
    float e[V], p[V], o[V];
    load_chunk(e, wte + static_cast<size_t>(tokens[bt]) * C, i, C);
    if (wpe) {
      load_chunk(p, wpe + static_cast<size_t>(bt % Tn) * C, i, C);
      for (int k = 0; k < V; ++k) o[k] = e[k] + p[k];
    } else {
      for (int k = 0; k < V; ++k) o[k] = e[k];
    }
    store_chunk(out + static_cast<size_t>(bt) * C, i, C, o);
  }
}

// dwpe(t, :) += dout(b, t, :) for b ascending, one thread per (t, chunk of dout's row); dwpe
// stored as G.
template <typename T, typename G>
__global__ void encoder_backward_wpe_kernel(G* dwpe, const T* dout, int B, int Tn, int C) {
  constexpr int V = Packed128<T>::size;
  const size_t chunks = static_cast<size_t>(ceil_div(C, V));
  const size_t total = static_cast<size_t>(Tn) * chunks;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx / chunks), i = static_cast<int>(idx % chunks) * V;
    G* row = dwpe + static_cast<size_t>(t) * C;
    float acc[V];
    load_span(acc, row, i, C);
    for (int b = 0; b < B; ++b) {
      float d[V];
      load_chunk(d, dout + (static_cast<size_t>(b) * Tn + t) * C, i, C);
      for (int k = 0; k < V; ++k) acc[k] += d[k];
    }
    store_span(row, i, C, acc);
  }
}

// dwte(id, :) += dout rows of the bucket's positions in ascending order, one thread per
// (bucket, chunk). Buckets own distinct rows, so no two threads write the same element. The
// bucket count is read from device memory (PackedBuckets), so that one launch serves any batch.
// dwte stored as G.
template <typename T, typename G>
__global__ void encoder_backward_wte_kernel(G* dwte, const T* dout, const int* packed_buckets, int n, int C) {
  constexpr int V = Packed128<T>::size;
  const PackedBucketsView b = PackedBucketsView::of(packed_buckets, n);
  const size_t chunks = static_cast<size_t>(ceil_div(C, V));
  const size_t total = static_cast<size_t>(b.count) * chunks;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int bucket = static_cast<int>(idx / chunks), i = static_cast<int>(idx % chunks) * V;
    G* row = dwte + static_cast<size_t>(b.ids[bucket]) * C;
    float acc[V];
    load_span(acc, row, i, C);
    const int end = b.starts[bucket + 1];
    for (int j = b.starts[bucket]; j < end; ++j) {
      float d[V];
      load_chunk(d, dout + static_cast<size_t>(b.positions[j]) * C, i, C);
      for (int k = 0; k < V; ++k) acc[k] += d[k];
    }
    store_span(row, i, C, acc);
  }
}

// ---------------------------------------------------------------------------- host side

// Positions grouped by token id, for the deterministic backward.
struct TokenBuckets {
  std::vector<int> ids;        // distinct token ids that occur, ascending
  std::vector<int> starts;     // ids.size() + 1 offsets into positions; bucket k is [starts[k], starts[k+1])
  std::vector<int> positions;  // every position once, ascending within each bucket
};

// Stable counting sort of positions 0..n-1 by tokens[position].
inline TokenBuckets bucket_tokens(const int* tokens, int n) {
  int max_id = -1;
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      throw std::invalid_argument("bucket_tokens: token " + std::to_string(tokens[i]) + " at position " +
                                  std::to_string(i) + " is negative");
    max_id = tokens[i] > max_id ? tokens[i] : max_id;
  }
  std::vector<int> count(static_cast<size_t>(max_id + 1), 0);
  for (int i = 0; i < n; ++i) ++count[tokens[i]];
  TokenBuckets out;
  std::vector<int> next(count.size());  // where the next position of each id goes
  int offset = 0;
  for (int id = 0; id <= max_id; ++id) {
    next[id] = offset;
    if (count[id] == 0) continue;
    out.ids.push_back(id);
    out.starts.push_back(offset);
    offset += count[id];
  }
  out.starts.push_back(offset);
  out.positions.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out.positions[next[tokens[i]]++] = i;
  return out;
}

// Blocks for `work` threads; the grid-stride loops cover any excess.
inline int encoder_blocks(size_t work) {
  constexpr size_t kMaxBlocks = 1 << 16;
  const size_t blocks = ceil_div(work, static_cast<size_t>(kEncoderThreads));
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// out(B, Tn, C) = wte[tokens] + wpe[t]; tokens (B, Tn) in device memory; wpe may be null.
template <typename T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C, cudaStream_t stream) {
  const size_t work = static_cast<size_t>(B) * Tn * ceil_div(C, Packed128<T>::size);
  if (work == 0) return;
  PTRAIN_LAUNCH(encoder_forward_kernel<T>, encoder_blocks(work), kEncoderThreads, 0, stream, out, tokens, wte, wpe,
                B * Tn, Tn, C);
}

// Writes `b`, the buckets of n positions, into packed (packed_bucket_ints(n) ints).
inline void pack_buckets(const TokenBuckets& b, int n, int* packed) {
  packed[0] = static_cast<int>(b.ids.size());
  std::copy(b.ids.begin(), b.ids.end(), packed + 1);
  std::copy(b.starts.begin(), b.starts.end(), packed + 1 + n);
  std::copy(b.positions.begin(), b.positions.end(), packed + 2 + 2 * static_cast<size_t>(n));
}

// Adds into dwte (V, C) and dwpe (Tn, C; null: none), both stored as G. packed_buckets: pack_buckets() of the step's tokens
// (bucket_tokens(tokens, B * Tn)) copied to the device. The grid covers as many buckets as
// there are positions, the most a batch can have; the kernel reads how many there are.
template <typename T, typename G = T>
void encoder_backward(G* dwte, G* dwpe, const T* dout, const int* packed_buckets, int B, int Tn, int C,
                      cudaStream_t stream) {
  const size_t chunks = static_cast<size_t>(ceil_div(C, Packed128<T>::size));
  const int n = B * Tn;
  const size_t wpe_work = static_cast<size_t>(Tn) * chunks, wte_work = static_cast<size_t>(n) * chunks;
  // Names with a comma cannot be macro arguments.
  auto encoder_backward_wpe_kernel_instance = encoder_backward_wpe_kernel<T, G>;
  auto encoder_backward_wte_kernel_instance = encoder_backward_wte_kernel<T, G>;
  if (wpe_work > 0 && dwpe)
    PTRAIN_LAUNCH(encoder_backward_wpe_kernel_instance, encoder_blocks(wpe_work), kEncoderThreads, 0, stream, dwpe,
                  dout, B, Tn, C);
  if (wte_work > 0)
    PTRAIN_LAUNCH(encoder_backward_wte_kernel_instance, encoder_blocks(wte_work), kEncoderThreads, 0, stream, dwte, dout,
                  packed_buckets, n, C);
}

}  // namespace ptrain::kernels

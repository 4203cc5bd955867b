// Conversions the CUDA backend needs between its own ops: storage type to storage type with a
// rounding to a number format, the tail of a GEMM whose product cuBLASLt wrote to FP32 scratch,
// and FP8 dequantisation (codes times the inverse scale, per tensor or per block).
//
// Why this shape: every one is a memory-bound stream, so each thread takes a run of elements
// that is 16 bytes of the narrowest type involved (8 elements between float and bf16, 16 FP8
// codes) and moves every operand in whole 16-byte vectors where a run is whole and aligned,
// element by element at a ragged end or an unaligned view. The arithmetic is the CPU backend's,
// operation for operation, and rounds once per output: round_to_format here gives exactly the
// bits of ptrain::round_to_format(x, f, /*saturate=*/false) (precision/formats.h), with the same
// NVIDIA conversions, so a converted tensor is the CPU's bit for bit. kernels/ cannot include
// src/ headers, so the format is a RoundFormat, which the backend maps from ptrain::Format.
#pragma once

#include "common.cuh"
#include "elementwise.cuh"

namespace ptrain::kernels {

// The formats a conversion rounds to, in ptrain::Format's order. fp32: no rounding beyond the
// destination type's own.
enum class RoundFormat : int { fp32, bf16, fp16, e4m3, e5m2 };

// ptrain::round_to_format(x, f, /*saturate=*/false), bit for bit: bf16 and fp16 overflow to +-inf,
// e4m3 overflow gives NaN (it has no infinity), e5m2 overflow +-inf; NaN stays NaN.
__host__ __device__ __forceinline__ float round_to_format(float x, RoundFormat f) {
  switch (f) {
    case RoundFormat::bf16: return __bfloat162float(__float2bfloat16_rn(x));
    case RoundFormat::fp16: return __half2float(__float2half_rn(x));
    case RoundFormat::e4m3: return fp8_to_float(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3), __NV_E4M3);
    case RoundFormat::e5m2: return fp8_to_float(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2), __NV_E5M2);
    case RoundFormat::fp32: break;
  }
  return x;
}

// Elements per thread run: 16 bytes of the narrower of A and B, so a run of either is a whole
// number of 16-byte vectors (4 floats; 8 when a 2-byte type is involved).
template <typename A, typename B>
struct RunLength {
  static constexpr int size = static_cast<int>(16 / (sizeof(A) < sizeof(B) ? sizeof(A) : sizeof(B)));
};

constexpr int kDequantRun = 16;  // FP8 codes per thread run: one 16-byte load

// Elements [0, count) of p as floats (count <= K), in 16-byte vectors where whole and aligned;
// elements from count on read as 0.
template <int K, typename T>
__device__ __forceinline__ void load_run(float (&out)[K], const T* p, int count) {
  constexpr int V = Packed128<T>::size;
  static_assert(K % V == 0, "a run is whole 16-byte vectors");
  for (int j = 0; j < K; j += V) {
    float part[V];
    load_chunk(part, p, j, count);
    for (int k = 0; k < V; ++k) out[j + k] = part[k];
  }
}

// Writes elements [0, count) of a run of K at p, rounding each to T.
template <int K, typename T>
__device__ __forceinline__ void store_run(T* p, int count, const float (&in)[K]) {
  constexpr int V = Packed128<T>::size;
  static_assert(K % V == 0, "a run is whole 16-byte vectors");
  for (int j = 0; j < K; j += V) {
    float part[V];
    for (int k = 0; k < V; ++k) part[k] = in[j + k];
    store_chunk(p, j, count, part);
  }
}

// Codes [0, count) of p (count <= kDequantRun): one 16-byte load where whole and aligned;
// codes from count on read as 0 (the value 0 in both FP8 formats).
__device__ __forceinline__ void load_codes(fp8 (&out)[kDequantRun], const fp8* p, int count) {
  static_assert(Packed128<fp8>::size == kDequantRun, "one 16-byte vector of codes per run");
  if (count == kDequantRun && aligned16(p)) {
    const Packed128<fp8> v = load128(p);
    for (int k = 0; k < kDequantRun; ++k) out[k] = v.v[k];
  } else {
    for (int k = 0; k < kDequantRun; ++k) out[k] = k < count ? p[k] : fp8(0);
  }
}

// ---------------------------------------------------------------------------- kernels

// out[i] = in[i] rounded to `round`, stored as Dst (which rounds once more, to its own format).
// out may be in itself (same type): each thread reads its run before writing it.
template <typename Dst, typename Src>
__global__ void convert_kernel(Dst* out, const Src* in, size_t n, RoundFormat round) {
  constexpr int K = RunLength<Dst, Src>::size;
  const size_t runs = ceil_div(n, static_cast<size_t>(K));
  for (size_t r = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs;
       r += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t base = r * K;
    const int count = run_len(n, base, K);
    float v[K];
    load_run(v, in + base, count);
    for (int k = 0; k < K; ++k) v[k] = round_to_format(v[k], round);
    store_run(out + base, count, v);
  }
}

// The tail of a GEMM computed into FP32 scratch acc (rows, cols) row-major:
// out = [out +] acc [+ bias(cols)], as one FP32 chain per element (old + product, then + bias)
// rounded once to Dst, the CPU backend's arithmetic. One thread per run of a row, so a run never
// straddles two rows and its bias is one contiguous run too.
template <typename Dst, typename Bias>
__global__ void gemm_finish_kernel(Dst* out, const float* acc, const Bias* bias, size_t rows, size_t cols,
                                   bool accumulate) {
  constexpr int K = RunLength<Dst, Bias>::size;  // acc (float) is never narrower
  const size_t runs_per_row = ceil_div(cols, static_cast<size_t>(K));
  const size_t runs = rows * runs_per_row;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < runs;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = idx / runs_per_row, col = (idx % runs_per_row) * K;
    const size_t offset = row * cols + col;
    const int count = run_len(cols, col, K);
    float v[K];
    load_run(v, acc + offset, count);
    if (accumulate) {
      float old[K];
      load_run(old, out + offset, count);
      for (int k = 0; k < K; ++k) v[k] = old[k] + v[k];
    }
    if (bias) {
      float b[K];
      load_run(b, bias + col, count);
      for (int k = 0; k < K; ++k) v[k] += b[k];
    }
    store_run(out + offset, count, v);
  }
}

// out[i] = fp8 value of codes[i] * inv_scale: the CPU backend's q * (1.0f / scale), with
// inv_scale computed on the host exactly as the CPU computes it.
template <typename Dst>
__global__ void fp8_dequantize_kernel(Dst* out, const fp8* codes, size_t n, float inv_scale,
                                      __nv_fp8_interpretation_t format) {
  constexpr int K = kDequantRun;
  const size_t runs = ceil_div(n, static_cast<size_t>(K));
  for (size_t r = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs;
       r += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t base = r * K;
    const int count = run_len(n, base, K);
    fp8 q[K];
    load_codes(q, codes + base, count);
    float v[K];
    for (int k = 0; k < K; ++k) v[k] = fp8_to_float(q[k], format) * inv_scale;
    store_run(out + base, count, v);
  }
}

// Block scaling: element (r, c) of the (rows, cols) tensor is dequantised with its block's
// scale_inv[(r / block_rows) * tile_cols + c / block_cols], tile_cols = ceil(cols / block_cols)
// (the layout fp8_quantize_blocks writes). One thread per run of a row; a run inside one block
// (the usual case: 16 divides 128) reads its scale once.
template <typename Dst>
__global__ void fp8_dequantize_blocks_kernel(Dst* out, const fp8* codes, const float* scale_inv, int rows, int cols,
                                             int block_rows, int block_cols, __nv_fp8_interpretation_t format) {
  constexpr int K = kDequantRun;
  const int tile_cols = ceil_div(cols, block_cols);
  const size_t runs_per_row = ceil_div(static_cast<size_t>(cols), static_cast<size_t>(K));
  const size_t runs = static_cast<size_t>(rows) * runs_per_row;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < runs;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(idx / runs_per_row), col = static_cast<int>(idx % runs_per_row) * K;
    const size_t offset = static_cast<size_t>(row) * cols + col;
    const int count = cols - col < K ? cols - col : K;
    const float* s = scale_inv + static_cast<size_t>(row / block_rows) * tile_cols;  // this row's blocks
    fp8 q[K];
    load_codes(q, codes + offset, count);
    float v[K];
    const int first = col / block_cols, last = (col + count - 1) / block_cols;
    if (first == last) {
      const float scale = s[first];
      for (int k = 0; k < K; ++k) v[k] = fp8_to_float(q[k], format) * scale;
    } else {
      // Never reads a scale past the row's last block: elements from count on are not stored.
      for (int k = 0; k < K; ++k) v[k] = k < count ? fp8_to_float(q[k], format) * s[(col + k) / block_cols] : 0.0f;
    }
    store_run(out + offset, count, v);
  }
}

// ---------------------------------------------------------------------------- launchers

// out = in rounded to `round` and stored as Dst, n elements. out may be in itself when Dst is
// Src (rounding in place); otherwise they must not overlap.
template <typename Dst, typename Src>
void convert(Dst* out, const Src* in, size_t n, RoundFormat round, cudaStream_t stream) {
  if (n == 0) return;
  const size_t runs = ceil_div(n, static_cast<size_t>(RunLength<Dst, Src>::size));
  auto convert_kernel_instance = convert_kernel<Dst, Src>;  // a name with a comma cannot be a macro argument
  PTRAIN_LAUNCH(convert_kernel_instance, elementwise_blocks(runs), kElementwiseThreads, 0, stream, out, in, n, round);
}

// out (rows, cols) = [out +] acc [+ bias(cols)] (bias may be null), rounded once to Dst. acc is
// the FP32 product. Without a bias the rows are one flat run of rows * cols elements.
template <typename Dst, typename Bias>
void gemm_finish(Dst* out, const float* acc, const Bias* bias, size_t rows, size_t cols, bool accumulate,
                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (!bias) {
    cols *= rows;
    rows = 1;
  }
  const size_t runs = rows * ceil_div(cols, static_cast<size_t>(RunLength<Dst, Bias>::size));
  auto gemm_finish_kernel_instance = gemm_finish_kernel<Dst, Bias>;
  PTRAIN_LAUNCH(gemm_finish_kernel_instance, elementwise_blocks(runs), kElementwiseThreads, 0, stream, out, acc, bias, rows, cols,
                accumulate);
}

// out[i] = value of FP8 code codes[i] (format) * inv_scale, n elements.
template <typename Dst>
void fp8_dequantize(Dst* out, const fp8* codes, size_t n, float inv_scale, __nv_fp8_interpretation_t format,
                    cudaStream_t stream) {
  if (n == 0) return;
  const size_t runs = ceil_div(n, static_cast<size_t>(kDequantRun));
  PTRAIN_LAUNCH(fp8_dequantize_kernel<Dst>, elementwise_blocks(runs), kElementwiseThreads, 0, stream, out, codes, n,
                inv_scale, format);
}

// out (rows, cols) = each code's value times its block's scale_inv, with the blocks and the
// scale_inv layout of fp8_quantize_blocks (ceil(rows / block_rows), ceil(cols / block_cols)).
template <typename Dst>
void fp8_dequantize_blocks(Dst* out, const fp8* codes, const float* scale_inv, int rows, int cols, int block_rows,
                           int block_cols, __nv_fp8_interpretation_t format, cudaStream_t stream) {
  if (block_rows < 1 || block_cols < 1)
    throw std::invalid_argument("fp8_dequantize_blocks: block shape must be positive");
  if (rows <= 0 || cols <= 0) return;
  const size_t runs =
      static_cast<size_t>(rows) * ceil_div(static_cast<size_t>(cols), static_cast<size_t>(kDequantRun));
  PTRAIN_LAUNCH(fp8_dequantize_blocks_kernel<Dst>, elementwise_blocks(runs), kElementwiseThreads, 0, stream, out,
                codes, scale_inv, rows, cols, block_rows, block_cols, format);
}

}  // namespace ptrain::kernels

// What every kernel file shares: storage types and conversions, 16-byte vector access, warp
// and block reductions, and the launch macro.
//
// Why this shape: each kernel is written once and compiled twice, by nvcc for the GPU and by
// g++ against the tests' SIMT emulator (tests/simt/simt.h), which supplies CUDA's built-ins on
// the CPU. So kernels use only what both understand: no tensor-core PTX, cp.async or TMA here
// (those go behind wrappers with a scalar fallback), shared memory only through
// PTRAIN_DYNAMIC_SHARED (the emulator poisons it with NaN before every block), and launches
// only through PTRAIN_LAUNCH.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include "simt.h"  // only test builds compile kernels without nvcc
#endif
#if defined(__CUDACC__) || defined(PTRAIN_SIM_DEVICE)
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#endif
#ifdef PTRAIN_SIM_DEVICE
#include "sim.h"  // the simulated device's streams (tests/sim): launches queue on them
#endif

namespace ptrain::kernels {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// ---------------------------------------------------------------------------- launching

#if defined(__CUDACC__) || defined(PTRAIN_SIM_DEVICE)
// PTRAIN_KERNEL_LOG=FILE: each kernel's name (as the launch writes it) is appended to FILE at
// its first launch, so scripts/gpu-check.sh can say which kernels a sanitizer run reached.
// Unset: one test of a static pointer per launch.
inline void note_launch(const char* kernel) {
  struct Log {
    FILE* file = nullptr;
    std::mutex mutex;
    std::set<std::string> seen;
  };
  static Log* log = [] {
    const char* path = std::getenv("PTRAIN_KERNEL_LOG");
    if (!path || !*path) return static_cast<Log*>(nullptr);
    Log* l = new Log;  // never freed: launches may come from static destructors
    l->file = std::fopen(path, "a");
    return l;
  }();
  if (!log || !log->file) return;
  std::lock_guard<std::mutex> lock(log->mutex);
  if (log->seen.insert(kernel).second) {
    std::fprintf(log->file, "%s\n", kernel);
    std::fflush(log->file);
  }
}

// Launch errors (bad configuration, no device) surface at the launch, named.
inline void check_launch(const char* kernel, const char* file, int line) {
  note_launch(kernel);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("launch of ") + kernel + " failed at " + file + ":" + std::to_string(line) +
                             ": " + cudaGetErrorString(err));
}
#endif

#ifdef __CUDACC__
#define PTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)            \
  do {                                                                           \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__);          \
    ::ptrain::kernels::check_launch(#kernel, __FILE__, __LINE__);                \
  } while (0)
#define PTRAIN_DYNAMIC_SHARED(T, name)                       \
  extern __shared__ __align__(16) unsigned char name##_bytes[]; \
  T* name = reinterpret_cast<T*>(name##_bytes)
#elif defined(PTRAIN_SIM_DEVICE)
// The simulated device: the launch queues on its stream, its arguments taken by value now.
#define PTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                              \
  do {                                                                                                             \
    ::ptrain::sim::launch((stream), dim3(grid), dim3(block), (shared_bytes), #kernel, kernel, __VA_ARGS__);       \
    ::ptrain::kernels::check_launch(#kernel, __FILE__, __LINE__);                                                  \
  } while (0)
#define PTRAIN_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::simt::detail::dynamic_shared_memory())
#else
#define PTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::simt::launch(dim3(grid), dim3(block), (shared_bytes), #kernel, [&]() { kernel(__VA_ARGS__); })
#define PTRAIN_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::simt::detail::dynamic_shared_memory())
#endif

constexpr int kWarpSize = 32;

__host__ __device__ constexpr inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Elements of the run of K that starts at `base` of a flat buffer of n (fewer only at its end).
__host__ __device__ __forceinline__ int run_len(size_t n, size_t base, int K) {
  return n - base < static_cast<size_t>(K) ? static_cast<int>(n - base) : K;
}

// ---------------------------------------------------------------------------- storage types

// Kernels read storage (float, bf16, fp16), compute in FP32 and round once when they write.
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ float to_float(fp16 x) { return __half2float(x); }

template <typename T>
__host__ __device__ __forceinline__ T from_float(float x);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__host__ __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__host__ __device__ __forceinline__ fp16 from_float<fp16>(float x) { return __float2half_rn(x); }

// FP8 codes are stored as raw bytes; the format is a run-time argument.
using fp8 = __nv_fp8_storage_t;
__host__ __device__ __forceinline__ fp8 float_to_fp8(float x, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format);
}
__host__ __device__ __forceinline__ float fp8_to_float(fp8 code, __nv_fp8_interpretation_t format) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, format)));
}
__host__ __device__ __forceinline__ float fp8_max(__nv_fp8_interpretation_t format) {
  return format == __NV_E4M3 ? 448.0f : 57344.0f;
}

// Bit tests, the same on both compilers (no std:: or libm overload questions in device code).
__host__ __device__ __forceinline__ bool is_nan(float x) { return x != x; }
__host__ __device__ __forceinline__ bool is_finite(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) != 0x7f800000u;
}

// ---------------------------------------------------------------------------- 16-byte vectors

// Sixteen bytes of T: one 128-bit load or store (LDG.128/STG.128) moves all of it.
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
};

template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {  // p 16-byte aligned
  Packed128<T> r;
#ifdef __CUDACC__
  const int4 bits = *reinterpret_cast<const int4*>(p);
  memcpy(&r, &bits, 16);
#else
  std::memcpy(static_cast<void*>(&r), p, 16);
#endif
  return r;
}

template <typename T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& value) {  // p 16-byte aligned
#ifdef __CUDACC__
  int4 bits;
  memcpy(&bits, &value, 16);
  *reinterpret_cast<int4*>(p) = bits;
#else
  std::memcpy(static_cast<void*>(p), &value, 16);
#endif
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Elements [i, i + size) of a row of n elements as floats: one vector load where the chunk is
// whole and aligned, element by element at a row's ragged end. Missing elements read as 0.
template <typename T>
__device__ __forceinline__ void load_chunk(float (&out)[Packed128<T>::size], const T* row, int i, int n) {
  constexpr int kSize = Packed128<T>::size;
  if (i + kSize <= n && aligned16(row + i)) {
    const Packed128<T> p = load128(row + i);
    for (int k = 0; k < kSize; ++k) out[k] = to_float(p.v[k]);
  } else {
    for (int k = 0; k < kSize; ++k) out[k] = i + k < n ? to_float(row[i + k]) : 0.0f;
  }
}

// Writes elements [i, min(i + size, n)) of a row, rounding each to T.
template <typename T>
__device__ __forceinline__ void store_chunk(T* row, int i, int n, const float (&in)[Packed128<T>::size]) {
  constexpr int kSize = Packed128<T>::size;
  if (i + kSize <= n && aligned16(row + i)) {
    Packed128<T> p;
    for (int k = 0; k < kSize; ++k) p.v[k] = from_float<T>(in[k]);
    store128(row + i, p);
  } else {
    for (int k = 0; k < kSize && i + k < n; ++k) row[i + k] = from_float<T>(in[k]);
  }
}

// load_chunk and store_chunk over V elements of a row stored as G, at least as wide as the
// element type whose 16-byte chunks V counts (FP32 gradient sums beside bf16 activations): as
// many of G's chunks as V covers.
template <int V, typename G>
__device__ __forceinline__ void load_span(float (&out)[V], const G* row, int i, int n) {
  constexpr int kSize = Packed128<G>::size;
  static_assert(V % kSize == 0, "load_span: G narrower than the chunk's element type");
  for (int j = 0; j < V; j += kSize) {
    float part[kSize];
    load_chunk(part, row, i + j, n);
    for (int k = 0; k < kSize; ++k) out[j + k] = part[k];
  }
}

template <int V, typename G>
__device__ __forceinline__ void store_span(G* row, int i, int n, const float (&in)[V]) {
  constexpr int kSize = Packed128<G>::size;
  static_assert(V % kSize == 0, "store_span: G narrower than the chunk's element type");
  for (int j = 0; j < V; j += kSize) {
    float part[kSize];
    for (int k = 0; k < kSize; ++k) part[k] = in[j + k];
    store_chunk(row, i + j, n, part);
  }
}

// ---------------------------------------------------------------------------- reductions

// Combining operations for the reductions. FloatMax ignores NaN (fmaxf), as the kernels'
// float maxima always have; NaN-aware maxima go through unsigned bit patterns (fp8.cuh).
struct Sum {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct FloatMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct UnsignedMax {
  __device__ __forceinline__ unsigned operator()(unsigned a, unsigned b) const { return a > b ? a : b; }
};

// Butterfly reduction over a full warp: every lane ends with the result, combined in the same
// order every run.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread: each warp reduces, then the first warp reduces the warps' results. `scratch` is 32
// elements of shared memory, free again when this returns; `identity` fills missing warps.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, Op op) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may be reused right after
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum{}); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, FloatMax{}); }
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, 0.0f, Sum{}); }
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, FloatMax{});
}

}  // namespace ptrain::kernels

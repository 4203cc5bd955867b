// A SIMT emulator that runs ptrain's CUDA kernels on the CPU, for tests only.
//
// Why: no machine that builds ptrain has a GPU, yet every kernel must be checked. Kernels are
// written once in kernels/*.cuh; nvcc compiles them for the GPU, and g++ compiles them against
// this header, which supplies CUDA's built-in variables, barriers, warp collectives and atomics.
//
// How: a launch runs the grid one block at a time. Each thread of the block is a fiber
// (Boost.Context) that runs until it reaches a synchronisation point (__syncthreads, __syncwarp,
// a shuffle or vote) and then yields. A block barrier releases when every thread of the block
// waits at it; a warp collective completes when every lane named in its mask has arrived. The
// order in which threads (and blocks) run is selectable: ascending, descending or seeded
// random, because any one fixed order hides some missing barriers.
//
// What it diagnoses (as simt::Error, never a hang): a __syncthreads that some threads exit
// without reaching or reach at different lines, a warp collective whose mask leaves out the
// calling lane or names lanes that do not exist or disagree, a shuffle reading a lane outside its
// mask, deadlock, and launch configurations a GPU would refuse.
//
// Limits: a race inside one barrier interval is invisible (each fiber runs to its next sync
// point); static __shared__ arrays persist across blocks and are not poisoned, so kernels keep
// their shared memory dynamic; results are not bit-identical to a GPU (expf, rsqrtf and FMA
// contraction differ), so tests compare with tolerances except for casts; no tensor-core PTX,
// cp.async or TMA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <driver_types.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>
#include <type_traits>

// CUDA's host_defines.h makes these empty for a host compiler. Shared memory must be one object
// per block (blocks run one after another on one OS thread), not one per thread.
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace simt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Order { ascending, descending, random };

struct Options {
  Order order = Order::ascending;
  uint64_t seed = 0;  // for Order::random
  std::string name() const;
};

// The orders a test runs a kernel under: ascending, descending and two seeded random orders (a
// fixed order hides a missing barrier).
std::vector<Options> test_orders();

// The options for launches from this OS thread; ScopedOptions restores the previous ones.
void set_options(const Options& options);
Options options();
class ScopedOptions {
 public:
  explicit ScopedOptions(const Options& o) : saved_(options()) { set_options(o); }
  ~ScopedOptions() { set_options(saved_); }
  ScopedOptions(const ScopedOptions&) = delete;
  ScopedOptions& operator=(const ScopedOptions&) = delete;

 private:
  Options saved_;
};

// Runs `body` (one call of the kernel) for every thread of every block. Dynamic shared memory
// is allocated per block with exactly the size asked (AddressSanitizer sees overruns) and
// filled with 0xFF bytes: NaN in every floating-point format.
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const char* kernel,
            const std::function<void()>& body);

// Launches counted since the start of the process (tests check a launcher really launched).
uint64_t launch_count();

namespace detail {
void* dynamic_shared_memory();
void syncthreads(const char* file, int line);
enum class Collective { syncwarp, shuffle, ballot, any, all };
enum class ShuffleKind { idx, up, down, xor_ };
// Arrives at a warp collective; returns this lane's result once every lane of `mask` arrived.
// For shuffles, `payload` is this lane's value and the result is the source lane's value; for
// votes, `payload` is the predicate and the result is the ballot of the mask's lanes.
uint64_t warp_collective(Collective kind, unsigned mask, uint64_t payload, ShuffleKind shuffle,
                         int lane_arg, int width, const char* what, const char* file, int line);

template <typename T>
uint64_t to_payload(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
  uint64_t p = 0;
  std::memcpy(&p, &v, sizeof(T));
  return p;
}
template <typename T>
T from_payload(uint64_t p) {
  T v;
  std::memcpy(&v, &p, sizeof(T));
  return v;
}
}  // namespace detail

}  // namespace simt

// ------------------------------------------------------------------ CUDA's built-in variables
// Thread-local globals, set by the emulator at every switch between fibers.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ------------------------------------------------------------------ barriers and collectives
#define __syncthreads() ::simt::detail::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) \
  ((void)::simt::detail::warp_collective(::simt::detail::Collective::syncwarp, ::simt::detail::syncwarp_mask(__VA_ARGS__), 0, \
                                         ::simt::detail::ShuffleKind::idx, 0, 32, "__syncwarp", __FILE__, __LINE__))
#define __shfl_sync(mask, v, lane, ...) \
  ::simt::detail::shuffle(::simt::detail::ShuffleKind::idx, mask, v, lane, "__shfl_sync", __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_up_sync(mask, v, delta, ...) \
  ::simt::detail::shuffle(::simt::detail::ShuffleKind::up, mask, v, delta, "__shfl_up_sync", __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_down_sync(mask, v, delta, ...) \
  ::simt::detail::shuffle(::simt::detail::ShuffleKind::down, mask, v, delta, "__shfl_down_sync", __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(mask, v, lane_mask, ...) \
  ::simt::detail::shuffle(::simt::detail::ShuffleKind::xor_, mask, v, lane_mask, "__shfl_xor_sync", __FILE__, __LINE__, ##__VA_ARGS__)
#define __ballot_sync(mask, pred) \
  static_cast<unsigned>(::simt::detail::warp_collective(::simt::detail::Collective::ballot, mask, (pred) ? 1 : 0, \
                                                        ::simt::detail::ShuffleKind::idx, 0, 32, "__ballot_sync", __FILE__, __LINE__))
#define __any_sync(mask, pred) \
  static_cast<int>(::simt::detail::warp_collective(::simt::detail::Collective::any, mask, (pred) ? 1 : 0, \
                                                   ::simt::detail::ShuffleKind::idx, 0, 32, "__any_sync", __FILE__, __LINE__))
#define __all_sync(mask, pred) \
  static_cast<int>(::simt::detail::warp_collective(::simt::detail::Collective::all, mask, (pred) ? 1 : 0, \
                                                   ::simt::detail::ShuffleKind::idx, 0, 32, "__all_sync", __FILE__, __LINE__))

namespace simt::detail {
inline unsigned syncwarp_mask() { return 0xffffffffu; }
inline unsigned syncwarp_mask(unsigned mask) { return mask; }

template <typename T>
T shuffle(ShuffleKind kind, unsigned mask, T v, int lane_arg, const char* what, const char* file, int line,
          int width = 32) {
  return from_payload<T>(warp_collective(Collective::shuffle, mask, to_payload(v), kind, lane_arg, width, what, file, line));
}
}  // namespace simt::detail

// ------------------------------------------------------------------ atomics
// A fiber is never preempted, so a plain read-modify-write is atomic here.
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  static_assert(std::is_integral<T>::value, "CUDA's atomicMax takes integers");
  const T old = *address;
  *address = old > value ? old : value;
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  static_assert(std::is_integral<T>::value, "CUDA's atomicMin takes integers");
  const T old = *address;
  *address = old < value ? old : value;
  return old;
}
template <typename T>
T atomicExch(T* address, T value) {
  const T old = *address;
  *address = value;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
inline void __threadfence() {}

// ------------------------------------------------------------------ device intrinsics
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
template <typename T>
T __ldg(const T* p) { return *p; }
template <typename T>
T __ldcs(const T* p) { return *p; }
template <typename T>
void __stcs(T* p, T v) { *p = v; }

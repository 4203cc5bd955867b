// The simulated CUDA device: the parts of the CUDA runtime ptrain calls, implemented on the CPU
// for tests (never linked into the shipped ptrain). A test build of the real CUDA backend is
// compiled by g++ against it, its kernels run under the SIMT emulator (tests/simt), and the
// backend's own logic — streams, events, copies, staging, capture — executes on every commit.
//
// What it models, so that host-code bugs give wrong numbers instead of passing by luck:
//  - Device memory is host memory (mmap, MAP_NORESERVE) under a small reported capacity
//    (PTRAIN_SIM_MEMORY bytes, default 4 GiB), so arena sizing and out-of-memory paths run.
//    Freed memory is poisoned with 0xFF bytes (NaN in every float format).
//  - Deferred execution: work queues on its stream and runs only when something needs it (a
//    synchronisation, an event wait, a copy to pageable host memory). A stream that reads
//    another stream's results without an event wait reads them before they are written: a
//    stream made to run runs the other streams' work its event waits need before its own
//    earlier work, so a reader there that forgot its wait runs first.
//    cudaDeviceSynchronize runs the pending streams interleaved in a seeded order
//    (PTRAIN_SIM_SEED).
//  - Copies from pageable host memory take their data when enqueued (CUDA stages them); copies
//    from pinned memory (cudaMallocHost) read it when they execute, so a pinned buffer reused
//    before its copy ran is caught. A copy to pageable host memory returns once it completed.
//  - Stream capture records instead of running, and refuses what CUDA refuses inside a capture
//    (synchronising the capturing stream, allocating or freeing in a thread-local or global
//    capture, synchronous copies, waiting on a captured event), with CUDA's error codes; the
//    capture is then invalidated. cudaGraphLaunch replays the recorded work in order.
//  - The legacy default stream (0) runs eagerly after draining every blocking stream.
//  - PTRAIN_SIM_DEVICES devices (default 1), for ranks that each take their local rank's GPU;
//    each process has its own memory. NCCL is simulated over MPI (nccl_sim.cpp).
//  - Faults injected on request (fail_call, PTRAIN_SIM_FAIL; faults.cpp).
//  - PTRAIN_SIM_REPORT=DIR: each process writes DIR/ops-PID.json at exit, counting the
//    operations executed by name (kernels, copies by the memories they joined, cublasLtMatmul,
//    cudnnBackendExecute, NCCL collectives, cudaGraphLaunch), for tests of whole runs.
// Not modelled: concurrency inside one stream, timing, peer access, managed memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "simt.h"

namespace ptrain::sim {

// Adds `amount` to what the PTRAIN_SIM_REPORT report says of `name` (the bytes a simulated
// collective moved, say).
void add_to_report(const std::string& name, uint64_t amount);

// Queues `work` on `stream` (named `what` in diagnostics); a capturing stream records it.
// Returns cudaSuccess or the error the enqueue hit (a sticky error, an invalidated capture).
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work);

// Sets the error cudaGetLastError returns next (a refused launch configuration).
void set_last_error(cudaError_t error);

// Kernel launches, as PTRAIN_LAUNCH writes them in a simulated-device build: the arguments are
// evaluated and converted to the kernel's parameter types now, the launch runs when the stream
// reaches it. A configuration a GPU refuses sets cudaErrorInvalidConfiguration and queues nothing.
bool launch_config_ok(dim3 grid, dim3 block, size_t shared_bytes);

template <typename... P, typename... A>
void launch(cudaStream_t stream, dim3 grid, dim3 block, size_t shared_bytes, const char* kernel_name,
            void (*kernel)(P...), A&&... args) {
  if (!launch_config_ok(grid, block, shared_bytes)) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  std::tuple<std::decay_t<P>...> values(static_cast<P>(std::forward<A>(args))...);
  const cudaError_t status = enqueue(stream, kernel_name, [=]() {
    ::simt::launch(grid, block, shared_bytes, kernel_name, [&]() { std::apply(kernel, values); });
  });
  if (status != cudaSuccess) set_last_error(status);
}

// Whether [p, p + bytes) lies inside one live device allocation (library simulations check the
// pointers they are given).
bool is_device_range(const void* p, size_t bytes);

// sum x[i] * y[i] in double, as four interleaved partial sums added in a fixed order: the
// libraries' reference products (faster than one chain, the same on every run and thread count).
inline double dot(const float* x, const float* y, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(x[i]) * y[i];
    s1 += double(x[i + 1]) * y[i + 1];
    s2 += double(x[i + 2]) * y[i + 2];
    s3 += double(x[i + 3]) * y[i + 3];
  }
  double s = (s0 + s1) + (s2 + s3);
  for (; i < n; ++i) s += double(x[i]) * y[i];
  return s;
}

// Fault injection: from the nth next call (1: the very next) of the library function named (as
// in its header: "cudaMalloc", "cublasLtMatmulAlgoGetHeuristic", "ncclAllReduce", ...; for
// cuDNN's execution plans "cudnnBackendFinalize execution plan"), `times` calls return `status`
// instead of running. Armed by a test, or for whole runs of ptrain_simulated by
// PTRAIN_SIM_FAIL=function:nth:status[:times][,...]. Only the functions that call
// injected_failure can fail so.
void fail_call(const std::string& function, int nth, int status, int times = 1);
void clear_faults();
// The status an armed fault makes this call of `function` return, or 0 to run it.
int injected_failure(const char* function);

// Test controls.
struct Stats {
  size_t bytes_in_use = 0;
  size_t capacity = 0;
  uint64_t executed = 0;  // operations run so far
  uint64_t pending = 0;   // operations queued and not yet run, all streams
};
Stats stats();
// Runs everything queued (as cudaDeviceSynchronize would) and reports a sticky error, if any.
cudaError_t drain_all();
// The compute capability the devices report (default 9.0, Hopper).
void set_compute_capability(int major, int minor);

}  // namespace ptrain::sim

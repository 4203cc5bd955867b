// A fixture of scripts/check-ptxas.sh (tests/CMakeLists.txt), never compiled: with
// tests/ptxas/register-heavy-report.txt, a kernel whose registers do not fit its largest block,
// one that just fits, and one launched with more threads than the check assumes of a kernel
// without __launch_bounds__.
#pragma once

namespace ptrain::kernels {

constexpr int kWideThreads = 1024;

__launch_bounds__(kWideThreads)  // 72 registers a thread in the report: 64 fit 1024 threads
__global__ void wide_kernel(float* out) {}

__launch_bounds__(kWideThreads / 2)  // 128 registers: exactly an SM's 65536 for 512 threads
__global__ void half_kernel(float* out) {}

__global__ void narrow_kernel(float* out) {}  // no bound, so assumed 256 threads, but launched with 512

inline void launch(float* out, cudaStream_t stream) {
  PTRAIN_LAUNCH(wide_kernel, 1, kWideThreads, 0, stream, out);
  PTRAIN_LAUNCH(half_kernel, 1, kWideThreads / 2, 0, stream, out);
  PTRAIN_LAUNCH(narrow_kernel, 1, kWideThreads / 2, 0, stream,
                out);
}

}  // namespace ptrain::kernels

// The simulated CUDA runtime itself (tests/sim/sim.h): that it defers work the way that makes
// missing synchronisation visible, stages copies as CUDA does, refuses inside a capture what
// CUDA refuses, and runs kernels under the SIMT emulator with the arguments they were given.
// Every test drains the device before it ends (the simulation's state is per process).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sim.h"

namespace {

// A kernel compiled by g++ against the SIMT emulator, as the backend's are in a sim build.
__global__ void add_kernel(float* x, int n, float amount) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] += amount;
}

// Returns before the barrier in thread 0 only: the emulator reports it, as a device fault.
__global__ void divergent_barrier_kernel(float* x) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  x[threadIdx.x] = 1.0f;
}

struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(p, 0, n * sizeof(float)) == cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> read() const {
    std::vector<float> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
  float* p = nullptr;
  size_t n;
};

struct OwnedStream {
  OwnedStream() { REQUIRE(cudaStreamCreate(&s) == cudaSuccess); }
  ~OwnedStream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

TEST_CASE("cudart: work on a stream waits until a synchronisation needs it") {
  DeviceFloats x(4);
  OwnedStream a;
  const uint64_t before = ptrain::sim::stats().executed;
  REQUIRE(cudaMemsetAsync(x.p, 0x3F, sizeof(float), a.s) == cudaSuccess);
  CHECK(ptrain::sim::stats().pending == 1);
  CHECK(ptrain::sim::stats().executed == before);
  REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
  CHECK(ptrain::sim::stats().pending == 0);
  CHECK(x.read()[0] != 0.0f);
}

TEST_CASE("cudart: a stream reading another stream's result without an event wait reads it unwritten") {
  DeviceFloats x(1), y(1);
  OwnedStream producer, consumer;
  const float one = 1.0f;
  REQUIRE(cudaMemcpyAsync(x.p, &one, sizeof(float), cudaMemcpyHostToDevice, producer.s) == cudaSuccess);
  SECTION("without a wait the consumer copies the old value") {
    REQUIRE(cudaMemcpyAsync(y.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, consumer.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(consumer.s) == cudaSuccess);
    CHECK(y.read()[0] == 0.0f);
  }
  SECTION("with an event wait it copies the new one") {
    cudaEvent_t written;
    REQUIRE(cudaEventCreateWithFlags(&written, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(written, producer.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(consumer.s, written, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(y.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, consumer.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(consumer.s) == cudaSuccess);
    CHECK(y.read()[0] == 1.0f);
    cudaEventDestroy(written);
  }
  REQUIRE(ptrain::sim::drain_all() == cudaSuccess);
}

// A stream waiting on another's event: the other's work up to the event runs first, ahead of the
// waiting stream's own earlier work. So a reader on the other stream that should have waited
// for that earlier work (ZeRO-3's prefetched gather on NCCL's stream, read by the next block)
// reads the buffer unwritten even though something later made both streams run.
TEST_CASE("cudart: a stream made to run runs the work its event waits need before its own earlier work") {
  DeviceFloats x(1), y(1);
  OwnedStream comm, compute;
  cudaEvent_t written, read;
  REQUIRE(cudaEventCreateWithFlags(&written, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&read, cudaEventDisableTiming) == cudaSuccess);
  const float one = 1.0f;
  REQUIRE(cudaMemcpyAsync(x.p, &one, sizeof(float), cudaMemcpyHostToDevice, comm.s) == cudaSuccess);
  const bool waits = GENERATE(false, true);
  if (waits) {
    REQUIRE(cudaEventRecord(written, comm.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(compute.s, written, 0) == cudaSuccess);
  }
  REQUIRE(cudaMemcpyAsync(y.p, x.p, sizeof(float), cudaMemcpyDeviceToDevice, compute.s) == cudaSuccess);
  REQUIRE(cudaEventRecord(read, compute.s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(comm.s, read, 0) == cudaSuccess);  // the next collective's wait
  REQUIRE(cudaStreamSynchronize(comm.s) == cudaSuccess);
  CHECK(y.read()[0] == (waits ? 1.0f : 0.0f));
  REQUIRE(ptrain::sim::drain_all() == cudaSuccess);
  cudaEventDestroy(written);
  cudaEventDestroy(read);
}

TEST_CASE("cudart: a copy from pageable memory takes its data at once, one from pinned memory when it runs") {
  DeviceFloats x(1);
  OwnedStream s;
  float pageable = 1.0f;
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(float)) == cudaSuccess);
  SECTION("pageable: changing the source after the call changes nothing") {
    REQUIRE(cudaMemcpyAsync(x.p, &pageable, sizeof(float), cudaMemcpyHostToDevice, s.s) == cudaSuccess);
    pageable = 2.0f;
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(x.read()[0] == 1.0f);
  }
  SECTION("pinned: a buffer reused before its copy ran is what the copy reads") {
    *pinned = 1.0f;
    REQUIRE(cudaMemcpyAsync(x.p, pinned, sizeof(float), cudaMemcpyHostToDevice, s.s) == cudaSuccess);
    *pinned = 2.0f;
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(x.read()[0] == 2.0f);
  }
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("cudart: a copy to pageable memory has completed when it returns, one to pinned memory has not") {
  DeviceFloats x(1);
  OwnedStream s;
  const float one = 1.0f;
  REQUIRE(cudaMemcpyAsync(x.p, &one, sizeof(float), cudaMemcpyHostToDevice, s.s) == cudaSuccess);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(float)) == cudaSuccess);
  *pinned = 0.0f;
  REQUIRE(cudaMemcpyAsync(pinned, x.p, sizeof(float), cudaMemcpyDeviceToHost, s.s) == cudaSuccess);
  CHECK(*pinned == 0.0f);
  float pageable = 0.0f;
  REQUIRE(cudaMemcpyAsync(&pageable, x.p, sizeof(float), cudaMemcpyDeviceToHost, s.s) == cudaSuccess);
  CHECK(pageable == 1.0f);
  CHECK(*pinned == 1.0f);  // queued before it, so run by the same wait
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("cudart: a copy whose direction contradicts its pointers is refused") {
  DeviceFloats x(1);
  float host = 0.0f;
  CHECK(cudaMemcpy(&host, x.p, sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // read once, then cleared
}

TEST_CASE("cudart: a kernel runs under the emulator when its stream reaches it, with the arguments given at launch") {
  DeviceFloats x(100);
  OwnedStream s;
  float amount = 1.5f;
  ptrain::sim::launch(s.s, dim3(4), dim3(32), 0, "add_kernel", add_kernel, x.p, 100, amount);
  amount = 100.0f;  // taken by value at the launch
  CHECK(ptrain::sim::stats().pending == 1);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  const std::vector<float> v = x.read();
  for (float e : v) CHECK(e == 1.5f);
}

TEST_CASE("cudart: a launch configuration a GPU refuses queues nothing and sets cudaErrorInvalidConfiguration") {
  DeviceFloats x(1);
  OwnedStream s;
  ptrain::sim::launch(s.s, dim3(1), dim3(2048), 0, "add_kernel", add_kernel, x.p, 1, 1.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  ptrain::sim::launch(s.s, dim3(1), dim3(32), 64 * 1024, "add_kernel", add_kernel, x.p, 1, 1.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(ptrain::sim::stats().pending == 0);
}

TEST_CASE("cudart: a capture records instead of running, and each graph launch replays it") {
  DeviceFloats x(32);
  OwnedStream s;
  REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  ptrain::sim::launch(s.s, dim3(1), dim3(32), 0, "add_kernel", add_kernel, x.p, 32, 1.0f);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(ptrain::sim::stats().pending == 0);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
  CHECK(x.read()[0] == 0.0f);  // nothing ran
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  CHECK(x.read()[31] == 2.0f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_CASE("cudart: inside a capture, synchronising, allocating and synchronous copies are refused and invalidate it") {
  DeviceFloats x(1);
  OwnedStream s;
  float host = 0.0f;
  void* p = nullptr;
  REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  SECTION("cudaStreamSynchronize of the capturing stream") {
    CHECK(cudaStreamSynchronize(s.s) == cudaErrorStreamCaptureUnsupported);
  }
  SECTION("cudaMalloc") { CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported); }
  SECTION("cudaMemcpy") {
    CHECK(cudaMemcpy(&host, x.p, sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureUnsupported);
  }
  SECTION("a copy to pageable memory on the capturing stream") {
    CHECK(cudaMemcpyAsync(&host, x.p, sizeof(float), cudaMemcpyDeviceToHost, s.s) ==
          cudaErrorStreamCaptureUnsupported);
  }
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(s.s, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  CHECK(p == nullptr);
  cudaGetLastError();
}

TEST_CASE("cudart: legacy-stream work invalidates a blocking stream's capture, not a non-blocking stream's") {
  DeviceFloats x(1);
  for (const bool blocking : {true, false}) {
    CAPTURE(blocking);
    cudaStream_t s = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking) == cudaSuccess);
    unsigned int flags = 0;
    REQUIRE(cudaStreamGetFlags(s, &flags) == cudaSuccess);
    CHECK(flags == (blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    // Relaxed: the legacy stream's memset is not refused as an unsafe call, only as a dependency.
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    ptrain::sim::launch(s, dim3(1), dim3(32), 0, "add_kernel", add_kernel, x.p, 1, 1.0f);
    CHECK(cudaMemsetAsync(x.p, 0, sizeof(float), nullptr) == (blocking ? cudaErrorStreamCaptureImplicit : cudaSuccess));
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == (blocking ? cudaErrorStreamCaptureInvalidated : cudaSuccess));
    CHECK((graph != nullptr) == !blocking);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  }
}

TEST_CASE("cudart: waiting on the host for an event recorded inside a capture is cudaErrorCapturedEvent") {
  OwnedStream s;
  cudaEvent_t e;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, s.s) == cudaSuccess);
  CHECK(cudaEventSynchronize(e) == cudaErrorCapturedEvent);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);
  cudaGraphDestroy(graph);
  cudaEventDestroy(e);
  cudaGetLastError();
}

TEST_CASE("cudart: memory past the reported capacity is cudaErrorMemoryAllocation, and freed memory is poisoned") {
  size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  CHECK(total == ptrain::sim::stats().capacity);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, free_bytes + 1) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  cudaGetLastError();
  float* x = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&x), 4 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(x, 0, 4 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaFree(x) == cudaSuccess);
  CHECK(std::isnan(x[0]));  // a stale pointer reads NaN, never the old numbers
  size_t free_after = 0;
  REQUIRE(cudaMemGetInfo(&free_after, &total) == cudaSuccess);
  CHECK(free_after == free_bytes);
}

TEST_CASE("cudart: a kernel that faults makes every later call return cudaErrorLaunchFailure") {
  DeviceFloats x(32);
  OwnedStream s;
  ptrain::sim::launch(s.s, dim3(1), dim3(32), 0, "divergent_barrier_kernel", divergent_barrier_kernel, x.p);
  CHECK(cudaStreamSynchronize(s.s) == cudaErrorLaunchFailure);
  CHECK(cudaMemsetAsync(x.p, 0, 4, s.s) == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);  // sticky: not cleared by reading it
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
}

}  // namespace

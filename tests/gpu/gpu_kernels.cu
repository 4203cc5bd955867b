// nvcc side of the gpu tests: device buffers, one launcher call, results back to the host.
#include "gpu_kernels.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "classifier.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"

namespace ptrain::gpu_test {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// A device array of T, freed on scope exit.
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) { check(cudaMalloc(&ptr, (n ? n : 1) * sizeof(T)), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(DeviceArray&& other) noexcept : ptr(other.ptr), n(other.n) { other.ptr = nullptr; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& v) { check(cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    check(cudaDeviceSynchronize(), "kernel");
    check(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  void poison() { check(cudaMemset(ptr, 0xFF, n * sizeof(T)), "cudaMemset"); }  // NaN in every float format
};

template <typename T>
DeviceArray<T> to_device(const std::vector<float>& v) {
  std::vector<T> typed(v.size());
  for (size_t i = 0; i < v.size(); ++i) typed[i] = kernels::from_float<T>(v[i]);
  DeviceArray<T> d(v.size());
  d.upload(typed);
  return d;
}

template <typename T>
std::vector<float> to_host_floats(const DeviceArray<T>& d) {
  const std::vector<T> typed = d.download();
  std::vector<float> v(typed.size());
  for (size_t i = 0; i < typed.size(); ++i) v[i] = kernels::to_float(typed[i]);
  return v;
}

// Calls fn with a value of the storage type.
template <typename Fn>
auto with_storage(Storage s, Fn&& fn) {
  switch (s) {
    case Storage::bf16: return fn(kernels::bf16{});
    case Storage::fp16: return fn(kernels::fp16{});
    default: return fn(float{});
  }
}

}  // namespace

LayernormResult layernorm_forward(Storage s, const std::vector<float>& inp, const std::vector<float>& weight,
                                  const std::vector<float>& bias, int N, int C) {
  return with_storage(s, [&](auto zero) {
    using T = decltype(zero);
    DeviceArray<T> d_inp = to_device<T>(inp), d_w = to_device<T>(weight), d_b = to_device<T>(bias);
    DeviceArray<T> out(static_cast<size_t>(N) * C);
    DeviceArray<float> mean(N), rstd(N);
    out.poison();
    mean.poison();
    rstd.poison();
    kernels::layernorm_forward(out.ptr, mean.ptr, rstd.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, nullptr);
    return LayernormResult{to_host_floats(out), mean.download(), rstd.download()};
  });
}

ClassifierResult fused_classifier(Storage s, const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                  int N, int V, int Vp, float dloss) {
  return with_storage(s, [&](auto zero) {
    using T = decltype(zero);
    DeviceArray<T> d_logits = to_device<T>(logits);
    DeviceArray<int> d_targets(targets.size());
    d_targets.upload(std::vector<int>(targets.begin(), targets.end()));
    DeviceArray<float> losses(N);
    losses.poison();
    kernels::fused_classifier(d_logits.ptr, losses.ptr, d_targets.ptr, N, V, Vp, dloss, nullptr);
    return ClassifierResult{losses.download(), to_host_floats(d_logits)};
  });
}

Fp8CastResult fp8_cast(Storage s, const std::vector<float>& in, int rows, int cols, float scale, bool e4m3) {
  return with_storage(s, [&](auto zero) {
    using T = decltype(zero);
    DeviceArray<T> d_in = to_device<T>(in);
    DeviceArray<kernels::fp8> out(in.size()), out_t(in.size());
    DeviceArray<float> amax(1), d_scale(1);
    DeviceArray<kernels::Fp8Counts> counts(1);
    check(cudaMemset(amax.ptr, 0, sizeof(float)), "cudaMemset");
    check(cudaMemset(counts.ptr, 0, sizeof(kernels::Fp8Counts)), "cudaMemset");
    d_scale.upload({scale});
    kernels::fp8_cast(out.ptr, out_t.ptr, amax.ptr, counts.ptr, d_in.ptr, rows, cols, d_scale.ptr,
                      e4m3 ? __NV_E4M3 : __NV_E5M2, nullptr);
    const kernels::Fp8Counts c = counts.download()[0];
    Fp8CastResult r;
    r.codes = out.download();
    r.codes_transposed = out_t.download();
    r.amax = amax.download()[0];
    r.nonzero = c.nonzero;
    r.underflow = c.underflow;
    r.saturated = c.saturated;
    return r;
  });
}

std::vector<uint8_t> fp8_transpose(const std::vector<uint8_t>& codes, int rows, int cols) {
  DeviceArray<kernels::fp8> in(codes.size()), out(codes.size());
  in.upload(codes);
  kernels::fp8_transpose(out.ptr, in.ptr, rows, cols, nullptr);
  return out.download();
}

}  // namespace ptrain::gpu_test

#include "backend/device.h"

#include "core/error.h"

#ifdef PTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif
#ifdef PTRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace ptrain {

CudaProbe probe_cuda() {
  CudaProbe probe;
#ifdef PTRAIN_HAVE_CUDA
  probe.built_with_cuda = true;
  // Without a driver the runtime returns an error (35, cudaErrorInsufficientDriver) and leaves
  // the count unwritten: start from 0 and treat any error as "no GPU".
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    probe.why_none = std::string("cudaGetDeviceCount returned ") + std::to_string(static_cast<int>(err)) + " (" +
                     cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + ")";
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    probe.devices.push_back({i, prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.totalGlobalMem});
  }
  if (probe.devices.empty()) probe.why_none = "the CUDA runtime found no device";
#else
  probe.why_none = "this ptrain was built without CUDA (the CUDA toolkit was not found, or -DPTRAIN_CUDA=OFF)";
#endif
  return probe;
}

std::string describe_devices() {
  std::string text;
#ifdef PTRAIN_HAVE_CUDA
  text += "build: CUDA backend, built against " + cuda_header_versions() + "\n";
  text += "loaded: " + cuda_library_versions();
#ifdef PTRAIN_HAVE_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess)
    text += ", NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
            std::to_string(nccl % 100);
#endif
  text += "\n";
#endif
  const CudaProbe probe = probe_cuda();
  if (probe.devices.empty()) text += "no usable CUDA device: " + probe.why_none + "\n";
  for (const CudaDeviceInfo& d : probe.devices)
    text += "cuda:" + std::to_string(d.index) + " " + d.name + " (sm_" + std::to_string(d.major) +
            std::to_string(d.minor) + ", " + std::to_string(d.multiprocessors) + " multiprocessors, " +
            std::to_string(d.memory_bytes >> 20) + " MiB)\n";
  return text;
}

#ifdef PTRAIN_HAVE_CUDA
static std::string describe(const CudaDeviceInfo& d) {
  return d.name + " (sm_" + std::to_string(d.major) + std::to_string(d.minor) + ", " +
         std::to_string(d.memory_bytes >> 30) + " GiB)";
}
#endif

std::unique_ptr<Backend> make_backend(DeviceRequest device, int threads, bool tf32, int local_rank, std::string* chosen) {
  // The CPU reference computes FP32 GEMMs in full FP32: TF32 is a tensor-core format.
  const std::string tf32_note = tf32 ? "; precision.tf32 has no effect on the CPU" : "";
  if (device == DeviceRequest::cpu) {
    *chosen = "device cpu (run.device: cpu" + tf32_note + ")";
    return make_cpu_backend(threads);
  }
  const CudaProbe probe = probe_cuda();
#ifdef PTRAIN_HAVE_CUDA
  if (!probe.devices.empty()) {
    // Data parallel: one GPU per rank of this node.
    const CudaDeviceInfo& gpu = probe.devices[static_cast<size_t>(local_rank) % probe.devices.size()];
    *chosen = "device cuda:" + std::to_string(gpu.index) + " " + describe(gpu) + " (run.device: " + choice_name(device) +
              (tf32 ? "; FP32 GEMMs on TF32 tensor cores" : "") + ")";
    return make_cuda_backend(gpu.index, 0, tf32);
  }
#endif
  const std::string why = "no usable CUDA device: " + probe.why_none;
  if (device == DeviceRequest::cuda) throw EnvironmentError("run.device: cuda cannot be used: " + why + "; set run.device: cpu (or auto)");
  *chosen = "device cpu (run.device: auto; " + why + tf32_note + ")";
  return make_cpu_backend(threads);
}

}  // namespace ptrain

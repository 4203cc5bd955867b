// Which device a run trains on (run.device: auto | cpu | cuda), and what CUDA devices this
// machine has. The probe works in every build: a build without CUDA says so, and a CUDA build
// on a machine without a GPU (or driver) reports the runtime's answer instead of failing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ptrain {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  size_t memory_bytes = 0;
};

struct CudaProbe {
  bool built_with_cuda = false;
  std::vector<CudaDeviceInfo> devices;
  std::string why_none;  // when devices is empty: why (no CUDA in this build, the runtime's error, ...)
};

CudaProbe probe_cuda();

// What `ptrain devices` prints: the build (CUDA or not, the library headers it was built
// against), the CUDA libraries this process loaded (runtime, driver, cuBLASLt, cuDNN, NCCL) and
// every usable device, or why there is none. Needs no GPU.
std::string describe_devices();

// The backend for run.device, and in `chosen` one line for the run log saying which device was
// taken and why. tf32 (precision.tf32) lets a GPU run FP32 GEMMs on TF32 tensor cores; a rank
// takes GPU `local_rank` of its node (modulo the GPUs there). Throws EnvironmentError when
// `cuda` is asked for and cannot be had.
std::unique_ptr<Backend> make_backend(DeviceRequest device, int threads, bool tf32, int local_rank,
                                      std::string* chosen);

}  // namespace ptrain

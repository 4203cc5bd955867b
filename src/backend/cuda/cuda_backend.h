// The CUDA backend: every Backend op on one GPU, through the hand-written kernels of kernels/
// and cuBLASLt (backend/cuda/matmul.h). Compiled only into CUDA builds (PTRAIN_HAVE_CUDA); this
// header needs no CUDA headers, so plain C++ (the device probe, the tests) may include it.
//
// Storage: a tensor of format bf16 is stored as DType::bf16, fp16 as DType::f16, everything
// else (fp32, and the dequantised FP8 buffers of format e4m3/e5m2) as f32; f64 is refused
// (storage_for). Ops accept operands of mixed float dtypes (e.g. f32 FP8 operands with a bf16
// output): an operand whose dtype is not the one the op computes in is converted into scratch
// first, an output is written through scratch and converted back, rounded to its format; FP32
// weight gradients beside 16-bit activations are added into as they are.
//
// Memory: one device arena, reserved by a single cudaMalloc when the backend is made, from
// which allocate() hands out zeroed, 256-byte aligned blocks (first fit, freed blocks are
// coalesced); scratch buffers of the ops come from the same arena and are kept between calls.
// Nothing calls cudaMalloc after construction.
//
// Streams: all work runs on one stream that the backend creates; results the host reads
// (download, sum, sum_squares, amax, the FP8 cast statistics) synchronise with it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace ptrain {

// The CUDA backend on device `device_index`. arena_bytes = 0 reserves the memory that is free
// on the device when the backend starts, less a margin of max(2 GiB, 1/16 of the device's
// memory) for the CUDA context, cuBLASLt, cuDNN and NCCL; a positive value reserves exactly
// that (rounded up to 2 MiB). Throws CudaError / EnvironmentError when there is no usable
// device, the device is older than sm_90, or the arena cannot be reserved. tf32: FP32 GEMMs run
// on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), as precision.tf32 asks.
std::unique_ptr<Backend> make_cuda_backend(int device_index, size_t arena_bytes = 0, bool tf32 = false);

// The libraries this process loaded: "CUDA runtime 13.0, driver 13.0, cuBLASLt 13.1.0, cuDNN
// 9.19.0" (driver "none" without one). Needs no GPU.
std::string cuda_library_versions();
// The versions of the headers ptrain was built against, in the same form.
std::string cuda_header_versions();

}  // namespace ptrain

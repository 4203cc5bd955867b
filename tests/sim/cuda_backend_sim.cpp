// The real CUDA backend, compiled by g++ for the simulated device: the same source nvcc builds
// into ptrain, its kernels under the SIMT emulator (PTRAIN_SIM_DEVICE; kernels/common.cuh).
#include "backend/cuda/cuda_backend.cu"

// The gpu tests' direct kernel launches (tests/gpu/gpu_kernels.cu), compiled by g++ for the
// simulated device.
#include "gpu/gpu_kernels.cu"

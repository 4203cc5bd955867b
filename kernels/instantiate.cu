// Instantiates every kernel launcher for every storage type it supports, so that nvcc compiles
// each kernel for the GPU with warnings as errors and ptxas reports each one's registers,
// shared memory and spills (scripts/check-ptxas.sh). The CUDA backend will call these launchers.
#include "layernorm.cuh"

namespace ptrain::kernels {

template <typename T>
void instantiate_launchers_for() {
  (void)&layernorm_forward<T>;
  (void)&fused_residual_layernorm_forward<T>;
  (void)&layernorm_backward<T>;
}

template void instantiate_launchers_for<float>();
template void instantiate_launchers_for<bf16>();
template void instantiate_launchers_for<fp16>();

}  // namespace ptrain::kernels

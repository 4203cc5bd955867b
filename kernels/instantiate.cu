// Instantiates every kernel launcher for every storage type it supports, so that nvcc compiles
// each kernel for the GPU with warnings as errors and ptxas reports each one's registers,
// shared memory and spills (scripts/check-ptxas.sh). The CUDA backend will call these launchers.
#include "attention.cuh"
#include "classifier.cuh"
#include "elementwise.cuh"
#include "encoder.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"
#include "optimizer.cuh"

namespace ptrain::kernels {

template <typename T>
void instantiate_launchers_for() {
  (void)&encoder_forward<T>;
  (void)&encoder_backward<T>;
  (void)&layernorm_forward<T>;
  (void)&fused_residual_layernorm_forward<T>;
  (void)&layernorm_backward<T>;
  (void)&gelu_forward<T>;
  (void)&gelu_backward<T>;
  (void)&add<T>;
  (void)&bias_add<T>;
  (void)&bias_backward<T>;
  (void)&attention_permute<T>;
  (void)&attention_unpermute<T>;
  (void)&attention_permute_backward<T>;
  (void)&attention_unpermute_backward<T>;
  (void)&softmax_causal_forward<T>;
  (void)&softmax_causal_backward<T>;
  (void)&fused_classifier<T>;
  (void)&adamw_update<T>;
  (void)&grad_norm_squared<T>;
  (void)&grad_unscale<T>;
  (void)&fp8_cast<T>;
  (void)&amax<T>;
  (void)&fp8_quantize_blocks<T>;
}

template void instantiate_launchers_for<float>();
template void instantiate_launchers_for<bf16>();
template void instantiate_launchers_for<fp16>();

// Launchers without a storage type.
void instantiate_untyped_launchers() {
  (void)&current_scale_from_amax;
  (void)&delayed_scaling_update;
}

}  // namespace ptrain::kernels

// Instantiates every kernel launcher for every storage type it supports, so that nvcc compiles
// each kernel for the GPU with warnings as errors and ptxas reports each one's registers,
// shared memory and spills (scripts/check-ptxas.sh), including kernels a build of the backend does not use.
#include "attention.cuh"
#include "classifier.cuh"
#include "convert.cuh"
#include "elementwise.cuh"
#include "encoder.cuh"
#include "fp8.cuh"
#include "layernorm.cuh"
#include "llama.cuh"
#include "optimizer.cuh"
#include "reduce.cuh"

namespace ptrain::kernels {

// Launchers over two storage types. The CUDA backend converts between, and finishes GEMMs into,
// any pair of its float dtypes (with a bias of any of them), so every pair is instantiated.
template <typename T, typename U>
void instantiate_pair_launchers() {
  (void)&convert<T, U>;
  (void)&gemm_finish<T, U>;
}

// The backward launchers that add parameter gradients into FP32 sums beside T activations.
template <typename T>
void instantiate_fp32_gradient_launchers() {
  (void)&encoder_backward<T, float>;
  (void)&layernorm_backward<T, float>;
  (void)&bias_backward<T, float>;
  (void)&rmsnorm_backward<T, float>;
  (void)&qk_norm_backward<T, float>;
}

template <typename T>
void instantiate_launchers_for() {
  (void)&encoder_forward<T>;
  (void)&encoder_backward<T>;
  (void)&layernorm_forward<T>;
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
  (void)&attention_decode<T>;
  (void)&rmsnorm_forward<T>;
  (void)&rmsnorm_backward<T>;
  (void)&qk_norm_forward<T>;
  (void)&qk_norm_backward<T>;
  (void)&rope<T>;
  (void)&swiglu_forward<T>;
  (void)&swiglu_backward<T>;
  (void)&fused_classifier<T>;
  (void)&adamw_update<T>;
  (void)&fp8_cast<T>;
  (void)&amax<T>;
  (void)&fp8_quantize_blocks<T>;
  (void)&fp8_quantize_blocks_into<T>;
  (void)&fp8_block_amax_part<T>;
  (void)&fp8_encode_part<T>;
  (void)&fp8_dequantize<T>;
  (void)&fp8_dequantize_blocks<T>;
  (void)&double_sum<T>;
  instantiate_pair_launchers<T, float>();
  instantiate_pair_launchers<T, bf16>();
  instantiate_pair_launchers<T, fp16>();
  instantiate_fp32_gradient_launchers<T>();
}

template void instantiate_launchers_for<float>();
template void instantiate_launchers_for<bf16>();
template void instantiate_launchers_for<fp16>();

// Launchers without a storage type.
void instantiate_untyped_launchers() {
  (void)&current_scale_from_amax;
  (void)&fp8_transpose;
}

}  // namespace ptrain::kernels

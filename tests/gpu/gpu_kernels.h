// Runs single kernels on the GPU for the gpu tests: host vectors in, host vectors out. The
// definitions are compiled by nvcc (gpu_kernels.cu); the tests that compare the results with
// the CPU backend are plain C++ (test_gpu_kernels.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain::gpu_test {

// Storage formats the kernels are run in (values travel as floats on the format's grid).
enum class Storage { fp32, bf16, fp16 };

struct LayernormResult {
  std::vector<float> out, mean, rstd;
};
LayernormResult layernorm_forward(Storage s, const std::vector<float>& inp, const std::vector<float>& weight,
                                  const std::vector<float>& bias, int N, int C);

struct ClassifierResult {
  std::vector<float> losses, dlogits;
};
ClassifierResult fused_classifier(Storage s, const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                  int N, int V, int Vp, float dloss);

struct Fp8CastResult {
  std::vector<uint8_t> codes, codes_transposed;
  float amax = 0;
  uint64_t nonzero = 0, underflow = 0, saturated = 0;
};
Fp8CastResult fp8_cast(Storage s, const std::vector<float>& in, int rows, int cols, float scale, bool e4m3);
// kernels::fp8_transpose: the (cols, rows) transpose of (rows, cols) codes.
std::vector<uint8_t> fp8_transpose(const std::vector<uint8_t>& codes, int rows, int cols);

}  // namespace ptrain::gpu_test

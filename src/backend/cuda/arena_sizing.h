// How the CUDA backend sizes its arena and the blocks it hands out, in plain C++ (no CUDA
// headers): the backend sizes its memory by these, and `--dry-run` plans a GPU run's memory by
// the same rules on a machine without a GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/tensor.h"

namespace ptrain {

// How the backend stores each format (Backend::storage_for): bf16 and fp16 in their own two
// bytes, everything else (fp32, and the dequantised values of the FP8 formats) as f32.
constexpr DType cuda_storage_dtype(Format f) {
  return f == Format::bf16 ? DType::bf16 : f == Format::fp16 ? DType::f16 : DType::f32;
}

// Every allocation and scratch buffer starts on 256 bytes, and takes a whole number of them.
constexpr size_t kArenaAlignment = 256;
constexpr size_t arena_block_bytes(size_t bytes) {
  return ((bytes > 0 ? bytes : 1) + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// Left outside the arena for the CUDA context, cuBLASLt, cuDNN and NCCL: max(2 GiB, 1/16 of the
// device's memory). The arena takes the rest of what is free when the backend starts.
constexpr size_t arena_margin_bytes(size_t device_total) {
  return std::max(size_t(2) << 30, device_total / 16);
}

// Blocks the backend takes for itself when it starts, before any model memory: cuBLASLt's
// workspace (Matmul::kRecommendedWorkspaceBytes), the reduction scratch (kernels::
// kReducePartials doubles) and the device scalars; cuda_backend.cu checks these against its own.
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kReduceScratchBytes = 264 * sizeof(double);
constexpr size_t kDeviceScalarsBytes = kArenaAlignment;
constexpr size_t kBackendFixedBytes =
    arena_block_bytes(kCublasLtWorkspaceBytes) + arena_block_bytes(kReduceScratchBytes) + kDeviceScalarsBytes;

// An FP8 activation store (backend/fp8_activation_store.h) of `layers` x rows x cols: the codes
// (a byte each), a factor per 1 x tile tile, and the statistics of each layer's casts and of
// unrecorded ones, kFp8TallyBytes each.
constexpr size_t kFp8TallyBytes = 64;
constexpr size_t fp8_activation_store_bytes(int64_t layers, int64_t rows, int64_t cols, int64_t tile) {
  const int64_t tiles = layers * rows * ((cols + tile - 1) / tile);
  return arena_block_bytes(static_cast<size_t>(layers * rows * cols)) +
         arena_block_bytes(static_cast<size_t>(tiles) * sizeof(float)) +
         arena_block_bytes(static_cast<size_t>(layers + 1) * kFp8TallyBytes);
}

// "79.1 GiB": how the backend's messages and the memory plan state sizes.
inline std::string gib_text(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / static_cast<double>(size_t(1) << 30));
  return text;
}

}  // namespace ptrain

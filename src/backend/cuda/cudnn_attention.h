// Causal scaled-dot-product attention (flash attention) forward and backward on cuDNN 9's graph
// (backend) C API, for ptrain's fused QKV layout. See cudnn_attention.cpp for the graphs, the
// determinism rules and the workspace layout.
//
//   CudnnAttention att(stream, /*deterministic=*/true);
//   SdpaShape s{B, T, NH, KV, HS, CUDA_R_16BF};
//   std::string why;
//   if (!att.supported(s, &why)) { ... use the fallback attention, report `why` ... }
//   void* ws = ...;  // att.workspace_bytes(s) bytes of device memory, 256-byte aligned
//   att.forward(s, out, stats, qkv, 1.0f / std::sqrt(float(HS)), ws);
//   att.backward(s, dqkv, dout, qkv, out, stats, 1.0f / std::sqrt(float(HS)), ws);
//
// Layouts (row-major, C = NH * HS, W = (NH + 2 KV) * HS, 16-bit elements of `type`):
//   qkv, dqkv  (B, T, W): per token q (NH heads x HS), then k (KV heads x HS), then v (KV heads);
//              KV < NH is grouped-query attention: query head h reads K/V head h / (NH / KV)
//   out, dout  (B, T, C)
//   stats      (B, NH, T) FP32: per query row, max + log(sum exp) of the scaled, masked scores
//
// Not thread-safe: one instance (its handle and plan cache) belongs to one host thread. Compiled
// only into CUDA builds (PTRAIN_HAVE_CUDA); links cudnn.
#pragma once

#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

namespace ptrain {

struct SdpaShape {  // one attention call
  int64_t B = 0, T = 0, NH = 0, KV = 0, HS = 0;  // KV: K/V heads, a divisor of NH
  cudaDataType_t type = CUDA_R_16BF;             // CUDA_R_16BF or CUDA_R_16F
  bool operator==(const SdpaShape& o) const {
    return B == o.B && T == o.T && NH == o.NH && KV == o.KV && HS == o.HS && type == o.type;
  }
  bool operator!=(const SdpaShape& o) const { return !(*this == o); }
};

struct SdpaShapeHash {
  size_t operator()(const SdpaShape& s) const {
    size_t h = 1469598103934665603ull;
    for (long long f : {static_cast<long long>(s.B), static_cast<long long>(s.T), static_cast<long long>(s.NH),
                        static_cast<long long>(s.KV), static_cast<long long>(s.HS), static_cast<long long>(s.type)})
      h = (h ^ std::hash<long long>()(f)) * 1099511628211ull;
    return h;
  }
};

// e.g. "B=8 T=1024 NH=12 HS=64 bf16", "B=8 T=2048 NH=12 KV=3 HS=64 bf16" (KV shown when < NH)
std::string describe_sdpa_shape(const SdpaShape& s);

class CudnnAttention {
 public:
  // Creates a cuDNN handle bound to `stream` (throws CudaError without a GPU). deterministic: the
  // backward pass must give bit-identical results run to run (see cudnn_attention.cpp for what
  // cuDNN offers per GPU generation; where it offers nothing, supported() says so).
  CudnnAttention(cudaStream_t stream, bool deterministic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds (once per shape, cached, the answer too) the forward and backward plans; false with
  // the reason in *why (why may be null) when cuDNN cannot run this shape: dtype not bf16/fp16, a
  // head size that is not a multiple of 8, no engine for a graph, no deterministic backward on
  // this GPU, ... Never throws for "unsupported"; throws CudaError for real API failures.
  bool supported(const SdpaShape& s, std::string* why);
  // Device workspace bytes that forward() and backward() of this shape need (the larger of the
  // two; 0 is possible). Builds the plans if needed; throws EnvironmentError for an unsupported
  // shape.
  size_t workspace_bytes(const SdpaShape& s);
  // out (B,T,C) and stats (B,NH,T) FP32 log-sum-exp from qkv (B,T,W); scale = 1/sqrt(HS).
  // All pointers are device pointers, 16-byte aligned; workspace: workspace_bytes(s) bytes,
  // 256-byte aligned. Runs on the stream given to the constructor.
  void forward(const SdpaShape& s, void* out, float* stats, const void* qkv, float scale, void* workspace);
  // dqkv (B,T,W) = gradients of q, k, v, written (not added), from dout (B,T,C), qkv, out, stats;
  // with grouped K/V heads each K/V gradient is the sum over its group of query heads.
  void backward(const SdpaShape& s, void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats,
                float scale, void* workspace);

  // One line for logs and the GPU check: cuDNN version, GPU, shape, and per pass the engine's global
  // index, how it was chosen, its numerical notes and the plan's workspace, then the backward graph
  // variant and the total workspace, e.g. "cuDNN 9.19.0 sm90 B=8 T=1024 NH=12 HS=64 bf16; forward:
  // engine 6 (heuristics A), notes tensor-core, plan workspace 0 B; backward: engine 6 (heuristics A),
  // ..., plan workspace 201326592 B, dP-workspace graph (deterministic); total workspace 201424896 B".
  // "unsupported: <why>" for an unsupported shape. Builds the plans if needed.
  std::string plan_summary(const SdpaShape& s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptrain

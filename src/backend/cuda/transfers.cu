// Moving data between the host and the device. Parameters, checkpoints and results go through
// pageable memory and wait (they are rare); the tokens of every micro-batch, with the buckets of
// the deterministic embedding backward built from them on the host, go up through pinned
// staging (pinned_staging.h) so that the host does not wait for the device each step.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "encoder.cuh"

namespace ptrain::cuda_impl {

void CudaBackend::zero(Tensor t) {
  if (t.empty() || t.numel() == 0) return;
  PTRAIN_EXPECT(t.device == Device::cuda, "zero", "the tensor is not in device memory");
  PTRAIN_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
}

void CudaBackend::upload(Tensor dst, const float* src) {
  const char* op = "upload";
  PTRAIN_EXPECT(!dst.empty(), op, "the destination is empty");
  expect_float(op, "dst", dst);
  const size_t n = static_cast<size_t>(dst.numel());
  if (n == 0) return;
  with_float_type(dst.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    if constexpr (std::is_same<T, float>::value) {
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
      sync();
    } else {
      std::vector<T> host(n);
      for (size_t i = 0; i < n; ++i) host[i] = kernels::from_float<T>(src[i]);
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream_));
      sync();  // before `host` goes away
    }
  });
}

void CudaBackend::download(float* dst, Tensor src) {
  const char* op = "download";
  PTRAIN_EXPECT(!src.empty(), op, "the source is empty");
  expect_float(op, "src", src);
  const size_t n = static_cast<size_t>(src.numel());
  if (n == 0) return;
  with_float_type(src.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    if constexpr (std::is_same<T, float>::value) {
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      sync();
    } else {
      std::vector<T> host(n);
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), src.data, n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
      sync();
      for (size_t i = 0; i < n; ++i) dst[i] = kernels::to_float(host[i]);
    }
  });
}

// Also builds the deterministic encoder backward's buckets of these tokens (kept per tokens
// tensor, keyed by its data pointer, until the memory holding it is released). Both go up
// through pinned staging: the call does not wait for the device.
void CudaBackend::upload_tokens(Tensor dst, const int32_t* src) {
  const char* op = "upload_tokens";
  expect_tokens(op, "dst", dst);
  const int64_t n = dst.numel();
  if (n == 0) return;
  to_int(n, op, "tokens");
  build_buckets(dst.data, src, n, dst.data);
}

void CudaBackend::copy(Tensor dst, Tensor src) {
  const char* op = "copy";
  const bool codes = dst.dtype == DType::u8 && src.dtype == DType::u8;  // FP8 codes, byte for byte
  if (!codes) expect_floats(op, {{"dst", &dst}, {"src", &src}});
  PTRAIN_EXPECT(dst.numel() == src.numel(), op,
                "shape mismatch: dst " + dst.shape_string() + " src " + src.shape_string());
  if (dst.numel() == 0) return;
  if (codes || (dst.dtype == src.dtype && !needs_rounding(dst))) {
    if (dst.data != src.data)
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  convert(dst, src, dst.format);
}

void CudaBackend::download_doubles(double* dst, Tensor src) {
  PTRAIN_EXPECT(src.dtype == DType::f64 && src.device == Device::cuda, "download_doubles",
                "src must be f64 in device memory");
  if (src.numel() == 0) return;
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
  sync();
}

// Buckets of `tokens` (host copy) for the tensor at `key`, built on the host and uploaded
// through pinned staging, with the tokens themselves to `copy_tokens_to` unless null. Nothing
// waits for the device, unless the staging's previous copy is still queued.
const DeviceBuckets& CudaBackend::build_buckets(const void* key, const int32_t* tokens, int64_t n,
                                                void* copy_tokens_to) {
  const int count = static_cast<int>(n);
  const kernels::TokenBuckets host = kernels::bucket_tokens(tokens, count);
  const size_t packed_ints = kernels::packed_bucket_ints(count);
  DeviceBuckets& entry = buckets_[key];
  if (!entry.packed || entry.tokens != n) {
    if (entry.packed) {
      arena_->release(entry.packed);
      entry.packed = nullptr;  // not left dangling if the allocation below throws
    }
    entry.packed = static_cast<int*>(allocate(packed_ints * sizeof(int)));
    entry.tokens = n;
  }
  PinnedStaging& staging = entry.staging[static_cast<size_t>(entry.next_staging)];
  entry.next_staging ^= 1;
  int* pinned = static_cast<int*>(staging.acquire((static_cast<size_t>(n) + packed_ints) * sizeof(int)));
  std::copy(tokens, tokens + n, pinned);
  kernels::pack_buckets(host, count, pinned + n);
  if (copy_tokens_to)
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(copy_tokens_to, pinned, static_cast<size_t>(n) * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_));
  PTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(entry.packed, pinned + n, packed_ints * sizeof(int), cudaMemcpyHostToDevice, stream_));
  staging.queued(stream_);
  entry.max_id = host.ids.empty() ? -1 : host.ids.back();
  return entry;
}

// The buckets of a tokens tensor; tokens that did not come through upload_tokens (or a view
// of part of an uploaded tensor) are read back and bucketed now.
const DeviceBuckets& CudaBackend::buckets_for(const Tensor& tokens) {
  const auto it = buckets_.find(tokens.data);
  if (it != buckets_.end() && it->second.tokens == tokens.numel()) return it->second;
  const int64_t n = tokens.numel();
  std::vector<int32_t> host(static_cast<size_t>(n));
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), tokens.data, static_cast<size_t>(n) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream_));
  sync();
  return build_buckets(tokens.data, host.data(), n, nullptr);
}

// Drops the buckets of tokens tensors inside [ptr, ptr + bytes): that memory is being released.
void CudaBackend::forget_buckets_within(const void* ptr, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr), end = begin + bytes;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(it->first);
    if (key >= begin && key < end) {
      if (it->second.packed) arena_->release(it->second.packed);
      it = buckets_.erase(it);
    } else {
      ++it;
    }
  }
}

// Tokens uploaded through upload_tokens have known buckets: their largest id is checked
// against the vocabulary for free.
void CudaBackend::check_token_range(const char* op, const Tensor& tokens, int64_t vocab) const {
  const auto it = buckets_.find(tokens.data);
  if (it == buckets_.end() || it->second.tokens != tokens.numel()) return;
  // The model checks the tokens on the host (Transformer::check_tokens): one out of range here is a bug.
  PTRAIN_EXPECT(it->second.max_id < vocab, op,
                "token id " + std::to_string(it->second.max_id) + " is not below the " + std::to_string(vocab) +
                    " rows of the token embedding (vocabulary size)");
}

}  // namespace ptrain::cuda_impl

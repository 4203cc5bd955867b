// Page-locked host memory for copies that do not wait. A copy from pageable memory makes the
// host wait until the driver has staged it; from pinned memory the copy is only queued and the
// host goes on, which is what lets the next batch's tokens go up while the step runs (and lets
// a CUDA graph replay copies at all). The price is a rule the compiler cannot check: the memory
// must not be written again (an upload's source) or read (a download's destination) until the
// copy has run. This class keeps that rule with one event per buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ptrain {

class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging();

  // At least `bytes`, once the copy queued last with this memory is done.
  void* acquire(size_t bytes);
  // After the copies that use the memory are queued on `stream`.
  void queued(cudaStream_t stream);

 private:
  void* host_ = nullptr;
  size_t bytes_ = 0;
  cudaEvent_t copied_ = nullptr;
};

}  // namespace ptrain

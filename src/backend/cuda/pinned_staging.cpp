#include "backend/cuda/pinned_staging.h"

#include "backend/cuda/cuda_error.h"

namespace ptrain {

PinnedStaging::~PinnedStaging() {
  if (copied_) {
    (void)cudaEventSynchronize(copied_);  // a queued copy may still read the memory
    (void)cudaEventDestroy(copied_);
  }
  if (host_) (void)cudaFreeHost(host_);
}

void* PinnedStaging::acquire(size_t bytes) {
  if (copied_)
    PTRAIN_CUDA_CHECK(cudaEventSynchronize(copied_));
  else
    PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  if (bytes > bytes_) {
    if (host_) PTRAIN_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    bytes_ = 0;
    PTRAIN_CUDA_CHECK(cudaMallocHost(&host_, bytes));
    bytes_ = bytes;
  }
  return host_;
}

void PinnedStaging::queued(cudaStream_t stream) { PTRAIN_CUDA_CHECK(cudaEventRecord(copied_, stream)); }

}  // namespace ptrain

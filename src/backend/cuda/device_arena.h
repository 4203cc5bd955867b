// The CUDA backend's device memory: one block reserved by a single cudaMalloc when the backend
// starts, handed out in pieces. Why not cudaMalloc per tensor: it synchronises the device, its
// cost varies with fragmentation, and a CUDA graph recorded over the training step bakes in
// addresses, so every allocation must be the backend's own, repeatable choice; one arena also
// makes the memory plan (`--dry-run`, arena_sizing.h) exact.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "backend/cuda/arena_annotations.h"

namespace ptrain {

class DeviceArena {
 public:
  // Reserves `bytes` (already rounded by the caller); blocks are zeroed on `stream`. Throws
  // EnvironmentError, naming the size and the device's free memory, when cudaMalloc refuses.
  // Destroy only once the work queued on `stream` is done (cudaFree synchronises the device, but
  // the caller's stream must outlive it).
  DeviceArena(size_t bytes, size_t device_free, size_t device_total, cudaStream_t stream);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // First fit in address order over the free blocks; a whole number of kArenaAlignment bytes,
  // zeroed on the stream. Throws EnvironmentError (out of GPU memory) when nothing fits.
  void* allocate(size_t bytes);
  // Returns a block to the free list, merging it with free neighbours. Throws
  // std::logic_error for a pointer allocate() did not return.
  void release(void* ptr);
  // The size of the block at ptr (never 0: a block has at least kArenaAlignment bytes), or 0 if
  // ptr is not one allocate() handed out.
  size_t block_bytes(const void* ptr) const;

  size_t capacity() const { return bytes_; }
  size_t in_use() const { return in_use_; }
  size_t peak() const { return peak_; }
  // Counts allocations and releases: a recording of work is only valid while it is unchanged.
  uint64_t epoch() const { return epoch_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0, in_use_ = 0, peak_ = 0;
  uint64_t epoch_ = 0;
  cudaStream_t stream_;
  std::unique_ptr<ArenaAnnotations> annotations_;   // the blocks, as compute-sanitizer sees them
  std::map<size_t, size_t> free_;                   // offset -> size of each free block, by address
  std::unordered_map<const void*, size_t> blocks_;  // pointer -> size of each block handed out
};

}  // namespace ptrain

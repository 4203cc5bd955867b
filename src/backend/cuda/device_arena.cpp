#include "backend/cuda/device_arena.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "backend/cuda/arena_sizing.h"
#include "backend/cuda/cuda_error.h"
#include "core/error.h"

namespace ptrain {

DeviceArena::DeviceArena(size_t bytes, size_t device_free, size_t device_total, cudaStream_t stream)
    : bytes_(bytes), stream_(stream) {
  void* base = nullptr;
  try {
    PTRAIN_CUDA_CHECK(cudaMalloc(&base, bytes));
  } catch (const CudaError& e) {
    throw EnvironmentError("could not reserve ptrain's CUDA arena of " + std::to_string(bytes) + " bytes (" +
                           gib_text(bytes) + "; " + gib_text(device_free) + " free of " + gib_text(device_total) +
                           "): " + e.what());
  }
  base_ = static_cast<char*>(base);
  try {
    annotations_ = std::make_unique<ArenaAnnotations>(base_, bytes_);
  } catch (...) {
    (void)cudaFree(base_);
    throw;
  }
  free_.emplace(size_t(0), bytes_);
}

DeviceArena::~DeviceArena() {
  annotations_.reset();
  (void)cudaFree(base_);
}

void* DeviceArena::allocate(size_t bytes) {
  const size_t need = arena_block_bytes(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t offset = it->first, size = it->second;
    free_.erase(it);
    if (size > need) free_.emplace(offset + need, size - need);
    void* p = base_ + offset;
    blocks_.emplace(p, need);
    annotations_->allocated(p, need);
    ++epoch_;
    in_use_ += need;
    peak_ = std::max(peak_, in_use_);
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(p, 0, need, stream_));
    annotations_->shrink(p, std::max<size_t>(bytes, 1));
    return p;
  }
  size_t largest = 0;
  for (const auto& block : free_) largest = std::max(largest, block.second);
  throw EnvironmentError("out of GPU memory in ptrain's CUDA arena: asked for " + std::to_string(bytes) +
                         " bytes, but only " + std::to_string(bytes_ - in_use_) + " bytes of the " +
                         std::to_string(bytes_) + "-byte (" + gib_text(bytes_) +
                         ") arena are free (the largest free block has " + std::to_string(largest) +
                         " bytes); lower training.micro_batch or free the GPU of other processes");
}

void DeviceArena::release(void* ptr) {
  const auto it = blocks_.find(ptr);
  PTRAIN_CHECK(it != blocks_.end(), "cuda backend: freeing a block the arena did not hand out");
  const size_t size = it->second;
  blocks_.erase(it);
  annotations_->released(ptr);
  ++epoch_;
  in_use_ -= size;
  const size_t offset = static_cast<size_t>(static_cast<char*>(ptr) - base_);
  auto pos = free_.emplace(offset, size).first;
  const auto next = std::next(pos);
  if (next != free_.end() && pos->first + pos->second == next->first) {
    pos->second += next->second;
    free_.erase(next);
  }
  if (pos != free_.begin()) {
    const auto prev = std::prev(pos);
    if (prev->first + prev->second == pos->first) {
      prev->second += pos->second;
      free_.erase(pos);
    }
  }
}

size_t DeviceArena::block_bytes(const void* ptr) const {
  const auto it = blocks_.find(ptr);
  return it == blocks_.end() ? 0 : it->second;
}

}  // namespace ptrain

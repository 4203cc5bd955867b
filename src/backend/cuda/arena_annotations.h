// The CUDA arena described to compute-sanitizer through NVTX's memory API. ptrain reserves one
// cudaMalloc block and hands out pieces of it, so to memcheck the whole arena is one valid
// allocation and a write past the end of a tensor into its neighbour goes unseen. Registered as
// a sub-allocator heap, with each block handed out registered as a region of exactly the bytes
// asked for, memcheck reports any access outside a live block (NVIDIA, "NVTX API for Compute
// Sanitizer", Suballocation API; needs `compute-sanitizer --nvtx yes`). Without a tool attached
// every call is a no-op.
#pragma once

#include <cstddef>
#include <memory>

namespace ptrain {

class ArenaAnnotations {
 public:
  ArenaAnnotations(const void* base, size_t bytes);
  ~ArenaAnnotations();
  ArenaAnnotations(const ArenaAnnotations&) = delete;
  ArenaAnnotations& operator=(const ArenaAnnotations&) = delete;

  // A block of `bytes` handed out: accessible, every byte.
  void allocated(const void* block, size_t bytes);
  // The block's accessible part shrunk to the bytes its caller asked for (the rest is the
  // arena's alignment padding, zeroed with the block but never the caller's to touch).
  void shrink(const void* block, size_t bytes_asked_for);
  void released(const void* block);

 private:
  struct Handles;  // NVTX's handle types stay out of this header
  std::unique_ptr<Handles> handles_;
};

}  // namespace ptrain

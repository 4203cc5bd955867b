// Large buffers on huge pages. On a virtual machine a page fault or a TLB miss costs far more
// than on bare metal (the host keeps tables of its own): on the 2-core cloud VM this project is
// built on, touching fresh memory cost 12-14 us per 4 KiB page, so an 8 MiB buffer's first
// fill took 25 ms, about as long as tokenizing a megabyte. Where the kernel gives transparent
// huge pages on request (the setting "madvise", as on those VMs), a 2 MiB page takes one fault
// and one TLB entry instead of 512.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace ptrain {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// Asks for huge pages over the whole 2 MiB pages within [data, data + bytes); call it before
// the memory is first written (a reserved, untouched vector's or string's buffer). Advice only:
// where the kernel has none to give, pages stay small.
inline void prefer_huge_pages(const void* data, size_t bytes) {
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePageBytes - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Reserves room for `n` elements in a vector or string that is empty or about to grow, on huge
// pages where the buffer is new: those whole 2 MiB pages that fall inside the block malloc
// gives, which for a buffer of 4 MiB or more is most of it.
template <class Buffer>
void reserve_on_huge_pages(Buffer& buffer, size_t n) {
  if (buffer.capacity() >= n) return;
  Buffer fresh;
  fresh.reserve(n);
  prefer_huge_pages(fresh.data(), n * sizeof(typename Buffer::value_type));
  fresh.assign(buffer.begin(), buffer.end());
  buffer.swap(fresh);
}

// An allocator for large tables built element by element and then read at random (a
// vocabulary's index): blocks of 2 MiB or more are aligned to 2 MiB and on huge pages.
template <class T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}

  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "small blocks come from plain operator new");

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* block = std::aligned_alloc(kHugePageBytes, rounded);
    if (block == nullptr) throw std::bad_alloc();
    prefer_huge_pages(block, rounded);
    return static_cast<T*>(block);
  }
  void deallocate(T* block, size_t n) {
    if (n * sizeof(T) < kHugePageBytes)
      ::operator delete(block);
    else
      std::free(block);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

}  // namespace ptrain
